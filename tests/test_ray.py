"""The Ray executor: the same recipe run as Ray tasks writes the same bytes as the local process pool, with or
without an address; a Ray worker killed in the middle of a unit is rerun by Ray and changes nothing; SIGTERM
still stops a run cleanly; bad input and a wrong address still end as one line. The tests share one local Ray
instance of 2 CPUs, started here; the stage process that tokmix runs connects to it by address, as it would
to a cluster. Needs the ray extra (skipped without it, but for the two tests that need no Ray)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

import tokmix
from tests.corpus import make_corpus, train_test_tokenizer, write_recipe, write_split
from tokmix import TokmixError
from tokmix.executors import make_executor

BLOCKS = 1024  # about 45 units of 16 rows each across the four streams, so a kill lands inside one
UNIT_BYTES = 1  # every parquet row group is a unit
RUN = {"workers": 2, "blocks": BLOCKS, "unit_bytes": UNIT_BYTES}
KILL_DEADLINE_SECONDS = 60


@pytest.fixture(scope="module")
def ray_address():
    ray = pytest.importorskip("ray", reason="the Ray executor is an extra: pip install 'tokmix[ray]'")
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ray-corpus")
    files = make_corpus(root, rows_per_group=16)
    write_split(root, files)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    write_recipe(root, "tokenizer/tokenizer.json", decontaminate=True)
    return root


@pytest.fixture(scope="module")
def local_run(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local")
    tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), out, executor="local", **RUN)
    return out


def outputs(out: Path) -> dict[str, bytes]:
    """Every output file, with index.json's timings and throughputs (which vary run to run) left out."""
    files = {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}
    index = json.loads((out / "index.json").read_text())
    index.pop("throughput")
    for meta in index["mix"]["streams"].values():
        for key in ("seconds_last_run", "tok_s_end_to_end", "tok_s_tokenizer_capacity"):
            meta.pop(key)
    files["index.json"] = json.dumps(index, sort_keys=True).encode()
    return files


def test_ray_writes_the_same_bytes_as_local(ray_address, corpus, local_run, tmp_path):
    index = tokmix.run(
        tokmix.load_recipe(corpus / "recipe.toml"), tmp_path, executor="ray", ray_address=ray_address, **RUN
    )
    assert len(index["shards"]) > 1
    assert outputs(tmp_path) == outputs(local_run)


def _running_unit() -> psutil.Process | None:
    """A Ray worker of this test's instance that is running tokenize_unit right now (Ray titles a worker
    process `ray::<function>` while it runs a task, `ray::IDLE` between tasks)."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.cmdline()[:1] == ["ray::tokenize_unit"]:
                return proc
        except psutil.Error:
            pass
    return None


def test_without_an_address_the_stage_process_starts_its_own_ray(ray_address, corpus, local_run, tmp_path):
    """`--executor ray` alone: a private Ray instance of --workers CPUs in the stage process, one per stage,
    within the default memory budget (the guard counts the driver; Ray's memory monitor watches the rest)."""
    tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), tmp_path, executor="ray", **RUN)
    assert outputs(tmp_path) == outputs(local_run)


def test_a_killed_ray_worker_is_retried_and_the_output_is_unchanged(ray_address, corpus, local_run, tmp_path):
    failure: list[BaseException] = []

    def run() -> None:
        try:
            tokmix.run(
                tokmix.load_recipe(corpus / "recipe.toml"), tmp_path, executor="ray", ray_address=ray_address, **RUN
            )
        except BaseException as e:  # handed to the test's thread
            failure.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    killed, deadline = None, time.monotonic() + KILL_DEADLINE_SECONDS
    while killed is None and runner.is_alive() and time.monotonic() < deadline:
        worker = _running_unit()
        if worker is not None:
            worker.kill()  # SIGKILL in the middle of a unit: its temporary files stay behind, uncommitted
            killed = worker.pid
        time.sleep(0.005)  # a poll, not a wait: the loop ends on the kill, the run's end or the deadline
    runner.join(KILL_DEADLINE_SECONDS)
    assert not runner.is_alive(), "the run did not finish"
    assert not failure, failure
    assert killed is not None, "no Ray worker was seen running tokenize_unit"
    assert outputs(tmp_path) == outputs(local_run)


def test_sigterm_in_a_ray_stage_stops_cleanly_and_the_run_resumes(ray_address, corpus, local_run, tmp_path):
    """ray.init makes SIGTERM a sys.exit; the executor puts tokmix's handler back, so a SIGTERM still ends the
    stage process as an interruption with its work kept, and the same run resumes to the same bytes."""
    fifo, out = tmp_path / "paused", tmp_path / "out"
    os.mkfifo(fifo)
    call = (
        f"tokmix.run(tokmix.load_recipe({str(corpus / 'recipe.toml')!r}), {str(out)!r}, executor='ray', "
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
    reader, said, deadline = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), b"", time.monotonic() + 60
    while said != b"paused" and proc.poll() is None and time.monotonic() < deadline:
        try:
            said += os.read(reader, 16)
        except BlockingIOError:  # the stage process has not reached the pause point yet
            pass
        time.sleep(0.01)
    os.close(reader)
    assert said == b"paused", proc.stderr.read() if proc.poll() is not None else "no pause within 60 s"
    proc.send_signal(signal.SIGTERM)  # the supervisor passes it on to the stage process
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert (out / "tokmix-state/error.txt").read_text().startswith("interrupted; committed work is kept")
    tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), out, executor="ray", ray_address=ray_address, **RUN)
    assert outputs(out) == outputs(local_run)


def test_bad_input_on_ray_is_one_line_and_keeps_the_holdouts(ray_address, corpus, tmp_path):
    """A broken JSONL line that only a worker reads (the driver's backend check reads the first documents)
    fails the task once, not RAY_MAX_RETRIES times, and reaches the user as the worker raised it."""
    root = tmp_path / "c"
    shutil.copytree(corpus, root)
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


def test_an_unreachable_ray_address_is_one_line(ray_address, corpus, tmp_path):
    with pytest.raises(TokmixError, match=r"^cannot reach the Ray cluster at 127\.0\.0\.1:1: Connection refused$"):
        tokmix.run(
            tokmix.load_recipe(corpus / "recipe.toml"), tmp_path, executor="ray", ray_address="127.0.0.1:1", **RUN
        )


def test_without_ray_the_executor_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(TokmixError, match=r"^the Ray executor needs Ray: pip install 'tokmix\[ray\]'$"):
        make_executor("ray", 2)


def test_an_unknown_executor_is_named():
    with pytest.raises(TokmixError, match="unknown executor 'dask'; choose 'local' or 'processes' or 'ray'"):
        make_executor("dask", 2)


def test_ray_workers_never_import_tokmix_from_the_working_directory(ray_address, corpus, local_run, tmp_path):
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
        [str(Path(sys.executable).with_name("tokmix")), "run", str(corpus / "recipe.toml"), "--out",
         str(tmp_path / "out"), "--executor", "ray", "--ray-address", ray_address, "--workers", "2",
         "--blocks", str(BLOCKS)],
        cwd=cwd, env={**env, "TOKMIX_UNIT_BYTES": str(UNIT_BYTES)}, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists(), f"code from the working directory ran: {marker.read_text()}"
    assert outputs(tmp_path / "out") == outputs(local_run)
