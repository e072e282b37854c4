"""A shard is written from the streams' unit files: each document's tokens in interleave order, from the
first shard token (inside a document) to the last (inside another), gathered GATHER_TOKENS at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tokmix.errors import TokmixError
from tokmix.shards import block_fingerprints, fingerprints_path
from tokmix.stages.assemble import GATHER_TOKENS, Interleave, ShardTask, write_shard

SEQ_LEN = 1024


def _units(tmp_path: Path, lengths: dict[str, list[list[int]]], rng) -> dict[str, list[tuple[Path, list]]]:
    """Unit files of random tokens, each document starting with EOT; per stream: (file, its documents)."""
    units = {}
    for stream, per_unit in lengths.items():
        units[stream] = []
        for k, docs in enumerate(per_unit):
            tokens = [np.concatenate([[0], rng.integers(1, 60_000, n - 1)]).astype(np.uint16) for n in docs]
            path = tmp_path / f"{stream}-{k}.tok"
            np.concatenate(tokens).tofile(path)
            units[stream].append((path, tokens))
    return units


def _task(tmp_path, units, order, skip, blocks) -> tuple[ShardTask, np.ndarray]:
    """The task for documents taken in `order` (stream names), and the tokens the shard must hold."""
    streams = tuple(units)
    docs = {s: [(u, off, d) for u, (_, unit_docs) in enumerate(units[s])
                for off, d in zip(np.cumsum([0] + [len(x) for x in unit_docs]), unit_docs)] for s in streams}
    taken = [docs[s].pop(0) for s in order]
    n_tokens = blocks * SEQ_LEN + 1
    task = ShardTask(
        str(tmp_path / "train_000.bin"), "<u2", SEQ_LEN, blocks, n_tokens, skip, False, streams,
        tuple(tuple(str(p) for p, _ in units[s]) for s in streams),
        doc_stream=np.array([streams.index(s) for s in order], dtype=np.uint8),
        doc_unit=np.array([u for u, _, _ in taken], dtype=np.int32),
        doc_offset=np.array([off for _, off, _ in taken], dtype=np.int64),
        doc_length=np.array([len(d) for _, _, d in taken], dtype=np.int64),
    )
    return task, np.concatenate([d for _, _, d in taken])[skip : skip + n_tokens]


def test_a_shard_of_several_gathers_holds_its_documents_in_order(tmp_path):
    rng = np.random.default_rng(0)
    big = GATHER_TOKENS + GATHER_TOKENS // 3  # one document longer than a gather: cut across two writes
    units = _units(tmp_path, {"a": [[700, big, 90], [5, 3_000]], "b": [[40, 2_000, GATHER_TOKENS, 77]]}, rng)
    order = ["a", "b", "b", "a", "a", "b", "a", "a", "b"]  # runs of one unit file and changes of file
    available = sum(len(d) for s in units for _, docs in units[s] for d in docs)
    blocks = (available - 300) // SEQ_LEN - 1
    task, want = _task(tmp_path, units, order, skip=123, blocks=blocks)
    assert len(want) == task.n_tokens and task.n_tokens > 2 * GATHER_TOKENS
    record = write_shard(task)
    shard = Path(task.path)
    assert np.array_equal(np.fromfile(shard, dtype=np.uint16), want)
    marks = np.fromfile(fingerprints_path(shard.parent, shard.name), dtype=np.uint32)
    assert np.array_equal(marks, block_fingerprints(shard, np.uint16, SEQ_LEN))
    assert record["tokens"] == task.n_tokens and sum(record["tokens_by_stream"].values()) == task.n_tokens


def test_too_few_tokens_for_a_shard_fail_and_leave_no_file(tmp_path):
    rng = np.random.default_rng(1)
    units = _units(tmp_path, {"a": [[3_000, 2_000]], "b": [[1_500]]}, rng)
    task, _ = _task(tmp_path, units, ["a", "b", "a"], skip=0, blocks=7)
    with pytest.raises(TokmixError, match="gathered 6,500 of 7,169 tokens"):
        write_shard(task)
    assert not list(tmp_path.glob("train_000.bin*"))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def test_a_shard_writer_holds_one_gather_buffer_not_its_unit_files(tmp_path):
    """RSS counts a memory-mapped file's pages once touched (what top and the memory guard see): a writer that
    maps its units grows by all it reads. Read through a buffer, it grows by about one gather."""
    rng = np.random.default_rng(2)
    per_unit = [[GATHER_TOKENS // 2] * 2 for _ in range(3)]  # 3 units of one gather's tokens each, per stream
    units = _units(tmp_path, {"a": per_unit, "b": per_unit}, rng)
    order = ["a", "b"] * 6
    task, _ = _task(tmp_path, units, order, skip=0, blocks=(6 * GATHER_TOKENS - 1) // SEQ_LEN)
    unit_bytes = sum(Path(p).stat().st_size for files in task.unit_files for p in files)
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the RSS now
    before = _status_kib("VmRSS") << 10
    write_shard(task)
    grew = (_status_kib("VmHWM") << 10) - before
    gather_bytes = GATHER_TOKENS * 2
    assert unit_bytes >= 6 * gather_bytes
    assert grew < 2 * gather_bytes, f"peak RSS grew {grew / 2**20:.0f} MiB over {unit_bytes / 2**20:.0f} MiB of units"


def test_a_document_that_starts_where_the_previous_one_of_another_file_ends_is_read_from_its_own_file(tmp_path):
    """a0 = a's file [0, 1500), b0 = b's file [0, 1500), a1 = a's file [1500, 3000): b0 ends at the offset where
    a1 starts, in another file, so the two are not one run."""
    rng = np.random.default_rng(2)
    units = _units(tmp_path, {"a": [[1_500, 1_500, 1_500]], "b": [[1_500, 1_500]]}, rng)
    task, want = _task(tmp_path, units, ["a", "b", "a", "b", "a"], skip=0, blocks=7)
    write_shard(task)
    assert np.array_equal(np.fromfile(task.path, dtype=np.uint16), want)


def test_documents_used_are_those_with_a_token_in_the_run():
    """Document ends at 3, 5, 9, 14 tokens: a run of 5 tokens uses the first two documents exactly, one of 6 the
    third one's first token too."""
    interleave = Interleave.__new__(Interleave)  # the arrays alone: no unit files needed
    interleave.streams, interleave.order = ("a", "b"), np.array([0, 1, 0, 1], dtype=np.uint8)
    interleave.ends = np.cumsum([3, 2, 4, 5])
    assert interleave.documents_used(5) == {"a": 1, "b": 1}
    assert interleave.documents_used(6) == {"a": 2, "b": 1}
    assert interleave.documents_used(14) == {"a": 2, "b": 2}
