"""A real multi-node Ray run: a head and a second node started on this machine with `ray start`, each in its
own temp dir and process group, a tokmix run on that cluster, the second node's raylet SIGKILLed while one of
its workers is known to hold a unit, and the output compared byte for byte with a local run.

The second node's workers pause inside their first unit (TOKMIX_FAULT in that node's environment only: the
head's workers and the driver never see it) and say so through a FIFO; the test kills the raylet then, so
the kill always lands with a unit in flight on the dying node, whatever the timing of the run. Ray reruns
that unit on the head. Needs the ray extra."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

import tokmix
from tests.corpus import make_inputs
from tests.test_ray import RUN, outputs

START_SECONDS = 180  # `ray start` on a loaded 2-core machine: ~10-25 s a node
RUN_SECONDS = 300
# The head declares the killed node dead after ~5 failed health checks a second apart (Ray's default takes
# 15-30 s), and Ray then reruns the node's tasks elsewhere; 2 s per check spares a node slowed by a loaded
# machine from being declared dead while it starts.
HEAD_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
            "RAY_health_check_failure_threshold": "5"}
# Ray 2.60 turns token authentication on for `ray start --head`; a test cluster on one machine needs none.
# A raylet waits for its node's agents (Python processes) to start, 30 s by default, then crashes: on a loaded
# 2-core machine they took longer.
COMMON_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_agent_register_timeout_ms": "150000"}
START_TRIES = 3  # Ray's own start gives up after 30 s of waiting for the raylet to register



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent_ports() -> list[str]:
    """Ports that default to fixed numbers (52365, ...): two nodes on one machine, or another engineer's Ray,
    would collide on them."""
    return ["--dashboard-agent-listen-port", str(_free_port()), "--dashboard-agent-grpc-port", str(_free_port()),
            "--metrics-export-port", str(_free_port()), "--runtime-env-agent-port", str(_free_port())]


class RayNode:
    """One `ray start` in its own process group and temp dir: its daemons are found by that dir and killed
    by their group, never with `ray stop` (which stops every Ray on the machine)."""

    def __init__(self, args: list[str], env: dict[str, str]):
        for attempt in range(START_TRIES):
            try:
                self._start(args, env)
                return
            except RuntimeError:
                if attempt == START_TRIES - 1:
                    raise

    def _start(self, args: list[str], env: dict[str, str]) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="tokmix-ray-")  # short: Ray's socket paths must fit 107 bytes
        ray = str(Path(sys.executable).with_name("ray"))
        proc = subprocess.Popen([ray, "start", *args, "--temp-dir", self.temp_dir, "--disable-usage-stats"],
                                env={**os.environ, **COMMON_ENV, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.pgid = proc.pid
        try:
            said, _ = proc.communicate(timeout=START_SECONDS)
        except subprocess.TimeoutExpired as e:
            said = f"no answer within {START_SECONDS} s: {e.output}"
        if proc.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start {' '.join(args)} failed:\n{said[-3000:]}")

    def processes(self) -> list[psutil.Process]:
        """Every process of this node: its group, and the workers its raylet started (which may leave it)."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if os.getpgid(proc.pid) == self.pgid or any(self.temp_dir in arg for arg in proc.info["cmdline"] or []):
                    found += [proc, *proc.children(recursive=True)]
            except (psutil.Error, ProcessLookupError):
                pass
        return found

    def raylet(self) -> psutil.Process:
        for proc in self.processes():
            if Path(proc.cmdline()[0]).name == "raylet":
                return proc
        raise AssertionError(f"no raylet running under {self.temp_dir}")

    def stop(self) -> None:
        for proc in self.processes():
            try:
                proc.kill()
            except psutil.Error:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture
def fifo() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="tokmix-ray-fifo-"))
    os.mkfifo(directory / "paused")
    yield directory / "paused"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def cluster(fifo):
    """A head of 1 CPU and a second node of 1 CPU whose workers pause in their first unit; yields the head's
    address and the second node. Both are killed in teardown whatever happened."""
    ray = pytest.importorskip("ray", reason="the Ray executor is an extra: pip install 'tokmix[ray]'")
    nodes: list[RayNode] = []
    try:
        port = _free_port()
        nodes.append(RayNode(["--head", "--port", str(port), "--num-cpus", "1", "--include-dashboard=false",
                              "--ray-client-server-port", str(_free_port()), *_agent_ports()], HEAD_ENV))
        # the address Ray gives this machine's nodes (it refuses loopback for a multi-node cluster)
        address = f"{ray.util.get_node_ip_address()}:{port}"
        pause = {"TOKMIX_FAULT": "streams:unit-before-rename:1:pause", "TOKMIX_PAUSE_FIFO": str(fifo)}
        nodes.append(RayNode(["--address", address, "--num-cpus", "1", *_agent_ports()], pause))
        yield address, nodes[1]
    finally:
        for node in reversed(nodes):
            node.stop()


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    """test_ray's corpus: every row group of 16 documents a unit."""
    return make_inputs(tmp_path_factory.mktemp("ray-cluster"), rows_per_group=16, decontaminate=True)


def _wait_for_pause(fifo: Path, runner: threading.Thread) -> bool:
    """True once a worker of the second node says it is paused inside a unit; False if the run ended or
    RUN_SECONDS passed first. select() wakes on the worker's write, not on a timer."""
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # no writer yet: select waits for the first one
    try:
        deadline, said = time.monotonic() + RUN_SECONDS, b""
        while said != b"paused" and runner.is_alive() and time.monotonic() < deadline:
            if select.select([reader], [], [], 1.0)[0]:  # 1 s: how often to notice that the run has ended
                said += os.read(reader, 16)
        return said == b"paused"
    finally:
        os.close(reader)


def test_a_node_lost_mid_run_changes_nothing(cluster, recipe, fifo, tmp_path):
    address, second = cluster
    local = tmp_path / "local"
    tokmix.run(tokmix.load_recipe(recipe), local, executor="local", **RUN)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            tokmix.run(tokmix.load_recipe(recipe), tmp_path / "ray", executor="ray",
                       ray_address=address, **RUN)
        except BaseException as e:  # handed to the test's thread
            failure.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        paused = _wait_for_pause(fifo, runner)
        assert paused, failure or "no worker of the second node reached a unit"
        worker = next(p for p in second.processes() if p.cmdline()[:1] == ["ray::tokenize_unit"])
        in_flight = list((tmp_path / "ray/streams").glob(f"*/units/*.tok.tmp-{worker.pid}"))
        assert len(in_flight) == 1, "the paused worker holds no unit"  # written, not committed
        raylet = second.raylet()
        raylet.send_signal(signal.SIGKILL)  # the node goes, with the unit its worker holds uncommitted
        raylet.wait(10)
    finally:
        runner.join(RUN_SECONDS)
    assert not runner.is_alive(), "the run did not finish after the node was lost"
    assert not failure, failure
    assert outputs(tmp_path / "ray") == outputs(local)
