"""Stage 3: interleave the streams' documents in a seeded random order (one stream label per document,
shuffled with np.random.default_rng(seed); the i-th label s is stream s's i-th document) and cut the result
into train shards. Each shard needs one contiguous range of each stream, so shards are written
independently, in parallel, each committed atomically, and a resume rewrites only the missing ones.

The driver never holds a per-document array but the labels while it shuffles them (1 byte per document;
the recipe's "chunked" interleave not even those): one pass over the labels and the units' .len files
finds where each shard starts (each stream's unit, document and token there), and each shard task reads its
own labels, lengths and tokens from there, through bounded buffers."""

from __future__ import annotations

import itertools
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tokmix.errors import TokmixError
from tokmix.faults import fault_point
from tokmix.interleave import Deviation, Labels, Mix, balanced_chunks, interleave_order
from tokmix.lock import RunWriter, writing
from tokmix.ownership import Ownership
from tokmix.provenance import DOC_DTYPE, UNIT_DOC_DTYPE, check_place
from tokmix.shards import (
    DamagedFile,
    Part,
    fingerprints_path,
    first_damage,
    open_read,
    read_json,
    tokens_in_shard,
    write_bytes,
    write_json,
    write_record,
)
from tokmix.stages import UNITS_IN_FLIGHT_PER_WORKER, Context, Window, drop_cached
from tokmix.store import ObjectPath, as_path
from tokmix.tokens import LENGTH_DTYPE, BlockFingerprinter, TokenFileWriter, write_tokens
from tokmix.unit_files import LENGTHS, PLACES, TOKENS, UnitFiles, unit_path

GATHER_TOKENS = 8 << 20  # tokens gathered in memory before each write: bounds a shard writer's memory
READ_BUFFER = 1 << 20  # bytes buffered per open unit file: a stream's documents are read in order, a few at a time
INTERLEAVE_CHUNK = 1 << 20  # documents of the interleave read at a time


# ---------------------------------------------------------------------------- reading a stream's units in order
@dataclass(frozen=True)
class Cursor:
    """Where a stream stands at a point of the interleave: its unit, and that unit's documents and tokens
    before the point."""

    unit: int
    doc: int
    token: int


class StreamUnits:
    """One stream's committed units as assemble reads them: names and cumulative documents and tokens (O(units))."""

    def __init__(self, directory: Path | ObjectPath, units: list[dict]):
        self.directory = directory
        self.names = [u["name"] for u in units]
        self.doc_ends = np.cumsum([u["docs"] for u in units], dtype=np.int64)
        self.token_ends = np.cumsum([u["tokens"] for u in units], dtype=np.int64)

    def cursor(self, docs: int, tokens: int) -> Cursor:
        """The cursor after the stream's first `docs` documents, which hold `tokens` tokens."""
        u = min(int(np.searchsorted(self.doc_ends, docs, side="right")), len(self.names) - 1)
        before_docs = int(self.doc_ends[u - 1]) if u else 0
        before_tokens = int(self.token_ends[u - 1]) if u else 0
        return Cursor(u, docs - before_docs, tokens - before_tokens)

    def paths(self, first: int, last: int) -> tuple[str, ...]:
        """Units first..last (inclusive), as paths without their suffix (UnitFiles.stem)."""
        return tuple(UnitFiles(self.directory, name).stem for name in self.names[first : last + 1])


class RecordReader:
    """A stream's per-document records from a cursor on, across its units' files of one kind (LENGTHS: lengths,
    PLACES: places), a bounded piece at a time."""

    def __init__(self, units: tuple[str, ...], doc: int, kind: str = LENGTHS, dtype: np.dtype = LENGTH_DTYPE):
        self.units, self.unit, self.file = units, 0, None
        self.doc, self.kind, self.dtype = doc, kind, dtype

    def take(self, n: int) -> np.ndarray:
        pieces = []
        while n > 0:
            if self.file is None:
                if self.unit >= len(self.units):
                    raise TokmixError(f"{as_path(self.units[-1]).parent}: the units end {n:,} documents early")
                self.file = open_read(unit_path(self.units[self.unit], self.kind), fetch=READ_BUFFER)
                self.file.seek(self.doc * self.dtype.itemsize)
            got = np.frombuffer(self.file.read(n * self.dtype.itemsize), dtype=self.dtype)
            pieces.append(got)
            n -= len(got)
            if n > 0:  # this unit is used up
                self.file.close()
                self.file, self.unit, self.doc = None, self.unit + 1, 0
        return np.concatenate(pieces) if len(pieces) > 1 else pieces[0] if pieces else np.empty(0, self.dtype)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class LengthReader(RecordReader):
    """A stream's document lengths (int64) from a cursor on, across its units' lengths files."""

    def take(self, n: int) -> np.ndarray:
        return super().take(n).astype(np.int64)


