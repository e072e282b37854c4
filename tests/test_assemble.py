"""Assemble, driver and shard sides, on real unit files (.tok, .len): the driver plans every shard from one
pass over the labels and the units' lengths; each shard task reads its documents from there. Every shard is
compared byte for byte with the naive construction (all documents in interleave order, concatenated, cut)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tokmix.errors import TokmixError
from tokmix.interleave import CHUNK_DOCS, Labels, chunked_order, interleave_labels, interleave_order
from tokmix.shards import fingerprints_path
from tokmix.stages.assemble import GATHER_TOKENS, INTERLEAVE_CHUNK, StreamUnits, plan_tasks, write_shard
from tokmix.tokens import LENGTH_DTYPE, block_fingerprints

SEQ_LEN = 1024


def _streams(tmp_path: Path, lengths: dict[str, list[list[int]]], rng, tokens: bool = True) -> tuple[dict, dict]:
    """Units of each stream (.len always; .tok of random tokens, each document starting with EOT, unless not
    `tokens`); returns the StreamUnits and, per stream, its documents' tokens in order (or lengths)."""
    units, docs = {}, {}
    for stream, per_unit in lengths.items():
        directory = tmp_path / stream
        directory.mkdir()
        records, docs[stream] = [], []
        for k, unit_docs in enumerate(per_unit):
            name = f"{k:06d}"
            np.array(unit_docs, dtype=LENGTH_DTYPE).tofile(directory / f"{name}.len")
            if tokens:
                arrays = [np.concatenate([[0], rng.integers(1, 60_000, n - 1)]).astype(np.uint16) for n in unit_docs]
                (np.concatenate(arrays) if arrays else np.empty(0, np.uint16)).tofile(directory / f"{name}.tok")
                docs[stream] += arrays
            else:
                docs[stream] += unit_docs
            records.append({"name": name, "docs": len(unit_docs), "tokens": int(sum(unit_docs))})
        units[stream] = StreamUnits(directory, records)
    return units, docs


def _labels(tmp_path: Path, kind: str, docs: list[int], seed: int = 1234) -> Labels:
    if kind == "chunked":
        return Labels(kind, tuple(docs), seed)
    path = tmp_path / "interleave.labels"
    interleave_order(docs, seed).tofile(path)
    return Labels(kind, tuple(docs), seed, str(path))


