"""The training-side loader against output directories written here with numpy, straight from the format's
description: shards of different block counts chained by their overlap token, documents spanning shard
boundaries, a document starting exactly on the overlap token, uint16 and uint32."""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tokmix.data import HoldoutWindows, TrainBlocks, bits_per_byte, to_torch, torch_batches
from tokmix.errors import TokmixError

SEQ_LEN = 16
SEQS_PER_STEP = 8
TRAIN_STEPS = 10
MARGIN_STEPS = 3
# 104 blocks: steps 4 and 7 straddle shard boundaries, step 7 spans three shards (one holds a single block)
SHARD_BLOCKS = [37, 20, 1, 46]
EVAL_WINDOWS = {"web": 7, "code": 5}


@dataclass
class Run:
    root: Path
    dtype: np.dtype
    stream: np.ndarray  # the train tokens in order, each once
    shard_files: list[Path]
    val: dict[str, np.ndarray]
    byte_len: np.ndarray  # UTF-8 bytes of each token id


def _documents(rng: np.random.Generator, n_tokens: int, vocab: int, long_at: int | None = None) -> np.ndarray:
    """EOT-prefixed documents of 2..6*S tokens, cut to n_tokens; a document of 25*S tokens starts exactly at
    `long_at`."""
    out, pos = [], 0
    while pos < n_tokens:
        n = int(rng.integers(2, 6 * SEQ_LEN))
        if long_at is not None and pos < long_at:
            n = max(2, min(n, long_at - pos))
            if long_at - pos - n == 1:  # a 1-token document cannot exist: take the token too
                n += 1
        elif pos == long_at:
            n = 25 * SEQ_LEN
        out.append(np.concatenate([[0], rng.integers(1, vocab, n - 1)]))
        pos += n
    return np.concatenate(out)[:n_tokens]


def build_run(
    root: Path,
    dtype: str = "uint16",
    shard_blocks: list[int] = SHARD_BLOCKS,
    train_steps: int = TRAIN_STEPS,
    margin_steps: int = MARGIN_STEPS,
    seed: int = 0,
) -> Run:
    """An output directory as tokmix writes it: train_XXX.bin, val_<domain>.bin, index.json."""
    root.mkdir(parents=True, exist_ok=True)
    dt = np.dtype(dtype)
    vocab = 1 << 16 if dt == np.uint16 else 200_000  # every uint16 id, and uint32 ids past 65535
    rng = np.random.default_rng(seed)
    byte_len = rng.integers(1, 9, vocab)
    byte_len[0] = 0
    total_blocks = sum(shard_blocks)
    stream = _documents(rng, total_blocks * SEQ_LEN + 1, vocab, long_at=shard_blocks[0] * SEQ_LEN).astype(dt)
    shard_entries, files, first = [], [], 0
    for k, b in enumerate(shard_blocks):
        tokens = stream[first * SEQ_LEN : (first + b) * SEQ_LEN + 1]
        files.append(root / f"train_{k:03d}.bin")
        tokens.tofile(files[-1])
        shard_entries.append({"file": files[-1].name, "tokens": len(tokens), "blocks": b, "tokens_by_stream": {}})
        first += b
    val, val_entries = {}, {}
    for domain, windows in EVAL_WINDOWS.items():
        n = windows * SEQ_LEN + 1 + int(rng.integers(0, 40))
        val[domain] = _documents(rng, n, vocab).astype(dt)
        val[domain].tofile(root / f"val_{domain}.bin")
        targets = val[domain][1:]
        val_entries[domain] = {
            "file": f"val_{domain}.bin",
            "tokens": n,
            "targets": n - 1,
            "docs": int((val[domain] == 0).sum()),
            "bytes": int(byte_len[targets].sum()),
            "eval_windows": windows,
            "eval_targets": windows * SEQ_LEN,
            "eval_bytes": int(byte_len[targets[: windows * SEQ_LEN]].sum()),
            "tokens_by_stream": {},
            "source_files": [],
        }
    index = {
        "dtype": dtype,
        "seq_len": SEQ_LEN,
        "block": SEQ_LEN + 1,
        "stride": SEQ_LEN,
        "eot_id": 0,
        "seed": seed,
        "blocks": total_blocks,
        "train_steps": train_steps,
        "seqs_per_step": SEQS_PER_STEP,
        "margin_steps": margin_steps,
        "shards": shard_entries,
        "val": val_entries,
    }
    (root / "index.json").write_text(json.dumps(index, indent=2))
    return Run(root, dt, stream, files, val, byte_len)


