"""Later passes over a stream whose train documents hold fewer tokens than its budget (`max_epochs` > 1).
Pass 1 is the stream's documents in canonical order, tokenized into units as usual; pass p >= 2 is the same
documents in a seeded order of pass p's own, materialized as further units copied from the committed pass-1
units. So the stream stays one sequence of documents in units (assemble reads it as any other), pass p + 1
starts only once pass p is used up, and every document appears floor(k) or ceil(k) times for a budget of k
passes. Decontamination happened in pass 1: a dropped holdout copy is in no pass."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokmix.faults import fault_point
from tokmix.lock import RunWriter, writing
from tokmix.provenance import UNIT_DOC_DTYPE
from tokmix.shards import DamagedFile, unit_name
from tokmix.stages import cached
from tokmix.store import ObjectPath, as_path, storage
from tokmix.tokens import LENGTH_DTYPE
from tokmix.unit_files import UnitFiles

GATHER_TOKENS = 8 << 20  # tokens gathered in memory before each write


# ---------------------------------------------------------------------------- a committed unit, checked
# As every reader checks one before using it: its record (sealed) and the sha256 of its token, lengths and (with
# provenance) places files against that record. The streams coordinator checks each unit before counting it (and
# remakes a damaged one); a repeat unit checks each pass-1 unit it copies from (and stops, naming it).
REMAKE_UNIT = "run the same command again: a damaged unit is remade from its source as the streams stage starts"


def unit_damage(directory: Path | ObjectPath, name: str) -> tuple[dict | None, str | None]:
    """A committed unit's record, or why the unit cannot be used (UnitFiles.damage). One read of each local file
    per process while they are unchanged (a repeat unit's check after the coordinator's costs nothing); a unit on
    an object store is read each time."""
    files = UnitFiles(directory, name)
    if storage(directory).remote:  # no stamps to trust: another host may have written it since
        return files.damage()
    return cached(("unit check", str(directory), name, files.stamps()), files.damage)


def checked_unit(directory: Path | ObjectPath, name: str) -> dict:
    """The unit's record when its files are whole; DamagedFile naming the unit otherwise (a worker cannot
    remake it: the next stage process does)."""
    record, why = unit_damage(directory, name)
    if why is not None:
        raise DamagedFile(directory / name, why, REMAKE_UNIT)
    return record


@dataclass(frozen=True)
class RepeatUnit:
    """Unit `source` of pass 1 repeated in pass `pass_no`: as many documents, taken at the same places of
    that pass's order. `size` is the source unit's bytes, for scheduling (its tokens are about the same)."""

    stream: str
    index: int
    pass_no: int
    source: int
    size: int

    @property
    def name(self) -> str:
        return unit_name(self.index)


@dataclass(frozen=True)
class RepeatTask:
    unit: RepeatUnit
    unit_dir: str
    dtype: str
    seed: int
    pass_units: int  # units of pass 1: indices 0 .. pass_units - 1
    limit: int | None = None  # as UnitTask.limit: stop after the document that reaches it
    provenance: bool = False  # copy the documents' places too (NNNNNN.src), marked with this pass
    writer: RunWriter | None = None  # the run it writes for (tokmix.lock.writing)
    benchmark_set: str | None = None  # as UnitTask's: the fingerprint of the set pass 1 was checked against


BENCHMARK_SET = "benchmark_set"  # a unit record's key: the fingerprint of the benchmark set its documents passed


def benchmark_set_field(fingerprint: str | None) -> dict:
    """A unit record's benchmark set field: none without a set (a record as before [decontaminate] existed)."""
    return {BENCHMARK_SET: fingerprint} if fingerprint is not None else {}


