"""The output format: every path in the output directory (Layout), block arithmetic, atomic writes, commit
records, and reading and writing index.json (its schema: tokmix.manifest); the token arrays themselves (dtype,
delimiters, token files, fingerprints) are tokmix.tokens'. Every producer and consumer of shards goes through the
two, and they import nothing of the pipeline, so a training job that reads shards needs numpy alone; this one
imports no numpy, so a command that reads only records starts without it.

A shard of `blocks` blocks holds `blocks * seq_len + 1` tokens; its last token is repeated as the first
token of the next shard, so block j of a shard is `tokens[j * seq_len : j * seq_len + seq_len + 1]`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tokmix.errors import TokmixError
from tokmix.format.commit import (  # noqa: F401 (NotAFile, check_*, open_regular, read_regular: used through shards)
    PUBLISHED_DIR,
    STATE_DIR,
    TMP,
    NotAFile,
    check_input_file,
    check_regular,
    mark_of,
    mark_published,
    not_regular,
    open_regular,
    place,
    publish_new,
    read_regular,
    tmp_name,
    tmp_recorded,
)
from tokmix.format.records import Index
from tokmix.store import READ_BLOCK_BYTES, ObjectPath, as_path, storage

EOT_TOKEN = "<|endoftext|>"
INDEX_NAME = "index.json"
CONTAMINATION_NAME = "contamination.json"  # beside index.json: the benchmark items found and where (sealed)
TOKENIZER_NAME = "tokenizer.json"  # the run's own (trained, copied from a URL, converted); a local one is read in place
# the run's own tokenizer file of each format (tokmix.backends.FORMATS): tiktoken's ranks, a URL's .model
OWN_TOKENIZER_NAMES = {"hf": TOKENIZER_NAME, "tiktoken": "tokenizer.tiktoken.json", "sentencepiece": "tokenizer.model"}
STREAMS_DIR = "streams"  # intermediates: one folder per stream of committed work units
UNITS_DIR = "units"
STREAM_META = "stream.json"  # in a stream's folder: the finished stream's record
DOCS_SUFFIX = ".docs"  # beside a train shard or holdout: its provenance index (tokmix.provenance)
IDS_SUFFIX = ".ids"  # beside it, with [streams.X] id_field: each document's own id (tokmix.provenance)
INTERLEAVE_LABELS = "interleave.labels"  # in STREAMS_DIR: the global interleave's labels, written by assemble
OWN_FILES_REMEDY = ("tokmix removes nothing through it: move away what you want to keep and delete the directory "
                    "yourself, or choose another --out")
RECORD_NAME = "created"  # in STATE_DIR: every path of the output directory tokmix created (Layout.record)
LOCK_NAME = "lock"
STORE_RUN_NAME = "run.json"  # on a store, in its tokmix-state/: the working folder that writes it, the recipe
WRITERS_NAME = "writers"  # in STATE_DIR: every task that writes holds a shared flock on it (tokmix.lock)
EXPECTED_NAME = "expected.json"  # in STATE_DIR: the shards' sha256 derived from the units and the seed
CHECKSUM = "sha256"
UNIT_BYTES = 16 << 20  # intermediates: source bytes per work unit, the grain of parallelism and of resume
READ_CHUNK_BYTES = 64 << 20  # sequential reads of this size keep checksums and validation streaming


def train_name(k: int) -> str:
    return f"train_{k:03d}.bin"


def val_name(domain: str) -> str:
    return f"val_{domain}.bin"


def docs_name(token_file: str) -> str:
    """The provenance index of a token file: train_000.bin -> train_000.docs."""
    return token_file.removesuffix(".bin") + DOCS_SUFFIX


def ids_name(token_file: str) -> str:
    """The documents' ids of a token file: train_000.bin -> train_000.ids."""
    return token_file.removesuffix(".bin") + IDS_SUFFIX


def tokens_in_shard(blocks: int, seq_len: int) -> int:
    """Tokens of a shard of `blocks` blocks (of the whole run, for all its blocks): the last block reads one
    token past them."""
    return blocks * seq_len + 1


def block_tokens(seq_len: int) -> int:
    """Tokens of one block as stored: seq_len inputs, and the last target."""
    return seq_len + 1


def shard_blocks(total_blocks: int, blocks_per_shard: int) -> list[int]:
    """Blocks of each shard: full shards, then the remainder."""
    full, rest = divmod(total_blocks, blocks_per_shard)
    return [blocks_per_shard] * full + ([rest] if rest else [])


