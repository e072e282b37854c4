"""The Ray executor: the same recipe run as Ray tasks writes the same bytes as the local process pool, with or
without an address; a Ray worker killed in the middle of a unit is rerun by Ray and changes nothing; SIGTERM
still stops a run cleanly; bad input and a wrong address still end as one line. The tests run on the session's
Ray head (tests/conftest.py `ray_head`); the stage process that tokmix runs connects to it by address, as it
would to a cluster. Needs the ray extra (skipped without it, but for the two tests that need no Ray)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import tokmix
from tests.pausing import wait_for_pause
from tests.ray_nodes import RUN, UNIT_BYTES
from tokmix import TokmixError
from tokmix.executors import make_executor

PAUSE_SECONDS = 120  # how long a run may take to reach its pause point on a loaded machine


@pytest.fixture
def ray_address(ray_head) -> str:
    return ray_head


def outputs(out: Path) -> dict[str, bytes]:
    """Every output file, with index.json's timings and throughputs (which vary run to run) and what came from
    the token cache left out."""
    files = {p.name: p.read_bytes() for p in sorted([*out.glob("*.bin"), *out.glob("*.docs"),
                                                     *out.glob("contamination.json")])}
    index = json.loads((out / "index.json").read_text())
    index.pop("throughput")
    index.pop("cache", None)
    for meta in index["mix"]["streams"].values():
        for key in ("seconds_last_run", "tok_s_end_to_end", "tok_s_tokenizer_capacity"):
            meta.pop(key)
    files["index.json"] = json.dumps(index, sort_keys=True).encode()
    return files


def test_ray_writes_the_same_bytes_as_local(ray_address, ray_corpus, ray_local_run, ray_cache, tmp_path):
    """Its Ray tasks take every unit from the token cache that the local run filled (tokmix.cache), but perhaps
    the one in which a stream reaches its budget: a unit gets its limit (the tokens left) only if every unit
    before it is committed when it is handed out, which depends on timing, so the local run may have cut it
    shorter than a Ray task given none needs, and that task tokenizes the rest on top of the entry."""
    index = tokmix.run(tokmix.load_recipe(ray_corpus / "recipe.toml"), tmp_path, executor="ray",
                       ray_address=ray_address, cache=str(ray_cache), **RUN)
    assert len(index["shards"]) > 1
    for name, cache in index["cache"]["by_stream"].items():
        assert cache["units_from_cache"] >= cache["units"] - 1 and cache["tokens_from_cache"] > 0, name
    assert outputs(tmp_path) == outputs(ray_local_run)


def test_without_an_address_the_stage_process_starts_its_own_ray(ray_corpus, ray_local_run, tmp_path):
    """`--executor ray` alone: a private Ray instance of --workers CPUs in the stage process, one per stage,
    within the default memory budget (the guard counts the driver; Ray's memory monitor watches the rest)."""
    pytest.importorskip("ray", reason="the Ray executor is an extra: pip install 'tokmix[ray]'")
    tokmix.run(tokmix.load_recipe(ray_corpus / "recipe.toml"), tmp_path, executor="ray", **RUN)
    assert outputs(tmp_path) == outputs(ray_local_run)


def test_a_killed_ray_worker_is_retried_and_the_output_is_unchanged(ray_address, ray_corpus, ray_local_run, tmp_path,
                                                                    monkeypatch):
    """The first Ray worker to hold a unit's tokens under their temporary name SIGKILLs itself there, once in
    the whole run (tokmix.faults `die` with TOKMIX_FAULT_ONCE: the retried task passes the point again); Ray
    reruns the unit and the run ends with the local run's bytes."""
    died = tmp_path / "died"
    monkeypatch.setenv("TOKMIX_FAULT", "streams:unit-before-rename:1:die")  # the stage process passes it on
    monkeypatch.setenv("TOKMIX_FAULT_ONCE", str(died))
    out = tmp_path / "out"
    tokmix.run(tokmix.load_recipe(ray_corpus / "recipe.toml"), out, executor="ray", ray_address=ray_address, **RUN)
    assert died.exists(), "no Ray worker reached the fault point"
    assert outputs(out) == outputs(ray_local_run)


def test_sigterm_in_a_ray_stage_stops_cleanly_and_the_run_resumes(ray_address, ray_corpus, ray_local_run, tmp_path):
    """ray.init makes SIGTERM a sys.exit; the executor puts tokmix's handler back, so a SIGTERM still ends the
    stage process as an interruption with its work kept, and the same run resumes to the same bytes. While it
    stands in the streams stage, `tokmix status` sees the stage and what the Ray tasks committed."""
    fifo, out = tmp_path / "paused", tmp_path / "out"
    os.mkfifo(fifo)
    call = (
        f"tokmix.run(tokmix.load_recipe({str(ray_corpus / 'recipe.toml')!r}), {str(out)!r}, executor='ray', "
        f"ray_address={ray_address!r}, **{RUN!r})"
    )
    env = {**os.environ, "TOKMIX_FAULT": "streams:after-unit:2:pause", "TOKMIX_PAUSE_FIFO": str(fifo)}
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import tokmix; {call}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    paused = wait_for_pause(fifo, lambda: proc.poll() is None, PAUSE_SECONDS)
    assert paused, proc.stderr.read() if proc.poll() is not None else f"no pause within {PAUSE_SECONDS} s"
    # `tokmix status` while the Ray tasks write: the stage, for how long, and the units committed so far
    shown = subprocess.run([sys.executable, "-m", "tokmix", "status", str(out)], capture_output=True, text=True)
    flat = " ".join(shown.stdout.split())
    assert shown.returncode == 0 and re.search(r"running: pid \d+ .*; stage streams for \d+:\d\d:\d\d", flat), flat
    assert "in progress" in flat and re.search(r"\d+ unit\(s\)", flat) and "holdout" in flat, flat
    proc.send_signal(signal.SIGTERM)  # the supervisor passes it on to the stage process
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert (out / "tokmix-state/error.txt").read_text().startswith("interrupted; committed work is kept")
    tokmix.run(tokmix.load_recipe(ray_corpus / "recipe.toml"), out, executor="ray", ray_address=ray_address, **RUN)
    assert outputs(out) == outputs(ray_local_run)


def test_bad_input_on_ray_is_one_line_and_keeps_the_holdouts(ray_address, ray_corpus, tmp_path):
    """A broken JSONL line that only a worker reads (the driver's backend check reads the first documents)
    fails the task once, not RAY_MAX_RETRIES times, and reaches the user as the worker raised it."""
    root = tmp_path / "c"
    shutil.copytree(ray_corpus, root)
    texts = pq.read_table(root / "corpus/dclm/part-0.parquet")["text"].to_pylist()
    lines = [json.dumps({"text": t}) for t in texts]
    lines[200] = '{"text": "cut off'
    (root / "corpus/dclm/part-0.jsonl").write_text("\n".join(lines) + "\n")
    split = root / "data/file_splits.json"
    split.write_text(split.read_text().replace("dclm/part-0.parquet", "dclm/part-0.jsonl"))
    recipe = root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('"corpus/dclm/*.parquet"', '"corpus/dclm/*"'))
    with pytest.raises(TokmixError) as failure:
        tokmix.run(
            tokmix.load_recipe(recipe),
            tmp_path / "out",
            executor="ray",
            ray_address=ray_address,
            **{**RUN, "unit_bytes": 20_000},
        )
    assert re.fullmatch(r"stream dclm: file \S+/part-0\.jsonl: line 201: invalid JSON \(.*\)", str(failure.value))
    assert (tmp_path / "out/val_dclm.bin").exists()


