"""Each benchmark file is read once per run ([decontaminate], issue 29): on a cold build without a token cache
the build hashes the bytes it reads and the run pins those (no second read in the stage process first); with a
cache the files are hashed first (the key is made of them) and a file not on this machine is copied as it is
read, the build reading the copy (one download). The files are URLs of a real fsspec filesystem, a local one
under the protocol countfs:// (an fsspec plugin, installed for the test's runs by an entry point on their
PYTHONPATH) that logs every open for reading, in every process of the run. The guarantees stay: a resume over a
changed file is refused naming it (and the set built from it is not kept), a bad file ends the run before the
holdout stage in one line, and a file that changes between the hash and the build is refused naming it. `tokmix
plan` reads each file once too: without a cache, and with one that holds the set or misses it (then it builds
the set from what its hash read kept, as a run does, and keeps nothing)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import make_corpus, train_test_tokenizer, write_recipe, write_split
from tests.test_decontam import HUMANEVAL, NGRAM, ROOT, ROWS_PER_GROUP, UNIT_BYTES, humaneval, plant
from tokmix.errors import TokmixError
from tokmix.recipe import load_recipe
from tokmix.shards import read_json

COUNTING_FS = '''"""A local filesystem under the protocol countfs:// that logs each open for reading (pid, path)."""
import os

from fsspec.implementations.local import LocalFileSystem


class CountingFileSystem(LocalFileSystem):
    protocol = ("countfs",)

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        return super()._strip_protocol(path[len("countfs://"):] if path.startswith("countfs://") else path)

    def _open(self, path, mode="rb", **kwargs):
        if "r" in mode:
            with open(os.environ["COUNTFS_LOG"], "a") as f:
                f.write(f"{os.getpid()} {self._strip_protocol(path)}\\n")
        return super()._open(path, mode, **kwargs)