def unit_name(index: int) -> str:
    """A work unit's name: its index in the stream, six digits (units list in order; its files: tokmix.unit_files)."""
    return f"{index:06d}"


# every path the record of what tokmix created may name (Layout.run_paths): anything else is an edit
RECORDABLE_PATH = re.compile(rf"{re.escape(INDEX_NAME)}|{'|'.join(map(re.escape, OWN_TOKENIZER_NAMES.values()))}|"
                              rf"{re.escape(CONTAMINATION_NAME)}|"
                              rf"(?:val_[^/]+|train_\d{{3,}})"
                              rf"\.(?:bin|{DOCS_SUFFIX[1:]}|{IDS_SUFFIX[1:]})|"
                              rf"{STREAMS_DIR}(?:/[^/]+(?:/{UNITS_DIR})?)?")


class _In:
    """A Layout attribute: the path of `name` in the layout's folder `folder` ("root", "work", "state", ...)."""

    def __init__(self, folder: str, name: str):
        self.folder, self.name = folder, name

    def __get__(self, layout: Layout, owner: type | None = None) -> Path:
        return getattr(layout, self.folder) / self.name


class Layout:
    """Where everything lives in one output directory. Which of it tokmix made, and may remove, is
    tokmix.ownership's.

    On a store (`out_dir` a URL, tokmix.store), the data (units and their records, shards and theirs,
    holdouts, the record of what tokmix created, index.json) are objects under the URL, and the state folder
    (the lock, the run's identity, its index while it is being built) is in the local folder `work`."""

    def __init__(self, out_dir: str | os.PathLike | ObjectPath, work: str | os.PathLike | None = None):
        self.root = as_path(out_dir)
        self.remote = storage(self.root).remote
        # where the state lives: the output directory itself, or for a store the local working folder
        self.work = as_path(work) if work is not None else self.root

    @property
    def index(self) -> Path:
        """index.json as the run builds it (for a store: in the working folder, published last)."""
        return self.work / INDEX_NAME

    @property
    def published_index(self) -> Path:
        """index.json where consumers read it; for a store, uploaded once every other file is there."""
        return self.root / INDEX_NAME

    @property
    def tokenizer(self) -> Path:
        """The run's own tokenizer (for a store: in the working folder, where its workers read it; published
        beside index.json)."""
        return self.work / TOKENIZER_NAME

    def own_tokenizer(self, fmt: str) -> Path:
        """The run's own tokenizer file of this format (beside `tokenizer` for a store)."""
        return self.work / OWN_TOKENIZER_NAMES[fmt]

    streams = _In("root", STREAMS_DIR)
    interleave_labels = _In("streams", INTERLEAVE_LABELS)
    state = _In("work", STATE_DIR)
    lock = _In("state", LOCK_NAME)
    # the state folder's files: the run's identity and options (runner), its progress and outcome (pipeline)
    recorded_recipe = _In("state", "recipe.json")
    options = _In("state", "options.json")
    done = _In("state", "done.json")  # written last: the run of this fingerprint was validated
    timings = _In("state", "timings.json")
    stage = _In("state", "stage.json")  # the stage running, since when, what it has done (tokmix status)
    error = _In("state", "error.txt")  # the one line a failed stage process ended with, for `tokmix status`
    unit_bytes = _In("state", "unit_bytes.json")  # the unit size the streams were cut with: a resume keeps it
    documents_used = _In("state", "documents_used.json")
    balance = _In("state", "balance.json")  # the balanced interleave's deviation from its targets (index.json)
    backend_choice = _In("state", "backend.json")  # the backend checked once per run: restarts reuse it
    # the tokenizer libraries' versions and the digests of the oracle's ids (a resume under others re-checks)
    tokenizer_libraries = _In("state", "tokenizer.libraries.json")
    tokenizer_checksum = _In("state", "tokenizer.checksum.json")  # a resume with other tokenizer bytes is refused
    tokenizer_source = _In("state", "tokenizer.source.json")  # the same, of the local file a run's copy is made of
    split_record = _In("state", "split.json")  # a resume with another split is refused
    provenance_sources = _In("state", "sources.json")  # the train shards' table of sources (tokmix.provenance)
    writers = _In("state", WRITERS_NAME)  # every writing task holds it shared (tokmix.lock)
    # every shard's sha256 as derived from the committed units and the seed (tokmix.stages.expected)
    expected = _In("state", EXPECTED_NAME)
    benchmark_set = _In("state", "benchmarks")  # the benchmarks' n-grams, built once (tokmix.stages.decontam)
    benchmark_identity = _In("state", "benchmarks.json")  # their files' sha256 and the normalization
    contamination = _In("root", CONTAMINATION_NAME)

    def holdout_state(self, domain: str, kind: str) -> Path:
        """What the holdout stage keeps of a domain: its documents' "hashes" and "keys" (tokmix.sources.text_keys),
        and the "record" of their checksums; "lengths", what an earlier tokmix kept in place of the keys (only
        named, to tell its holdouts: tokmix.stages.holdout.holdout_damage)."""
        suffix = {"hashes": "hashes.npy", "keys": "keys.npy", "lengths": "lengths.npy", "record": "json"}[kind]
        return self.state / f"holdout_{domain}.{suffix}"

    @property
    def store_run(self) -> Path:
        """On a store: the working folder (host, path) whose lock guards it, and the recipe it was started with."""
        return self.root / STATE_DIR / STORE_RUN_NAME

    @property
    def record(self) -> Path:
        """What tokmix created in the output directory: beside what it names (on the store for a store)."""
        return self.root / STATE_DIR / RECORD_NAME


    def train(self, k: int) -> Path:
        return self.root / train_name(k)

    def val(self, domain: str) -> Path:
        return self.root / val_name(domain)

    def docs(self, token_file: Path) -> Path:
        """The provenance index beside a train shard or holdout."""
        return token_file.with_name(docs_name(token_file.name))

    def ids(self, token_file: Path) -> Path:
        """The documents' ids beside a train shard or holdout (with an id_field)."""
        return token_file.with_name(ids_name(token_file.name))

    def stream(self, name: str) -> Path:
        return self.streams / name

    def units(self, stream: str) -> Path:
        return self.stream(stream) / UNITS_DIR

    def stream_meta(self, stream: str) -> Path:
        return self.stream(stream) / STREAM_META

    # ------------------------------------------------------------------ what the run creates, and the record
    def run_paths(self, domains: list[str], streams: list[str], shards: int, own_tokenizer: str | None,
                  provenance: bool = True, decontaminates: bool = False, ids: bool = False) -> list[Path]:
        """Every path a run of these domains, streams and shards creates, the state folder's content aside;
        `own_tokenizer`: the format of the run's own tokenizer file, None for none."""
        paths = [self.published_index, *map(self.val, domains), *map(self.train, range(shards))]
        token_files = paths[1:]
        paths += [self.docs(p) for p in token_files] if provenance else []
        paths += [self.ids(p) for p in token_files] if ids else []
        paths += [self.contamination] if decontaminates else []
        paths += [self.root / OWN_TOKENIZER_NAMES[own_tokenizer]] if own_tokenizer else []
        paths += [self.streams, *map(self.stream, streams), *map(self.units, streams)]
        return paths

    def sample_paths(self, unit: list[Path]) -> list[Path]:
        """One path of every kind tokmix may write, for asking whether a source pattern would match them; `unit`:
        a unit's files in stream "s" (tokmix.unit_files.sample_files)."""
        stream = self.stream("s")
        return [self.root, self.index, self.val("d"), self.train(0), self.tokenizer, self.recorded_recipe,
                self.lock, self.record, stream, self.stream_meta("s"), *unit, self.docs(self.train(0)),
                self.train(0).with_name(f"{self.train(0).name}.tmp-{os.getpid()}")]

    def is_run(self) -> bool:
        """Whether this directory holds a tokmix run's record (a run in progress, stopped or finished)."""
        if self.remote:
            return self.record.is_file()
        # a real folder and file: a link to another run's state would make its bookkeeping this run's
        if self.state.is_dir() and not self.state.is_symlink() and os.path.lexists(self.record) \
                and (kind := not_regular(os.lstat(self.record).st_mode)) and kind != "a link":
            raise DamagedFile(self.record, f"{kind}, not the record tokmix writes", OWN_FILES_REMEDY)
        return self.state.is_dir() and not self.state.is_symlink() and self.record.is_file() \
            and not self.record.is_symlink()

    def holdout_copies(self, kind: str) -> Path:
        """Every domain's holdout documents in one sorted array, "hashes" (of their texts) or "keys"
        (tokmix.sources.text_keys): written by the holdout stage, read by the streams stage to drop exact copies."""
        return self.state / f"holdout.{kind}.npy"

    def shard_record(self, shard_file: str) -> Path:
        """What the assemble stage recorded of a shard it committed (tokens by stream, checksum): the shard's
        commit, beside it (on the store for a store)."""
        return self.root / STATE_DIR / "shards" / f"{shard_file}.json"

    def read_index(self) -> Index | None:
        """index.json as the run builds it (tokmix.format.records.Index), None when there is none."""
        return read_index_file(self.index)

    def write_index(self, index: Index) -> None:
        write_json(self.index, index.to_json())


