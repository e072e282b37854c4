"""Ray nodes started for the tests with `ray start`, each in its own temp dir and process group: the session's
head (tests/conftest.py `ray_head`, which every Ray test runs on by address) and the second node that
tests/test_ray_cluster.py adds to it and kills. Never `ray stop`: it stops every Ray on the machine."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

# The run every Ray test makes (on tests/conftest.py's ray_corpus, whose schedule gives it 960 blocks): about 45
# units of 16 rows each across the four streams, so a kill lands inside one.
UNIT_BYTES = 1  # every parquet row group is a unit
RUN = {"workers": 2, "unit_bytes": UNIT_BYTES}
START_SECONDS = 180  # `ray start` on a loaded 2-core machine: ~10-25 s a node
# The head declares a killed node dead after ~5 failed health checks a second apart (Ray's default takes
# 15-30 s), and Ray then reruns the node's tasks elsewhere; 2 s per check spares a node slowed by a loaded
# machine from being declared dead while it starts.
HEAD_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
            "RAY_health_check_failure_threshold": "5"}
# Ray 2.60 turns token authentication on for `ray start --head`; a test cluster on one machine needs none.
# A raylet waits for its node's agents (Python processes) to start, 30 s by default, then crashes: on a loaded
# 2-core machine they took longer.
COMMON_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_agent_register_timeout_ms": "150000"}
START_TRIES = 3  # Ray's own start gives up after 30 s of waiting for the raylet to register


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports: each socket stays bound until all are chosen (one port asked for at a time, the
    system may give the same one twice: Ray refuses a port two of its components are given)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def agent_ports(ports: list[int] | None = None) -> list[str]:
    """Ports that default to fixed numbers (52365, ...): two nodes on one machine, or another engineer's Ray,
    would collide on them. Four distinct free ones, unless given."""
    ports = ports or free_ports(4)
    return ["--dashboard-agent-listen-port", str(ports[0]), "--dashboard-agent-grpc-port", str(ports[1]),
            "--metrics-export-port", str(ports[2]), "--runtime-env-agent-port", str(ports[3])]


class RayNode:
    """One `ray start` in its own process group and temp dir: its daemons are found by that dir and killed
    by their group."""

    def __init__(self, args: list[str], env: dict[str, str]):
        for attempt in range(START_TRIES):
            try:
                self._start(args, env)
                return
            except RuntimeError:
                if attempt == START_TRIES - 1:
                    raise

    @classmethod
    def head(cls, num_cpus: int) -> tuple[RayNode, str]:
        """A head node of `num_cpus` CPUs, no dashboard; returns it and its address (the address Ray gives this
        machine's nodes: it refuses loopback for a multi-node cluster)."""
        import ray

        port, client, *agents = free_ports(6)
        node = cls(["--head", "--port", str(port), "--num-cpus", str(num_cpus), "--include-dashboard=false",
                    "--ray-client-server-port", str(client), *agent_ports(agents)], HEAD_ENV)
        return node, f"{ray.util.get_node_ip_address()}:{port}"

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