'''


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    """A corpus with HumanEval planted (tests/test_decontam's plant), and a recipe whose two benchmarks are
    countfs:// URLs: HumanEval (.jsonl.gz) and a plain JSONL file of a few of its problems under other ids."""
    root = tmp_path_factory.mktemp("reads")
    plugin = root / "plugin"
    (plugin / "countfs-1.0.dist-info").mkdir(parents=True)
    (plugin / "countfs.py").write_text(COUNTING_FS)
    (plugin / "countfs-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: countfs\nVersion: 1.0\n")
    (plugin / "countfs-1.0.dist-info" / "entry_points.txt").write_text(
        "[fsspec.specs]\ncountfs = countfs:CountingFileSystem\n")
    files = make_corpus(root, doc_limit=200, rows_per_group=ROWS_PER_GROUP)
    problems = humaneval()
    plant(files, problems)
    write_split(root, files)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    bench = root / "bench"
    bench.mkdir()
    shutil.copy(HUMANEVAL, bench / "HumanEval.jsonl.gz")
    (bench / "few.jsonl").write_text("".join(json.dumps({"id": f"few/{i}", "text": p["prompt"]}) + "\n"
                                             for i, p in enumerate(problems[100:110])))
    plain = write_recipe(root, "tokenizer/tokenizer.json", decontaminate=True, steps=50).read_text()
    recipes = {}
    for kind, prefix in (("countfs", "countfs://"), ("local", "")):
        recipes[kind] = root / f"{kind}.toml"
        recipes[kind].write_text(
            plain + f'\n[decontaminate]\nngram = {NGRAM}\n[decontaminate.benchmarks.humaneval]\nfiles = '
            f'["{prefix}{bench / "HumanEval.jsonl.gz"}"]\nfields = ["prompt", "canonical_solution"]\n'
            f'id_field = "task_id"\n[decontaminate.benchmarks.few]\nfiles = ["{prefix}{bench / "few.jsonl"}"]\n'
            'id_field = "id"\n')
    return {"root": root, "plugin": plugin, "bench": bench, "recipes": recipes}


def run(inputs: dict, out: Path, *args: str, fault: str | None = None,
        command: str = "run") -> tuple[subprocess.CompletedProcess, dict]:
    """`tokmix run` (or `command`) of the countfs recipe; returns the result and how often each benchmark file was
    opened to be read, in all of the run's processes."""
    log = out.with_name(out.name + ".opens")
    log.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{inputs['plugin']}{os.pathsep}{ROOT}", "COUNTFS_LOG": str(log),
           "TOKMIX_UNIT_BYTES": str(UNIT_BYTES)}
    env.pop("TOKMIX_CACHE", None)
    if fault is not None:
        env["TOKMIX_FAULT"] = fault
    workers = ["--workers", "2"] if command == "run" else []
    done = subprocess.run([sys.executable, "-m", "tokmix.cli", command, str(inputs["recipes"]["countfs"]), "--out",
                           str(out), *workers, *args], capture_output=True, text=True, env=env,
                          start_new_session=True, timeout=600)
    opens: dict[str, int] = {}
    for line in (log.read_text().splitlines() if log.exists() else []):
        path = line.split(" ", 1)[1]
        opens[Path(path).name] = opens.get(Path(path).name, 0) + 1
    return done, opens


ONCE = {"HumanEval.jsonl.gz": 1, "few.jsonl": 1}


def local_fingerprint(inputs: dict, tmp_path: Path) -> str:
    """The fingerprint of the set built in this process from the same files as local paths."""
    from tokmix.stages.decontam import build_set

    return build_set(load_recipe(inputs["recipes"]["local"]), tmp_path / "local-set", [])["fingerprint"]


def decontamination(out: Path) -> dict:
    entry = json.loads((out / "index.json").read_text())["benchmark_decontamination"]
    return {k: entry[k] for k in ("set_fingerprint", "documents", "tokens")} | {
        "contamination": (out / "contamination.json").read_bytes()}


@pytest.fixture(scope="module")
def cold(inputs) -> tuple[Path, dict]:
    """A run without a token cache (its output, and the opens of each benchmark file)."""
    done, opens = run(inputs, inputs["root"] / "cold", "--no-cache")
    assert done.returncode == 0, done.stderr[-3000:]
    return inputs["root"] / "cold", opens


def test_a_cold_build_without_a_cache_reads_each_file_once(inputs, cold, tmp_path):
    out, opens = cold
    assert opens == ONCE
    got = decontamination(out)
    assert got["documents"] > 0 and got["set_fingerprint"] == local_fingerprint(inputs, tmp_path)
    pinned = read_json(out / "tokmix-state" / "benchmarks.json")
    assert set(pinned["files"]) == {"humaneval", "few"}
    for files in pinned["files"].values():  # the bytes the build read
        for url, digest in files.items():
            assert digest == hashlib.sha256(Path(url.removeprefix("countfs://")).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def cached(inputs) -> Path:
    """A token cache that a cold run filled with the set (the run's folder beside it: cached-out)."""
    cache, out = inputs["root"] / "cache", inputs["root"] / "cached-out"
    done, opens = run(inputs, out, "--cache", str(cache))
    assert done.returncode == 0, done.stderr[-3000:]
    assert opens == ONCE and "benchmark n-grams: kept in the token cache" in done.stdout + done.stderr
    assert not [p for p in (out / "tokmix-state" / "benchmarks").iterdir() if ".tmp-" in p.name]
    return cache


def test_a_cold_build_with_a_cache_reads_each_file_once_and_a_warm_one_once(inputs, cached, tmp_path):
    warm, opens = run(inputs, tmp_path / "warm", "--cache", str(cached))
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert opens == ONCE and "benchmark n-grams: taken from the token cache" in warm.stdout + warm.stderr
    assert decontamination(tmp_path / "warm") == decontamination(inputs["root"] / "cached-out")


def contamination_notes(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("note: decontaminate: stream")]


def test_plan_reads_each_file_once_with_a_cache_that_misses_or_holds_the_set_and_without_one(inputs, cached,
                                                                                            tmp_path):
    """`tokmix plan` hashes the files for the cache's key; on a miss it builds the set from what that read kept
    (a URL's file copied as it was hashed), not from a second read, and keeps nothing in the cache. With the
    cache holding the set, and without a cache, each file is read once too; the three plans estimate the same."""
    plans = {}
    for kind, args in (("miss", ["--cache", str(tmp_path / "empty")]), ("hit", ["--cache", str(cached)]),
                       ("none", ["--no-cache"])):
        done, opens = run(inputs, tmp_path / kind, *args, command="plan")
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
        assert opens == ONCE, kind
        plans[kind] = contamination_notes(done)
    assert plans["miss"] and plans["miss"] == plans["hit"] == plans["none"]
    assert not [p for p in (tmp_path / "empty").rglob("*") if p.is_file()]
    assert not [p for p in tmp_path.iterdir() if p.name in ("miss", "hit", "none")]  # plan writes no output


def test_plan_refuses_a_file_changed_between_its_hash_and_the_build(inputs, tmp_path):
    """A large local set's files are hashed for the cache's key, then read again by plan's build on a miss: a
    file whose bytes changed in between is refused in one line naming it, and nothing is kept in the cache."""
    from tokmix.plan import plan_set
    from tokmix.stages.decontam import benchmark_checksums

    bench, recipe = _local_copy(inputs, tmp_path)
    checksums = benchmark_checksums(recipe, [])
    few = bench / "few.jsonl"
    few.write_bytes(few.read_bytes() + json.dumps({"id": "few/late", "text": "an item added later"}).encode() + b"\n")
    (tmp_path / "set").mkdir()
    with pytest.raises(TokmixError, match=rf"^benchmark few: file {few}: changed while this run read it "
                                          r"\(sha256 [0-9a-f]{12}\.\.\. when pinned, [0-9a-f]{12}\.\.\. when its "
                                          r"n-grams were built\)"):
        plan_set(recipe, tmp_path / "set", [], [].append, str(tmp_path / "cache"), checksums)
    assert not [p for p in tmp_path.glob("cache/**/*") if p.is_file()]


def test_plan_names_a_bad_line_of_a_benchmark_file_in_one_line(inputs, tmp_path):
    """A line that is not JSON: plan ends in one line naming the benchmark, the file and the line (exit 2),
    the file read once, nothing kept in the cache."""
    few = inputs["bench"] / "few.jsonl"
    kept = few.read_bytes()
    try:
        few.write_bytes(kept + b'{"id": "broken", "text": "unclosed\n')
        failed, opens = run(inputs, tmp_path / "out", "--cache", str(tmp_path / "cache"), command="plan")
    finally:
        few.write_bytes(kept)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stdout + failed.stderr
    lines = [line for line in (failed.stdout + failed.stderr).splitlines() if "benchmark few" in line]
    assert len(lines) == 1 and f"file countfs://{few}: line 11: not JSON" in lines[0], failed.stderr[-2000:]
    assert opens == ONCE
    assert not [p for p in tmp_path.glob("cache/**/*") if p.is_file()] and not (tmp_path / "out").exists()


def test_a_resume_over_a_changed_file_is_refused_naming_it(inputs, cold, tmp_path):
    """Killed in the holdout stage (its set built, its files pinned); a benchmark file changed: the resume is
    refused naming it, with the set whole and with the set gone (a cold build: the build's bytes checked against
    the pin, and the set built from the changed file removed); the file restored, the run ends as an
    uninterrupted one."""
    out = tmp_path / "out"
    killed, _ = run(inputs, out, "--no-cache", fault="holdout:after-write:1")
    assert killed.returncode != 0 and (out / "tokmix-state" / "benchmarks" / "set.json").is_file()
    few = inputs["bench"] / "few.jsonl"
    kept = few.read_bytes()
    try:
        few.write_bytes(kept + json.dumps({"id": "few/new", "text": "an item added later"}).encode() + b"\n")
        for remove in (False, True):
            if remove:
                (out / "tokmix-state" / "benchmarks" / "set.json").unlink()
            refused, opens = run(inputs, out, "--no-cache")
            assert refused.returncode != 0
            lines = [line for line in refused.stderr.splitlines() if "changed since this run started" in line]
            assert len(lines) == 1 and f"benchmark few: file countfs://{few}" in lines[0], refused.stderr[-2000:]
            assert opens == ONCE
            assert not (out / "tokmix-state" / "benchmarks" / "set.json").exists() or not remove
    finally:
        few.write_bytes(kept)
    done, opens = run(inputs, out, "--no-cache")
    assert done.returncode == 0, done.stderr[-3000:]
    assert opens == ONCE
    whole = cold[0]
    assert decontamination(out) == decontamination(whole)
    assert [p.read_bytes() for p in sorted(out.glob("*.bin"))] == [p.read_bytes() for p in sorted(whole.glob("*.bin"))]


def test_a_bad_file_built_in_a_process_of_its_own_ends_the_run_before_the_holdout_stage(inputs, tmp_path):
    """A URL's set is built in a fresh process: a line that is not JSON there ends the run in one line naming
    the benchmark, the file and the line, nothing of the stages written."""
    few = inputs["bench"] / "few.jsonl"
    kept = few.read_bytes()
    out = tmp_path / "out"
    try:
        few.write_bytes(kept + b'{"id": "broken", "text": "unclosed\n')
        failed, opens = run(inputs, out, "--no-cache")
    finally:
        few.write_bytes(kept)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    lines = [line for line in failed.stderr.splitlines() if "benchmark few" in line]
    assert len(lines) == 1 and f"file countfs://{few}: line 11: not JSON" in lines[0], failed.stderr[-2000:]
    assert opens == ONCE
    written = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in written if p.suffix in (".bin", ".npy", ".part") or "holdout" in p.name
                or "unit" in p.name or p.name in ("benchmarks.json", "set.json")], written


def test_a_file_changed_between_its_hash_and_the_build_is_refused_naming_it(inputs, tmp_path):
    """With a token cache a local file is hashed (the key), then read again by the build: one whose bytes
    changed in between is refused in one line naming it; nothing of the set is left, nothing is kept in the
    cache."""
    from tokmix.stages.decontam import benchmark_checksums, prepare_set

    bench, recipe = _local_copy(inputs, tmp_path)
    checksums = benchmark_checksums(recipe, [])
    with gzip.open(bench / "HumanEval.jsonl.gz", "ab") as f:
        f.write(json.dumps({"task_id": "late", "prompt": "def late(): pass", "canonical_solution": ""}).encode()
                + b"\n")
    said: list[str] = []
    with pytest.raises(TokmixError, match=rf"^benchmark humaneval: file {bench / 'HumanEval.jsonl.gz'}: changed "
                                          r"while this run read it \(sha256 [0-9a-f]{12}\.\.\. when pinned, "
                                          r"[0-9a-f]{12}\.\.\. when its n-grams were built\)"):
        prepare_set(recipe, tmp_path / "set", [], said.append, cache=str(tmp_path / "cache"), checksums=checksums)
    assert not [p for p in (tmp_path / "set").iterdir() if p.suffix in (".json", ".npy", ".part")]
    assert not list(tmp_path.glob("cache/**/*.npy"))


def _local_copy(inputs, tmp_path):
    """A copy of the benchmark files and the local recipe reading them, to change a file of: (folder, recipe)."""
    bench = tmp_path / "bench"
    shutil.copytree(inputs["bench"], bench)
    recipe_path = tmp_path / "local.toml"
    recipe_path.write_text(inputs["recipes"]["local"].read_text().replace(str(inputs["bench"]), str(bench)))
    return bench, load_recipe(recipe_path)
