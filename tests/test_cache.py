"""The token cache (tokmix.cache), for real: two runs filling one cache at once, a remix (other shares, seed,
interleave and blocks) that takes every unit it can from it and writes byte for byte what the same recipe writes
with --no-cache, with worker processes, through a damaged entry, and SIGKILLed inside taking an entry and inside
filling one; the cache checked (`tokmix cache verify`), listed and pruned, and never an entry a run holds
evicted."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tokmix
from tests.corpus import make_inputs
from tokmix.cache import ENTRY, KeyBase, UnitCache, source_identity, unit_key

ROOT = Path(__file__).resolve().parents[1]
UNIT_BYTES = 4_000  # several units per file (a row group of 8 documents each, about)
SAMPLE = 16 << 10  # text `tokmix plan` samples per stream and part
# the recipe's shares are 0.45, 0.35, 0.07, 0.13; the remix's phases'
PHASES = {"dclm": (0.38, 0.35), "edu": (0.42, 0.45), "code_py": (0.12, 0.12), "code_other": (0.08, 0.08)}


def outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted([*out.glob("*.bin"), *out.glob("*.docs")])}


def cli(*args: str, fault: str | None = None, env: dict | None = None) -> subprocess.Popen:
    env = dict(env or {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": str(UNIT_BYTES)})
    env.pop("TOKMIX_CACHE", None)  # the suite's "off": each run names its cache
    if fault:
        env["TOKMIX_FAULT"] = fault
    return subprocess.Popen([sys.executable, "-m", "tokmix.cli", "run", *args, "--workers", "2",
                             "--tokenizer-backend", "hf"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)


def finished(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out


def killed(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    return out


@pytest.fixture(scope="module")
def recipes(tmp_path_factory) -> tuple[Path, Path]:
    """The test recipe, and its remix: a schedule of two phases whose shares move 5-10 points from the recipe's
    (so the balanced interleave, not the global one), another seed and more steps (nothing of it in the cache
    key)."""
    root = tmp_path_factory.mktemp("cache-inputs")
    recipe = make_inputs(root, doc_limit=400, rows_per_group=8, decontaminate=True)
    text = re.sub(r"\nshare = [0-9.]+\n", "\n", recipe.read_text())
    text = text.replace("seed = 1234", "seed = 77").replace("[layout]\n", '[layout]\ninterleave = "balanced"\n')
    text = text.replace("steps = 40", "steps = 46")
    text += "".join(f'\n[[schedule]]\nname = "{name}"\nsteps = {steps}\n{ramp}shares = {{ '
                    + ", ".join(f"{s} = {shares[i]}" for s, shares in PHASES.items()) + " }\n"
                    for i, (name, steps, ramp) in enumerate((("main", 30, ""), ("anneal", 16, "ramp_steps = 4\n"))))
    remix = root / "remix.toml"
    remix.write_text(text)
    return recipe, remix


@pytest.fixture(scope="module")
def cold(recipes, tmp_path_factory) -> tuple[Path, Path, Path]:
    """Two runs of the recipe started at once on one empty cache (the second keeps its units, which link the
    cache's entries: it holds them): both fill the same entries. Returns (cache, out, out with its units)."""
    base = tmp_path_factory.mktemp("cold")
    cache = base / "cache"
    first = cli(str(recipes[0]), "--out", str(base / "a"), "--cache", str(cache))
    second = cli(str(recipes[0]), "--out", str(base / "b"), "--cache", str(cache), "--keep-streams")
    logs = finished(first) + finished(second)
    assert "token cache: " + str(cache) in logs
    return cache, base / "a", base / "b"


@pytest.fixture(scope="module")
def remix_without_cache(recipes, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("remix-nocache")
    tokmix.run(tokmix.load_recipe(recipes[1]), out, workers=1, cache=None, unit_bytes=UNIT_BYTES, backend="hf")
    return out


def test_runs_filling_one_cache_at_once_write_the_same_bytes_and_one_whole_entry_per_unit(cold):
    cache, a, b = cold
    assert outputs(a) == outputs(b)
    whole, problems = UnitCache(str(cache)).verify()
    used = {(p.parent.parent.name, p.stem) for p in (b / "streams").glob("*/units/*.json")}
    entries = list(UnitCache(str(cache)).entries())
    filled = [(e.record["parts"]["stream"], e.record["parts"]["unit"]) for e in entries if "kind" not in e.record]
    held_out = sorted(e.record["parts"]["stream"] for e in entries if e.record.get("kind") == "holdout")
    # one entry per unit (a unit tokenized past a budget while the ones before it were in flight has one too),
    # and one of each stream's holdout documents
    assert problems == [] and whole == len(filled) + len(held_out) and len(filled) == len(set(filled))
    assert set(filled) >= used and len(used) > 8 and held_out == sorted(PHASES)
    assert not list((cache / "tmp").iterdir()), "nothing left of the fill that lost the race"
    index = json.loads((a / "index.json").read_text())
    # index.json counts the units the budgets used: b may keep one more, tokenized past a budget while the units
    # before it were in flight, and which of the two runs did so depends on their timing
    assert index["cache"]["location"] == str(cache) and 8 < index["cache"]["units"] <= len(used)
    assert index["cache"]["units"] == json.loads((b / "index.json").read_text())["cache"]["units"]


def test_plan_shows_what_the_cache_holds_of_a_recipe_and_the_disk_it_and_the_run_need(recipes, cold, tmp_path,
                                                                                      monkeypatch):
    """`tokmix plan` builds every unit's key as the run does (with [decontaminate]: tests/test_decontam.py):
    after the cold run, the cache holds all of the recipe's units (nothing for the cache to add, the run needs
    disk only for its shards and holdouts: the units are linked from the cache) and part of the remix's."""
    from rich.console import Console

    from tokmix.plan import make_plan, render_plan

    monkeypatch.setenv("TOKMIX_UNIT_BYTES", str(UNIT_BYTES))  # the units as the runs cut them
    cache = str(cold[0])  # as the cold runs left it (the remix below adds to it)
    plan = make_plan(tokmix.load_recipe(recipes[0]), out=tmp_path / "out", cache=cache, sample_bytes=SAMPLE)
    assert all(s.cached_units == s.units > 0 and s.cached_tokens >= s.budget for s in plan.streams.values())
    assert plan.cache.linked and plan.cache.grows == 0 and plan.cache.holds == plan.disk.intermediates
    assert plan.disk.needed == plan.disk.shards + plan.disk.holdouts
    console = Console(width=200, record=True)
    console.print(render_plan(plan))
    shown = console.export_text()
    units = sum(s.units for s in plan.streams.values())
    assert f"holds {units:,} of the ~{units:,} units the budgets need (~100% of their tokens" in shown, shown
    assert plan.cache.holdout_cached == plan.cache.holdout_tokens > 0  # every stream's holdout entry: all it reads
    assert "; and ~100% of the tokens the holdouts read" in " ".join(shown.split()), shown
    assert "in the token cache already (linked from it: no second copy)" in shown

    remix = make_plan(tokmix.load_recipe(recipes[1]), out=tmp_path / "out", cache=cache, sample_bytes=SAMPLE)
    held = sum(s.cached_units for s in remix.streams.values())
    assert 0 < remix.cache.holdout_cached <= remix.cache.holdout_tokens
    assert 0 < held < sum(s.units for s in remix.streams.values())
    assert 0 < remix.cache.grows < remix.disk.intermediates
    assert remix.disk.needed == remix.disk.intermediates - remix.cache.holds + remix.disk.shards + remix.disk.holdouts


def test_plan_cuts_the_units_as_the_run_into_its_directory_would(recipes, cold, tmp_path, monkeypatch):
    """The cache was filled with 4,000-byte units and this shell sets no TOKMIX_UNIT_BYTES: over the cold run's
    directory (a resume keeps the unit size it recorded) plan cuts 4,000-byte units and finds every one the run
    used in the cache; over a new directory it cuts the default 16 MiB units, as a new run there would, none of
    which is in the cache."""
    from tokmix.plan import make_plan

    monkeypatch.delenv("TOKMIX_UNIT_BYTES", raising=False)
    cache, a, _ = cold
    recipe = tokmix.load_recipe(recipes[0])
    resume = make_plan(recipe, out=a, cache=str(cache), sample_bytes=SAMPLE)
    used = json.loads((a / "index.json").read_text())["cache"]["by_stream"]
    assert {n: (s.units, s.cached_units) for n, s in resume.streams.items()} == {
        n: (u["units"], u["units"]) for n, u in used.items()}
    fresh = make_plan(recipe, out=tmp_path / "new", cache=str(cache), sample_bytes=SAMPLE)
    assert sum(s.cached_units for s in fresh.streams.values()) == 0
    assert sum(s.units for s in fresh.streams.values()) < sum(s.units for s in resume.streams.values())


def test_a_remix_takes_its_units_from_the_cache_and_writes_what_it_writes_without_it(
        recipes, cold, remix_without_cache, tmp_path):
    """Through worker processes, damaged entries (a flipped byte in a unit's and in dclm's holdout documents':
    found, removed, tokenized again), a SIGKILL while filling code_py's holdout entry (its share in its domain
    grew: its documents past the cold run's are encoded), one while taking a unit's entry and one while filling
    one (the unit, not committed before its entry is made, is tokenized again and its entry made); every resume
    ends with the bytes, holdouts included, of the same recipe run with --no-cache, tokenizing no more than the
    budgets grew plus a unit a stream."""
    cache, _, kept = cold
    records = [(path, json.loads(path.read_text())) for path in sorted((cache / "entries").glob(f"*/*/{ENTRY}"))]
    for path, record in records:
        if record["parts"]["stream"] == "dclm" and record["parts"].get("unit", "000000") == "000000":
            # a unit every mix of the recipe uses, and the stream's holdout documents
            tok = path.parent / (record["extra"]["tok"]["file"] if "kind" in record else record["files"]["tok"])
            tok.chmod(0o644)
            data = bytearray(tok.read_bytes())
            data[5] ^= 0xFF
            tok.write_bytes(bytes(data))  # in place: the units of the run that holds it are damaged too
    out = tmp_path / "remix"
    args = (str(recipes[1]), "--out", str(out), "--cache", str(cache))
    log = killed(cli(*args, fault="cache:holdout-fill-before-rename@code_py:1"))
    log += killed(cli(*args, fault="cache:after-take-file:2"))
    log += killed(cli(*args, fault="cache:fill-before-rename:1"))
    filling = list((cache / "tmp").iterdir())
    assert filling, "the kill left an entry being filled in tmp/"
    log += finished(cli(*args, "--executor", "processes"))
    assert outputs(out) == outputs(remix_without_cache)
    assert UnitCache(str(cache)).verify()[1] == [], "every entry whole, the damaged one remade"
    # the unit whose fill was killed was not committed without its entry: the resume made both
    assert all((cache / "entries" / p.name[:2] / p.name.split(".")[0] / ENTRY).exists() for p in filling)

    # what the remix took and what it tokenized (over its three stage processes), from its index
    index = json.loads((out / "index.json").read_text())
    before = json.loads((cold[1] / "index.json").read_text())
    took = index["cache"]
    assert 0 < took["units_from_cache"] < took["units"]
    assert re.search(rf"token cache: \d+ of {took['units']} units \([\d,]+ tokens\) taken from", log), log
    grown = sum(max(0, index["mix"]["streams"][n]["budget"] - before["mix"]["streams"][n]["budget"])
                for n in PHASES)
    biggest = max(r["tokens"] for r in map(json.loads, map(Path.read_text, (kept / "streams").glob("*/units/*.json"))))
    assert 0 < took["tokens_tokenized"] <= grown + len(PHASES) * biggest
    # edu (a domain of its own: its holdout set is the recipe's) grows: its last unit went on from its partial
    # entry, so all the recipe's edu tokens came from the cache and it tokenized only its new tail
    edu, was = took["by_stream"]["edu"], before["mix"]["streams"]["edu"]
    assert index["mix"]["streams"]["edu"]["budget"] > was["budget"]
    assert edu["tokens_from_cache"] >= was["tokens"]
    assert edu["tokens_tokenized"] <= index["mix"]["streams"]["edu"]["budget"] - was["budget"] + biggest
    # the holdouts' reads: edu's and code_other's (its share in its domain shrank: a prefix of its entry) from
    # the cache, code_py's encoded past what the cold run read, dclm's encoded again (its entry was damaged)
    assert "holdout dclm's documents encoded again" in log and "token cache: " in log
    held = took["holdouts"]["by_stream"]
    assert held["dclm"]["tokens_from_cache"] == 0 < held["dclm"]["tokens_tokenized"]
    assert held["edu"]["tokens_tokenized"] == held["code_other"]["tokens_tokenized"] == 0
    assert 0 < held["code_py"]["tokens_from_cache"] and 0 < held["code_py"]["tokens_tokenized"]
    assert took["holdouts"]["tokens_tokenized"] == sum(h["tokens_tokenized"] for h in held.values())


def test_eviction_under_a_running_run_never_removes_an_entry_it_holds(recipes, cold, tmp_path):
    """A run paused after taking units from the cache holds them (its units folder links the entries' files):
    evicting everything leaves exactly those. (A resume after an eviction takes what is left and tokenizes the
    rest: the remix test's resumes.)"""
    import shutil

    cache, out, fifo = tmp_path / "cache", tmp_path / "out", tmp_path / "paused"
    shutil.copytree(cold[0] / "entries", cache / "entries")  # a cache of its own: no other run links these
    os.mkfifo(fifo)
    args = (str(recipes[0]), "--out", str(out), "--cache", str(cache))
    proc = cli(*args, fault="streams:after-unit:3:pause", env={**os.environ, "PYTHONPATH": str(ROOT),
                                                               "TOKMIX_UNIT_BYTES": str(UNIT_BYTES),
                                                               "TOKMIX_PAUSE_FIFO": str(fifo)})
    with open(fifo) as f:  # blocks until the stage process stands at the pause point
        assert f.read() == "paused"
    unit_cache = UnitCache(str(cache))
    before = list(unit_cache.entries())
    removed, _ = unit_cache.evict(0)
    linked = {p.stat().st_ino for p in out.glob("streams/*/units/*.tok")}  # after: a take in flight has ended

    def inode(entry) -> int | None:
        path = cache / "entries" / entry.key[:2] / entry.key / entry.record["files"]["tok"]
        return path.stat().st_ino if path.exists() else None

    left = {e.key: inode(e) for e in unit_cache.entries()}
    assert len(left) >= 3 and set(left.values()) <= linked, "what is left is what the paused run took"
    # the paused run's other worker may still put units it tokenized: entries can appear between the two listings
    gone = {e.key for e in before} - set(left)
    assert removed >= len(gone) > 0
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)


def test_tokmix_cache_lists_verifies_and_prunes(cold, tmp_path):
    import shutil

    cache = tmp_path / "copy"
    shutil.copytree(cold[0] / "entries", cache / "entries")  # copies: nothing links them
    from typer.testing import CliRunner

    from tokmix.cli import app

    def tokmix_cache(*args: str):
        return CliRunner().invoke(app, ["cache", *args, "--cache", str(cache)])

    listed = tokmix_cache()
    count = len(list(UnitCache(str(cache)).entries()))
    assert listed.exit_code == 0 and f"in {count:,} entries" in listed.output and "by tokenizer" in listed.output
    assert re.search(r"holdouts\s+│\s+4\b", listed.output), listed.output  # one entry a stream (by kind)
    assert "part-0.parquet" in listed.output
    records = sorted((cache / "entries").glob(f"*/*/{ENTRY}"))
    records[0].write_text(records[0].read_text()[:-9])  # truncated
    verify = tokmix_cache("verify")
    assert verify.exit_code == 1 and "not whole JSON" in verify.output
    assert f"{count - 1:,} entries whole, 1 damaged (removed)" in verify.output
    assert tokmix_cache("verify").exit_code == 0
    pruned = tokmix_cache("--max-size", "0")
    assert pruned.exit_code == 0 and "in 0 entries" in pruned.output


def test_the_key_is_every_part_that_decides_a_units_bytes(tmp_path):
    source = tmp_path / "a.parquet"
    source.write_bytes(b"x" * 10)
    parts = dict(tokenizer="t", oracle="tokenizers 1", delimiters={"prefix": [0], "suffix": []}, dtype="<u2",
                 huge_doc_chars=1 << 22, provenance=True, text_field="text", unit_index=0,
                 pieces=[[str(source), "parquet", 0, 1]], sources=[source_identity(str(source), 10)],
                 decontamination=None, benchmarks=None)
    key = unit_key(**parts)
    changed = {"tokenizer": "u", "oracle": "tokenizers 2", "delimiters": {"prefix": [1], "suffix": []},
               "dtype": "<u4", "huge_doc_chars": 1 << 62, "provenance": False, "text_field": "content",
               "unit_index": 1, "pieces": [[str(source), "parquet", 0, 2]], "decontamination": "holdout-exact 2",
               "benchmarks": "ngrams"}
    assert all(unit_key(**{**parts, name: value}) != key for name, value in changed.items())
    os.utime(source, ns=(1, 1))  # rewritten in place at the same size: another file
    assert unit_key(**{**parts, "sources": [source_identity(str(source), 10)]}) != key

    # a stream's holdout documents: the run's parts that decide their ids and what is kept of them, and its
    # holdout files; not where a huge document is cut nor the benchmarks (the holdout stage does neither)
    base = dict(tokenizer="t", oracle="tokenizers 1", delimiters={"prefix": [0], "suffix": []}, dtype="<u2",
                huge_doc_chars=1 << 22, provenance=True, decontamination="holdout-exact 2", benchmarks=None)
    files, identity = [str(source)], [source_identity(str(source), 10)]
    held = KeyBase(**base).holdout_key("text", files, identity)
    assert held != key
    for name, value in {**changed, "decontamination": None}.items():
        if name in base:
            other = KeyBase(**{**base, name: value}).holdout_key("text", files, identity)
            assert (other == held) == (name in ("huge_doc_chars", "benchmarks")), name
    assert KeyBase(**base).holdout_key("content", files, identity) != held
    assert KeyBase(**base).holdout_key("text", [*files, "b.parquet"], [*identity, [1]]) != held
    assert KeyBase(**base).holdout_key("text", files, [source_identity(str(source), 11)]) != held



def test_a_unit_needing_more_than_its_partial_entry_holds_goes_on_from_it_encoding_only_its_tail(
        recipes, tmp_path, monkeypatch):
    """A stream's last unit stopped at its budget is a partial entry; a run that needs more of that unit takes
    the entry's tokens for its first documents (reading them again: holdout copies, benchmark items, provenance)
    and encodes only the documents after them, writing exactly what tokenizing it from its start writes. (On a
    store: tests/test_store.py.)"""
    goes_on_from_a_partial_entry(recipes[0].parent, str(tmp_path / "cache"), tmp_path, monkeypatch)


def goes_on_from_a_partial_entry(root: Path, cache: str, work: Path, monkeypatch, thirds: tuple = (2, 3)) -> None:
    """A unit of `root`'s test corpus tokenized whole without a cache, then to a third of it (a partial entry in
    `cache`), then to each of `thirds` of it (3: whole), each going on from the entry the one before left."""
    import numpy as np
    import pyarrow.parquet as pq

    from tokmix.shards import read_json
    from tokmix.sources import plan_units
    from tokmix.stages import shared_encoder
    from tokmix.stages.streams import UnitTask, tokenize_unit

    path = root / "corpus" / "edu" / "part-0.parquet"
    unit = next(plan_units("edu", [str(path)], [], 1 << 30))  # the whole file
    texts = [t for t in pq.read_table(path)["text"].to_pylist() if t]
    tokenizer = str(root / "tokenizer" / "tokenizer.json")
    key = "ab" * 32

    def run(name: str, limit: int | None, cache: str | None = None) -> tuple[dict, dict[str, bytes]]:
        (work / name).mkdir()
        task = UnitTask(unit, "text", tokenizer, "hf", "<u2", str(work / name), None, (), 4 << 20, limit,
                        provenance=True, cache=cache, cache_key=key if cache else None, cache_parts={})
        record = tokenize_unit(task)
        return record, {kind: (work / name / f"{unit.name}.{kind}").read_bytes() for kind in ("tok", "len", "src")}

    whole, want = run("whole", None)
    ends = np.cumsum(np.frombuffer(want["len"], "<u4"))
    stopped, _ = run("stopped", int(ends[len(ends) // 3]), cache)  # a stream's end: a partial entry
    encoded: list[str] = []
    encoder = shared_encoder(tokenizer, "hf")
    encode = encoder.encode_batch
    monkeypatch.setattr(encoder, "encode_batch", lambda batch: encoded.extend(batch) or encode(batch))
    # a later stream's end in the same unit; then all of it
    for limit in (int(ends[k * len(ends) // 3]) if k < 3 else None for k in thirds):
        encoded.clear()
        record, got = run(f"more-{limit}", limit, cache)
        docs, tokens = record["docs"], record["tokens"]
        assert record["tokens_from_cache"] == stopped["tokens"] and not record.get("from_cache")
        assert encoded[0] == texts[stopped["docs"]], "the first document encoded is the first one after the entry's"
        assert got["tok"] == want["tok"][:2 * tokens] and got["len"] == want["len"][:4 * docs]
        assert got["src"] == want["src"][:len(want["src"]) * docs // whole["docs"]]
        entry = read_json(UnitCache(cache).entry_dir(key) / ENTRY, sealed=True)
        assert entry["unit"]["tokens"] == tokens and entry["complete"] == (limit is None)
        stopped = record
