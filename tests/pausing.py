"""Waiting for a run that stands at a fault point (tokmix.faults, action `pause`): the paused process says so
through a FIFO, so a test acts at a known moment of the run, never by polling the run's files or timing it."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from pathlib import Path


def wait_for_pause(fifo: Path, alive: Callable[[], bool], seconds: float) -> bool:
    """True once a process paused at a fault point (tokmix.faults, action `pause`) says "paused" through `fifo`;
    False if `alive()` turns false or `seconds` pass first. select() wakes on the write, not on a timer; the
    1 s timeout is only how often to notice that the run has ended."""
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # no writer yet: select waits for the first one
    try:
        deadline, said = time.monotonic() + seconds, b""
        while said != b"paused" and alive() and time.monotonic() < deadline:
            if select.select([reader], [], [], 1.0)[0]:
                said += os.read(reader, 16)
        return said == b"paused"
    finally:
        os.close(reader)


def resume(fifo: Path) -> None:
    """Let the process held at a fault point (action `hold`) go on: it waits for this word on the same FIFO."""
    with open(fifo, "w") as f:
        f.write("resume")
