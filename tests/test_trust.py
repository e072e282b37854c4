"""The user's files and machine are the user's: tokmix runs only its installed code whatever the working
directory holds, touches only the paths it recorded creating, refuses an output directory that overlaps its
sources or belongs to something else, treats the split file as part of the run's identity, and lets one run
at a time write a directory. Every case is a real `tokmix` process on real files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import make_inputs

TOKMIX = Path(sys.executable).with_name("tokmix")  # the console script: the supervisor never has cwd on its path
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # tokmix as installed, nothing else


def tokmix(*args: str | Path, cwd: Path | None = None, env: dict | None = None, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([str(TOKMIX), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**ENV, **(env or {})}, start_new_session=True, **popen)


def run(recipe: Path, out: Path, *more: str, **kw) -> subprocess.CompletedProcess:
    return tokmix("run", recipe, "--out", out, "--workers", "2", *more, **kw)


def outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root, by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trust")
    return make_inputs(root, doc_limit=300, rows_per_group=16)


@pytest.fixture(scope="module")
def clean(corpus, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("clean")
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr
    return outputs(out)


# ---------------------------------------------------------------------------- only the installed code runs
@pytest.mark.parametrize("shadow", ["a clone's folder", "a package with code"])
def test_the_stage_process_never_imports_tokmix_from_the_working_directory(corpus, clean, tmp_path, shadow):
    """A `tokmix` folder in the working directory: the folder that holds a clone (no __init__, so a namespace
    package, which an editable install's finder loses to), or a package whose code would leave a marker."""
    cwd, marker = tmp_path / "cwd", tmp_path / "executed"
    (cwd / "tokmix").mkdir(parents=True)
    if shadow == "a clone's folder":
        (cwd / "tokmix" / "README.md").write_text("the clone of tokmix\n")
    else:
        code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
        for name in ("__init__.py", "pipeline.py", "runner.py", "stages.py"):
            (cwd / "tokmix" / name).write_text(code)
    proc = run(corpus, tmp_path / "out", cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists(), f"code from the working directory ran: {marker.read_text()}"
    assert outputs(tmp_path / "out") == clean


# ---------------------------------------------------------------------------- the split file is the run's
def test_an_edited_split_file_is_refused_naming_the_files_it_moved(corpus, clean, tmp_path):
    """decontaminate = false, the run killed once the holdout stage is done, a holdout file moved to train: the
    resume used to exit 0 with that file's holdout documents in the train shards."""
    root = tmp_path / "c"
    shutil.copytree(corpus.parent, root)
    recipe, split_path = root / "recipe.toml", root / "data" / "file_splits.json"
    assert "decontaminate = false" in recipe.read_text()
    out = tmp_path / "out"
    killed = run(recipe, out, env={"TOKMIX_FAULT": "holdout:after-index:3"})  # the third and last domain
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert sorted(p.name for p in out.glob("val_*.bin")) == ["val_code.bin", "val_dclm.bin", "val_edu.bin"]
    first = split_path.read_text()
    split = json.loads(first)
    moved = split["code"]["holdout"].pop(0)
    split["code"]["train"].append(moved)
    split_path.write_text(json.dumps(split, indent=2))
    refused = run(recipe, out)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"error: split file {split_path}: changed since this run started (code: {moved} moved holdout -> train); "
        "what is already written follows the first split: restore it, or use --restart to start over")
    assert not list(out.glob("train_*.bin"))
    split_path.write_text(first)  # restored: the run resumes to the clean run's bytes
    assert run(recipe, out).returncode == 0
    assert outputs(out) == clean