@pytest.fixture(params=["uint16", "uint32"])
def run(request, tmp_path) -> Run:
    return build_run(tmp_path / "out", request.param)


def test_fixture_has_the_cases_it_claims(run):
    assert run.stream[0] == 0 and run.stream[SHARD_BLOCKS[0] * SEQ_LEN] == 0  # a document starts on the overlap
    assert run.stream.max() >= (60_000 if run.dtype == np.uint16 else 70_000)
    # the document starting on the overlap token runs through shards 1 and 2 into shard 3
    assert (run.stream[SHARD_BLOCKS[0] * SEQ_LEN + 1 : sum(SHARD_BLOCKS[:3]) * SEQ_LEN + 1] != 0).all()


def test_every_block_is_the_shard_slice_it_names(run):
    loader = TrainBlocks(run.root)
    assert loader.blocks == sum(SHARD_BLOCKS) and loader.dtype == run.dtype
    j = 0
    for k, b in enumerate(SHARD_BLOCKS):
        raw = run.shard_files[k].read_bytes()
        size = run.dtype.itemsize
        for local in range(b):
            start = local * SEQ_LEN * size
            block = loader.block(j)
            assert block.dtype == run.dtype
            assert block.tobytes() == raw[start : start + (SEQ_LEN + 1) * size]
            assert np.array_equal(block, run.stream[j * SEQ_LEN : j * SEQ_LEN + SEQ_LEN + 1])
            assert loader.locate(j) == (k, local * SEQ_LEN)
            j += 1
    with pytest.raises(TokmixError, match="does not exist"):
        loader.block(j)


def test_batches_read_blocks_in_order_across_shard_boundaries(run):
    loader = TrainBlocks(run.root)
    for step in range(loader.physical_steps):
        x, y = loader.batch(step)
        assert x.shape == y.shape == (SEQS_PER_STEP, SEQ_LEN) and x.dtype == y.dtype == np.int64
        for i in range(SEQS_PER_STEP):
            block = loader.block(step * SEQS_PER_STEP + i).astype(np.int64)
            assert np.array_equal(x[i], block[:-1]) and np.array_equal(y[i], block[1:])