def test_an_unreachable_ray_address_is_one_line(ray_address, ray_corpus, tmp_path):
    with pytest.raises(TokmixError, match=r"^cannot reach the Ray cluster at 127\.0\.0\.1:1: Connection refused$"):
        tokmix.run(
            tokmix.load_recipe(ray_corpus / "recipe.toml"), tmp_path, executor="ray", ray_address="127.0.0.1:1", **RUN
        )


def test_without_ray_the_executor_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(TokmixError, match=r"^the Ray executor needs Ray: pip install 'tokmix\[ray\]'$"):
        make_executor("ray", 2)


def test_an_unknown_executor_is_named():
    with pytest.raises(TokmixError, match="unknown executor 'dask'; choose 'local' or 'processes' or 'ray'"):
        make_executor("dask", 2)


def test_ray_workers_never_import_tokmix_from_the_working_directory(ray_address, ray_corpus, ray_local_run, tmp_path):
    """Ray adds its driver's working directory to every worker's sys.path: run from a directory holding a
    `tokmix` package whose code would leave a marker, neither the stage process (the driver) nor a worker runs
    it. The console script is used, as a user would, with tokmix found only where it is installed."""
    cwd, marker = tmp_path / "cwd", tmp_path / "executed"
    (cwd / "tokmix" / "stages").mkdir(parents=True)
    code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for name in ("__init__.py", "pipeline.py", "stages/__init__.py", "stages/streams.py", "stages/assemble.py"):
        (cwd / "tokmix" / name).write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("tokmix")), "run", str(ray_corpus / "recipe.toml"), "--out",
         str(tmp_path / "out"), "--executor", "ray", "--ray-address", ray_address, "--workers", "2"],
        cwd=cwd, env={**env, "TOKMIX_UNIT_BYTES": str(UNIT_BYTES)}, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists(), f"code from the working directory ran: {marker.read_text()}"
    assert outputs(tmp_path / "out") == outputs(ray_local_run)
