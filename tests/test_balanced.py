"""The balanced interleave (docs/format.md, "The balanced interleave") and schedules (docs/recipe.md,
"Schedules"): on a real corpus of parquet and JSONL streams with long documents, every stream stays within one
document of its target at every document boundary, the shards are the streams' documents in the labelled order
byte for byte, index.json records the realized deviation; a 3-phase schedule (a ramp, a long-context phase) is
exact per phase, and its bytes do not depend on the workers, the executor, the unit size or kill -9 + resume (in
the streams and in assemble); the loader, trace and the exports take each phase its own blocks. The rule's bound
is also checked on heavy-tailed lengths far past the corpus's, with fixed shares and with a schedule's ramps.
Every run here is one of two module runs (balanced, scheduled) or is compared with one."""

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
from tests.corpus import make_corpus, train_test_tokenizer, with_schedule, write_recipe, write_split
from tests.test_export import read_llmc, read_megatron
from tokmix.data import TrainBlocks
from tokmix.export import export_llmc, export_megatron
from tokmix.interleave import Deviation, Mix, balanced_chunks
from tokmix.report import gather
from tokmix.trace import step_blocks, token_block, trace_blocks

ROOT = Path(__file__).resolve().parents[1]
JSONL_STREAM = "code_other"  # its files are written as JSONL, the other streams' stay parquet
# 150 steps of 8 x 64 (~79k train tokens): the longest document (~4,000 tokens) is ~5% of the run, so the bound
# says something about every stream (a smaller run's longest document was most of it)
LAYOUT = {"steps": 150, "interleave": '"balanced"'}


def outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted([*out.glob("*.bin"), *out.glob("*.docs")])}


def _long(name: str) -> str:
    return " ".join(f"{name} long document word {i}" for i in range(256))


def _with_long_documents(files: dict[str, list[Path]]) -> None:
    """A long document (~4,000 tokens, longer than any other of its stream) early in the first file of two
    parquet streams; one stream's parquet files rewritten as JSONL (same texts, same order, and a long one)."""
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
    """Parquet streams and a JSONL one, each with a ~4,000-token document among its short ones (tests/corpus.py);
    a recipe with interleave = "balanced"."""
    root = tmp_path_factory.mktemp("balanced")
    files = make_corpus(root, doc_limit=600, rows_per_group=16)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    _with_long_documents(files)
    write_split(root, files)
    recipe = write_recipe(root, "tokenizer/tokenizer.json", **LAYOUT)
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
    long = [max(len(d) for d in docs[n][: taken[n]]) for n in ("dclm", "edu", JSONL_STREAM)]
    assert min(long) > 3500 and longest < end / 15  # the long documents are in the run, and a small part of it
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
    assert {n: f.tokens_in_shards for n, f in facts.items()} == index.total.tokens_by_stream


def test_the_report_of_a_schedule_gives_each_phase_its_own_layout(scheduled):
    """The report of the 3-phase run: its overview says each phase's blocks, their length and its sequences per
    step (a long-context phase's are not the layout's), the schedule table each phase's steps, ramp, seq_len and
    margin; the shard scan's per-stream tokens are index.json's. (The page itself, plots included, is
    test_report's: its lines are checked here without drawing them.)"""
    from tokmix.report import _blocks_line, _schedule_table, _steps_line

    index, facts = gather(scheduled, scan=True)
    assert {n: f.tokens_in_shards for n, f in facts.items()} == index.total.tokens_by_stream
    assert _blocks_line(index) == "1,184 blocks (main 752 of 64, anneal 320 of 64, final 112 of 128 tokens)"
    assert _steps_line(index) == ("150 in 3 phases (main 90 x 8, anneal 36 x 8, final 24 x 4 sequences), each with "
                                  "its own margin")
    row = "<td>final</td><td>126-150</td><td>0</td><td>4</td><td>128</td><td>4</td>"
    assert row in _schedule_table(index).replace("<td class=\"l\">", "<td>")


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


