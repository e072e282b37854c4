"""The balanced interleave (docs/format.md, "The balanced interleave"): on a real corpus of parquet and JSONL
streams with long documents, every stream stays within one document of its target at every document boundary,
the shards are the streams' documents in the labelled order byte for byte, index.json records the realized
deviation, and the bytes do not depend on the workers, the executor or a kill -9 and resume. The rule's bound is
also checked on heavy-tailed lengths far past the corpus's, with fixed shares and with a schedule's ramps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokmix
from tests.corpus import make_corpus, train_test_tokenizer, write_recipe, write_split
from tokmix.interleave import Deviation, Mix, balanced_chunks
from tokmix.report import gather

ROOT = Path(__file__).resolve().parents[1]
JSONL_STREAM = "code_other"  # its files are written as JSONL, the other streams' stay parquet


def outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted([*out.glob("*.bin"), *out.glob("*.docs")])}


def _long(name: str) -> str:
    return " ".join(f"{name} long document word {i}" for i in range(1200))


def _with_long_documents(files: dict[str, list[Path]]) -> None:
    """A long document (~6,000 tokens, 4-6x a stream's longest otherwise) early in the first file of two parquet
    streams; one stream's parquet files rewritten as JSONL (same texts, same order, and a long document)."""
    for name in ("dclm", "edu"):
        table = pq.read_table(files[name][0])
        texts = table["text"].to_pylist()
        texts.insert(4, _long(name))
        pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), files[name][0], row_group_size=16)
    for i, path in enumerate(files[JSONL_STREAM]):
        texts = pq.read_table(path)["text"].to_pylist()
        if i == 0:
            texts.insert(10, _long(JSONL_STREAM))
        target = path.with_suffix(".jsonl")
        target.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        path.unlink()
        files[JSONL_STREAM][i] = target


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Parquet streams and a JSONL one, each with a ~6,000-token document among its short ones (tests/corpus.py);
    a recipe with interleave = "balanced"."""
    root = tmp_path_factory.mktemp("balanced")
    files = make_corpus(root, doc_limit=300, rows_per_group=16)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    _with_long_documents(files)
    write_split(root, files)
    recipe = write_recipe(root, "tokenizer/tokenizer.json", interleave='"balanced"')
    text = recipe.read_text().replace('code_other/*.parquet', 'code_other/*.jsonl')
    recipe.write_text(text)
    return recipe


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("balanced-run")
    tokmix.run(tokmix.load_recipe(corpus), out, workers=2, keep_streams=True)
    return out


def _stream_documents(out: Path, name: str) -> list[np.ndarray]:
    units = sorted((out / "streams" / name / "units").glob("*.tok"))
    tokens = np.concatenate([np.fromfile(u, dtype=np.uint16) for u in units])
    lengths = np.concatenate([np.fromfile(u.with_suffix(".len"), dtype="<u4") for u in units]).astype(np.int64)
    return np.split(tokens, np.cumsum(lengths)[:-1])


def test_every_stream_stays_within_one_document_of_its_target_at_every_boundary(run):
    """The shards are the streams' documents (from the units kept) in the order of the labels assemble wrote;
    at every document boundary of that order, every stream's tokens are within the longest document of
    share x position, and index.json records exactly the worst deviations that order has."""
    index = json.loads((run / "index.json").read_text())
    names = list(index["mix"]["streams"])
    shares = np.array([index["mix"]["target_share_by_stream"][n] for n in names])
    docs = {n: _stream_documents(run, n) for n in names}
    labels = np.fromfile(run / "streams" / "interleave.labels", dtype=np.uint8)
    taken, flat = dict.fromkeys(names, 0), []
    for label in labels.tolist():
        flat.append(docs[names[label]][taken[names[label]]])
        taken[names[label]] += 1
    assert taken == index["mix"]["documents_used"]
    lengths = np.array([len(d) for d in flat], dtype=np.int64)
    flat = np.concatenate(flat)
    start = 0
    for shard in index["shards"]:
        got = np.fromfile(run / shard["file"], dtype=np.uint16)
        assert np.array_equal(got, flat[start : start + len(got)]), shard["file"]
        start += len(got) - 1
    end = start + 1  # the run's tokens
    ends = np.cumsum(lengths)
    per = np.zeros((len(labels), len(names)), dtype=np.int64)
    per[np.arange(len(labels)), labels] = lengths
    deviation = np.cumsum(per, axis=0)[ends <= end] - ends[ends <= end, None] * shares
    longest = max(len(d) for n in names for d in docs[n][: taken[n] + 1])
    assert longest > 4000  # the corpus's long documents are among those the bound is over
    assert np.abs(deviation).max() <= longest
    over = np.maximum(shares * 0, deviation.max(axis=0))
    under = np.maximum(shares * 0, -deviation.min(axis=0))
    balance = index["mix"]["balance"]
    assert balance["bound_tokens"] == longest
    assert [balance["over_by_stream"][n] for n in names] == pytest.approx(over.tolist(), abs=0.06)
    assert [balance["under_by_stream"][n] for n in names] == pytest.approx(under.tolist(), abs=0.06)
    for k in (1, len(names) - 1):  # the constant-share bound is tighter above: (1 - share) x the longest
        assert over[k] <= (1 - shares[k]) * longest


def test_the_report_tells_the_streams_apart_from_the_provenance_index(run):
    """A balanced order depends on the lengths: the report's scan of the shards reads each document's stream from
    the provenance index, and its per-stream tokens are index.json's (gather raises otherwise)."""
    index, facts = gather(run, scan=True)
    assert {n: f.tokens_in_shards for n, f in facts.items()} == index["total"]["tokens_by_stream"]


