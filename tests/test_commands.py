"""The commands' exit codes, run through the CLI as a user runs them: `tokmix demo` end to end (at a quarter of
its corpus, to stay cheap), then `tokmix plan` on the recipe it wrote: 0 when the sources suffice, 1 when they
do not, 2 for a recipe that cannot be read."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokmix.cli import app


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