def test_steps_and_margin_cover_the_stream_once(run):
    """Every block of train_steps + margin_steps is read once and none repeats: the x rows laid end to end,
    plus the last target, are the train stream itself."""
    loader = TrainBlocks(run.root)
    assert loader.physical_steps == TRAIN_STEPS + MARGIN_STEPS
    xs, ys = zip(*(loader.batch(s) for s in range(TRAIN_STEPS)))
    loader.skip(MARGIN_STEPS)
    # after skipping the whole margin the last logical step reads the last physical step
    x_last, y_last = loader.batch(TRAIN_STEPS - 1)
    tail = [TrainBlocks(run.root).batch(s) for s in range(TRAIN_STEPS, TRAIN_STEPS + MARGIN_STEPS)]
    x_all = np.concatenate([*xs, *(x for x, _ in tail)])
    assert np.array_equal(np.append(x_all.ravel(), tail[-1][1][-1, -1]), run.stream)
    assert np.array_equal(x_last, tail[-1][0]) and np.array_equal(y_last, tail[-1][1])
    assert len({r.tobytes() for r in x_all}) == len(x_all)


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_ranks_partition_each_step(run, world_size):
    loader = TrainBlocks(run.root)
    for step in range(loader.physical_steps):
        full_x, full_y = loader.batch(step)
        parts = [loader.batch(step, rank, world_size) for rank in range(world_size)]
        assert all(x.shape == (SEQS_PER_STEP // world_size, SEQ_LEN) for x, _ in parts)
        assert np.array_equal(np.concatenate([x for x, _ in parts]), full_x)
        assert np.array_equal(np.concatenate([y for _, y in parts]), full_y)
    # the rank and world size given to the loader are its defaults
    r = TrainBlocks(run.root, rank=world_size - 1, world_size=world_size)
    assert np.array_equal(r.batch(3)[0], loader.batch(3, world_size - 1, world_size)[0])


def test_bad_rank_or_world_size_is_refused(run):
    with pytest.raises(TokmixError, match="does not divide seqs_per_step"):
        TrainBlocks(run.root, world_size=3)
    loader = TrainBlocks(run.root)
    with pytest.raises(TokmixError, match="does not divide"):
        loader.batch(0, 0, 3)
    with pytest.raises(TokmixError, match="outside world_size"):
        loader.batch(0, 2, 2)


def test_skip_consumes_the_margin_and_is_refused_past_it(run):
    loader = TrainBlocks(run.root)
    reference = TrainBlocks(run.root)
    loader.skip(2)
    assert np.array_equal(loader.batch(5)[0], reference.batch(7)[0])
    loader.skip(1)
    assert loader.skipped == MARGIN_STEPS
    with pytest.raises(TokmixError, match="margin"):
        loader.skip(1)
    with pytest.raises(TokmixError, match="past the last block"):
        loader.batch(TRAIN_STEPS)
    with pytest.raises(TokmixError, match="past the last block"):
        reference.batch(TRAIN_STEPS + MARGIN_STEPS)
    with pytest.raises(TokmixError, match="negative"):
        reference.batch(-1)


def _train(loader: TrainBlocks, skip_at: dict[int, int], stop_after: int | None = None):
    """A training loop: the NaN guard skips at some steps; returns the batches it trained on."""
    seen = []
    for x, y in loader:
        step = loader.step - 1
        seen.append((step, x, y))
        if step in skip_at:
            loader.skip(skip_at[step])
        if step == stop_after:
            break
    return seen


@pytest.mark.parametrize("stop_after", [0, 3, 4, 8])
def test_resume_returns_the_batches_of_the_uninterrupted_run(run, stop_after):
    skip_at = {2: 1, 5: 2}
    full = _train(TrainBlocks(run.root, rank=1, world_size=2), skip_at)
    assert [s for s, _, _ in full] == list(range(TRAIN_STEPS))  # the margin absorbed the skips

    first = TrainBlocks(run.root, rank=1, world_size=2)
    head = _train(first, skip_at, stop_after)
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    resumed = TrainBlocks(run.root, rank=1, world_size=2)
    resumed.load_state_dict(state)
    tail = _train(resumed, skip_at)
    assert len(head) + len(tail) == len(full)
    for (s1, x1, y1), (s2, x2, y2) in zip(head + tail, full):
        assert s1 == s2 and np.array_equal(x1, x2) and np.array_equal(y1, y2)


def test_state_of_another_run_is_refused(run, tmp_path):
    other = build_run(tmp_path / "other", shard_blocks=[50, 30], train_steps=9, margin_steps=1)
    with pytest.raises(TokmixError, match="blocks"):
        TrainBlocks(run.root).load_state_dict(TrainBlocks(other.root).state_dict())


def test_short_run_iterates_until_its_blocks_run_out(tmp_path):
    short = build_run(tmp_path / "short", shard_blocks=[20, 5], train_steps=TRAIN_STEPS, margin_steps=0)
    loader = TrainBlocks(short.root)
    assert loader.steps == 3 and len(list(loader)) == 3
    with pytest.raises(TokmixError, match="margin"):
        loader.skip(1)


def test_pickled_loader_carries_no_tokens(run):
    loader = TrainBlocks(run.root)
    loader.batch(0)  # opens the memory maps
    data = pickle.dumps(loader)
    assert len(data) < 4096
    assert np.array_equal(pickle.loads(data).batch(5)[1], loader.batch(5)[1])


def test_broken_directories_fail_clearly(run, tmp_path):
    with pytest.raises(TokmixError, match="no index.json"):
        TrainBlocks(tmp_path / "nowhere")
    with open(run.shard_files[2], "r+b") as f:
        f.truncate(run.dtype.itemsize * 3)
    with pytest.raises(TokmixError, match="train_002.bin"):
        TrainBlocks(run.root)


def test_holdout_windows_are_the_first_eval_targets(run):
    holdouts = HoldoutWindows(run.root)
    assert holdouts.domains() == list(EVAL_WINDOWS)
    for domain, windows in EVAL_WINDOWS.items():
        tokens = run.val[domain]
        for i in range(windows):
            assert np.array_equal(holdouts.window(i, domain), tokens[i * SEQ_LEN : i * SEQ_LEN + SEQ_LEN + 1])
        for world_size in (1, 2, 3):
            ys = [y for rank in range(world_size) for _, y in holdouts.batches(3, domain, rank, world_size)]
            assert np.array_equal(np.concatenate(ys).ravel(), tokens[1 : windows * SEQ_LEN + 1])
        xs = [x for x, _ in holdouts.batches(3, domain)]
        assert [len(x) for x in xs] == [3] * (windows // 3) + ([windows % 3] if windows % 3 else [])
        assert np.array_equal(np.concatenate(xs).ravel(), tokens[: windows * SEQ_LEN])


def test_bits_per_byte_of_a_known_loss_is_exact(run):
    """A model whose loss on each target is ln 2 times the target's bytes spends one bit per byte."""
    for domain in EVAL_WINDOWS:
        holdouts = HoldoutWindows(run.root, domain)
        nll = sum(float(np.log(2) * run.byte_len[y].sum()) for _, y in holdouts.batches(4))
        assert holdouts.bits_per_byte(nll) == pytest.approx(1.0, rel=1e-12)
        eval_bytes = holdouts.eval_bytes()
        assert holdouts.bits_per_byte(1234.5) == 1234.5 / math.log(2) / eval_bytes
        assert bits_per_byte(1234.5, eval_bytes) == holdouts.bits_per_byte(1234.5, domain)
    with pytest.raises(TokmixError, match="no holdout 'math'"):
        HoldoutWindows(run.root, "math")


def test_torch_glue_without_torch_says_so(run):
    """Runs whether or not torch is installed: a fresh interpreter where `import torch` fails."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from tokmix.data import TrainBlocks, to_torch, torch_batches\n"
        "from tokmix.errors import TokmixError\n"
        f"loader = TrainBlocks({str(run.root)!r})\n"
        "for call in (lambda: to_torch(loader.batch(0)), lambda: torch_batches(loader)):\n"
        "    try:\n"
        "        call()\n"
        "        print('no error')\n"
        "    except TokmixError as e:\n"
        "        print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["PyTorch is not installed; the numpy batches need no torch"] * 2


def test_torch_batches_are_the_numpy_batches_as_int64_tensors(run):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    x, y = to_torch(TrainBlocks(run.root).batch(3))
    want_x, want_y = TrainBlocks(run.root).batch(3)
    assert x.dtype == y.dtype == torch.int64
    assert np.array_equal(x.numpy(), want_x) and np.array_equal(y.numpy(), want_y)
    loader = TrainBlocks(run.root, rank=1, world_size=2)
    loader.skip(1)  # the loader's own skips and positions act through the torch iterator
    got = [(x.numpy().copy(), y.numpy().copy()) for x, y in torch_batches(loader)]
    reference = TrainBlocks(run.root, rank=1, world_size=2)
    reference.skip(1)
    want = list(reference)
    assert len(got) == len(want) == TRAIN_STEPS
    assert all(np.array_equal(a, c) and np.array_equal(b, d) for (a, b), (c, d) in zip(got, want))


def test_the_loader_imports_numpy_and_the_format_alone():
    code = (
        "import sys, tokmix.data; "
        "print(sorted(m for m in sys.modules if m.startswith('tokmix'))); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'pyarrow', 'tokenizers', 'ray', 'torch', 'pydantic', 'fsspec', 'typer', 'rich'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    tokmix_modules, heavy = out.splitlines()
    # the format's modules: shards and tokens (with store, its paths on an object store, fsspec imported only
    # there) and the provenance index (with tokmix.text, a leaf of no tokmix import: its CRC-32)
    format_modules = {"tokmix.shards", "tokmix.tokens", "tokmix.store", "tokmix.errors", "tokmix.provenance",
                      "tokmix.text", "tokmix.format", "tokmix.format.records", "tokmix.format.commit"}
    assert set(eval(tokmix_modules)) <= {"tokmix", "tokmix.data", *format_modules}
    assert eval(heavy) == []