class TokenReader:
    """A stream's tokens from a cursor on, across its units' token files, read into the caller's buffer (never
    memory-mapped: mapped pages count in the RSS that top and the memory guard see)."""

    def __init__(self, units: tuple[str, ...], token: int, itemsize: int):
        self.units, self.unit, self.file, self.itemsize = units, 0, None, itemsize
        self.token = token

    def read_into(self, out: np.ndarray) -> None:
        view, got = memoryview(out).cast("B"), 0
        while got < len(view):
            if self.file is None:
                if self.unit >= len(self.units):
                    raise TokmixError(f"{as_path(self.units[-1]).parent}: the units end before the shard's tokens")
                self.file = open_read(unit_path(self.units[self.unit], TOKENS), READ_BUFFER, READ_BUFFER)
                self.file.seek(self.token * self.itemsize)
            n = self.file.readinto(view[got:])
            got += n
            if got < len(view):  # this unit is used up (a regular file reads short only at its end)
                self.file.close()
                self.file, self.unit, self.token = None, self.unit + 1, 0

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


# ---------------------------------------------------------------------------- the driver's plan
@dataclass(frozen=True)
class Boundary:
    """Where a token of the run falls: the document holding it (position in the interleave, its stream), the
    tokens of that document before it, and every stream's cursor and documents at that document's start."""

    doc: int
    stream: int
    skip: int
    cursors: tuple[Cursor, ...]
    docs_before: tuple[int, ...]


def find_boundaries(streams: list[StreamUnits], labels: Labels, positions: list[int]) -> list[Boundary]:
    """The boundaries of the sorted token `positions`, in one pass over the labels and the streams' .len files,
    INTERLEAVE_CHUNK documents at a time: memory O(chunk + streams + units), whatever the documents."""
    readers = [LengthReader(s.paths(0, len(s.names) - 1), 0) for s in streams]
    n = len(streams)
    docs_before, tokens_before = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    found: list[Boundary] = []
    at_doc = at_token = 0
    try:
        while len(found) < len(positions):
            chunk = labels.read(at_doc, at_doc + INTERLEAVE_CHUNK)
            if not len(chunk):
                raise TokmixError(f"the streams hold {at_token:,} tokens, fewer than the {positions[-1] + 1:,} "
                                  "the blocks need (stream_slack too small?)")
            lengths = np.empty(len(chunk), dtype=np.int64)
            for s in range(n):
                at = chunk == s
                lengths[at] = readers[s].take(int(np.count_nonzero(at)))
            ends = at_token + np.cumsum(lengths)
            done = 0  # documents of the chunk counted into docs_before and tokens_before so far
            while len(found) < len(positions) and positions[len(found)] < ends[-1]:
                t = positions[len(found)]
                d = int(np.searchsorted(ends, t, side="right"))
                docs_before += np.bincount(chunk[done:d], minlength=n)
                tokens_before += _tokens_of(chunk[done:d], lengths[done:d], n)
                done = d
                cursors = tuple(u.cursor(int(k), int(tok)) for u, k, tok in zip(streams, docs_before, tokens_before))
                found.append(Boundary(at_doc + d, int(chunk[d]), t - int(ends[d] - lengths[d]), cursors,
                                      tuple(int(k) for k in docs_before)))
            docs_before += np.bincount(chunk[done:], minlength=n)
            tokens_before += _tokens_of(chunk[done:], lengths[done:], n)
            at_doc, at_token = at_doc + len(chunk), int(ends[-1])
    finally:
        for reader in readers:
            reader.close()
    return found


