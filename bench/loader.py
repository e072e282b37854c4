"""Loader throughput: TrainBlocks.batch against raw np.memmap slicing of the same blocks, on a run of a few
hundred MB written to a temporary directory (uint16, seq_len 1024, 128 sequences a step, three shards).

    .venv/bin/python bench/loader.py [--tokens 150e6] [--dir /tmp/somewhere]

Each method reads every step once to warm the page cache, then is timed over every step; the files were
just written, so this measures the loader's own cost (slicing, widening to int64), not the disk.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tokmix import shards
from tokmix.data import TrainBlocks
from tokmix.tokens import write_tokens

SEQ_LEN = 1024
SEQS_PER_STEP = 128
MARGIN_STEPS = 20
SHARDS = 3


def write_run(root: Path, total_tokens: int) -> None:
    """A run laid out as tokmix writes it: EOT-prefixed documents of ~1,000 tokens, shards chained by their
    overlap token, index.json."""
    steps = total_tokens // (SEQS_PER_STEP * SEQ_LEN)
    blocks = steps * SEQS_PER_STEP
    rng = np.random.default_rng(0)
    stream = rng.integers(1, 1 << 16, blocks * SEQ_LEN + 1, dtype=np.uint16)
    stream[np.cumsum(rng.geometric(1 / 1000, len(stream) // 500))[: len(stream) // 1000]] = 0
    stream[0] = shards.EOT_ID
    per_shard = -(-blocks // SHARDS)
    entries, first = [], 0
    for k, b in enumerate(shards.shard_blocks(blocks, per_shard)):
        tokens = stream[first * SEQ_LEN : (first + b) * SEQ_LEN + 1]
        write_tokens(root / shards.train_name(k), tokens)
        entries.append({"file": shards.train_name(k), "tokens": len(tokens), "blocks": b, "tokens_by_stream": {}})
        first += b
    index = {
        "dtype": "uint16",
        "seq_len": SEQ_LEN,
        "block": SEQ_LEN + 1,
        "stride": SEQ_LEN,
        "eot_id": shards.EOT_ID,
        "seed": 0,
        "blocks": blocks,
        "train_steps": steps - MARGIN_STEPS,
        "seqs_per_step": SEQS_PER_STEP,
        "margin_steps": MARGIN_STEPS,
        "shards": entries,
    }
    shards.write_json(root / shards.INDEX_NAME, index)


def raw_pieces(root: Path) -> tuple[list[np.ndarray], list[list[tuple[int, int, int]]]]:
    """The memmaps and, per step, the (shard, first token, blocks) pieces it covers: the baseline's bookkeeping
    is done outside the timed loop."""
    index = json.loads((root / shards.INDEX_NAME).read_text())
    maps = [np.memmap(root / s["file"], dtype=np.uint16, mode="r") for s in index["shards"]]
    first = np.cumsum([0] + [s["blocks"] for s in index["shards"]])
    steps = []
    for step in range(int(first[-1]) // SEQS_PER_STEP):
        j, end, pieces = step * SEQS_PER_STEP, (step + 1) * SEQS_PER_STEP, []
        while j < end:
            k = int(np.searchsorted(first, j, side="right")) - 1
            n = min(end, int(first[k + 1])) - j
            pieces.append((k, (j - int(first[k])) * SEQ_LEN, n))
            j += n
        steps.append(pieces)
    return maps, steps


def raw_batch(maps: list[np.ndarray], pieces: list[tuple[int, int, int]], dtype) -> tuple[np.ndarray, np.ndarray]:
    spans = [maps[k][start : start + n * SEQ_LEN + 1] for k, start, n in pieces]
    x = np.concatenate([s[:-1].reshape(-1, SEQ_LEN) for s in spans]).astype(dtype, copy=False)
    y = np.concatenate([s[1:].reshape(-1, SEQ_LEN) for s in spans]).astype(dtype, copy=False)
    return x, y


def timed(fn: Callable[[int], object], steps: int) -> float:
    for s in range(steps):  # warm the page cache
        fn(s)
    t0 = time.perf_counter()
    for s in range(steps):
        fn(s)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=float, default=150e6, help="train tokens of the run written (default 150M)")
    ap.add_argument("--dir", type=Path, help="write the run here instead of a temporary directory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        write_run(root, int(args.tokens))
        size = sum(p.stat().st_size for p in root.glob("train_*.bin"))
        print(
            f"run: {size / 1e6:,.0f} MB in {len(list(root.glob('train_*.bin')))} shards, written in "
            f"{time.perf_counter() - t0:.1f}s"
        )

        loader = TrainBlocks(root)
        maps, pieces = raw_pieces(root)
        steps = loader.physical_steps
        world = 8
        methods = {
            "TrainBlocks.batch, int64": lambda s: loader.batch(s),
            f"TrainBlocks.batch, int64, {world} ranks in turn": lambda s: [
                loader.batch(s, r, world) for r in range(world)
            ],
            "raw memmap slices, int64": lambda s: raw_batch(maps, pieces[s], np.int64),
            "raw memmap slices, uint16 copy": lambda s: raw_batch(maps, pieces[s], np.uint16),
        }
        tokens_per_step = SEQS_PER_STEP * SEQ_LEN
        print(f"\n{steps:,} steps of {SEQS_PER_STEP} x {SEQ_LEN} tokens\n")
        print(f"{'method':<40} {'batches/s':>10} {'Mtokens/s':>10}")
        for name, fn in methods.items():
            secs = timed(fn, steps)
            print(f"{name:<40} {steps / secs:>10,.0f} {steps * tokens_per_step / secs / 1e6:>10,.0f}")


if __name__ == "__main__":
    main()
