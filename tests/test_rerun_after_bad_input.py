"""A first run that stops on bad input before its first stage writes (a benchmark file's path with a typo) has
recorded its recipe; the recipe fixed, the same command starts the run over with it (said), instead of refusing
a resume that "would mix two runs": nothing was written to mix. Once a stage has written, a changed recipe is
refused as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.corpus import HUMANEVAL, make_inputs

ROOT = Path(__file__).resolve().parents[1]


def run(recipe: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": "9000"}
    for name in ("TOKMIX_CACHE", "TOKMIX_FAULT"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--no-cache"],
                          capture_output=True, text=True, env=env, timeout=600)


def test_a_typo_fixed_after_a_run_that_wrote_nothing_starts_it_over(tmp_path):
    recipe = make_inputs(tmp_path, doc_limit=200, rows_per_group=16, steps=40)
    plain = recipe.read_text()
    section = '\n[decontaminate]\n[decontaminate.benchmarks.humaneval]\nfiles = ["{}"]\nfields = ["prompt"]\n'
    recipe.write_text(plain + section.format(tmp_path / "HumanEvl.jsonl.gz"))
    out = tmp_path / "out"
    failed = run(recipe, out)
    assert failed.returncode == 2 and "HumanEvl.jsonl.gz: not found" in failed.stderr, failed.stderr[-2000:]
    assert (out / "tokmix-state" / "recipe.json").exists() and not list(out.glob("*.bin"))

    recipe.write_text(plain + section.format(HUMANEVAL))
    done = run(recipe, out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("started with another recipe, which wrote nothing yet (decontaminate.benchmarks.humaneval.files: "
            in done.stdout + done.stderr), (done.stdout + done.stderr)[-3000:]
    fresh = run(recipe, tmp_path / "fresh")
    assert fresh.returncode == 0
    assert ({p.name: p.read_bytes() for p in out.glob("*.bin")}
            == {p.name: p.read_bytes() for p in (tmp_path / "fresh").glob("*.bin")})

    # written: a changed recipe is refused, and the run's outputs stay
    recipe.write_text(plain + section.format(HUMANEVAL).replace('["prompt"]', '["prompt", "canonical_solution"]'))
    refused = run(recipe, out)
    assert refused.returncode == 2 and "was started with another recipe; resuming would mix two runs" in \
        refused.stderr, refused.stderr[-2000:]
    assert list(out.glob("*.bin"))
