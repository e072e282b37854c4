"""Several mixes of one corpus with [decontaminate] (issue 29; docs/cache.md: ablations from one tokenization):
the recipe, another mix of it (other shares, seed and steps) and a two-phase schedule, each run once with a
token cache they share (the later ones take the first one's units) and once without. Each cached run writes its
uncached run's shards and contamination.json byte for byte, and every mix drops the same documents of a stream:
of two mixes drawing a stream, the contaminated places of the one that reads less of it are those of the other
up to where it stops (one's places are a subset of the other's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import make_inputs, plant_humaneval, with_schedule
from tokmix.shards import read_json

ROOT = Path(__file__).resolve().parents[1]
SCHEDULE = """
[[schedule]]
name = "warm"
steps = 25
shares = { dclm = 0.6, edu = 0.2, code_py = 0.1, code_other = 0.1 }

[[schedule]]
name = "anneal"
steps = 35
shares = { dclm = 0.2, edu = 0.4, code_py = 0.3, code_other = 0.1 }
"""


def run(recipe: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": "9000"}
    env.pop("TOKMIX_CACHE", None)
    done = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--workers",
                           "2", *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def mixes(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("decontam-mixes")
    recipe = make_inputs(root, doc_limit=300, rows_per_group=16, steps=60)
    plant_humaneval(root, recipe, 16, {"code_py": [2, 15, 16, 30], "edu": [3, 40], "dclm": [5]})
    text = recipe.read_text()
    other = root / "other.toml"
    other.write_text(re.sub(r"share = 0\.(45|35)", "share = 0.40", text.replace("seed = 1234", "seed = 99"))
                     .replace("steps = 60", "steps = 70"))
    scheduled = with_schedule(recipe, SCHEDULE, "scheduled.toml")
    scheduled.write_text(scheduled.read_text().replace("[layout]\n", '[layout]\ninterleave = "balanced"\n'))
    found = {}
    for name, path in (("recipe", recipe), ("other", other), ("scheduled", scheduled)):
        cached = run(path, root / f"{name}-cached", "--cache", str(root / "cache"))
        run(path, root / f"{name}-alone", "--no-cache")
        found[name] = (root / f"{name}-cached", root / f"{name}-alone", cached.stdout + cached.stderr)
    return found


def contamination(out: Path) -> dict:
    return read_json(out / "contamination.json", sealed=True)


def test_a_mix_from_the_cache_writes_what_it_writes_alone(mixes):
    for name, (cached, alone, log) in mixes.items():
        assert [p.read_bytes() for p in sorted(cached.glob("*.bin"))] == [
            p.read_bytes() for p in sorted(alone.glob("*.bin"))], name
        assert (cached / "contamination.json").read_bytes() == (alone / "contamination.json").read_bytes(), name
        taken = re.search(r"token cache: ([\d,]+) of ([\d,]+) units", log)
        assert taken is not None and (name == "recipe" or int(taken.group(1).replace(",", "")) > 0), (name, log)


def test_every_mix_drops_the_same_documents_of_a_stream(mixes):
    places = {}
    for name, (_, alone, _) in mixes.items():
        for item in contamination(alone)["items"]:
            for p in item["places"]:
                places.setdefault(name, {}).setdefault(p["stream"], set()).add((p["file"], p["place"], item["id"]))
    streams = {s for by_stream in places.values() for s in by_stream}
    assert {"code_py", "edu", "dclm"} <= streams
    for stream in streams:
        sets = sorted((places[name].get(stream, set()) for name in places), key=len)
        assert all(a <= b for a, b in zip(sets, sets[1:])), (stream, sets)
    assert len(places["scheduled"]["code_py"]) > len(places["recipe"]["code_py"])  # a mix reading more of it