def reader_layout(out: str | os.PathLike | ObjectPath) -> Layout:
    """The Layout a command that reads a run (status, inspect, trace, report, export) sees: a local directory, or
    a store's URL, whose state folder is the local working folder the store names (tokmix-state/run.json) when it
    is on this machine, and what the store holds of it otherwise."""
    root = as_path(out)
    if not storage(root).remote:
        return Layout(root)
    found = read_json(root / STATE_DIR / STORE_RUN_NAME, remedy=REMAKE_REMEDY)
    import socket

    work = found.get("work") if isinstance(found, dict) and found.get("host") == socket.gethostname() else None
    if work and Path(work, STATE_DIR).is_dir():
        return Layout(root, work=work)
    return Layout(root, work=root)  # the state the store holds: the run's record, its recipe, its index


def read_bytes_of(path: Path | ObjectPath) -> bytes:
    """A whole file's bytes: a local regular file (read_regular), or an object on a store."""
    return path.read_bytes() if storage(path).remote else read_regular(path)


def run_tokenizer_path(out_dir: str | os.PathLike | ObjectPath, index: Index) -> Path | ObjectPath | None:
    """The tokenizer file of a finished run: the path index.json records, or, for a moved directory (or a store),
    the run's own tokenizer file (of any format, OWN_TOKENIZER_NAMES) beside its index; None when neither is there."""
    recorded = Path(str(index.tokenizer or TOKENIZER_NAME))
    root = as_path(out_dir)
    for path in (recorded, *(root / name for name in OWN_TOKENIZER_NAMES.values()), root / recorded.name):
        if path.is_file():
            return path
    return None


