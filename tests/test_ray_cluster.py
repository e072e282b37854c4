"""A real multi-node Ray run: a second node added with `ray start` to the session's head (tests/conftest.py
`ray_head`, 1 CPU each, each in its own temp dir and process group), a tokmix run on that cluster, the second
node's raylet SIGKILLed while one of its workers is known to hold a unit, and the output compared byte for byte
with a local run.

The second node's workers pause inside their first unit (TOKMIX_FAULT in that node's environment only: the
head's workers and the driver never see it) and say so through a FIFO; the test kills the raylet then, so
the kill always lands with a unit in flight on the dying node, whatever the timing of the run. Ray reruns
that unit on the head. The recipe has [decontaminate] (HumanEval, three problems planted): both nodes read
the benchmark n-grams from the run's working folder, and drop and record what the local run does. Needs the
ray extra."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import pytest

import tokmix
from tests.pausing import wait_for_pause
from tests.ray_nodes import RUN, RayNode, agent_ports
from tests.test_ray import outputs
from tokmix.cache import UnitCache
from tokmix.shards import read_json

RUN_SECONDS = 300


@pytest.fixture
def fifo() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="tokmix-ray-fifo-"))
    os.mkfifo(directory / "paused")
    yield directory / "paused"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def second_node(ray_head, fifo) -> RayNode:
    """A node of 1 CPU joined to the session's head, whose workers pause in their first unit; killed in
    teardown whatever happened (the head carries on without it)."""
    pause = {"TOKMIX_FAULT": "streams:unit-before-rename:1:pause", "TOKMIX_PAUSE_FIFO": str(fifo)}
    node = RayNode(["--address", ray_head, "--num-cpus", "1", *agent_ports()], pause)
    try:
        yield node
    finally:
        node.stop()


def test_a_node_lost_mid_run_changes_nothing(ray_head, second_node, ray_corpus, ray_local_run, fifo, tmp_path):
    recipe = ray_corpus / "recipe.toml"
    failure: list[BaseException] = []

    cache = tmp_path / "cache"  # a token cache the workers of both nodes fill (tokmix.cache)

    def run() -> None:
        try:
            tokmix.run(tokmix.load_recipe(recipe), tmp_path / "ray", executor="ray",
                       ray_address=ray_head, cache=str(cache), **RUN)
        except BaseException as e:  # handed to the test's thread
            failure.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        paused = wait_for_pause(fifo, runner.is_alive, RUN_SECONDS)
        assert paused, failure or "no worker of the second node reached a unit"
        worker = next(p for p in second_node.processes() if p.cmdline()[:1] == ["ray::tokenize_unit"])
        in_flight = list((tmp_path / "ray/streams").glob(f"*/units/*.tok.tmp-{worker.pid}"))
        assert len(in_flight) == 1, "the paused worker holds no unit"  # written, not committed
        raylet = second_node.raylet()
        raylet.send_signal(signal.SIGKILL)  # the node goes, with the unit its worker holds uncommitted
        raylet.wait(10)
    finally:
        runner.join(RUN_SECONDS)
    assert not runner.is_alive(), "the run did not finish after the node was lost"
    assert not failure, failure
    assert outputs(tmp_path / "ray") == outputs(ray_local_run)  # contamination.json too
    assert len(read_json(tmp_path / "ray" / "contamination.json", sealed=True)["items"]) == 3  # the planted ones
    index = json.loads((tmp_path / "ray" / "index.json").read_text())
    whole, problems = UnitCache(str(cache)).verify()  # the unit lost with the node: tokenized and filled again
    assert problems == [] and whole >= index["cache"]["units"] > 1