def _naive(docs: dict[str, list[np.ndarray]], labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All documents in interleave order, concatenated; and the stream of every token."""
    names, taken = list(docs), {s: 0 for s in docs}
    pieces, owner = [], []
    for label in labels.tolist():
        name = names[label]
        pieces.append(docs[name][taken[name]])
        owner.append(np.full(len(pieces[-1]), label, dtype=np.uint8))
        taken[name] += 1
    return np.concatenate(pieces), np.concatenate(owner)


@pytest.mark.parametrize("kind", ["global", "chunked"])
def test_every_shard_holds_the_interleaved_documents_byte_for_byte(tmp_path, kind):
    rng = np.random.default_rng(0)
    big = GATHER_TOKENS + GATHER_TOKENS // 3  # one document longer than a gather: cut across two writes
    lengths = {
        "a": [[700, big, 90], [], [5, 3_000] + [int(x) for x in rng.integers(2, 4_000, 300)]],  # an empty unit
        "b": [[40, 2_000, 77]] + [[int(x) for x in rng.integers(2, 9_000, 150)] for _ in range(3)],
        "c": [[int(x) for x in rng.integers(2, 300, 900)]],
    }
    units, docs = _streams(tmp_path, lengths, rng)
    labels = _labels(tmp_path, kind, [len(docs[s]) for s in docs])
    flat, owner = _naive(docs, labels.read(0, labels.total))
    blocks = [2_000, 5_000, 1_700, 3]  # shard starts fall inside documents; the last shard ends inside one too
    assert sum(blocks) * SEQ_LEN + 1 < len(flat)
    paths = [tmp_path / f"train_{k:03d}.bin" for k in range(len(blocks))]
    tasks, used = plan_tasks(paths, np.dtype(np.uint16), SEQ_LEN, blocks, units, labels)
    start = 0
    for k, task in enumerate(tasks):
        record = write_shard(task)
        want = flat[start : start + task.n_tokens]
        assert np.array_equal(np.fromfile(paths[k], dtype=np.uint16), want), k
        counted = np.bincount(owner[start + (k > 0) : start + task.n_tokens], minlength=3)
        assert record["tokens_by_stream"] == {s: int(n) for s, n in zip(docs, counted)}
        marks = np.fromfile(fingerprints_path(tmp_path, paths[k].name), dtype=np.uint32)
        assert np.array_equal(marks, block_fingerprints(paths[k], np.uint16, SEQ_LEN))
        start += task.n_tokens - 1
    ends = np.cumsum([len(d) for d in _in_order(docs, labels)])
    last = int(np.searchsorted(ends, sum(blocks) * SEQ_LEN, side="right"))
    order = labels.read(0, last + 1)
    assert used == {s: int(np.count_nonzero(order == i)) for i, s in enumerate(docs)}


def _in_order(docs: dict[str, list], labels: Labels) -> list:
    names, taken, out = list(docs), {s: 0 for s in docs}, []
    for label in labels.read(0, labels.total).tolist():
        out.append(docs[names[label]][taken[names[label]]])
        taken[names[label]] += 1
    return out


def test_a_truncated_unit_fails_its_shard_and_leaves_no_file(tmp_path):
    rng = np.random.default_rng(1)
    units, docs = _streams(tmp_path, {"a": [[3_000, 2_000]], "b": [[1_500, 900]]}, rng)
    labels = _labels(tmp_path, "global", [2, 2])
    tasks, _ = plan_tasks([tmp_path / "train_000.bin"], np.dtype(np.uint16), SEQ_LEN, [7], units, labels)
    for name in ("a", "b"):
        tok = tmp_path / name / "000000.tok"
        tok.write_bytes(tok.read_bytes()[:1000])
    with pytest.raises(TokmixError, match="units end before"):
        write_shard(tasks[0])
    assert not list(tmp_path.glob("train_000.bin*"))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def _peak_growth(fn) -> int:
    """Bytes the process's peak RSS (VmHWM: file-backed mapped pages included) rose above its RSS while fn ran."""
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from the RSS now
    before = _status_kib("VmRSS") << 10
    fn()
    return (_status_kib("VmHWM") << 10) - before


def test_a_shard_writer_holds_one_gather_buffer_not_its_unit_files(tmp_path):
    """RSS counts a memory-mapped file's pages once touched (what top and the memory guard see): a writer that
    maps its units grows by all it reads. Read through a buffer, it grows by about one gather."""
    rng = np.random.default_rng(2)
    per_unit = [[GATHER_TOKENS // 2] * 2 for _ in range(3)]  # 3 units of one gather's tokens each, per stream
    units, _ = _streams(tmp_path, {"a": per_unit, "b": per_unit}, rng)
    labels = _labels(tmp_path, "global", [6, 6])
    blocks = (12 * (GATHER_TOKENS // 2) - 1) // SEQ_LEN
    tasks, _ = plan_tasks([tmp_path / "train_000.bin"], np.dtype(np.uint16), SEQ_LEN, [blocks], units, labels)
    unit_bytes = sum(p.stat().st_size for p in tmp_path.glob("*/*.tok"))
    grew = _peak_growth(lambda: write_shard(tasks[0]))
    gather_bytes = GATHER_TOKENS * 2
    assert unit_bytes >= 6 * gather_bytes
    assert grew < 2 * gather_bytes, f"peak RSS grew {grew / 2**20:.0f} MiB over {unit_bytes / 2**20:.0f} MiB of units"


def test_the_chunked_interleave_gives_every_stream_exactly_its_documents_in_any_range():
    docs = (3 * CHUNK_DOCS + 17, CHUNK_DOCS // 3, 5, 0, 2 * CHUNK_DOCS + 1)
    whole = interleave_labels(list(docs), 7, "chunked")
    assert np.array_equal(np.bincount(whole, minlength=len(docs)), docs)
    # spread evenly: every chunk-sized window holds each stream's share to within a few documents
    total = sum(docs)
    for lo in range(0, total - CHUNK_DOCS, CHUNK_DOCS):
        counts = np.bincount(whole[lo : lo + CHUNK_DOCS], minlength=len(docs))
        share = np.array(docs) * CHUNK_DOCS / total
        assert np.all(np.abs(counts - share) <= 3 + 4 * np.sqrt(share)), (lo, counts, share)
    for start, stop in [(0, 10), (CHUNK_DOCS - 3, CHUNK_DOCS + 4), (123_457, 3 * CHUNK_DOCS),
                        (total - 9, total)]:
        assert np.array_equal(chunked_order(docs, 7, start, stop), whole[start:stop])
    assert not np.array_equal(whole, interleave_order(list(docs), 7))


def test_the_driver_does_not_grow_with_documents(tmp_path):
    """Planning 3M documents' shards holds the labels' 1 byte per document at most (the global shuffle), not
    the ~29 bytes per document that arrays of lengths, units and offsets took."""
    rng = np.random.default_rng(3)
    per_stream = 1_000_000
    lengths = {s: [[int(x) for x in rng.integers(2, 2_000, per_stream // 4)] for _ in range(4)] for s in "abc"}
    units, docs = _streams(tmp_path, lengths, rng, tokens=False)
    total_tokens = sum(sum(d) for d in docs.values())
    blocks = [50_000] * ((total_tokens - 2) // SEQ_LEN // 50_000)
    paths = [tmp_path / f"train_{k:03d}.bin" for k in range(len(blocks))]
    # one chunk of the pass: its labels, int64 lengths and ends, a mask (~26 bytes per chunk document, 26 MiB
    # traced); the whole 3M documents at ~29 bytes each would be 83 MiB
    chunk = 32 * INTERLEAVE_CHUNK
    for kind, allowed in [("global", 3 * per_stream + chunk), ("chunked", chunk)]:
        result: dict = {}

        def plan(kind=kind, result=result):  # as the driver: the labels (global: shuffled, written), the pass
            labels = _labels(tmp_path, kind, [per_stream] * 3)
            result["tasks"], _ = plan_tasks(paths, np.dtype(np.uint16), SEQ_LEN, blocks, units, labels)

        grew = _peak_growth(plan)
        assert len(result["tasks"]) == len(blocks)
        assert grew < allowed, f"{kind}: planning grew the peak RSS by {grew / 2**20:.0f} MiB"


def test_a_run_past_2_31_tokens_plans_writes_and_loads_every_block_where_it_belongs(tmp_path):
    """3B tokens of documents (their .len files real, their .tok files sparse but for a marker at each
    document's start): the plan's offsets, the shard past 2^31 written, and the loader's blocks on both sides of
    2^31 tokens and across the shard boundary, all checked against int64 arithmetic done the naive way."""
    import json

    from tokmix.data import TrainBlocks

    rng = np.random.default_rng(5)
    blocks = [2_400_000, 400]  # shard 1 starts at token 2,457,600,000 > 2**31
    first, n_tokens = blocks[0] * SEQ_LEN, blocks[1] * SEQ_LEN + 1
    assert first > 2**31
    # stream a holds most of the tokens: its own offsets cross 2**31 before shard 1 too
    lengths = {"a": [[int(x) for x in rng.integers(40_000, 160_000, 2_500)] for _ in range(11)],
               "b": [[int(x) for x in rng.integers(40_000, 160_000, 700)]],
               "c": [[int(x) for x in rng.integers(100, 160_000, 900)] for _ in range(2)]}
    units, docs = _streams(tmp_path, lengths, rng, tokens=False)
    marker = {}  # (stream, document) -> its first token, 1..65535 (an EOT is 0 in a real unit: zeros are)
    for s, name in enumerate(docs):
        k = 0
        for u, unit_docs in enumerate(lengths[name]):
            starts = np.cumsum([0] + unit_docs[:-1])
            with open(tmp_path / name / f"{u:06d}.tok", "wb") as f:
                f.truncate(sum(unit_docs) * 2)
                for start in starts.tolist():
                    marker[s, k] = 1 + (7919 * (s * 100_003 + k)) % 65535
                    f.seek(start * 2)
                    f.write(np.uint16(marker[s, k]).tobytes())
                    k += 1
    labels = _labels(tmp_path, "global", [len(docs[s]) for s in docs])
    order = labels.read(0, labels.total)
    lens = np.empty(len(order), dtype=np.int64)
    index_in_stream = np.empty(len(order), dtype=np.int64)
    for s, name in enumerate(docs):
        at = np.flatnonzero(order == s)
        lens[at], index_in_stream[at] = docs[name], np.arange(len(at))
    ends = np.cumsum(lens)  # int64 throughout: the naive way
    assert ends[-1] > first + n_tokens
    assert int(lens[(order == 0) & (ends <= first)].sum()) > 2**31  # stream a's own offset there, too

    paths = [tmp_path / "train_000.bin", tmp_path / "train_001.bin"]
    tasks, used = plan_tasks(paths, np.dtype(np.uint16), SEQ_LEN, blocks, units, labels)
    d = int(np.searchsorted(ends, first, side="right"))
    assert (tasks[1].first_doc, tasks[1].skip) == (d, first - int(ends[d] - lens[d]))
    last = int(np.searchsorted(ends, first + n_tokens - 1, side="right"))
    assert tasks[1].last_doc == last
    assert used == {name: int(np.count_nonzero(order[: last + 1] == s)) for s, name in enumerate(docs)}

    record = write_shard(tasks[1])
    want = np.zeros(n_tokens, dtype=np.uint16)
    for doc in range(d + (tasks[1].skip > 0), last + 1):
        want[int(ends[doc] - lens[doc]) - first] = marker[int(order[doc]), int(index_in_stream[doc])]
    assert np.count_nonzero(want) >= 2  # documents start inside the shard
    assert np.array_equal(np.fromfile(paths[1], dtype=np.uint16), want)
    owner = np.repeat(order[d : last + 1], lens[d : last + 1])[first - int(ends[d] - lens[d]):][:n_tokens]
    assert record["tokens_by_stream"] == {n: int(np.count_nonzero(owner[1:] == s)) for s, n in enumerate(docs)}

    # the loader: shard 0 a sparse file of 2.46B tokens with its last block marked, shard 1 the one just written
    with open(paths[0], "wb") as f:
        f.truncate((first + 1) * 2)
        f.seek((first - SEQ_LEN) * 2)
        f.write(np.arange(1, SEQ_LEN + 1, dtype=np.uint16).tobytes())
        f.write(want[:1].tobytes())  # the last token of shard 0 is shard 1's first
    shard_entries = [{"file": p.name, "tokens": b * SEQ_LEN + 1, "blocks": b} for p, b in zip(paths, blocks)]
    index = {"dtype": "uint16", "seq_len": SEQ_LEN, "block": SEQ_LEN + 1, "stride": SEQ_LEN, "eot_id": 0,
             "blocks": sum(blocks), "train_steps": sum(blocks) // 8, "seqs_per_step": 8, "margin_steps": 0,
             "shards": shard_entries}
    (tmp_path / "index.json").write_text(json.dumps(index))
    loader = TrainBlocks(tmp_path)
    j = blocks[0] - 1  # its first token at 2,457,598,976 > 2**31
    assert np.array_equal(loader.block(j), np.append(np.arange(1, SEQ_LEN + 1), want[0]))
    assert np.array_equal(loader.block(j + 3), want[2 * SEQ_LEN : 3 * SEQ_LEN + 1])
    x, y = loader.batch(j // 8)  # the step of blocks 2,399,992..2,399,999: ends at the shard boundary
    assert np.array_equal(x[-1], np.arange(1, SEQ_LEN + 1)) and y[-1][-1] == want[0]
    x, y = loader.batch(blocks[0] // 8)  # the next step: shard 1's first 8 blocks
    assert np.array_equal(x.ravel(), want[: 8 * SEQ_LEN]) and np.array_equal(y.ravel(), want[1 : 8 * SEQ_LEN + 1])


def _ordered(tmp_path: Path, order: list[int], docs: list[int]) -> Labels:
    """Labels in a given order (as the driver writes the global one)."""
    path = tmp_path / "order.labels"
    np.array(order, dtype=np.uint8).tofile(path)
    return Labels("global", tuple(docs), 0, str(path))


def test_a_document_that_starts_where_the_previous_one_of_another_file_ends_is_read_from_its_own_file(tmp_path):
    """a0 = a's file [0, 1500), b0 = b's file [0, 1500), a1 = a's file [1500, 3000): b0 ends at the offset where
    a1 starts, in another file, so the two are not one run."""
    rng = np.random.default_rng(2)
    units, docs = _streams(tmp_path, {"a": [[1_500, 1_500, 1_500]], "b": [[1_500, 1_500]]}, rng)
    labels = _ordered(tmp_path, [0, 1, 0, 1, 0], [3, 2])
    flat, _ = _naive(docs, labels.read(0, labels.total))
    tasks, _ = plan_tasks([tmp_path / "train_000.bin"], np.dtype(np.uint16), SEQ_LEN, [7], units, labels)
    write_shard(tasks[0])
    assert np.array_equal(np.fromfile(tmp_path / "train_000.bin", dtype=np.uint16), flat[: 7 * SEQ_LEN + 1])


def test_documents_used_are_those_with_a_token_in_the_run(tmp_path):
    """Document ends at 3, 5, 9, 14 tokens: a run of 5 tokens uses the first two documents exactly, one of 6 the
    third one's first token too."""
    units, _ = _streams(tmp_path, {"a": [[3, 4]], "b": [[2, 5]]}, np.random.default_rng(0), tokens=False)
    labels = _ordered(tmp_path, [0, 1, 0, 1], [2, 2])
    for blocks, used in [(4, {"a": 1, "b": 1}), (5, {"a": 2, "b": 1}), (13, {"a": 2, "b": 2})]:
        _, got = plan_tasks([tmp_path / "train_000.bin"], np.dtype(np.uint16), 1, [blocks], units, labels)
        assert got == used, blocks
