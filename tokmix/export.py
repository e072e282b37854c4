"""Exports of a finished run for other trainers: a Megatron-LM indexed dataset (.bin + .idx, one entry per
document) and llm.c token files (one per train shard and per holdout). Everything is streamed in chunks and
committed atomically, so memory stays bounded whatever the run's size and a killed export leaves no file
half-written under its final name.

Megatron: the train token stream (shard 0 whole, every later shard without its first token, which repeats the
previous shard's last) is cut where the provenance index says documents meet (a run without one: before each
doc_prefix, after each doc_suffix), so each document appears once with its delimiters as in the shards: the
documents concatenated are the train stream token for token. The last document is cut where the run's last block
ends, as in the shards. Tokens are written as Megatron's preprocess writes them: uint16 for a vocabulary under
65,500 ids, int32 from there on (DType.optimal_dtype in megatron/core/datasets/indexed_dataset.py). Holdouts are
written the same way as `<prefix>_val_<domain>`.

llm.c: each train shard and holdout is copied token for token behind llm.c's 256-int32 header: "gpt-2"'s
(magic 20240520, version 1) for uint16 tokens, "llama-3"'s (20240801, version 7) for uint32 ones
(HEADERS_INFO in llm.c's dev/data/data_common.py).

A run with a schedule is exported as one train dataset per phase (`<prefix>_<phase>`, `tokmix_<phase>_train_XXX.bin`):
both trainers shuffle the samples of a dataset, which would undo the schedule, and a long-context phase's blocks
have their own seq_len. A phase's dataset is its shards' stream, its first shard whole (its first token is the
previous phase's last: its first block needs it), so it holds exactly the phase's blocks.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from tokmix import shards
from tokmix.data import TrainBlocks, check_token_file, read_run_index
from tokmix.errors import TokmixError
from tokmix.format.records import Index, TokenFileEntry
from tokmix.provenance import file_documents, read_ids, sources_of
from tokmix.store import storage
from tokmix.tokens import Delimiters, iter_token_chunks

FORMATS = ("megatron", "llmc")

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
# Megatron's DType enum (megatron/core/datasets/indexed_dataset.py): the .idx names the token dtype by code
MEGATRON_DTYPE_CODE = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
MEGATRON_UINT16_BELOW = 65_500  # Megatron's preprocess writes uint16 tokens for fewer ids than this, else int32

LLMC_HEADER_INTS = 256
# llm.c dev/data/data_common.py HEADERS_INFO: "gpt-2" (uint16 tokens) and "llama-3" (uint32 tokens)
LLMC_MAGIC_VERSION = {np.dtype(np.uint16): (20240520, 1), np.dtype(np.uint32): (20240801, 7)}
LLMC_PREFIX = "tokmix_"


EXPORT_RECORD = "tokmix-export.json"  # beside the exported files: the names tokmix exported there (sealed)


class _AtomicFile:
    """A file written under a fresh temporary name (created exclusively: never a file of the user's) and moved
    into place on a clean exit; removed on an error. Into place means linked in, which fails if anything is there
    (the user's file put there meanwhile), unless `replace`: an earlier export's own file, with --overwrite."""

    def __init__(self, path: Path, replace: bool = False):
        self.path, self.replace = path, replace

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tokmix-tmp", dir=self.path.parent)
        self.tmp = Path(tmp)
        self.f = os.fdopen(fd, "wb")
        return self.f

    def __exit__(self, exc_type, exc, tb) -> None:
        self.f.close()
        if exc_type is not None:
            self.tmp.unlink(missing_ok=True)
            return
        with open(self.tmp, "rb+") as f:
            os.fsync(f.fileno())
        shards.place(self.tmp, self.path, self.replace)


def _claim_targets(out_dir: Path, targets: list[Path], overwrite: bool) -> set[Path]:
    """Check where an export writes, before anything is written, and record it: never inside the run's own
    directory, never over a file tokmix did not export there (the record beside them, tokmix-export.json, names
    what earlier exports wrote; only those are replaced, and only with `overwrite`). Returns the targets that
    replace an earlier export's file."""
    run = None if storage(out_dir).remote else Path(os.path.realpath(out_dir))
    replaced: set[Path] = set()
    by_folder: dict[Path, list[Path]] = {}
    for path in targets:
        folder = Path(os.path.realpath(path.parent))
        if run is not None and (folder == run or run in folder.parents):
            raise TokmixError(f"{path}: inside the run's directory {out_dir}, whose files are the run's: export "
                              "somewhere outside it")
        by_folder.setdefault(path.parent, []).append(path)
    for folder, paths in by_folder.items():
        record = folder / EXPORT_RECORD
        if record.is_symlink() or (record.exists() and not record.is_file()):
            raise TokmixError(f"{record}: not the record tokmix export writes; move it away")
        kept = shards.read_json(record, sealed=True, remedy="move it away: tokmix export replaces nothing it names")
        if kept is not None and not isinstance(kept.get("files"), list):
            raise shards.DamagedFile(record, "not the record tokmix export writes", "move it away")
        exported = set(kept["files"]) if kept else set()
        for path in paths:
            if not (path.exists() or path.is_symlink()):
                continue
            if path.name not in exported or path.is_symlink() or not path.is_file():
                raise TokmixError(f"{path}: exists and tokmix did not export it; export never writes over it: "
                                  "choose another target")
            if not overwrite:
                raise TokmixError(f"{path}: exists (an earlier export's); run again with --overwrite to replace "
                                  "it, or choose another target")
            replaced.add(path)
        folder.mkdir(parents=True, exist_ok=True)  # recorded before any of them is created
        shards.write_record(record, {"files": sorted(exported | {p.name for p in paths})})
    return replaced


def _settle_records(targets: list[Path]) -> None:
    """After a failed export: each record names only what is there (or is removed, naming nothing), so a failed
    export leaves its target as it found it."""
    for folder in {p.parent for p in targets}:
        record = folder / EXPORT_RECORD
        kept = shards.read_json(record, sealed=True) if record.is_file() else None
        if kept is None:
            continue
        there = [name for name in kept.get("files", []) if (folder / name).is_file()]
        if there:
            shards.write_record(record, {"files": there})
        else:
            record.unlink()


def _checked(path: Path, chunks: Iterable[np.ndarray], checksum: str | None) -> Iterator[np.ndarray]:
    """`chunks` of a shard or holdout as read, then its sha256 against the index's: a damaged file fails the
    export before its output is committed (the caller's _AtomicFile removes it)."""
    h = hashlib.new(shards.CHECKSUM)
    for chunk in chunks:
        h.update(memoryview(np.ascontiguousarray(chunk)).cast("B"))
        yield chunk
    if checksum is not None and h.hexdigest() != checksum:
        raise TokmixError(f"{path}: damaged (sha256 differs from {shards.INDEX_NAME}); not exported (the "
                          "run's `tokmix run` command, run again, remakes it)")


def train_stream(blocks: TrainBlocks, chunk_bytes: int = shards.READ_CHUNK_BYTES,
                 checksums: list[str | None] | None = None, part: range | None = None) -> Iterator[np.ndarray]:
    """The run's train tokens in order (or those of the shards in `part`, the first of them whole), each once:
    the overlap token heading shard k+1 is checked against the last token of shard k and dropped; each shard's
    sha256 against `checksums` (the index's) once it is read."""
    last = None
    for k in part if part is not None else range(len(blocks.files)):
        path, first = blocks.files[k], True
        chunks = iter_token_chunks(path, blocks.dtype, chunk_bytes)
        for chunk in _checked(path, chunks, checksums[k] if checksums else None):
            tail = int(chunk[-1])
            if first and last is not None:
                if int(chunk[0]) != last:
                    raise TokmixError(
                        f"{path}: first token {int(chunk[0])} is not the previous shard's last token {last}: "
                        "the shards do not chain"
                    )
                chunk = chunk[1:]
            first = False
            if len(chunk):
                yield chunk
            last = tail


def _holdout_files(out_dir: Path) -> list[tuple[str, Path, int, str | None]]:
    index = read_run_index(out_dir)
    dtype = np.dtype(index.dtype)
    out = []
    for domain, entry in index.val.items():
        path = out_dir / entry.file
        check_token_file(path, int(entry.tokens), dtype)
        out.append((domain, path, int(entry.tokens), entry.checksum))
    return out


def _shard_checksums(run: Index) -> list[str | None]:
    return [shard.checksum for shard in run.shards]


def train_parts(run: Index) -> list[tuple[str | None, range]]:
    """What is exported as one train dataset: (phase name, its shards) for each phase of a schedule, else the
    whole run (name None)."""
    if not run.phases:
        return [(None, range(len(run.shards)))]
    return [(phase.name, range(*phase.shards)) for phase in run.phases]


def _distinct(targets: list[Path]) -> list[Path]:
    """The targets, refused in one line if two are one file (a phase named like a holdout's file)."""
    seen: set[Path] = set()
    for path in targets:
        if path in seen:
            raise TokmixError(f"{path}: the export would write two datasets there (a phase is named as a holdout "
                              "is): rename the phase")
        seen.add(path)
    return targets


# ---------------------------------------------------------------------- Megatron-LM
def megatron_token_dtype(vocab_size: int) -> np.dtype:
    """The dtype Megatron's preprocess would write this vocabulary's tokens in."""
    return np.dtype("<u2" if vocab_size < MEGATRON_UINT16_BELOW else "<i4")


class _DocumentSplitter:
    """Fed the token stream chunk by chunk, returns the lengths of the documents each chunk completes. A
    document runs from where one starts (Delimiters.starts) to where the next does; the last one is
    completed by `finish()`."""

    def __init__(self, delimiters: Delimiters):
        self.delimiters = delimiters
        self.start: int | None = None  # where the open document began
        self.previous: int | None = None  # the token before this chunk
        self.tokens = 0
        self.documents = 0

    def feed(self, chunk: np.ndarray) -> np.ndarray:
        starts = self.delimiters.starts(chunk, self.previous) + self.tokens
        if self.start is None and (not len(starts) or starts[0] != 0):
            raise TokmixError(f"the token stream starts with {int(chunk[0])}, not a document's first delimiter "
                              f"({self.delimiters.marker})")
        self.previous = int(chunk[-1])
        self.tokens += len(chunk)
        if not len(starts):
            return starts
        lengths = np.diff(starts) if self.start is None else np.diff(starts, prepend=self.start)
        self.start = int(starts[-1])
        return self.count(lengths)

    def finish(self) -> np.ndarray:
        if self.start is None:
            raise TokmixError("no tokens to export")
        return self.count(np.array([self.tokens - self.start]))

    def count(self, lengths: np.ndarray) -> np.ndarray:
        if len(lengths) and int(lengths.max()) > np.iinfo(np.int32).max:
            raise TokmixError(f"a document of {int(lengths.max()):,} tokens exceeds Megatron's int32 lengths")
        self.documents += len(lengths)
        return lengths


def index_lengths(out_dir: Path, entries: list[TokenFileEntry], sources: list) -> Iterator[np.ndarray]:
    """The documents' lengths in the token stream of `entries` (the train shards, or one holdout) from their
    provenance index: a shard's first document goes on from the previous shard's last, which ends with the
    overlap token they share (counted once)."""
    carry = None
    for entry in entries:
        lengths = file_documents(out_dir, entry, sources).records["tokens"].astype(np.int64)
        if carry is not None:
            lengths[0] += carry - 1
        carry = int(lengths[-1])
        if len(lengths) > 1:
            yield lengths[:-1]
    if carry is not None:
        yield np.array([carry])


def _write_megatron(chunks: Iterable[np.ndarray], dtype: np.dtype, delimiters: Delimiters, prefix: Path,
                    chunk_bytes: int, documents: Iterator[np.ndarray] | None = None,
                    replace: frozenset[Path] = frozenset()) -> list[Path]:
    """The .bin and .idx of a token stream: one sequence per document, its documents' lengths from `documents`
    (the provenance index) or, without, cut where the delimiters say."""
    bin_path, idx_path = prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx")
    limit = np.iinfo(dtype).max
    # document lengths are spooled to disk, 4 bytes a document, so a corpus of any size exports in bounded memory
    fd, spool_name = tempfile.mkstemp(prefix=f".{idx_path.name}.", suffix=".lengths.tokmix-tmp",
                                      dir=idx_path.parent)
    os.close(fd)
    spool = Path(spool_name)
    splitter = _DocumentSplitter(delimiters)
    try:
        with _AtomicFile(bin_path, bin_path in replace) as f, open(spool, "wb") as lengths:
            written = 0
            for chunk in chunks:
                if chunk.dtype != dtype and int(chunk.max()) > limit:
                    raise TokmixError(f"token id {int(chunk.max())} does not fit Megatron's {dtype.name}")
                if documents is None:
                    lengths.write(splitter.feed(chunk).astype("<i4").tobytes())
                f.write(chunk.astype(dtype, copy=False).tobytes())
                written += len(chunk)
            if documents is None:
                lengths.write(splitter.finish().astype("<i4").tobytes())
            else:
                held = 0
                for part in documents:
                    lengths.write(splitter.count(part).astype("<i4").tobytes())
                    held += int(part.sum())
                if held != written:
                    raise TokmixError(f"{prefix}: the provenance index's documents hold {held:,} tokens, the "
                                      f"token stream {written:,}")
        _write_megatron_index(idx_path, spool, splitter.documents, dtype, chunk_bytes // 8 or 1, idx_path in replace)
    finally:
        spool.unlink(missing_ok=True)
    return [bin_path, idx_path]


def _write_megatron_index(idx_path: Path, spool: Path, count: int, dtype: np.dtype, chunk: int,
                          replace: bool = False) -> None:
    """The .idx: header, then int32 sequence lengths, int64 byte pointers, int64 document indices (count+1).
    One sequence per document, so the document indices are 0..count. Written `chunk` entries at a time."""
    lengths = np.memmap(spool, dtype="<i4", mode="r")
    with _AtomicFile(idx_path, replace) as f:
        f.write(MEGATRON_MAGIC)
        f.write(struct.pack("<Q", MEGATRON_VERSION))
        f.write(struct.pack("<B", MEGATRON_DTYPE_CODE[np.dtype(dtype.name)]))
        f.write(struct.pack("<Q", count))  # sequences
        f.write(struct.pack("<Q", count + 1))  # entries of the document index, as Megatron's writer counts them
        for a in range(0, count, chunk):
            f.write(np.asarray(lengths[a : a + chunk]).tobytes())
        offset = 0
        for a in range(0, count, chunk):
            nbytes = lengths[a : a + chunk].astype("<i8") * dtype.itemsize
            pointers = np.cumsum(nbytes) - nbytes + offset
            f.write(pointers.astype("<i8").tobytes())
            offset += int(nbytes.sum())
        for a in range(0, count + 1, chunk):
            f.write(np.arange(a, min(a + chunk, count + 1), dtype="<i8").tobytes())
    del lengths


def export_megatron(
    out_dir: str | os.PathLike, out_prefix: str | os.PathLike, chunk_bytes: int = shards.READ_CHUNK_BYTES,
    overwrite: bool = False,
) -> list[Path]:
    """`<out_prefix>.bin/.idx` from the train shards (a schedule: `<out_prefix>_<phase>.bin/.idx` from each
    phase's), `<out_prefix>_val_<domain>.bin/.idx` from each holdout. Returns the files written."""
    out_dir, prefix = shards.as_path(out_dir), Path(out_prefix)
    blocks = TrainBlocks(out_dir)
    index = read_run_index(out_dir)
    trains = [_megatron_prefix(prefix, phase) for phase, _ in train_parts(index)]
    prefixes = [*trains, *(prefix.with_name(f"{prefix.name}_val_{d}") for d in index.val)]
    targets = [p.with_name(p.name + ext) for p in prefixes for ext in (".bin", ".idx")]
    targets += [_megatron_ids_path(p) for p, (_, part) in zip(trains, train_parts(index))
                if _has_ids(index.shards[part.start : part.stop])]
    targets += [_megatron_ids_path(p) for p, e in zip(prefixes[len(trains):], index.val.values()) if _has_ids([e])]
    targets = _distinct(targets)
    replace = frozenset(_claim_targets(out_dir, targets, overwrite))
    try:
        return _export_megatron(out_dir, blocks, index, prefix, chunk_bytes, replace)
    except BaseException:
        _settle_records(targets)
        raise


def _export_megatron(out_dir, blocks: TrainBlocks, index: Index, prefix: Path, chunk_bytes: int,
                     replace: frozenset[Path]) -> list[Path]:
    # an index without vocab_size: the largest vocabulary the run's dtype holds
    dtype = megatron_token_dtype(index.vocab_size or np.iinfo(blocks.dtype).max + 1)
    delimiters = Delimiters.from_index(index)
    # documents where the provenance index says they are; a run without one is cut at its delimiters
    traced = index.provenance is not None
    written = []
    for phase, part in train_parts(index):
        entries = index.shards[part.start : part.stop]
        documents = index_lengths(out_dir, entries, sources_of(index.provenance.sources)) if traced else None
        stream = train_stream(blocks, chunk_bytes, _shard_checksums(index), part)
        written += _write_megatron(stream, dtype, delimiters, _megatron_prefix(prefix, phase), chunk_bytes,
                                   documents, replace)
        written += _write_ids(out_dir, entries, _megatron_ids_path(_megatron_prefix(prefix, phase)), replace)
    for domain, path, _, checksum in _holdout_files(out_dir):
        chunks = _checked(path, iter_token_chunks(path, blocks.dtype, chunk_bytes), checksum)
        entry = index.val[domain]
        documents = index_lengths(out_dir, [entry], sources_of(entry.provenance.sources)) if traced else None
        val_prefix = prefix.with_name(f"{prefix.name}_val_{domain}")
        written += _write_megatron(chunks, dtype, delimiters, val_prefix, chunk_bytes, documents, replace)
        written += _write_ids(out_dir, [entry], _megatron_ids_path(val_prefix), replace)
    return written


def _megatron_prefix(prefix: Path, phase: str | None) -> Path:
    return prefix if phase is None else prefix.with_name(f"{prefix.name}_{phase}")


def _has_ids(entries: list[TokenFileEntry]) -> bool:
    """Whether the run kept the documents' ids ([streams.X] id_field) of every one of `entries`."""
    return all(e.provenance is not None and e.provenance.ids is not None for e in entries)


def _megatron_ids_path(prefix: Path) -> Path:
    return prefix.with_name(prefix.name + shards.IDS_SUFFIX)


def _llmc_ids_path(dst: Path) -> Path:
    return dst.with_name(LLMC_PREFIX + shards.ids_name(dst.name[len(LLMC_PREFIX):]))


def _write_ids(out_dir: Path, entries: list[TokenFileEntry], dest: Path,
               replace: frozenset[Path] | set[Path] = frozenset()) -> list[Path]:
    """With documents' ids ([streams.X] id_field): one JSON value a line, line i the id of the export's document i
    (a shard's first document goes on from the previous shard's last, as in index_lengths). Nothing without."""
    if not _has_ids(entries):
        return []
    with _AtomicFile(dest, dest in replace) as f:
        for k, entry in enumerate(entries):
            ids = read_ids(out_dir, entry)
            f.write("".join(json.dumps(v, ensure_ascii=False) + "\n" for v in ids[1 if k else 0:]).encode("utf-8"))
    return [dest]


# ---------------------------------------------------------------------- llm.c
def _write_llmc(src: Path, dst: Path, tokens: int, dtype: np.dtype, checksum: str | None, replace: bool) -> Path:
    if dtype not in LLMC_MAGIC_VERSION:
        raise TokmixError(f"llm.c has no token format for {dtype.name}")
    if tokens >= 2**31:
        raise TokmixError(f"{src}: {tokens:,} tokens do not fit llm.c's int32 token count; use smaller shards")
    magic, version = LLMC_MAGIC_VERSION[dtype]
    header = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
    header[:3] = magic, version, tokens
    with _AtomicFile(dst, replace) as f:
        f.write(header.tobytes())
        for chunk in _checked(src, iter_token_chunks(src, dtype), checksum):
            f.write(memoryview(chunk).cast("B"))  # shard tokens are already llm.c's little-endian ints
    return dst


def export_llmc(out_dir: str | os.PathLike, llmc_dir: str | os.PathLike, overwrite: bool = False) -> list[Path]:
    """`tokmix_train_XXX.bin` per train shard (a schedule: `tokmix_<phase>_train_XXX.bin`, one glob per phase) and
    `tokmix_val_<domain>.bin` per holdout in llmc_dir. Each shard keeps its overlap token: llm.c reads every file
    on its own and needs B*T + 1 tokens for B*T targets."""
    out_dir, llmc_dir = shards.as_path(out_dir), Path(llmc_dir)
    blocks = TrainBlocks(out_dir)
    index = read_run_index(out_dir)
    holdouts = _holdout_files(out_dir)
    trains = [llmc_dir / (LLMC_PREFIX + (f"{phase}_" if phase else "") + shards.train_name(k))
              for phase, part in train_parts(index) for k in part]
    vals = [llmc_dir / (LLMC_PREFIX + shards.val_name(domain)) for domain, *_ in holdouts]
    ids = [_llmc_ids_path(dst) for dst, e in zip(trains, index.shards) if _has_ids([e])]
    ids += [_llmc_ids_path(dst) for dst, (domain, *_) in zip(vals, holdouts) if _has_ids([index.val[domain]])]
    replace = _claim_targets(out_dir, _distinct(trains + vals + ids), overwrite)
    try:
        return _export_llmc(blocks, index, holdouts, trains, vals, replace)
    except BaseException:
        _settle_records(trains + vals + ids)
        raise


def _export_llmc(blocks: TrainBlocks, index: Index, holdouts: list, trains: list[Path], vals: list[Path],
                 replace: set[Path]) -> list[Path]:
    written = []
    for path, dst, checksum in zip(blocks.files, trains, _shard_checksums(index)):
        tokens = path.stat().st_size // blocks.dtype.itemsize
        written.append(_write_llmc(path, dst, tokens, blocks.dtype, checksum, dst in replace))
    for k, dst in enumerate(trains):
        written += _write_ids(blocks.root, [index.shards[k]], _llmc_ids_path(dst), replace)
    for (domain, path, tokens, checksum), dst in zip(holdouts, vals):
        written.append(_write_llmc(path, dst, tokens, blocks.dtype, checksum, dst in replace))
        written += _write_ids(blocks.root, [index.val[domain]], _llmc_ids_path(dst), replace)
    return written


def export(out_dir: str | os.PathLike, fmt: str, out: str | os.PathLike, overwrite: bool = False) -> list[Path]:
    """What `tokmix export DIR --format megatron|llmc OUT` runs: OUT is a path prefix for megatron, a directory
    for llmc. Returns the files written. Nothing is written over a file tokmix did not export; an earlier
    export's files are replaced only with `overwrite`; every shard and holdout is checked against its sha256."""
    if fmt == "megatron":
        return export_megatron(out_dir, out, overwrite=overwrite)
    if fmt == "llmc":
        return export_llmc(out_dir, out, overwrite)
    raise TokmixError(f"unknown export format {fmt!r}: one of {', '.join(FORMATS)}")