def tokenizer_change(out_dir: str | os.PathLike | ObjectPath, index: Index) -> str | None:
    """The one line saying that the run's tokenizer file is not the one its shards were made with (its sha256
    differs from index.json's `tokenizer_sha256`); None when it is, or when there is none to compare."""
    path = run_tokenizer_path(out_dir, index)
    if path is None or not index.tokenizer_sha256:
        return None
    now = file_checksum(path)
    if now == index.tokenizer_sha256:
        return None
    return (f"tokenizer {path}: changed since this run wrote its shards (sha256 {index.tokenizer_sha256[:12]}... in "
            f"index.json, now {now[:12]}...); its ids are not the shards' ids: restore it")


def read_index_file(path: Path | ObjectPath) -> Index | None:
    """An index.json, None when there is none; DamagedFile when it is not whole JSON, or not an object."""
    found = read_json(path, remedy=REMAKE_REMEDY)
    if found is None:
        return None
    if not isinstance(found, dict):
        raise DamagedFile(path, "not a JSON object", REMAKE_REMEDY)
    return Index.from_json(found)


def read_index(out_dir: str | os.PathLike) -> Index | None:
    """A run's index.json (tokmix.format.records.Index), None when there is none; DamagedFile when it is not
    whole JSON."""
    return read_index_file(as_path(out_dir) / INDEX_NAME)


# ---------------------------------------------------------------------------- records and their checksums
RECORD_SEAL = "record_sha256"  # a record's checksum of its own content: a torn write or an edit shows
RESTART_REMEDY = "it records what this run is and cannot be remade: use --restart to start over"
REMAKE_REMEDY = "run the same command again to remake it, or use --restart to start over"


class DamagedFile(TokmixError):
    """A file tokmix wrote that is not what it wrote: truncated, edited, bits flipped. A reader that can remake
    it catches this; otherwise it is the user's one line, naming the file and the remedy."""

    def __init__(self, path: Path, why: str, remedy: str = RESTART_REMEDY):
        self.path, self.why, self.remedy = path, why, remedy
        super().__init__(f"{path}: damaged ({why}); {remedy}")

    def __reduce__(self):  # raised in a worker process, it crosses back pickled: rebuilt from its own arguments
        return type(self), (self.path, self.why, self.remedy)


