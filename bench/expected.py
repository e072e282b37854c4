"""What validate's derivation of the shards from the units and the seed (tokmix.stages.expected) costs, as a ratio
to assemble writing the same shards from the same units: both run here, one process each, on synthetic units
(three streams at 45/35/20, documents of lognormal lengths around 600 tokens, random uint16 ids) cut into
`--shards` shards, alternately, `--repeat` times. Every derived digest is checked against the shard assemble
wrote: the two code paths agree at this size too. Last, the derivation's peak of allocated memory (tracemalloc,
which numpy's arrays report to) in one more run.

    .venv/bin/python bench/expected.py [--tokens 100e6] [--shards 8] [--repeat 3] [--work bench/work/expected]
"""

from __future__ import annotations

import argparse
import shutil
import time
import tracemalloc
from pathlib import Path

import numpy as np

from tokmix.interleave import Labels, interleave_order
from tokmix.shards import file_checksum, shard_blocks, train_name, write_bytes
from tokmix.stages.assemble import StreamUnits, plan_tasks, write_shard
from tokmix.stages.expected import expected_digests
from tokmix.tokens import LENGTH_DTYPE

SEQ_LEN = 1024
SHARES = {"web": 0.45, "edu": 0.35, "code": 0.20}
UNIT_TOKENS = 4 << 20
SEED = 1337


def make_units(root: Path, tokens: int, rng: np.random.Generator) -> tuple[dict[str, list[dict]], list[int]]:
    """Each stream's units (records as assemble reads them) holding its share of `tokens`, and its documents."""
    units, docs = {}, []
    for name, share in SHARES.items():
        folder = root / "streams" / name / "units"
        folder.mkdir(parents=True)
        records, left, k = [], int(tokens * share) + 10 * SEQ_LEN, 0
        while left > 0:
            lengths = np.maximum(rng.lognormal(6.0, 1.0, UNIT_TOKENS // 400).astype(np.int64), 2)
            lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), min(left, UNIT_TOKENS))) + 1]
            ids = rng.integers(1, 50_000, int(lengths.sum()), dtype=np.uint16)
            ids[np.cumsum(lengths) - lengths] = 0  # each document starts with <|endoftext|>
            write_bytes(folder / f"{k:06d}.tok", ids.tobytes(), durable=False)
            write_bytes(folder / f"{k:06d}.len", lengths.astype(LENGTH_DTYPE).tobytes(), durable=False)
            records.append({"name": f"{k:06d}", "tokens": int(lengths.sum()), "docs": len(lengths)})
            left, k = left - int(lengths.sum()), k + 1
        units[name] = records
        docs.append(sum(r["docs"] for r in records))
    return units, docs


def assemble(root: Path, units: dict[str, list[dict]], docs: list[int], blocks: list[int]) -> list[str]:
    for shard in root.glob("train_*.bin"):
        shard.unlink()
    labels_path = root / "streams" / "interleave.labels"
    interleave_order(docs, SEED).tofile(labels_path)
    labels = Labels("global", tuple(docs), SEED, str(labels_path))
    streams = {name: StreamUnits(root / "streams" / name / "units", records) for name, records in units.items()}
    tasks, _ = plan_tasks([root / train_name(k) for k in range(len(blocks))], np.dtype(np.uint16), SEQ_LEN, blocks,
                          streams, labels)
    return [write_shard(task)["checksum"] for task in tasks]


def derive(root: Path, units: dict[str, list[dict]], docs: list[int], blocks: list[int]) -> list[str]:
    paths = [tuple(str(root / "streams" / name / "units" / r["name"]) for r in records)
             for name, records in units.items()]
    return expected_digests(paths, docs, SEED, "global", np.dtype(np.uint16), SEQ_LEN, blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=100e6)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(__file__).resolve().parent / "work" / "expected")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    total_blocks = int(args.tokens) // SEQ_LEN
    blocks = shard_blocks(total_blocks, -(-total_blocks // args.shards))
    units, docs = make_units(args.work, int(args.tokens), np.random.default_rng(0))
    print(f"{sum(docs):,} documents, {total_blocks:,} blocks ({total_blocks * SEQ_LEN / 1e6:,.0f}M tokens) in "
          f"{len(blocks)} shards")
    for rep in range(args.repeat):
        t0 = time.perf_counter()
        written = assemble(args.work, units, docs, blocks)
        t1 = time.perf_counter()
        derived = derive(args.work, units, docs, blocks)
        t2 = time.perf_counter()
        assert derived == written == [file_checksum(args.work / train_name(k)) for k in range(len(blocks))]
        print(f"run {rep + 1}: assemble {t1 - t0:6.2f} s, derive {t2 - t1:6.2f} s, derive/assemble "
              f"{(t2 - t1) / (t1 - t0):.2f}")
    tracemalloc.start()
    derive(args.work, units, docs, blocks)
    print(f"derive's peak allocation: {tracemalloc.get_traced_memory()[1] / 2**20:,.1f} MiB")
    tracemalloc.stop()
    shutil.rmtree(args.work)


if __name__ == "__main__":
    main()