SCHEDULE = """
[[schedule]]
name = "main"
steps = 90
shares = { dclm = 0.45, edu = 0.35, code_py = 0.07, code_other = 0.13 }

[[schedule]]
name = "anneal"
steps = 36
ramp_steps = 12
shares = { dclm = 0.2, edu = 0.5, code_py = 0.1, code_other = 0.2 }

[[schedule]]
name = "final"
steps = 24
seq_len = 128
shares = { edu = 0.7, code_py = 0.1, code_other = 0.2 }
"""


@pytest.fixture(scope="module")
def scheduled(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scheduled-run")
    tokmix.run(tokmix.load_recipe(with_schedule(corpus, SCHEDULE)), out, workers=2, keep_streams=True)
    return out


def _step_targets(index: dict, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token positions of every step boundary (margins included) and every stream's target there, from the
    phases' shares: a ramp step's share is the linear ramp's at the step's middle."""
    positions, targets, at, total, previous = [0], [np.zeros(len(names))], 0, np.zeros(len(names)), None
    for phase in index["phases"]:
        shares = np.array([phase["requested_share_by_stream"][n] for n in names])
        step_tokens = phase["seqs_per_step"] * phase["seq_len"]
        for t in range(phase["steps"][1] - phase["steps"][0] + phase["margin_steps"]):
            share = shares if t >= phase["ramp_steps"] else previous + (shares - previous) * (t + 0.5) / phase[
                "ramp_steps"]
            at, total = at + step_tokens, total + share * step_tokens
            positions.append(at)
            targets.append(total)
        previous = shares
    return np.array(positions, dtype=np.float64), np.array(targets)


def test_a_schedule_is_exact_per_phase_and_within_one_document_at_every_boundary(scheduled):
    """Three phases (a ramp, then a phase without one stream): every stream within the longest document of the
    integral of its share at every document boundary; each phase's realized tokens as index.json records them,
    within its two ends' bound of its target (a stream at share 0 too); each shard is one phase's; validate
    accepts the run."""
    index = json.loads((scheduled / "index.json").read_text())
    names = list(index["mix"]["streams"])
    docs = {n: _stream_documents(scheduled, n) for n in names}
    labels = np.fromfile(scheduled / "streams" / "interleave.labels", dtype=np.uint8)
    lengths = np.array([len(docs[names[s]][i]) for s, i in zip(labels, _occurrence(labels))], dtype=np.int64)
    ends = np.cumsum(lengths)
    end = index["blocks"] * index["seq_len"] + 1
    per = np.zeros((len(labels), len(names)), dtype=np.int64)
    per[np.arange(len(labels)), labels] = lengths
    cum = np.cumsum(per, axis=0)
    positions, targets = _step_targets(index, names)
    inside = ends <= end
    target_at = np.stack([np.interp(ends[inside], positions, targets[:, s]) for s in range(len(names))], axis=1)
    longest = index["mix"]["balance"]["bound_tokens"]
    assert np.abs(cum[inside] - target_at).max() <= longest
    before = np.zeros(len(names), dtype=np.int64)
    for phase in index["phases"]:
        stop = phase["tokens"][1]
        d = int(np.searchsorted(ends, stop, side="left"))  # the document holding the phase's last token
        at = cum[d] - per[d]
        at[labels[d]] += stop - (ends[d] - lengths[d])
        realized = at - before
        assert realized.tolist() == [phase["tokens_by_stream"][n] for n in names], phase["name"]
        for s, n in enumerate(names):
            assert abs(realized[s] - phase["target_tokens_by_stream"][n]) <= 2 * longest
        before = at
        for shard in index["shards"][phase["shards"][0] : phase["shards"][1]]:
            assert shard["phase"] == phase["name"] and shard["seq_len"] == phase["seq_len"]
    final = index["phases"][-1]
    # a stream at share 0 in a phase: within one document of its target there (it may enter the phase under it)
    assert final["requested_share_by_stream"]["dclm"] == 0 and final["tokens_by_stream"]["dclm"] <= longest
    assert [p["name"] for p in index["phases"]] == ["main", "anneal", "final"]
    assert index["blocks"] == (90 + 4 + 36 + 4) * 8 + (24 + 4) * 4  # every phase has its own margin_steps
    long = index["shards"][final["shards"][0] : final["shards"][1]]
    assert final["seq_len"] == 128 and final["seqs_per_step"] == 4  # a step holds the same 512 tokens
    for shard in long:  # the long-context phase's shards hold blocks of its own seq_len
        assert shard["tokens"] == shard["blocks"] * 128 + 1
        assert (scheduled / shard["file"]).stat().st_size == shard["tokens"] * 2
    from typer.testing import CliRunner

    from tokmix.cli import app

    validated = CliRunner().invoke(app, ["validate", str(scheduled)])  # the command, in this process
    assert validated.exit_code == 0 and "valid (" in validated.output, validated.output


def _occurrence(labels: np.ndarray) -> np.ndarray:
    """For each label, how many of its stream came before it."""
    out = np.empty(len(labels), dtype=np.int64)
    for s in np.unique(labels):
        where = labels == s
        out[where] = np.arange(int(where.sum()))
    return out


def test_the_loader_gives_each_step_its_phase_and_skips_within_it(scheduled):
    """TrainBlocks: a step's phase and blocks; a skip takes the current phase's margin only, and the next phase
    starts at its own first block; a resumed loader continues exactly."""
    loader = TrainBlocks(scheduled)
    assert loader.steps == 150
    assert [loader.phase(s) for s in (0, 89, 90, 125, 126, 149)] == ["main", "main", "anneal", "anneal", "final",
                                                                     "final"]
    assert loader.step_blocks(90) == range(752, 760)  # anneal starts after main's 90 + 4 margin steps
    loader.step = 86
    loader.skip(4)
    assert loader.step_blocks(89) == range(93 * 8, 94 * 8)  # main's last margin step
    with pytest.raises(tokmix.TokmixError, match="phase main's 4 margin steps are used"):
        loader.skip(1)
    assert loader.step_blocks(90) == range(752, 760)  # the skip does not reach into the next phase
    loader.step = 100
    loader.skip(2)
    state = loader.state_dict()
    again = TrainBlocks(scheduled)
    again.load_state_dict(state)
    assert again.step_blocks(101) == loader.step_blocks(101) == range(752 + 13 * 8, 752 + 14 * 8)
    x, _ = again.batch(101)
    assert x.shape == (8, 64)
    x, y = again.batch(149)  # the long-context phase: its shapes
    assert x.shape == (4, 128) and np.array_equal(x[0, 1:], y[0, :-1])
    first = again.step_blocks(126).start
    assert np.array_equal(again.block(first)[:-1], again.batch(126)[0][0])
    index = json.loads((scheduled / "index.json").read_text())
    long = index["phases"][-1]
    assert token_block(scheduled, long["tokens"][0] + 3 * 128 + 5) == (long["blocks"][0] + 3, 5)
    assert token_block(scheduled, long["tokens"][0] - 1) == (long["blocks"][0] - 1, 63)


def test_trace_step_takes_each_phase_its_own_blocks_and_names_it(scheduled):
    """`trace --step` on ranks of a world of 2, after skips: a step's blocks are its phase's (its own
    seqs_per_step and seq_len, the skips of that phase), as index.json's phases give them, each block's documents
    hold its phase's seq_len + 1 tokens, and the step's summary names the phase."""
    from typer.testing import CliRunner

    from tokmix.cli import app

    phases = json.loads((scheduled / "index.json").read_text())["phases"]
    for step, skipped in ((5, 0), (89, 4), (90, 0), (130, 3), (149, 4)):
        phase = next(p for p in phases if p["steps"][0] <= step < p["steps"][1])
        seqs, half = phase["seqs_per_step"], phase["seqs_per_step"] // 2
        first = phase["blocks"][0] + (step - phase["steps"][0] + skipped) * seqs + half
        assert step_blocks(scheduled, step, 1, 2, skipped) == list(range(first, first + half)), step
        traced = trace_blocks(scheduled, [first])[0]
        assert sum(d.tokens for d in traced.documents) == phase["seq_len"] + 1
    shown = CliRunner().invoke(app, ["trace", str(scheduled), "--step", "130", "--rank", "1", "--world-size", "2"])
    assert shown.exit_code == 0, shown.output
    flat = " ".join(shown.output.split())  # the step's summary opens it, its head line naming the phase
    assert flat.startswith("step 130, rank 1 of 2: ") and "; phase final (steps 126-150, seq_len 128, " in flat
    assert flat.index("; phase final") < flat.index("block "), flat[:400]
    refused = CliRunner().invoke(app, ["trace", str(scheduled), "--step", "100", "--skipped", "5"])
    assert refused.exit_code != 0 and "phase anneal's 4 margin steps" in refused.output


def _phase_tokens(scheduled: Path, phase: dict) -> np.ndarray:
    """A phase's tokens as its shards hold them: its first shard whole, each later one after its overlap token."""
    files = [scheduled / s["file"] for s in json.loads((scheduled / "index.json").read_text())["shards"]]
    return np.concatenate([np.fromfile(files[k], np.uint16)[k > phase["shards"][0] :] for k in range(*phase["shards"])])


def test_the_exports_are_one_dataset_per_phase(scheduled, tmp_path):
    """Megatron: one .bin/.idx per phase, whose sequences are the documents (from the units, in the labelled
    order) cut at the phase's ends, laid end to end its blocks' tokens exactly; llm.c: each phase's shards as
    tokmix_<phase>_train_XXX.bin, the shard's tokens verbatim; the holdouts as for any run."""
    index = json.loads((scheduled / "index.json").read_text())
    names = list(index["mix"]["streams"])
    docs = {n: _stream_documents(scheduled, n) for n in names}
    labels = np.fromfile(scheduled / "streams" / "interleave.labels", dtype=np.uint8)
    flat = np.concatenate([docs[names[s]][i] for s, i in zip(labels, _occurrence(labels))])
    starts = np.cumsum([0, *(len(docs[names[s]][i]) for s, i in zip(labels, _occurrence(labels)))])
    written = export_megatron(scheduled, tmp_path / "m" / "run")
    assert sorted(p.name for p in written) == sorted(f"run_{n}.{e}" for n in [p["name"] for p in index["phases"]]
                                                     + [f"val_{d}" for d in index["val"]] for e in ("bin", "idx"))
    for phase in index["phases"]:
        a, S = phase["tokens"][0], phase["seq_len"]
        n = (phase["blocks"][1] - phase["blocks"][0]) * S + 1
        cuts = [a, *(int(x) for x in starts if a < x < a + n), a + n]
        code, _, sequences = read_megatron(tmp_path / "m" / f"run_{phase['name']}")
        assert code == 8 and len(sequences) == len(cuts) - 1, phase["name"]
        assert all(np.array_equal(q, flat[lo:hi]) for q, lo, hi in zip(sequences, cuts, cuts[1:])), phase["name"]
        assert np.array_equal(np.concatenate(sequences), _phase_tokens(scheduled, phase))
    written = export_llmc(scheduled, tmp_path / "l")
    trains = [p for p in written if "_train_" in p.name]
    assert [p.name for p in trains] == [f"tokmix_{p['name']}_train_{k:03d}.bin" for p in index["phases"]
                                        for k in range(*p["shards"])]
    for path, shard in zip(trains, index["shards"]):
        assert read_llmc(path)[2].tobytes() == (scheduled / shard["file"]).read_bytes()
    assert {p.name for p in written} - {p.name for p in trains} == {f"tokmix_val_{d}.bin" for d in index["val"]}


def test_kill_9_in_the_streams_then_in_assemble_then_resume_ends_identical(corpus, scheduled, tmp_path):
    """The scheduled recipe run as a user runs it (`tokmix run`, one worker thread, units of ~20 kB: several
    per file) is SIGKILLed with its whole process group inside a unit (its tokens under their temporary name),
    run again and SIGKILLed after assemble's second shard, and run again to the end: its shards, provenance
    indexes, holdouts and realized mix are the module's uninterrupted run's (two threads, one unit per file).
    (Worker processes: the Ray tests run this schedule in Ray's, on one node and on two.)"""
    recipe = corpus.with_name("scheduled.toml")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": "20000"}
    command = [sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(tmp_path), "--workers", "1"]
    for fault in ("streams:unit-before-rename:3", "assemble:after-rename:2"):
        killed = subprocess.run(command, capture_output=True, text=True, env={**env, "TOKMIX_FAULT": fault},
                                start_new_session=True)
        assert killed.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), (fault, killed.stderr[-2000:])
        if fault.startswith("streams"):
            assert list(tmp_path.rglob("*.tok.tmp-*")) and not list(tmp_path.glob("train_*.bin")), "not in a unit"
    assert 0 < len(list(tmp_path.glob("train_*.bin"))) < len(list(scheduled.glob("train_*.bin"))), "not in assemble"
    resumed = subprocess.run(command, capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert outputs(tmp_path) == outputs(scheduled)
    got, want = (json.loads((d / "index.json").read_text()) for d in (tmp_path, scheduled))
    for key in ("shards", "phases", "total", "val", "blocks"):
        assert got[key] == want[key], key
    assert got["mix"]["balance"] == want["mix"]["balance"]


@pytest.mark.parametrize("change, message", [
    (lambda t: t.replace('interleave = "balanced"', 'interleave = "global"'),
     'a \\[\\[schedule\\]\\] needs \\[layout\\] interleave = "balanced"'),
    (lambda t: t.replace("steps = 24\n", "steps = 25\n"), "the schedule's phases have 151 steps, layout.steps is 150"),
    (lambda t: t.replace("edu = 0.7", "edux = 0.7"), "phase final: 'edux' is not a stream of the recipe"),
    (lambda t: t.replace("edu = 0.7", "edu = 0.6"), "phase final: shares sum to 0.9, not 1"),
    (lambda t: t.replace('domain = "edu"', 'domain = "edu"\nshare = 0.3'), "stream edu has a share and the recipe"),
    (lambda t: t.replace("steps = 90\n", "steps = 90\nramp_steps = 2\n"), "the first phase has no previous one"),
])
def test_schedule_mistakes_are_one_line(corpus, tmp_path, change, message):
    path = with_schedule(corpus, SCHEDULE)
    path.write_text(change(path.read_text()))
    with pytest.raises(tokmix.TokmixError, match=message):
        tokmix.load_recipe(path)


def test_budgets_are_the_integral_of_the_schedule_and_plan_names_the_phase_that_runs_short(corpus, tmp_path):
    """A stream's budget is its target over the phases (ramps included) times the slack; plan's budget at each
    phase's end grows to it, and a stream whose supply ends before a phase's end is short in that phase."""
    from tokmix.plan import StreamPlan, Supply, phase_budgets

    recipe = tokmix.load_recipe(with_schedule(corpus, SCHEDULE))
    phases = [{"steps": [p.first_step, p.first_step + p.steps], "margin_steps": p.margin_steps,
               "ramp_steps": p.ramp_steps, "seqs_per_step": p.seqs_per_step, "seq_len": p.seq_len,
               "requested_share_by_stream": dict(zip(recipe.streams, p.shares))} for p in recipe.phases]
    positions, targets = _step_targets({"phases": phases}, list(recipe.streams))
    assert positions[-1] + 1 == recipe.train_tokens
    for s, name in enumerate(recipe.streams):
        want = targets[-1][s] + recipe.phases[-1].shares[s]  # the run's last token, at the last phase's shares
        assert recipe.budget(name) == int(want * recipe.layout.stream_slack) + 1
        budgets = phase_budgets(recipe, name)
        assert list(budgets) == ["main", "anneal", "final"] and abs(budgets["final"] - recipe.budget(name)) <= 1
    budgets = phase_budgets(recipe, "dclm")
    supply = Supply(files=1, tokens=budgets["main"] + 1)
    plan = StreamPlan("dclm", "dclm", 0.3, recipe.budget("dclm"), [], [], supply, supply, 0, phase_budgets=budgets)
    assert plan.short_phase == "anneal"
