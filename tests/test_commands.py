"""The commands' exit codes, run through the CLI as a user runs them: `tokmix demo` end to end (at a quarter of
its corpus, to stay cheap), then `tokmix plan` on the recipe it wrote: 0 when the sources suffice, 1 when they
do not, 2 for a recipe that cannot be read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tokmix as tokmix_api
from tokmix.cli import app
from tokmix.plan import make_plan


def tokmix(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    result = tokmix("demo", "--out", out, "--workers", 2, "--scale", 0.25)
    assert result.exit_code == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "demo done in" in result.stdout
    return out


def test_demo_exits_0_with_a_valid_run(demo):
    result = tokmix("validate", demo / "run")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"{demo / 'run'}: valid (")


def test_plan_shows_a_stream_that_gives_its_holdout_nothing(demo):
    """The demo's case (tests/test_stream_holdouts.py has the others): a stream's first held-out document is
    longer than the whole holdout and the seeded draw takes it first, so the domain's other stream gives nothing.
    Plan says so, with the numbers the run got."""
    recipe = tokmix_api.load_recipe(demo / "corpus/demo.toml")
    index = json.loads((demo / "run/index.json").read_text())
    plan = make_plan(recipe, out=demo / "run")
    assert {d: h.gives for d, h in plan.holdouts.items()} == {d: v["tokens_by_stream"] for d, v in index["val"].items()}
    assert index["val"]["code"]["docs"] == 1 and index["val"]["code"]["tokens_by_stream"]["code_c"] == 0
    need = plan.streams["code_c"].holdout_need
    assert need > 0 and [note.split(":")[:2] for note in plan.notes] == [
        ["holdout code", f" stream code_c gives none of its {need:,}-token share"]]


def test_demo_with_a_bad_scale_exits_2_with_one_line(tmp_path):
    result = tokmix("demo", "--out", tmp_path / "d", "--scale", 0)
    assert (result.exit_code, result.stderr) == (2, "error: demo corpus: scale must be > 0, got 0.0\n")


def test_plan_exits_0_when_the_sources_suffice(demo):
    result = tokmix("plan", demo / "corpus/demo.toml", "--out", demo / "plan-run")
    assert result.exit_code == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "problem(s)" not in result.stdout


def test_plan_exits_1_when_a_stream_runs_short(demo):
    recipe = demo / "corpus/demo.toml"
    text = recipe.read_text()
    steps = next(line for line in text.splitlines() if line.startswith("steps = "))
    short = recipe.with_name("short.toml")
    short.write_text(text.replace(steps, f"steps = {int(steps.split('=')[1]) * 10}"))
    result = tokmix("plan", short, "--out", demo / "short-run")
    assert result.exit_code == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "likely to run short" in result.stdout and "problem(s)" in result.stdout


def test_plan_of_a_missing_recipe_exits_2_with_one_line(tmp_path):
    result = tokmix("plan", tmp_path / "nope.toml")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "nope.toml" in result.stderr
