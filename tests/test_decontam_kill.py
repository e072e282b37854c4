"""kill -9 inside the build of the benchmark set ([decontaminate], issue 29): between two groups of items, after
some of its arrays are committed, and with every array written but not its record (set.json, the commit). The
same command again builds it whole and ends with the output of an uninterrupted run, nothing of the killed
build left in the state folder; for a small set (built in the stage process) and a large one (over
SMALL_BENCHMARK_BYTES: built in a process of its own)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import make_inputs, plant_humaneval
from tokmix.stages.decontam import ITEMS_PER_GROUP, SMALL_BENCHMARK_BYTES

ROOT = Path(__file__).resolve().parents[1]
SET = Path("tokmix-state") / "benchmarks"


def run(recipe: Path, out: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": "9000"}
    env.pop("TOKMIX_CACHE", None)
    if fault is not None:
        env["TOKMIX_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--workers",
                           "2", "--no-cache"], capture_output=True, text=True, env=env, start_new_session=True,
                          timeout=600)


def outputs(out: Path) -> dict:
    index = json.loads((out / "index.json").read_text())
    return {"bins": {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))},
            "contamination": (out / "contamination.json").read_bytes(),
            "entry": index["benchmark_decontamination"]}


@pytest.fixture(scope="module")
def recipes(tmp_path_factory) -> dict:
    """HumanEval planted into a corpus; two recipes: HumanEval alone (small), and HumanEval with a benchmark of
    3 groups of random lines over SMALL_BENCHMARK_BYTES (large); each one's uninterrupted outputs."""
    root = tmp_path_factory.mktemp("decontam-kill")
    small = make_inputs(root, doc_limit=300, rows_per_group=16, steps=60)
    plant_humaneval(root, small, 16, {"code_py": [2], "edu": [3], "dclm": [5]})
    rng = random.Random(29)
    words = [f"w{i}" for i in range(5000)]
    lines, size = [], 0
    while size <= SMALL_BENCHMARK_BYTES or len(lines) < 3 * ITEMS_PER_GROUP:
        lines.append(json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(20, 400)))}) + "\n")
        size += len(lines[-1])
    (root / "random.jsonl").write_text("".join(lines))
    large = root / "large.toml"
    large.write_text(small.read_text() + f'[decontaminate.benchmarks.random]\nfiles = ["{root / "random.jsonl"}"]\n')
    found = {}
    for name, recipe in (("small", small), ("large", large)):
        done = run(recipe, root / f"{name}-whole")
        assert done.returncode == 0, done.stderr[-3000:]
        found[name] = (recipe, outputs(root / f"{name}-whole"))
    return found


CASES = [("small", "benchmarks:after-array:3"), ("small", "benchmarks:before-record"),  # (HumanEval: one group)
         ("large", "benchmarks:after-group:2"), ("large", "benchmarks:after-array:3"),
         ("large", "benchmarks:before-record")]


@pytest.mark.parametrize("size, fault", CASES, ids=[f"{s}-{f.split(':')[1]}" for s, f in CASES])
def test_a_kill_inside_the_build_resumes_to_the_same_output(recipes, tmp_path, size, fault):
    recipe, whole = recipes[size]
    out = tmp_path / "out"
    killed = run(recipe, out, fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (out / SET / "set.json").exists()
    assert not list(out.glob("*.bin"))
    done = run(recipe, out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert outputs(out) == whole
    left = sorted(p.name for p in (out / SET).iterdir() if p.suffix == ".part" or ".tmp-" in p.name)
    assert left == []
