"""A run's units carry the fingerprint of the benchmark set their documents were checked against
([decontaminate], issue 29): a resume whose set is another one (a benchmark file changed while the record that
pins the files' checksums, tokmix-state/benchmarks.json, was deleted: state is input) remakes every unit of the
other set, said in the log, and ends with the bytes of a run made against the new set alone."""

from __future__ import annotations

import gzip
import json
import signal
from pathlib import Path

from tests.corpus import HUMANEVAL, make_inputs, plant_humaneval
from tests.test_decontam_kill import run


def outputs(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted([*out.glob("*.bin"), out / "contamination.json"])}


def test_a_resume_against_another_benchmark_set_remakes_the_units_of_the_first(tmp_path):
    recipe = make_inputs(tmp_path, doc_limit=300, rows_per_group=16, steps=60)
    planted = plant_humaneval(tmp_path, recipe, 16, {"dclm": [1, 5], "edu": [3]})
    with gzip.open(HUMANEVAL, "rt") as f:
        problems = [json.loads(line) for line in f]
    bench = tmp_path / "he.jsonl"  # the recipe's benchmark: a local copy, changed between the kill and the resume
    bench.write_text("".join(json.dumps(p) + "\n" for p in problems))
    recipe.write_text(recipe.read_text().replace(str(HUMANEVAL), str(bench)))
    fewer = [p for p in problems if p["task_id"] != planted[1]]  # the second dclm plant is no longer an item

    out = tmp_path / "out"
    killed = run(recipe, out, "streams:after-unit:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    units = list((out / "streams").rglob("units/*.json"))
    assert units and all(json.loads(u.read_text())["benchmark_set"] for u in units)
    bench.write_text("".join(json.dumps(p) + "\n" for p in fewer))
    (out / "tokmix-state" / "benchmarks.json").unlink()
    done = run(recipe, out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "were checked against another benchmark set" in done.stdout, done.stdout[-3000:]

    fresh = tmp_path / "fresh"
    assert run(recipe, fresh).returncode == 0
    assert outputs(out) == outputs(fresh)
    dropped = json.loads((out / "index.json").read_text())["benchmark_decontamination"]["documents"]
    assert dropped == len(planted) - 1
