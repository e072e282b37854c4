"""Stage 2: each stream tokenized to its budget. A stream's content is its train documents in canonical
order (split-file order, rows in file order, empty texts and copies of holdout documents dropped), each
framed by the recipe's delimiters (the reference's: <|endoftext|> before it), up to and including the document that
crosses the budget.

Work units (contiguous pieces of files) are tokenized independently by workers; each commits three files
in `streams/<name>/units/`: tokens (.tok), document lengths (.len) and, last, its record (.json), which is
the commit. The coordinator keeps a bounded window of units in flight and stops once the committed prefix
of units holds the budget; a resume skips committed units, so a kill loses only the units in flight.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import numpy as np

from tokmix import identity
from tokmix.cache import UnitCache
from tokmix.errors import TokmixError
from tokmix.faults import fault_point
from tokmix.lock import RunWriter, writing
from tokmix.provenance import UNIT_DOC_DTYPE, check_place, text_crc32
from tokmix.shards import DamagedFile, read_json, write_record
from tokmix.sources import HugeText, Places, Unit, batches, plan_units, read_texts, stream_files, text_hashes, text_keys
from tokmix.sources.parquet import unit_text_lists
from tokmix.sources.units import BATCH_BYTES, BATCH_DOCS
from tokmix.stages import (
    UNITS_IN_FLIGHT_PER_WORKER,
    Context,
    Window,
    alone_share,
    cache_key_base,
    cached,
    shared_encoder,
)
from tokmix.stages.decontam import benchmark_set, stream_contamination
from tokmix.stages.passes import (
    BENCHMARK_SET,
    RepeatTask,
    RepeatUnit,
    benchmark_set_field,
    passes_needed,
    repeat_unit,
    unit_damage,
)
from tokmix.store import ObjectPath, as_path
from tokmix.text import document_pieces, without_cut_spaces
from tokmix.tokens import LENGTH_DTYPE, REFERENCE_DELIMITERS, Delimiters, TokenFileWriter
from tokmix.unit_files import UnitFiles, recorded

TAIL_BATCH_CHARS = 256 << 10  # a limited unit's smallest batch: ~60k tokens


@dataclass(frozen=True)
class UnitTask:
    unit: Unit
    text_field: str
    tokenizer_path: str
    backend: str
    dtype: str
    unit_dir: str
    hashes_path: str | None
    mirrors: tuple[tuple[str, str], ...]
    huge: int  # Context.huge_doc_chars
    # The stream's budget minus the tokens of all units before this one, when those are committed: the unit
    # then stops after the document that reaches it, which is where the stream ends (no text read past it).
    limit: int | None = None
    keys_path: str | None = None  # the holdout documents' text_keys, when recorded: only texts of those are hashed
    delimiters: Delimiters = REFERENCE_DELIMITERS
    provenance: bool = False  # write the unit's documents' places and text checksums (NNNNNN.src)
    writer: RunWriter | None = None  # the run it writes for (tokmix.lock.writing)
    benchmarks: str | None = None  # the run's benchmark n-grams ([decontaminate], tokmix.stages.decontam)
    benchmark_set: str | None = None  # their fingerprint, in the unit's record (StreamRun takes no unit of another)
    drop_contaminated: bool = True  # action "drop"; False: "report" (kept and counted)
    cache: str | None = None  # the token cache (tokmix.cache) the unit is taken from or added to
    cache_key: str | None = None
    cache_parts: dict | None = None  # what `tokmix cache` lists the entry by: tokenizer, stream, source files
    drops_space: bool = False  # Context.cut_drops_space: a huge document's pieces given without the cut's space


# ---------------------------------------------------------------------------- worker side
def _pieces(text: str | HugeText, drops_space: bool) -> Iterator[str]:
    """A huge document's pieces as its tokenizer is given them (tokmix.backends.can_cut_documents,
    cut_drops_space)."""
    pieces = text.pieces() if isinstance(text, HugeText) else document_pieces(text)
    return without_cut_spaces(pieces) if drops_space else pieces


def _write_in_pieces(encoder, text: str | HugeText, writer: TokenFileWriter, delimiters: Delimiters,
                     drops_space: bool) -> int:
    """One huge document, encoded piece by piece (ids identical to encoding it whole, see document_pieces) and
    written as it goes, so memory holds the text and one piece's ids; returns its token count, delimiters
    included."""
    writer.write(np.array(delimiters.prefix, dtype=writer.dtype))
    n = delimiters.per_document
    for piece in _pieces(text, drops_space):
        ids, _ = encoder.encode_batch([piece])
        writer.write(ids)
        n += len(ids)
    writer.write(np.array(delimiters.suffix, dtype=writer.dtype))
    return n


def holdout_copies(texts: list[str | HugeText], hashes: np.ndarray, held_keys: np.ndarray | None,
                   keys: np.ndarray | None = None) -> np.ndarray:
    """Which texts are exact copies of a holdout document (their hash is among `hashes`). With `held_keys` (the
    holdout documents' text_keys) only a text whose key is one of those can be one, so only those are hashed
    (`keys`: the texts' own, when the caller has them): on the bench corpus almost none, where hashing every text
    cost ~30% of the encoding's CPU, and those of a holdout document's length ~10%. `hashes` and `held_keys` are
    sorted and without repeats (_holdout_array)."""
    if held_keys is None:
        return among(text_hashes(texts), hashes)
    candidates = np.flatnonzero(among(text_keys(texts, text_crc32(texts)) if keys is None else keys, held_keys))
    is_copy = np.zeros(len(texts), dtype=bool)
    if len(candidates):
        is_copy[candidates] = among(text_hashes([texts[i] for i in candidates]), hashes)
    return is_copy


def among(values: np.ndarray, held: np.ndarray) -> np.ndarray:
    """Whether each of `values` is in `held`, sorted and without repeats: a binary search per value, where
    np.isin sorts both arrays at each call (a batch against the bench corpus's holdout lengths: 228 against
    14 us, and the holdout checks were ~6% of the unit function's samples)."""
    if not len(held):
        return np.zeros(len(values), dtype=bool)
    values = np.asarray(values).astype(held.dtype, copy=False)  # uint64 against int64 would compare as floats
    return held[np.minimum(np.searchsorted(held, values), len(held) - 1)] == values


def _holdout_array(path: str | None) -> np.ndarray | None:
    """The array saved at `path`, loaded once per process while the file is unchanged: a Ray worker can outlive
    a run, and the next run of the same output directory may hold out other documents."""
    if path is None:
        return None
    stat = os.stat(path)
    return cached(("holdout array", path, stat.st_mtime_ns, stat.st_size), lambda: _sorted_set(np.load(path)))


def _sorted_set(values: np.ndarray) -> np.ndarray:
    """`values` sorted, without repeats, as `among` needs them: the holdout stage writes them so (np.unique), and
    a file that is not is sorted here rather than searched wrongly."""
    if len(values) > 1 and not bool((values[1:] > values[:-1]).all()):
        return np.unique(values)
    return values


class UnitDocuments:
    """The places and text checksums of a unit's kept documents, gathered batch by batch (UNIT_DOC_DTYPE)."""

    def __init__(self, unit: Unit):
        self.unit, self.parts = unit, []

    def add(self, where: np.ndarray, texts: list) -> None:
        """`where`: each text's (piece, place, CRC-32 or -1 where the reader did not give it: Places.take_kept)."""
        part = np.zeros(len(texts), dtype=UNIT_DOC_DTYPE)
        part["unit"], part["pass"] = self.unit.index, 1
        crc = np.full(len(texts), -1, dtype=np.int64)
        if len(where):
            piece, place, crc = where.T.copy()
            if int(place.max()) > np.iinfo(np.uint32).max:
                check_place(int(place.max()), self.unit.stream, self.unit.pieces[int(piece[place.argmax()])].path)
            part["piece"], part["place"] = piece, place
        if (missing := np.flatnonzero(crc < 0)).size:
            crc[missing] = text_crc32([texts[i] for i in missing.tolist()])
        part["crc32"] = crc
        self.parts.append(part)

    def result(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.empty(0, UNIT_DOC_DTYPE)


def _batch_chars(task: UnitTask, writer: TokenFileWriter, chars: Callable[[], int]) -> Callable[[int], int] | None:
    """For a limited unit: the text its next batch should hold, given the characters already read, so that the
    unit ends within a small batch of its last document: the limit at the unit's characters per token so far
    (4 before any) with 10% to spare, and at least TAIL_BATCH_CHARS once that estimate is used up."""
    if task.limit is None:
        return None

    def size(read: int) -> int:
        per_token = chars() / writer.tokens if writer.tokens else 4.0
        return max(int(task.limit * per_token * 1.1) - read, TAIL_BATCH_CHARS)

    return size


def list_batches(lists: Iterator[list], huge: int = 1 << 62, max_chars: Callable[[int], int] | None = None
                 ) -> Iterator[list]:
    """sources.batches (the same batches) of texts that come a list at a time (a parquet reader's Arrow batches):
    each batch cut out of the lists by their lengths' running sums, where batches takes a Python step per
    document (~1.3 us, holding the GIL that the other worker thread waits for)."""
    batch, size, limit, yielded = [], 0, BATCH_BYTES, 0
    for texts in lists:
        texts = list(filter(None, texts))
        if not texts:
            continue
        lens = list(map(len, texts))
        ends = list(accumulate(lens))  # ends[j]: the characters of texts[:j + 1]
        over = [j for j, n in enumerate(lens) if n > huge] if max(lens) > huge else []
        over.append(len(texts))
        i = 0
        for stop in over:  # texts[i:stop] are within `huge`; texts[stop], if any, is a batch alone
            while i < stop:
                if not batch and max_chars is not None:
                    limit = min(BATCH_BYTES, max(1, max_chars(yielded)))
                before = ends[i - 1] if i else 0
                # the first text that takes the batch to its limit, or its last room, or the run's end
                j = min(bisect_left(ends, before + limit - size, i, stop) + 1, i + BATCH_DOCS - len(batch), stop)
                batch += texts[i:j]
                size += ends[j - 1] - before
                i = j
                if len(batch) >= BATCH_DOCS or size >= limit:
                    yield batch
                    batch, size, yielded = [], 0, yielded + size
            if stop < len(texts):
                if batch:
                    yield batch
                yield [texts[stop]]
                batch, size, yielded = [], 0, yielded + size + lens[stop]
                i = stop + 1
    if batch:
        yield batch


def _unit_batches(task: UnitTask, places: Places | None, max_chars: Callable[[int], int] | None) -> Iterator[list]:
    """The unit's non-empty documents in tokenizer batches; a unit of parquet pieces an Arrow batch at a time."""
    unit = task.unit
    if all(piece.kind == "parquet" for piece in unit.pieces):
        lists = unit_text_lists(unit.pieces, task.text_field, unit.stream, task.mirrors, task.huge, places)
        return list_batches(lists, task.huge, max_chars)
    texts = read_texts(unit, task.text_field, unit.stream, task.mirrors, task.huge, places=places)
    return batches(texts, task.huge, max_chars)


def _decontaminate(bench, batch: list, where: np.ndarray, kept: int, contaminated: list, task: UnitTask,
                   encoder) -> list[int] | None:
    """Record the batch's documents that a benchmark item contaminates ([kept documents before it, piece,
    place, tokens, items...]); returns the positions of the documents that stay, None for all of them. With
    action "drop" the contaminated ones leave the batch (their tokens counted by encoding them apart:
    _documents_tokens), with "report" they stay (their tokens filled in once the unit is encoded: -1 until
    then)."""
    items = bench.contaminating(batch)
    hits = [i for i, found in enumerate(items) if found]
    if not hits:
        return None
    before = np.cumsum([0] + [1 if not (items[i] and task.drop_contaminated) else 0 for i in range(len(batch))])
    tokens = (_documents_tokens(encoder, [batch[i] for i in hits], task.delimiters, task.drops_space)
              if task.drop_contaminated else [-1] * len(hits))
    for i, count in zip(hits, tokens):
        piece, place = where[i, :2].tolist() if len(where) else (0, 0)
        contaminated.append([kept + int(before[i]), piece, place, count, *items[i]])
    if not task.drop_contaminated:
        return None
    return [i for i in range(len(batch)) if not items[i]]


def _take(keep: list[int], batch: list, where: np.ndarray, keys: np.ndarray | None
          ) -> tuple[list, np.ndarray, np.ndarray | None]:
    """The documents at positions `keep` of a batch, their places (none: none) and their keys (None: none)."""
    return ([batch[i] for i in keep], where[keep] if len(where) else where,
            None if keys is None else keys[keep])


def _batch_keys(batch: list, where: np.ndarray) -> np.ndarray:
    """The batch's text_keys, from the CRC-32s the reader gave in `where` (provenance: a parquet column's); the
    others are computed, and put in `where` for the unit's provenance (UnitDocuments) too."""
    if not len(where):
        return text_keys(batch, text_crc32(batch))
    crcs = where[:, 2]
    if (missing := np.flatnonzero(crcs < 0)).size:
        crcs[missing] = text_crc32([batch[i] for i in missing.tolist()])
    return text_keys(batch, crcs)


def _documents_tokens(encoder, texts: list, delimiters: Delimiters, drops_space: bool) -> list[int]:
    """The tokens each document would have had in the stream, delimiters included: the strs encoded in one batch
    (0.08 against 0.10 CPU-s for 1,800 web documents one call each), a HugeText piece by piece."""
    strs = [t for t in texts if not isinstance(t, HugeText)]
    counts = iter((encoder.encode_batch(strs)[1] + delimiters.per_document).tolist() if strs else [])
    return [delimiters.per_document + sum(int(encoder.encode_batch([piece])[1].sum())
                                          for piece in _pieces(t, drops_space))
            if isinstance(t, HugeText) else next(counts) for t in texts]


def tokenize_unit(task: UnitTask) -> dict:
    """Tokenize one unit and commit it, while its run holds the directory; returns its record. With a cache,
    the unit is taken from it when it holds it (checked), and added to it once tokenized."""
    with writing(task.writer):
        if task.cache_key is None:
            return _tokenize_unit(task)
        cache = UnitCache(task.cache)
        record, rejected = _from_cache(task, cache)
        if record is not None:
            return record
        prefix, rejected = (None, True) if rejected else _cached_prefix(task, cache)

        def fill(record: dict, complete: bool, copies: dict | None) -> None:
            # before the unit's record: a unit is never committed without its entry, whenever the run is killed
            # (killed before the record, the unit is tokenized again, or taken from the entry just made)
            try:
                cache.fill(task.cache_key, as_path(task.unit_dir), task.unit.name, _entry_unit(record), complete,
                           task.cache_parts or {}, copies, replace=rejected)
            except (OSError, DamagedFile):  # a full or read-only cache: the run goes on without adding to it
                pass

        record = _tokenize_unit(task, prefix, fill)
        if cache.problem is not None:  # told by the coordinator; not in the unit's sealed record
            record = {**record, "cache_problem": f"{cache.entry_dir(task.cache_key)}: damaged ({cache.problem}); "
                      "removed, the unit tokenized again"}
        return record


# a unit record's fields that are the run's, not the cached unit's (the benchmark set's fingerprint is in the
# entry's key)
RUN_FIELDS = ("index", "name", "pieces", "size", "file_bytes", "limit", "from_cache", "tokens_from_cache",
              "cache_problem", BENCHMARK_SET)


def _entry_unit(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in RUN_FIELDS}


def _from_cache(task: UnitTask, cache: UnitCache) -> tuple[dict | None, bool]:
    """The unit's record, its files taken from the cache, or None when the cache cannot give it; and whether an
    entry was there that this run's holdout set rejects (the unit's new entry then replaces it). A complete
    entry serves any limit (the stream is cut at the document that reaches its budget wherever the unit ends);
    a partial one, a limit it reaches."""
    unit, unit_dir = task.unit, as_path(task.unit_dir)
    accept, verdict = _same_copies(task), []
    judged = None if accept is None else lambda entry, read: verdict.append(accept(entry, read)) or verdict[-1]
    try:
        cached_unit = cache.take(task.cache_key, unit_dir, unit.name, task.limit, judged)
    except OSError:  # an unreadable cache: tokenized as without one
        return None, False
    if cached_unit is None:
        return None, verdict == [False]
    complete = cached_unit.pop("complete", True)
    record = {"index": unit.index, "name": unit.name, "pieces": unit.describe(), "size": unit.size,
              "file_bytes": unit.file_bytes(), "limit": None if complete else cached_unit["tokens"],
              **cached_unit, "from_cache": True, **benchmark_set_field(task.benchmark_set)}
    fault_point("streams:unit-before-record")
    UnitFiles(unit_dir, unit.name).commit(record)
    return record, False


def _cached_prefix(task: UnitTask, cache: UnitCache) -> tuple[tuple[np.ndarray, np.ndarray] | None, bool]:
    """For a unit whose entry is partial (an earlier run's stream ended in it) and short of what this run
    needs: the entry's tokens and document lengths, checked, which the unit then starts with; and whether an
    entry was there that this run's holdout set rejects."""
    accept, verdict = _same_copies(task), []
    judged = None if accept is None else lambda entry, read: verdict.append(accept(entry, read)) or verdict[-1]
    try:
        found = cache.prefix(task.cache_key, judged)
    except OSError:  # an unreadable cache: tokenized as without one
        return None, False
    if found is None:
        return None, verdict == [False]
    unit, tokens, lengths = found
    if task.limit is not None and unit["tokens"] >= task.limit:  # a take would have served it: not a prefix
        return None, False
    return (np.frombuffer(tokens, np.dtype(task.dtype)), np.frombuffer(lengths, LENGTH_DTYPE)), False


def _tokenize_unit(task: UnitTask, prefix: tuple[np.ndarray, np.ndarray] | None = None,
                   before_record: Callable[[dict, bool, dict | None], None] | None = None) -> dict:
    """Tokenize and commit the unit; its record. `prefix`: the tokens and document lengths of its first
    documents, from a partial cache entry: those documents are read again (holdout copies, benchmark items and
    provenance as without it) but not encoded. `before_record(record, complete, copies)` runs once the unit's
    files are in place, before its record commits it: `complete`, whether it holds every document of its pieces
    (not cut at its limit); `copies`, its documents' keys and its dropped copies' hashes for the cache
    (_same_copies)."""
    unit, files = task.unit, UnitFiles.of(task.unit_dir, task.unit.name)  # a local folder, or a prefix on a store
    encoder = shared_encoder(task.tokenizer_path, task.backend)
    hashes, held_keys = _holdout_array(task.hashes_path), _holdout_array(task.keys_path)
    # sha256 as the tokens are written, checked when a later stage process reads the unit
    writer = files.token_writer(np.dtype(task.dtype), fault="streams:unit-mid-write")
    lengths, dropped_at, kept, encode_seconds = [], [], 0, 0.0
    chars = [0]
    huge, delimiters = task.huge, task.delimiters
    extra = delimiters.per_document
    bench = benchmark_set(task.benchmarks) if task.benchmarks else None
    places = Places(checksums=task.provenance, kept=True) if task.provenance or bench else None
    nowhere = np.empty((0, 3), dtype=np.int64)  # the batches' places without provenance or benchmarks
    contaminated: list[list] = []  # [kept documents before it, piece, place, tokens, items...] of each
    documents = UnitDocuments(unit)
    complete = True
    # for the cache: every kept document's key (text_keys) and the dropped ones' hashes, so that a run with another
    # holdout set can tell whether this unit's bytes are its own (_same_copies)
    kept_keys = [] if task.cache_key is not None and hashes is not None else None
    dropped_hashes: list[int] = []
    checks_copies = hashes is not None and len(hashes) > 0
    with_keys = kept_keys is not None or (checks_copies and held_keys is not None)  # (else no batch's keys are read)
    replay = _Replay(*prefix) if prefix is not None else None

    def add_kept(batch: list, where: np.ndarray, lens: np.ndarray, keys: np.ndarray | None) -> None:
        nonlocal kept
        if task.provenance:
            documents.add(where, batch)
        if kept_keys is not None:
            kept_keys.append(keys)
        lengths.append(lens.astype(LENGTH_DTYPE))
        kept += len(batch)
        chars[0] += sum(map(len, batch))

    unit_batches = _unit_batches(task, places, _batch_chars(task, writer, lambda: chars[0]))
    try:
        for batch in unit_batches:
            where = places.take_kept(len(batch)) if places is not None else nowhere
            keys = _batch_keys(batch, where) if with_keys else None
            if checks_copies:
                is_copy = holdout_copies(batch, hashes, held_keys, keys)
                if is_copy.any():
                    dropped_at += (kept + np.cumsum(~is_copy)[is_copy]).tolist()
                    if kept_keys is not None:
                        dropped_hashes += text_hashes([t for t, c in zip(batch, is_copy.tolist()) if c]).tolist()
                    batch, where, keys = _take(np.flatnonzero(~is_copy).tolist(), batch, where, keys)
            if bench is not None:
                keep = _decontaminate(bench, batch, where, kept, contaminated, task, encoder)
                if keep is not None:
                    batch, where, keys = _take(keep, batch, where, keys)
            if replay is not None and replay.left:  # documents the cache holds the tokens of
                r = min(replay.left, len(batch))
                add_kept(batch[:r], where[:r], replay.write(r, writer), None if keys is None else keys[:r])
                batch, where, keys = batch[r:], where[r:], None if keys is None else keys[r:]
            if not batch:
                continue
            t0 = time.perf_counter()
            if isinstance(batch[0], HugeText) or len(batch[0]) > huge:
                n = _write_in_pieces(encoder, batch[0], writer, delimiters, task.drops_space)
                lens = np.array([n], dtype=np.int64)
            else:
                ids, lens = encoder.encode_batch(batch)
                lens = lens + extra
                if task.limit is not None and writer.tokens + int(lens.sum()) >= task.limit:
                    # the stream ends in this batch: keep it up to the document that reaches the limit
                    keep = int(np.searchsorted(np.cumsum(lens), task.limit - writer.tokens)) + 1
                    complete &= keep == len(batch)
                    batch, lens, ids = batch[:keep], lens[:keep], ids[: int(lens[:keep].sum()) - keep * extra]
                    where, keys = where[:keep], None if keys is None else keys[:keep]
                writer.write(delimiters.frame(ids, lens - extra, writer.dtype))
            encode_seconds += time.perf_counter() - t0
            add_kept(batch, where, lens, keys)
            if task.limit is not None and writer.tokens >= task.limit:
                complete = False  # stopped at its limit (had it read all, it cannot tell without reading on)
                break
    except BaseException:
        writer.abort()
        raise
    finally:
        unit_batches.close()  # the source file, also when the unit stops at its limit
    tokens_sha256 = writer.close(before_commit=lambda: fault_point("streams:unit-before-rename"))
    lengths = np.concatenate(lengths) if lengths else np.empty(0, LENGTH_DTYPE)
    lengths_sha256 = files.write_lengths(lengths.tobytes())
    src = {}
    if places is not None:  # `lines`: where a JSONL file's next piece starts
        src["lines"] = [places.lines.get(i, 0) for i in range(len(unit.pieces))]
    if task.provenance:  # sha256 as every intermediate's
        src["src_sha256"] = files.write_places(documents.result().tobytes())
    if bench is not None:
        for entry in contaminated:  # a kept document's tokens, now that it is encoded
            if entry[3] < 0:
                entry[3] = int(lengths[entry[0]]) if entry[0] < len(lengths) else 0
        src["contaminated"] = [e for e in contaminated if not (e[3] == 0 and not task.drop_contaminated)]
    fault_point("streams:unit-before-record")
    record = {
        "index": unit.index,
        "name": unit.name,
        "pieces": unit.describe(),
        "tokens": writer.tokens,
        "docs": kept,
        "chars": chars[0],
        "size": unit.size,
        "file_bytes": unit.file_bytes(),
        "limit": task.limit,
        "dropped_at": dropped_at,  # kept-document count when each holdout copy was dropped
        "encode_seconds": encode_seconds,
        **({"tokens_from_cache": replay.tokens} if replay is not None else {}),
        "tok_sha256": tokens_sha256,
        "len_sha256": lengths_sha256,
        **src,
        **benchmark_set_field(task.benchmark_set),
    }
    if before_record is not None:
        copies = None
        if kept_keys is not None:
            copies = {"keys": (np.concatenate(kept_keys) if kept_keys else np.empty(0, np.uint64)).tobytes(),
                      "dropped": np.array(dropped_hashes, dtype=np.uint64).tobytes()}
        before_record(record, complete, copies)
    files.commit(record)
    return record


class _Replay:
    """The tokens of a unit's first documents as a partial cache entry holds them, written in their place."""

    def __init__(self, tokens: np.ndarray, lengths: np.ndarray):
        self.tokens_of, self.lengths = tokens, lengths
        self.docs = self.at = 0
        self.tokens = len(tokens)

    @property
    def left(self) -> int:
        return len(self.lengths) - self.docs

    def write(self, docs: int, writer: TokenFileWriter) -> np.ndarray:
        """Write the next `docs` documents' tokens; returns their lengths."""
        lens = self.lengths[self.docs:self.docs + docs]
        n = int(lens.sum())
        writer.write(self.tokens_of[self.at:self.at + n])
        self.docs, self.at = self.docs + docs, self.at + n
        return lens


def _same_copies(task: UnitTask) -> Callable[[dict, Callable[[str], bytes]], bool] | None:
    """Whether a cached unit is this run's under its holdout set: none of its kept documents may be a holdout
    document now (no kept key is a holdout document's: text_keys), and every one it dropped still is (by hash).
    A kept key that is a holdout document's refuses the entry even where the texts differ: the unit is then
    tokenized again, and its new entry replaces this one. (Another holdout set, e.g. other shares of a
    domain's streams, mostly leaves a unit's bytes as they were: the set is checked per unit, not put in the
    key.)"""
    if task.hashes_path is None:
        return None

    def accept(entry: dict, read: Callable[[str], bytes]) -> bool:
        if task.keys_path is None:  # no keys to judge its documents by: tokenized again
            return False
        held_keys, held = _holdout_array(task.keys_path), _holdout_array(task.hashes_path)
        kept, dropped = (np.frombuffer(read(part), np.uint64) for part in ("keys", "dropped"))
        return not among(kept, held_keys).any() and bool(among(dropped, held).all())

    return accept


# ---------------------------------------------------------------------------- coordinator side
def meta_path(ctx: Context, stream: str) -> Path:
    return ctx.layout.stream_meta(stream)


def unit_lengths(ctx: Context, stream: str, name: str) -> np.ndarray:
    return UnitFiles(ctx.layout.units(stream), name).read_lengths()


def load_meta(ctx: Context, stream: str) -> dict | None:
    """The stream's record once it is finished, None before; a damaged one is None too (it is remade from the
    stream's units)."""
    try:
        return read_json(meta_path(ctx, stream), sealed=True)
    except DamagedFile as e:
        ctx.log(f"stream {stream}: its record {e.path} is damaged ({e.why}); remade from its units")
        return None


def _committed(directory: Path | ObjectPath, log: Callable[[str], None], benchmark_set: str | None = None
               ) -> dict[int, dict]:
    """The directory's committed units by index, each checked against its record; a damaged one is discarded,
    and so is one decontaminated against another benchmark set than the run's (`benchmark_set`, its fingerprint;
    None: none), or against one when the run has none: its documents are not the ones this run drops."""
    records = {}
    for files in recorded(directory):
        record, why = unit_damage(directory, files.name)
        if why is None and record.get(BENCHMARK_SET) != benchmark_set:
            files.discard(f"its documents were checked against {'another' if benchmark_set else 'a'} benchmark set "
                          f"({str(record.get(BENCHMARK_SET, 'none'))[:12]}, not {str(benchmark_set)[:12]})", log,
                          damaged=False)
        elif why is not None:
            files.discard(why, log)
        else:
            records[record["index"]] = record
    return records


def _out_of_source(stream: str, got: int, budget: int, records: list[dict], max_epochs: int,
                   drops_contaminated: bool) -> TokmixError:
    """The stream's train documents, all of them `got` tokens, fall short of its budget even in `max_epochs`
    passes (and what the run dropped of them: _dropped)."""
    taken = _dropped(records, drops_contaminated)
    if max_epochs > 1 and got:
        return TokmixError(
            f"stream {stream}: its train documents hold {got:,} tokens{taken}, its budget of {budget:,} needs "
            f"{passes_needed(budget, got)} passes over them and max_epochs is {max_epochs}: raise max_epochs, add "
            "train files or lower the stream's share or the number of blocks"
        )
    chars = sum(r["chars"] for r in records)
    more = repeat = ""
    if got:
        missing = (budget - got) * chars / got
        size = f"{missing / 1e6:,.1f} MB" if missing >= 1e5 else f"{missing / 1e3:,.1f} kB"
        more = f"; about {size} more text ({100 * (budget - got) / got:.0f}% more) is needed"
        repeat = f", or let its documents repeat (max_epochs = {passes_needed(budget, got)})"
    return TokmixError(
        f"stream {stream}: source files ran out at {got:,} tokens of a budget of {budget:,}{taken}{more}: "
        f"add train files or lower the stream's share or the number of blocks{repeat}"
    )


def _dropped(records: list[dict], drops_contaminated: bool) -> str:
    """What the run dropped of the units' documents, said after the tokens they hold: the documents a benchmark
    item contaminates (action "drop") and the copies of holdout documents ("" for none)."""
    said = []
    contaminated = [entry for record in records for entry in record.get("contaminated", [])] if drops_contaminated \
        else []
    if contaminated:
        said.append(f"benchmark decontamination dropped {len(contaminated):,} of its documents, "
                    f"{sum(entry[3] for entry in contaminated):,} tokens")
    if copies := sum(len(record["dropped_at"]) for record in records):
        said.append("1 copy of a holdout document dropped" if copies == 1 else
                    f"{copies:,} copies of holdout documents dropped")
    return f" ({'; '.join(said)})" if said else ""


def _changed_source(stream: str, unit: Unit, record: dict) -> TokmixError | None:
    """None while a committed unit's files are cut as they were and have the sizes they had; otherwise they
    changed since the run started, resuming would mix documents of two versions of them, and this is the error
    naming the file."""
    paths = [piece.path for piece in unit.pieces]
    cut = record["pieces"] == unit.describe()
    resized = [(piece.path, was, piece.file_bytes)
               for piece, was in zip(unit.pieces, record["file_bytes"])
               if was != piece.file_bytes]
    if cut and not resized and record["size"] == unit.size:
        return None
    moved = [path for path, (was, *_) in zip(paths, record["pieces"]) if path != was]
    if moved or resized or len(paths) == 1:
        where = f"file {moved[0] if moved else resized[0][0] if resized else paths[0]}"
    else:  # grouped small files: which one changed is not known
        where = f"a file of unit {unit.name} ({paths[0]} or {len(paths) - 1} more)"
    if not cut and not moved and not resized:  # no file it held changed: one came or went, or the cutting rule
        held = paths[0] if len(paths) == 1 else f"{paths[0]} and {len(paths) - 1} more"
        return TokmixError(f"stream {stream}: unit {unit.name} ({held}) is cut differently "
                           "now than when this run wrote it, and the files it held have the sizes they had: a file "
                           "was added to or removed from it, or the tokmix that started the run cut units another "
                           "way (upgraded since?); restore the files or finish with that tokmix, or use --restart "
                           "to start over")
    if resized and not moved:
        how = f"{resized[0][1]:,} bytes when unit {unit.name} was written, now {resized[0][2]:,}"
    elif not cut:
        how = f"unit {unit.name} is cut differently now"
    else:
        how = f"unit {unit.name} held {record['size']:,} bytes, now {unit.size:,}"
    return TokmixError(f"stream {stream}: {where}: changed since this run started ({how}); units already written "
                       "hold the earlier version's documents: restore it, or use --restart to start over")


def _finish(ctx: Context, stream: str, budget: int, used: list[dict], seconds: float, new_tokens: int) -> dict:
    """Cut the last unit at the document that crosses the budget and write the stream's record."""
    before = sum(r["tokens"] for r in used[:-1])
    last = used[-1]
    cum = np.cumsum(unit_lengths(ctx, stream, last["name"]), dtype=np.int64)
    last_docs = int(np.searchsorted(cum, budget - before)) + 1
    # a copy dropped once the stream's last document was kept (dropped_at == last_docs) lies past the stream
    dropped = sum(len(r["dropped_at"]) for r in used[:-1]) + sum(1 for k in last["dropped_at"] if k < last_docs)
    tokenized = [r for r in used if r.get("pass", 1) == 1]  # later passes are copies of these
    contamination = (stream_contamination(tokenized, last_docs if last.get("pass", 1) == 1 else None,
                                          ctx.benchmarks) if ctx.benchmarks is not None else None)
    encode_seconds = sum(r["encode_seconds"] for r in tokenized) or 1e-9
    passes = last.get("pass", 1)
    meta = {
        "name": stream,
        "tokens": before + int(cum[last_docs - 1]),
        "docs": sum(r["docs"] for r in used[:-1]) + last_docs,
        "budget": budget,
        "seconds_last_run": round(seconds, 3),
        "tok_s_end_to_end": round(new_tokens / max(seconds, 1e-9)),
        "tok_s_tokenizer_capacity": round(sum(r["tokens"] for r in tokenized) / encode_seconds * ctx.workers),
        "num_proc": ctx.workers,
        "backend": ctx.backend,
        "dropped_holdout_duplicates": dropped,
        "passes": passes,  # over the train documents: more than 1 when they hold fewer tokens than the budget
        **({"pass_tokens": sum(r["tokens"] for r in tokenized), "pass_docs": sum(r["docs"] for r in tokenized)}
           if passes > 1 else {}),
        **({"benchmark_contamination": contamination} if contamination is not None else {}),
        **(_from_cache_counts(used, tokenized) if ctx.cache else {}),
        "units": [{"name": r["name"], "tokens": r["tokens"], "docs": r["docs"]} for r in used],
        "last_unit_docs": last_docs,
    }
    fault_point("streams:before-meta")
    write_record(meta_path(ctx, stream), meta)
    fault_point("streams:after-meta")
    return meta


def _from_cache_counts(used: list[dict], tokenized: list[dict]) -> dict:
    """The units a stream took whole from the token cache, the tokens it took from it (a unit that went on from a
    partial entry took that entry's), and the tokens it tokenized itself."""
    taken = [r for r in used if r.get("from_cache")]
    continued = sum(r.get("tokens_from_cache", 0) for r in used if not r.get("from_cache"))
    return {"units_from_cache": len(taken), "tokens_from_cache": sum(r["tokens"] for r in taken) + continued,
            "tokens_tokenized": sum(r["tokens"] - r.get("tokens_from_cache", 0)
                                    for r in tokenized if not r.get("from_cache"))}


class StreamRun:
    """One stream's progress: its lazily planned units, the committed ones, and the committed prefix."""

    def __init__(self, ctx: Context, stream: str):
        self.ctx, self.name = ctx, stream
        self.budget = ctx.recipe.budget(stream)
        self.directory = ctx.layout.units(stream)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.records: dict[int, dict] = {}
        self.committed_tokens = self.whole_tokens = self.whole_bytes = 0  # running sums over self.records
        self.benchmark_set = ctx.benchmarks["fingerprint"] if ctx.benchmarks is not None else None
        for record in _committed(self.directory, ctx.log, self.benchmark_set).values():
            self._add(record)
        self.plan = plan_units(stream, stream_files(ctx.recipe, ctx.split, stream, "train"), ctx.mirrors,
                               ctx.unit_bytes)
        self.prefix = self.prefix_tokens = self.new_tokens = self.in_flight = self.in_flight_bytes = 0
        self.exhausted = False
        self.max_epochs = ctx.recipe.streams[stream].max_epochs
        self.planned_units = 0  # units of the files planned so far; all of pass 1 once the plan ends
        self.pass_units: int | None = None  # set when the files' plan ends
        self.repeating = False
        self.upcoming: Unit | None = None
        self.started = time.perf_counter()
        self.hashes = self.keys = None
        self.benchmarks = str(ctx.layout.benchmark_set) if ctx.benchmarks is not None else None
        # the token cache's key parts every unit of the run shares, built once: they ask importlib.metadata for the
        # oracle library's version, ~0.7 ms on the coordinator's thread, holding the GIL the workers need
        self.key_base = cache_key_base(ctx) if ctx.cache is not None else None
        if ctx.recipe.holdout.decontaminate:
            self.hashes = str(ctx.layout.holdout_copies("hashes"))
            self.keys = str(ctx.layout.holdout_copies("keys"))
        committed = f", {len(self.records)} units already committed" if self.records else ""
        ctx.log(f"{stream}: budget {self.budget:,} tokens{committed}")
        ctx.progress.start(stream, self.budget, self.committed_tokens)

    def _add(self, record: dict) -> None:
        """Record a committed unit; the sums spare a pass over every record each time a unit is sent (62,500
        units in a 1T-token run)."""
        self.records[record["index"]] = record
        self.committed_tokens += record["tokens"]
        if record.get("size") and record.get("limit") is None:
            self.whole_tokens += record["tokens"]
            self.whole_bytes += record["size"]

    def advance(self) -> bool:
        """Extend the committed prefix; True once it holds the budget."""
        while self.prefix in self.records and self.prefix_tokens < self.budget:
            self.prefix_tokens += self.records[self.prefix]["tokens"]
            self.prefix += 1
        if self.prefix_tokens < self.budget:
            self._repeat_if_allowed()
        return self.prefix_tokens >= self.budget

    def _repeat_if_allowed(self) -> None:
        """Once every unit of the files is committed short of the budget: plan the later passes, if
        max_epochs allows as many as the budget needs (else the stream stays exhausted and runs out)."""
        if self.repeating or self.pass_units is None or self.prefix < self.pass_units or self.max_epochs == 1:
            return
        first = [self.records[i] for i in range(self.pass_units)]
        pass_tokens = sum(r["tokens"] for r in first)
        if not pass_tokens or passes_needed(self.budget, pass_tokens) > self.max_epochs:
            return
        passes = passes_needed(self.budget, pass_tokens)
        self.ctx.log(f"{self.name}: its train documents hold {pass_tokens:,} tokens: {passes} passes over them")
        self.plan = (RepeatUnit(self.name, (p - 1) * self.pass_units + j, p, j, r.get("size", 0))
                     for p in range(2, passes + 1) for j, r in enumerate(first))
        self.repeating, self.exhausted = True, False

    def _tokens_per_byte(self) -> float:
        """This stream's tokens per source byte over its whole committed units, or one token per 3 bytes before
        any is back (text runs 3.5-4.5 bytes per token: the guess errs towards more tokens)."""
        return self.whole_tokens / self.whole_bytes if self.whole_bytes else 1 / 3

    def wants_more(self) -> bool:
        """Whether another unit may be needed: not while the units in flight are expected to reach the budget
        (more would be work thrown away)."""
        if self.exhausted:
            return False
        return self.prefix_tokens + self.in_flight_bytes * self._tokens_per_byte() < self.budget

    def next_unit(self) -> Unit | None:
        """The first planned unit not committed yet (kept until it is submitted): of the files, then of the later
        passes when the stream repeats; or None when there is none (for now, while pass 1 is in flight)."""
        while self.upcoming is None:
            unit = next(self.plan, None)
            if unit is None:
                if not self.repeating:  # the files are planned: pass 1 is complete once its units are committed
                    self.pass_units = self.planned_units
                    self._repeat_if_allowed()
                    if self.repeating:
                        continue
                self.exhausted = True
                return None
            self.planned_units += not self.repeating
            record = self.records.get(unit.index)
            if record is None:
                self.upcoming = unit
            elif isinstance(unit, RepeatUnit):
                continue
            elif (changed := _changed_source(self.name, unit, record)) is not None:
                raise changed
        return self.upcoming

    def next_task(self) -> UnitTask | RepeatTask | None:
        """The next unit to tokenize, or None for now. A unit expected to reach the budget waits until every
        unit before it is committed: it then carries the exact tokens left (UnitTask.limit) and stops there,
        instead of tokenizing the rest of its text for nothing. Meanwhile the workers take other streams' units."""
        if self.advance() or (unit := self.next_unit()) is None:
            return None
        ready = self.prefix == unit.index
        expected = self.prefix_tokens + (self.in_flight_bytes + unit.size) * self._tokens_per_byte()
        if not ready and expected >= self.budget:
            return None
        self.upcoming = None
        self.in_flight += 1
        self.in_flight_bytes += unit.size
        limit = self.budget - self.prefix_tokens if ready else None
        if isinstance(unit, RepeatUnit):
            return RepeatTask(unit, str(self.directory), self.ctx.dtype.str, self.ctx.recipe.seed,
                              self.pass_units, limit, self.ctx.recipe.layout.provenance, self.ctx.writer,
                              self.benchmark_set)
        key, parts = self._cache_key(unit)
        return UnitTask(unit, self.ctx.recipe.streams[self.name].text_field, self.ctx.tokenizer_path,
                        self.ctx.backend, self.ctx.dtype.str, str(self.directory), self.hashes,
                        tuple(self.ctx.mirrors), self.ctx.huge_doc_chars,
                        limit=limit, keys_path=self.keys, delimiters=self.ctx.delimiters,
                        provenance=self.ctx.recipe.layout.provenance, writer=self.ctx.writer,
                        benchmarks=self.benchmarks, benchmark_set=self.benchmark_set,
                        drop_contaminated=self.benchmarks is None or self.ctx.recipe.decontaminate.action == "drop",
                        cache=self.ctx.cache, cache_key=key, cache_parts=parts,
                        drops_space=self.ctx.cut_drops_space)

    def _cache_key(self, unit: Unit) -> tuple[str | None, dict | None]:
        """The unit's key in the token cache (tokmix.cache.unit_key) and what `tokmix cache` lists it by."""
        if self.ctx.cache is None:
            return None, None
        ctx = self.ctx
        key = self.key_base.key(unit, ctx.recipe.streams[self.name].text_field)
        return key, {"tokenizer": ctx.tokenizer_sha256, "tokenizer_path": ctx.tokenizer_path, "stream": self.name,
                     "unit": unit.name, "sources": sorted({p.path for p in unit.pieces})}

    def committed(self, unit: Unit, record: dict) -> None:
        if (problem := record.pop("cache_problem", None)) is not None:
            self.ctx.log(f"token cache: {problem}")
        self._add(record)
        self.in_flight -= 1
        self.in_flight_bytes -= unit.size
        self.new_tokens += record["tokens"]

    def out_of_source(self) -> TokmixError | None:
        if self.exhausted and not self.in_flight and self.prefix_tokens < self.budget:
            return _out_of_source(self.name, self.prefix_tokens, self.budget,
                                  [self.records[i] for i in range(self.prefix)], self.max_epochs,
                                  self.benchmarks is not None and self.ctx.recipe.decontaminate.action == "drop")
        return None

    def finish(self) -> dict:
        seconds = time.perf_counter() - self.started
        meta = _finish(self.ctx, self.name, self.budget, [self.records[i] for i in range(self.prefix)], seconds,
                       self.new_tokens)
        dropped = f", {meta['dropped_holdout_duplicates']:,} holdout copies dropped" if self.hashes else ""
        self.ctx.log(f"{self.name}: done, {meta['tokens']:,} tokens, {meta['docs']:,} docs, "
                     f"{meta['tok_s_end_to_end']:,} tok/s{dropped}")
        return meta


def tokenize_streams(ctx: Context, executor, names: list[str]) -> dict[str, dict]:
    """All unfinished streams through one window of units in flight, earlier streams first, so every worker
    stays busy until the last budget is reached (a stream's tail overlaps the next stream's start)."""
    runs = [StreamRun(ctx, name) for name in names]
    metas: dict[str, dict] = {}
    window = Window(executor, UNITS_IN_FLIGHT_PER_WORKER * ctx.workers)
    alone = False  # a unit too large for a worker's share of the budget is in flight, or waits for the others
    while True:
        for run in runs:
            if run.name not in metas and run.advance():
                metas[run.name] = run.finish()
        active = [run for run in runs if run.name not in metas]
        if not active:
            return metas
        for run in active:
            while not alone and window.room > 0 and run.wants_more():
                upcoming = run.next_unit()  # kept until next_task submits it
                share = alone_share(ctx, upcoming) if isinstance(upcoming, Unit) else None
                if share and len(window):
                    alone = True  # the units in flight finish first; nothing else is sent until this one is done
                    break
                if (task := run.next_task()) is None:
                    break
                if share:
                    alone = True
                    ctx.log(f"{run.name}: unit {task.unit.name} (one read of {task.unit.held / 2**20:,.0f} MiB) runs "
                            f"alone: over a worker's share of --max-memory ({share / 2**20:,.0f} MiB)")
                # a unit of pass 1 is tokenized from its files, one of a later pass copied from pass 1's (each
                # function submitted by name: Ray titles its worker by it)
                work = repeat_unit if isinstance(task, RepeatTask) else tokenize_unit
                window.submit(work, task, (run, task.unit))
        if not window:
            failed = next((e for e in map(StreamRun.out_of_source, active) if e), None)
            if failed:
                raise failed
            continue  # committed units alone reached a budget: finish it above
        for (run, unit), result in window.finished():
            run.committed(unit, result)
            alone = alone and bool(window)  # a unit that waited for the others goes next; one that ran alone is done
            fault_point("streams:after-unit", run.name)
            ctx.progress.update(run.name, run.committed_tokens, run.budget)


def _finished(ctx: Context, stream: str) -> dict | None:
    """A finished stream's record when every unit it uses is whole; otherwise its damaged units are discarded,
    and so is its record: the stream is finished again, tokenizing only those units."""
    meta = load_meta(ctx, stream)
    if meta is None:
        return None
    directory, whole = ctx.layout.units(stream), True
    for unit in meta["units"]:
        if (why := unit_damage(directory, unit["name"])[1]) is not None:
            UnitFiles(directory, unit["name"]).discard(why, ctx.log)
            whole = False
    if not whole:
        meta_path(ctx, stream).unlink()
    return meta if whole else None


def run_streams(ctx: Context) -> dict[str, dict]:
    """Every stream's record, tokenizing those not finished yet. Every committed unit is checked against its
    record before it is used (StreamRun, _finished): a stage process never builds on a damaged one."""
    metas = {name: _finished(ctx, name) for name in ctx.recipe.streams}
    todo = [name for name, meta in metas.items() if meta is None]
    if todo:
        # units are numbered by how files were cut: a resume keeps the cut the run started with
        ctx.unit_bytes = identity.pinned(ctx.layout, "unit size", ctx.unit_bytes)
        metas.update(tokenize_streams(ctx, ctx.pool, todo))
    return metas