def test_the_bytes_do_not_depend_on_workers_or_executor(corpus, run, tmp_path):
    """One worker process with other units against the module's run (two threads)."""
    tokmix.run(tokmix.load_recipe(corpus), tmp_path, workers=1, executor="processes", unit_bytes=20_000)
    assert outputs(tmp_path) == outputs(run)


def test_kill_9_in_assemble_then_resume_ends_identical(corpus, run, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_FAULT": "assemble:after-rename:2"}
    command = [sys.executable, "-m", "tokmix.cli", "run", str(corpus), "--out", str(tmp_path), "--workers", "2"]
    killed = subprocess.run(command, capture_output=True, text=True, env=env, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    del env["TOKMIX_FAULT"]
    resumed = subprocess.run(command, capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert outputs(tmp_path) == outputs(run)


def _order(lengths: list[np.ndarray], mix: Mix, tokens: int) -> Deviation:
    at = [0] * len(lengths)

    def taker(s):
        def take(n):
            at[s] += n
            return lengths[s][at[s] - n : at[s]]
        return take

    deviation = Deviation(mix, tokens)
    for labels, took in balanced_chunks([taker(s) for s in range(len(lengths))], [len(x) for x in lengths], mix,
                                        7, tokens, chunk=4096):
        deviation.feed(labels, took)
    return deviation


@pytest.mark.parametrize("shares", [[0.45, 0.35, 0.07, 0.13], [0.97, 0.01, 0.01, 0.01], [0.5, 0.5]])
def test_the_bound_holds_for_heavy_tailed_lengths(shares):
    """Pareto lengths (a few documents 1000x the median): the worst deviation of every stream, above and below
    its target, stays within the longest document."""
    rng = np.random.default_rng(len(shares))
    lengths = [np.minimum((rng.pareto(0.9, 20_000) * 40).astype(np.int64) + 1, 400_000) for _ in shares]
    tokens = int(min(x.sum() / w for x, w in zip(lengths, shares)) * 0.95)
    deviation = _order(lengths, Mix.fixed(shares), tokens)
    assert deviation.longest > 50_000
    assert max(deviation.over.max(), deviation.under.max()) <= deviation.longest
    assert np.all(deviation.over <= (1 - np.array(shares)) * deviation.longest + 1e-6)


def test_the_bound_holds_through_a_schedule_with_ramps_and_a_stream_at_zero():
    """A mix that changes along the run (a ramp of many small pieces, then a stretch where one stream's share is
    0): every stream stays within the longest document of its target, the integral of its share."""
    rng = np.random.default_rng(3)
    lengths = [np.minimum((rng.pareto(1.1, 30_000) * 60).astype(np.int64) + 1, 100_000) for _ in range(3)]
    ramp = [(200_000 + 10_000 * i, (0.5 - 0.02 * i, 0.3, 0.2 + 0.02 * i)) for i in range(10)]
    pieces = [(0, (0.5, 0.3, 0.2)), *ramp, (300_000, (0.3, 0.3, 0.4)), (900_000, (0.0, 0.6, 0.4))]
    mix = Mix(tuple(p for p, _ in pieces), tuple(s for _, s in pieces))
    deviation = _order(lengths, mix, 1_500_000)
    assert max(deviation.over.max(), deviation.under.max()) <= deviation.longest
    target = mix.target(np.array([1_500_000]))[0]
    assert target.sum() == pytest.approx(1_500_000)