def _tokens_of(labels: np.ndarray, lengths: np.ndarray, n: int) -> np.ndarray:
    """Tokens of each stream among the documents (exact: int64 sums, not bincount's float weights)."""
    return np.array([int(lengths[labels == s].sum()) for s in range(n)], dtype=np.int64)


# ---------------------------------------------------------------------------- the provenance index
@dataclass(frozen=True)
class StreamOrigins:
    """How a stream's unit documents (UNIT_DOC_DTYPE) become provenance records (DOC_DTYPE): per piece of each
    pass-1 unit, its file's position among the stream's files and the line its file's earlier JSONL pieces
    end at (0 for parquet, whose places are the file's rows already). O(pieces)."""

    stream: str
    first_source: int  # the id of the stream's (pass 1, first file) source; pass p's start files * (p - 1) later
    files: tuple[str, ...]
    kinds: tuple[str, ...]
    passes: int
    piece_start: np.ndarray  # per pass-1 unit: where its pieces start in piece_file and piece_base
    piece_file: np.ndarray
    piece_base: np.ndarray

    def sources(self) -> list[list]:
        """The stream's entries of the run's source table: [stream, pass, kind, file], pass by pass."""
        return [[self.stream, p, kind, file] for p in range(1, self.passes + 1)
                for file, kind in zip(self.files, self.kinds)]

    def records(self, docs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        at = self.piece_start[docs["unit"]] + docs["piece"]
        out = np.empty(len(docs), DOC_DTYPE)
        out["source"] = self.first_source + (docs["pass"].astype(np.int64) - 1) * len(self.files) \
            + self.piece_file[at]
        place = docs["place"].astype(np.int64) + self.piece_base[at]
        if len(place) and int(place.max()) > np.iinfo(np.uint32).max:
            check_place(int(place.max()), self.stream, self.files[int(self.piece_file[at[place.argmax()]])])
        out["place"], out["tokens"], out["crc32"] = place, tokens, docs["crc32"]
        return out


def stream_origins(directory: Path, units: list[dict], first_source: int) -> StreamOrigins:
    """A stream's origins from the records of the units it uses (pass-1 units first, in order)."""
    stream, files, kinds, starts, piece_file, piece_base = directory.parent.name, {}, [], [0], [], []
    lines: dict[str, int] = {}  # a JSONL file's lines in the pieces before
    passes = 1
    for unit in units:
        record = UnitFiles(directory, unit["name"]).read_record()
        passes = max(passes, record.get("pass", 1))
        if record.get("pass", 1) > 1:
            continue
        for (path, kind, *_), n in zip(record["pieces"], record.get("lines") or [0] * len(record["pieces"])):
            if path not in files:
                files[path] = len(files)
                kinds.append(kind)
            piece_file.append(files[path])
            piece_base.append(lines.get(path, 0))
            lines[path] = lines.get(path, 0) + n
        starts.append(len(piece_file))
    return StreamOrigins(stream, first_source, tuple(files), tuple(kinds), passes, np.array(starts, np.int64),
                         np.array(piece_file, np.int64), np.array(piece_base, np.int64))


def run_origins(ctx: Context, metas: dict[str, dict]) -> tuple[StreamOrigins, ...]:
    """Every stream's origins, numbering the run's sources stream by stream (recipe order), pass by pass."""
    out, first = [], 0
    for name in ctx.recipe.streams:
        origins = stream_origins(ctx.layout.units(name), metas[name]["units"], first)
        out.append(origins)
        first += len(origins.files) * origins.passes
    return tuple(out)


class ShardDocuments:
    """The shard's provenance records, written as its documents are gathered: each stream's unit places read
    from its cursor on (.src files), mapped by its StreamOrigins, committed beside the shard."""

    def __init__(self, task: ShardTask):
        self.task = task
        self.readers = [RecordReader(units, c.doc, PLACES, UNIT_DOC_DTYPE)
                        for units, c in zip(task.units, task.cursors)]
        self.writer = TokenFileWriter(as_path(task.docs_path), DOC_DTYPE, fault="assemble:mid-write")

    def add(self, labels: np.ndarray, tokens: np.ndarray) -> None:
        out = np.empty(len(labels), DOC_DTYPE)
        for s, origins in enumerate(self.task.origins):
            where = labels == s
            if where.any():
                out[where] = origins.records(self.readers[s].take(int(np.count_nonzero(where))), tokens[where])
        self.writer.write(out)

    def close(self) -> dict:
        """Commit the file; its entry in the shard's record."""
        for reader in self.readers:
            reader.close()
        checksum = self.writer.close()
        return {"file": as_path(self.task.docs_path).name, "documents": self.writer.tokens, "skip": self.task.skip,
                "checksum": checksum}

    def abort(self) -> None:
        for reader in self.readers:
            reader.close()
        self.writer.abort()


# ---------------------------------------------------------------------------- one shard
@dataclass(frozen=True)
class ShardTask:
    """Everything one shard needs, O(streams + its units): where its documents start and end in the interleave,
    and each stream's units and cursor there. Each document's stream, unit and place in it follow from these
    as the shard is read."""

    path: str
    dtype: str
    seq_len: int
    blocks: int
    n_tokens: int
    first_doc: int  # the interleave position of the shard's first document
    last_doc: int  # ... and of its last
    skip: int  # tokens of the first document before the shard starts
    drop_first: bool  # the first token repeats the previous shard's last one and is counted there
    streams: tuple[str, ...]
    labels: Labels
    units: tuple[tuple[str, ...], ...]  # per stream: its units from the one its cursor is in, without suffix
    cursors: tuple[Cursor, ...]  # per stream, at the first document's start (unit relative to `units`)
    docs_path: str | None = None  # the shard's provenance index, with `origins` (None: provenance off)
    origins: tuple[StreamOrigins, ...] | None = None
    writer: RunWriter | None = None  # the run it writes for (tokmix.lock.writing)


def shard_documents(task: ShardTask):
    """The shard's documents in order, INTERLEAVE_CHUNK at a time: (stream of each, its tokens in the shard),
    the first cut by `skip`, the last by the shard's end."""
    n = len(task.streams)
    lengths = [LengthReader(units, c.doc) for units, c in zip(task.units, task.cursors)]
    try:
        at, left, skip = task.first_doc, task.n_tokens, task.skip
        while at <= task.last_doc and left > 0:
            chunk = task.labels.read(at, min(at + INTERLEAVE_CHUNK, task.last_doc + 1))
            took = np.empty(len(chunk), dtype=np.int64)
            for s in range(n):
                where = chunk == s
                took[where] = lengths[s].take(int(np.count_nonzero(where)))
            took[0] -= skip
            ends = np.cumsum(took)
            last = min(int(np.searchsorted(ends, left)), len(ends) - 1)
            chunk, took = chunk[: last + 1], took[: last + 1]
            took[-1] -= max(int(ends[last]) - left, 0)
            yield chunk, took
            at, left, skip = at + len(chunk), left - int(took.sum()), 0
    finally:
        for reader in lengths:
            reader.close()


def runs_of(chunk: np.ndarray, took: np.ndarray):
    """Documents as runs (stream, tokens): consecutive documents of one stream merged (a document's Python cost
    is most of a shard's otherwise)."""
    new_run = np.ones(len(chunk), dtype=bool)
    new_run[1:] = chunk[1:] != chunk[:-1]
    starts = np.flatnonzero(new_run)
    return zip(chunk[starts].tolist(), np.add.reduceat(took, starts).tolist())


def shard_runs(task: ShardTask):
    """The shard's tokens in order as runs (stream, tokens). Labels and lengths are read INTERLEAVE_CHUNK
    documents at a time."""
    for chunk, took in shard_documents(task):
        yield from runs_of(chunk, took)


@contextmanager
def _aborted_on_error(readers, *writers):
    """The readers closed however the block ends; the writers (None: not writing) aborted if it raises, so no
    partial file is left behind."""
    try:
        yield
    except BaseException:
        for writer in writers:
            if writer is not None:
                writer.abort()
        raise
    finally:
        for reader in readers:
            reader.close()


def write_shard(task: ShardTask) -> dict:
    """Gather the shard's documents from the unit files and commit the shard, while its run holds the directory;
    returns its record."""
    with writing(task.writer):
        return _write_shard(task)


def _write_shard(task: ShardTask) -> dict:
    """Every read goes through one GATHER_TOKENS buffer and a READ_BUFFER per open unit file."""
    drop_cached()  # a Ray worker that tokenized before: its encoder is not needed any more
    path = as_path(task.path)  # a local file, or an object on a store
    writer = TokenFileWriter(path, np.dtype(task.dtype), fault="assemble:mid-write")
    marks = BlockFingerprinter(task.seq_len, writer.dtype)
    first_stream = int(task.labels.read(task.first_doc, task.first_doc + 1)[0])
    readers = [TokenReader(units, c.token + (task.skip if s == first_stream else 0), writer.dtype.itemsize)
               for s, (units, c) in enumerate(zip(task.units, task.cursors))]
    gathered, pending = np.empty(min(GATHER_TOKENS, task.n_tokens), dtype=writer.dtype), 0
    by_stream = [0] * len(task.streams)
    documents = ShardDocuments(task) if task.docs_path else None
    with _aborted_on_error(readers, writer, documents):
        for chunk, took in shard_documents(task):
            if documents is not None:
                documents.add(chunk, took)
            for s, n in runs_of(chunk, took):
                by_stream[s] += n
                while n > 0:  # a run longer than what is left to gather before a write is cut there
                    k = min(n, len(gathered) - pending)
                    readers[s].read_into(gathered[pending : pending + k])
                    n, pending = n - k, pending + k
                    if pending == len(gathered):
                        _write_gathered(gathered, writer, marks)
                        pending = 0
        if pending:
            _write_gathered(gathered[:pending], writer, marks)
        if writer.tokens != task.n_tokens:
            raise TokmixError(f"{path.name}: gathered {writer.tokens:,} of {task.n_tokens:,} tokens")
        docs = documents.close() if documents is not None else None  # committed before the shard: see _done
    checksum = writer.close(before_commit=lambda: fault_point("assemble:before-rename"))
    marks_path = fingerprints_path(path.parent, path.name)
    marks_path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(marks_path, marks.result().tobytes(), durable=False)  # a diagnosis aid, checked by its length
    if task.drop_first:
        by_stream[first_stream] -= 1
    return {
        "file": path.name,
        "tokens": task.n_tokens,
        "blocks": task.blocks,
        "tokens_by_stream": dict(zip(task.streams, by_stream)),
        "checksum": checksum,
        **({"provenance": docs} if docs is not None else {}),
    }


def _write_gathered(gathered: np.ndarray, writer: TokenFileWriter, marks: BlockFingerprinter) -> None:
    writer.write(gathered)
    marks.update(gathered)


def plan_tasks(layout_paths: list[Path], dtype: np.dtype, seq_len: int | list[int], blocks: list[int],
               streams: dict[str, StreamUnits], labels: Labels, origins: tuple[StreamOrigins, ...] | None = None,
               docs_paths: list[Path] | None = None) -> tuple[list[ShardTask], dict[str, int]]:
    """Every shard's task, and the documents of each stream the shards use, from one pass over the interleave
    (find_boundaries): the driver holds O(streams + units + shards), never a per-document array. With
    `origins`, each task also writes its shard's provenance index at `docs_paths[k]`."""
    seq_lens = seq_len if isinstance(seq_len, list) else [seq_len] * len(blocks)  # per shard (a phase's own)
    starts = np.concatenate([[0], np.cumsum(np.array(blocks, dtype=np.int64) * np.array(seq_lens, dtype=np.int64))])
    # (the last start: the run's end)
    positions = [int(t) for t in starts[:-1]] + [int(starts[-1])]  # the run's last token is shard K-1's end
    units = list(streams.values())
    bounds = find_boundaries(units, labels, positions)
    tasks = []
    for k, n_blocks in enumerate(blocks):
        b0, b1 = bounds[k], bounds[k + 1]
        tasks.append(ShardTask(
            str(layout_paths[k]), dtype.str, seq_lens[k], n_blocks, tokens_in_shard(n_blocks, seq_lens[k]), b0.doc,
            b1.doc,
            b0.skip, k > 0, tuple(streams), labels,
            tuple(u.paths(c0.unit, c1.unit) for u, c0, c1 in zip(units, b0.cursors, b1.cursors)),
            tuple(Cursor(0, c.doc, c.token) for c in b0.cursors),
            str(docs_paths[k]) if origins is not None else None, origins))
    end = bounds[-1]
    used = [d + (s == end.stream) for s, d in enumerate(end.docs_before)]
    return tasks, dict(zip(streams, used))


def write_labels(ctx: Context, docs: list[int], streams: dict[str, StreamUnits]) -> Labels:
    """The recipe's interleave over these documents. The reference's global shuffle needs every label in one
    process (1 byte per document): it is written once per assemble to streams/interleave.labels, which the
    shard tasks read a range at a time, and freed. The balanced order is written there in one streaming pass
    over the units' .len files (its deviation from the targets kept in the state folder for index.json)."""
    kind, seed = ctx.recipe.layout.interleave, ctx.recipe.seed
    if kind == "chunked":
        return Labels(kind, tuple(docs), seed)
    path = ctx.layout.interleave_labels
    if kind == "balanced":
        counts, deviation = balanced_order(ctx.recipe, docs, list(streams.values()), path)
        write_record(ctx.layout.balance, deviation)
        return Labels(kind, tuple(counts), seed, str(path))
    write_tokens(path, interleave_order(docs, seed))
    return Labels(kind, tuple(docs), seed, str(path))


def recipe_mix(recipe) -> Mix:
    starts, shares = recipe.mix_pieces
    return Mix(starts, shares)


def balanced_order(recipe, docs: list[int], units: list[StreamUnits], path: Path | ObjectPath | None
                   ) -> tuple[list[int], dict]:
    """The balanced interleave of the recipe over the streams' committed units, written to `path` (None: not
    written): the documents of each stream it labels and its deviation from the targets (index.json's
    mix.balance). One pass over the .len files; memory O(chunk + streams)."""
    mix = recipe_mix(recipe)
    readers = [LengthReader(u.paths(0, len(u.names) - 1), 0) for u in units]
    writer = TokenFileWriter(as_path(path), np.uint8, checksum=False) if path is not None else None
    deviation = Deviation(mix, recipe.train_tokens, recipe.phase_positions)
    counts = np.zeros(len(units), dtype=np.int64)
    with _aborted_on_error(readers, writer):
        for labels, lengths in balanced_chunks([r.take for r in readers], docs, mix, recipe.seed,
                                               recipe.train_tokens, INTERLEAVE_CHUNK):
            if writer is not None and len(labels):
                writer.write(labels)
            deviation.feed(labels, lengths)
            counts += np.bincount(labels, minlength=len(units))
    if writer is not None:
        writer.close()
    return counts.tolist(), deviation.to_index(list(recipe.streams))


def _record_path(ctx: Context, k: int) -> Path:
    return ctx.layout.shard_record(ctx.layout.train(k).name)


def _done(ctx: Context, k: int, n_tokens: int) -> dict | None:
    """A shard's record when the shard is on disk, whole, from this recipe: the bytes its record's checksum was
    taken of (one read of the shard). A damaged shard or record is None: the shard is written again."""
    path, shard = _record_path(ctx, k), ctx.layout.train(k)
    if not (shard.exists() and shard.stat().st_size == n_tokens * ctx.dtype.itemsize):
        return None
    try:
        record = read_json(path, sealed=True)
    except DamagedFile as e:
        ctx.log(f"{shard.name}: its record is damaged ({e.why}); rewritten")
        return None
    if record is not None and first_damage([Part(shard, record["checksum"])]) is not None:
        ctx.log(f"{shard.name}: damaged (sha256 differs from its record); rewritten")
        return None
    if record is not None and ctx.recipe.layout.provenance:
        docs = ctx.layout.docs(shard)  # committed before its shard: a shard on disk has had its index
        if first_damage([Part(docs, record.get("provenance", {}).get("checksum"))]) is not None:
            ctx.log(f"{docs.name}: missing or damaged (sha256 differs from its record); {shard.name} rewritten")
            return None
    return record


def run_assemble(ctx: Context, metas: dict[str, dict]) -> tuple[list[dict], dict[str, int]]:
    """Write every train shard not on disk yet; returns the shard records in order and the documents of each
    stream that the shards use."""
    recipe, layout = ctx.recipe, ctx.layout
    seq_lens, plan = recipe.shard_seq_lens, recipe.shard_blocks
    records: list[dict | None] = [_done(ctx, k, n) for k, n in enumerate(recipe.shard_tokens_list)]
    todo = [k for k, r in enumerate(records) if r is None]
    # a run with fewer blocks than an earlier one in this directory: what it made beyond this plan goes
    owned = Ownership(layout)
    owned.remove_created(sorted(layout.root.glob("train_*.bin"))[len(plan):])
    owned.remove_created(sorted(layout.root.glob("train_*.docs"))[len(plan) if recipe.layout.provenance else 0:])
    used_path, sources_path = layout.documents_used, ctx.layout.provenance_sources
    try:
        used = read_json(used_path)
        if recipe.layout.provenance and read_json(sources_path, sealed=True) is None:
            used = None
    except DamagedFile:
        used = None  # computed again below, from the units
    if not todo and used is not None:
        return records, used
    t0 = time.perf_counter()
    layout.shard_record(layout.train(0).name).parent.mkdir(parents=True, exist_ok=True)
    streams = {name: StreamUnits(ctx.layout.units(name), metas[name]["units"]) for name in recipe.streams}
    held = sum(metas[name]["tokens"] for name in recipe.streams)
    if held < recipe.train_tokens:
        raise TokmixError(f"streams hold {held:,} tokens, fewer than the {recipe.train_tokens:,} "
                          "the blocks need (stream_slack too small?)")
    labels = write_labels(ctx, [metas[name]["docs"] for name in recipe.streams], streams)
    origins = run_origins(ctx, metas) if recipe.layout.provenance else None
    paths = [layout.train(k) for k in range(len(plan))]
    tasks, used = plan_tasks(paths, ctx.dtype, seq_lens, plan, streams, labels, origins, list(map(layout.docs, paths)))
    write_json(used_path, used)
    if origins is not None:  # the index's table of sources, for tokmix.manifest.build_index
        write_record(sources_path, {"sources": [entry for o in origins for entry in o.sources()]})
    tasks = {k: replace(tasks[k], writer=ctx.writer) for k in todo}
    queue, window = iter(tasks.items()), Window(ctx.pool, UNITS_IN_FLIGHT_PER_WORKER * ctx.workers)
    while True:
        for k, task in itertools.islice(queue, window.room):
            window.submit(write_shard, task, k)
        if not window:
            break
        for k, record in window.finished():
            records[k] = record
            fault_point("assemble:after-rename")
            write_record(_record_path(ctx, k), records[k])
            fault_point("assemble:after-record")
            ctx.log(f"shard {records[k]['file']}: {plan[k]:,} blocks, {records[k]['tokens']:,} tokens")
    ctx.log(f"assembled {len(todo)} shard(s) in {time.perf_counter() - t0:.1f}s")
    return records, used


def balance_entry(ctx: Context, metas: dict[str, dict]) -> dict | None:
    """index.json's `mix.balance` for a balanced run: its deviation from the targets, as assemble recorded it
    (computed again from the units, without writing labels, when that record is missing or damaged)."""
    if ctx.recipe.layout.interleave != "balanced":
        return None
    try:
        record = read_json(ctx.layout.balance, sealed=True)
    except DamagedFile:
        record = None
    if record is None:
        units = [StreamUnits(ctx.layout.units(n), metas[n]["units"]) for n in ctx.recipe.streams]
        record = balanced_order(ctx.recipe, [metas[n]["docs"] for n in ctx.recipe.streams], units, None)[1]
        write_record(ctx.layout.balance, record)
    return record


def provenance_entry(ctx: Context) -> dict:
    """index.json's `provenance`: the layout of the .docs records, the train shards' table of sources and the
    text field each stream's documents were read from (what `tokmix trace --text` reads again)."""
    return {
        "record": [[name, DOC_DTYPE.fields[name][0].str] for name in DOC_DTYPE.names],
        "sources": read_json(ctx.layout.provenance_sources, sealed=True)["sources"],
        "text_fields": {n: s.text_field for n, s in ctx.recipe.streams.items()},
    }
