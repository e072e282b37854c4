"""Output on object storage, through fsspec's memory filesystem (the code path an s3:// or gs:// bucket
takes): the run works locally and publishes write-once objects, index.json last; an interrupted publish is
resumed by running the same command again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

import tokmix
from tests.corpus import make_inputs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    return make_inputs(tmp_path_factory.mktemp("pub"), doc_limit=600, blocks=120)


def test_a_url_output_holds_the_same_bytes_as_a_local_run(recipe, tmp_path):
    local = tmp_path / "local"
    tokmix.run(tokmix.load_recipe(recipe), local, workers=2)
    index = tokmix.run(tokmix.load_recipe(recipe), "memory://bucket/run", work=tmp_path / "work", workers=2)
    fs = fsspec.filesystem("memory")
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls("/bucket/run", detail=False))
    want = sorted(p.name for p in [*local.glob("*.bin"), *local.glob("*.docs")]) + ["index.json"]
    assert names == sorted(want)
    for name in want[:-1]:
        assert fs.cat(f"/bucket/run/{name}") == (local / name).read_bytes(), name
    assert index["shards"] == tokmix.shards.read_index(local)["shards"]


def test_file_urls_are_local_paths(recipe, tmp_path):
    tokmix.run(tokmix.load_recipe(recipe), f"file://{tmp_path}/out", workers=2)
    assert (tmp_path / "out" / "index.json").exists()


def test_an_interrupted_publish_resumes_and_the_index_comes_last(recipe, tmp_path):
    url = f"file://{tmp_path}/bucket/run"  # a URL the subprocess sees too, through fsspec's local filesystem
    out = str(tmp_path / "bucket" / "run")
    cmd = [sys.executable, "-c", "import tokmix, sys; tokmix.run(tokmix.load_recipe(sys.argv[1]), sys.argv[2], "
           "work=sys.argv[3], workers=2)", str(recipe), url.replace("file://", "simplecache::file://"),
           str(tmp_path / "work")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_FAULT": "publish:before-move:3"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not Path(out, "index.json").exists(), "no commit record before every file is there"
    env.pop("TOKMIX_FAULT")
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    local = tmp_path / "work"
    for p in local.glob("*.bin"):
        assert Path(out, p.name).read_bytes() == p.read_bytes()
    assert Path(out, "index.json").exists()
    assert not list(Path(out).glob("*.tmp-*")), "temporary objects of the interrupted publish are removed"