def passes_needed(budget: int, pass_tokens: int) -> int:
    """Passes that reach `budget`: the document that crosses it ends the stream, so a budget of exactly m
    passes' tokens needs m passes, one token more needs m + 1."""
    return -(-budget // pass_tokens)


def passes_used(meta: dict, tokens_used: int) -> float:
    """The epochs that `tokens_used` tokens of a stream make: over the tokens of one pass of its train
    documents, from its record (tokmix.stages.streams); 1 for a stream that did not repeat. (In documents
    it differs: a pass's documents come in its own order, long ones early or late.)"""
    return tokens_used / meta["pass_tokens"] if meta.get("pass_tokens") else 1.0


def pass_order(seed: int, stream: str, pass_no: int, docs: int) -> np.ndarray:
    """The order of the pass-1 documents in pass `pass_no` >= 2: seeded by the recipe's seed, the stream and
    the pass, so each pass has its own and a resume finds the same."""
    rng = np.random.default_rng([seed, zlib.crc32(stream.encode()), pass_no])
    return rng.permutation(docs)


def _pass_one(unit_dir: str, pass_units: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where pass 1's documents lie: each one's length, unit and first token in its unit, and the first
    document of each unit (pass_units + 1 entries). Built once per process: every repeat unit needs it. Every
    pass-1 unit is checked against its record first, as the coordinator checks it (a damaged one is named,
    never copied from)."""

    def build():
        for i in range(pass_units):
            checked_unit(as_path(unit_dir), unit_name(i))
        per_unit = [UnitFiles.of(unit_dir, i).read_lengths() for i in range(pass_units)]
        lengths = np.concatenate(per_unit).astype(np.int64)
        unit = np.repeat(np.arange(pass_units, dtype=np.int32), [len(x) for x in per_unit])
        offset = np.concatenate([np.cumsum(x, dtype=np.int64) - x for x in per_unit])
        first = np.concatenate([[0], np.cumsum([len(x) for x in per_unit])])
        return lengths, unit, offset, first

    return cached(("pass one", unit_dir, pass_units), build)


def _pass_one_places(unit_dir: str, pass_units: int) -> np.ndarray:
    """Pass 1's documents' places and checksums (UNIT_DOC_DTYPE), in pass-1 order; built once per process."""
    return cached(("pass one places", unit_dir, pass_units), lambda: np.concatenate(
        [UnitFiles.of(unit_dir, i).read_places(UNIT_DOC_DTYPE) for i in range(pass_units)]))


def repeat_unit(task: RepeatTask) -> dict:
    """Copy one repeat unit's documents from the pass-1 units and commit it as a tokenized unit is
    committed (tokens, lengths, then the record), while its run holds the directory; returns its record."""
    with writing(task.writer):
        return _repeat_unit(task)


def _repeat_unit(task: RepeatTask) -> dict:
    unit, files = task.unit, UnitFiles.of(task.unit_dir, task.unit.name)
    lengths, doc_unit, offset, first = _pass_one(task.unit_dir, task.pass_units)
    docs = pass_order(task.seed, unit.stream, unit.pass_no, len(lengths))[first[unit.source] : first[unit.source + 1]]
    take = lengths[docs]
    if task.limit is not None:
        reached = np.flatnonzero(np.cumsum(take) >= task.limit)
        if len(reached):
            docs, take = docs[: reached[0] + 1], take[: reached[0] + 1]
    # sha256 for its record; a repeat unit is a unit to the crash tests
    writer = files.token_writer(np.dtype(task.dtype), fault="streams:unit-mid-write")
    sources: dict[int, np.ndarray] = {}
    chunk, pending = [], 0
    try:
        for d in docs.tolist():
            u = int(doc_unit[d])
            if u not in sources:
                sources[u] = UnitFiles.of(task.unit_dir, u).read_tokens(task.dtype)
            chunk.append(sources[u][offset[d] : offset[d] + lengths[d]])
            pending += int(lengths[d])
            if pending >= GATHER_TOKENS:
                writer.write(np.concatenate(chunk))
                chunk, pending = [], 0
        if chunk:
            writer.write(np.concatenate(chunk))
    except BaseException:
        writer.abort()
        raise
    tokens_sha256 = writer.close(before_commit=lambda: fault_point("streams:unit-before-rename"))
    lengths_sha256 = files.write_lengths(take.astype(LENGTH_DTYPE).tobytes())
    src = {}
    if task.provenance:
        places = _pass_one_places(task.unit_dir, task.pass_units)[docs]  # a copy: marking the pass keeps pass 1's
        places["pass"] = unit.pass_no
        src = {"src_sha256": files.write_places(places.tobytes())}
    fault_point("streams:unit-before-record")
    record = {
        "index": unit.index,
        "name": unit.name,
        "pass": unit.pass_no,
        "source_unit": unit.source,
        "tokens": writer.tokens,
        "docs": len(docs),
        "chars": 0,
        "size": unit.size,
        "limit": task.limit,
        "dropped_at": [],
        "encode_seconds": 0.0,
        "tok_sha256": tokens_sha256,
        "len_sha256": lengths_sha256,
        **src,
        **benchmark_set_field(task.benchmark_set),
    }
    files.commit(record)  # checked as a tokenized unit's is
    return record