def _record_digest(body: dict) -> str:
    return hashlib.new(CHECKSUM, json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_record(path: Path, record: dict[str, Any]) -> None:
    """A commit record, sealed with its own checksum (read it back with read_json(path, sealed=True))."""
    write_json(path, {**record, RECORD_SEAL: _record_digest(record)})


def read_json(path: Path, sealed: bool = False, remedy: str = RESTART_REMEDY) -> Any:
    """A JSON file tokmix wrote, None when there is none. DamagedFile when it is not whole JSON or, `sealed`, its
    seal is missing or does not match its content (the seal is not returned)."""
    path = as_path(path)
    try:  # a state file is tokmix's own: a link, FIFO or device in its place is named, never opened
        data = read_regular(path, follow=False) if not storage(path).remote else path.read_bytes()
    except FileNotFoundError:
        return None
    except NotAFile as e:
        raise DamagedFile(path, f"{e.kind}, not a file tokmix wrote", remedy) from None
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):  # JSONDecodeError is a ValueError
        raise DamagedFile(path, "not whole JSON: truncated or overwritten", remedy) from None
    if not sealed:
        return value
    if not isinstance(value, dict) or RECORD_SEAL not in value:
        raise DamagedFile(path, "its record has no checksum", remedy)
    seal = value.pop(RECORD_SEAL)
    if seal != _record_digest(value):
        raise DamagedFile(path, "its record was changed", remedy)
    return value


def write_bytes(path: Path | ObjectPath, data: bytes, durable: bool = True) -> str:
    """Write and commit `data`; returns its checksum, computed from the bytes in memory (no read back)."""
    storage(path).write(path, data, durable)
    return hashlib.new(CHECKSUM, data).hexdigest()


def write_json(path: Path, obj: Any) -> None:
    write_bytes(path, json.dumps(obj, indent=2).encode())


def open_read(path: Path | ObjectPath | str, buffering: int = -1, fetch: int = READ_BLOCK_BYTES) -> BinaryIO:
    """A file to read: a local one with `buffering`, an object on a store fetched `fetch` bytes per request."""
    path = as_path(path)
    return storage(path).open_read(path, buffering, fetch)


def file_checksum(path: Path | ObjectPath) -> str:
    h, path = hashlib.new(CHECKSUM), as_path(path)
    if storage(path).remote:
        with open_read(path, fetch=READ_CHUNK_BYTES) as f:
            while data := f.read(READ_CHUNK_BYTES):
                h.update(data)
        return h.hexdigest()
    # a local file read into one buffer: a new 64 MiB bytes object per read costs as much as the hashing (241 MiB:
    # 0.62 s against 0.33 s, docs/benchmarks.md)
    buffer = memoryview(bytearray(CHECKSUM_BUFFER_BYTES))
    with open_read(path, buffering=0) as f:
        while n := f.readinto(buffer):
            h.update(buffer[:n])
    return h.hexdigest()


CHECKSUM_BUFFER_BYTES = 1 << 20


# ---------------------------------------------------------------------------- is a committed artifact whole
@dataclass(frozen=True)
class Part:
    """One file of a committed artifact (a unit, a shard, a holdout, a finished run's files) and the sha256 that
    was recorded of it, in `against` (its sealed record, or index.json)."""

    path: Path | ObjectPath
    checksum: str | None
    against: str = "its record"


def first_damage(parts: list[Part]) -> tuple[Part, str] | None:
    """The first of `parts` that is not the bytes its checksum was taken of, and how: "missing" or "differs";
    None when the artifact is whole (one read of each file)."""
    for part in parts:
        if not part.path.exists():
            return part, "missing"
        if file_checksum(part.path) != part.checksum:
            return part, "differs"
    return None


def damage(parts: list[Part]) -> str | None:
    """Why an artifact is not whole, as its check says it ("NAME is missing", "sha256 of NAME differs from its
    record"), None when it is."""
    found = first_damage(parts)
    if found is None:
        return None
    part, how = found
    name = part.path.name
    return f"{name} is missing" if how == "missing" else f"sha256 of {name} differs from {part.against}"


def sealed_record(path: Path | ObjectPath) -> tuple[dict | None, str | None]:
    """A commit record and why it cannot be used: (record, None), or (None, "its record is missing") or (None,
    why it is damaged)."""
    try:
        record = read_json(path, sealed=True)
    except DamagedFile as e:
        return None, e.why
    return (record, None) if record is not None else (None, "its record is missing")


def fingerprints_path(root: Path, shard_file: str) -> Path:
    return root / STATE_DIR / "blocks" / f"{shard_file}.fingerprints"
