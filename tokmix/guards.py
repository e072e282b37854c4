"""The stage process's two watchdogs: the memory guard (past the run's budget, or with the machine running low,
exit for a restart from committed work) and the supervisor watch (the tokmix command gone: stop as Ctrl-C
stops a run)."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil

from tokmix.faults import end_descendants, exit_for_restart
from tokmix.process import ERROR_EXIT_CODE, log
from tokmix.progress import tree_rss

MEMORY_POLL_SECONDS = 0.25
MIN_AVAILABLE_BYTES = 256 << 20  # the machine itself running out: restart before the kernel's OOM killer acts


def start_memory_guard(limit: int, with_workers: bool = True, with_supervisor: bool = False) -> None:
    """Exit for a restart when this process and its workers pass `limit` bytes, or the machine runs low.
    Units commit atomically, so exiting at any moment loses only the units in flight (exit_for_restart runs
    the hooks that make the next start leaner first: tokmix.pipeline.fewer_worker_processes). With Ray the workers
    are Ray's (its own memory monitor kills and retries a task past its node's budget): the guard then
    watches this process, the driver, alone. RSS as top shows it, file-backed mapped pages included."""
    # The supervisor is counted when it is the tokmix command (docs/benchmarks.md), so that the guard's figure is the
    # whole command's, as the docs and benchmarks report it; under the Python API it is the caller's own
    # process (a notebook, a test runner), whose memory is not the run's.
    me = psutil.Process()
    supervisor = me.parent() if with_supervisor else None

    def watch() -> None:
        while True:
            rss = tree_rss() if with_workers else me.memory_info().rss
            if supervisor is not None:
                try:
                    rss += supervisor.memory_info().rss
                except psutil.Error:  # the supervisor is gone: this process is being stopped anyway
                    pass
            available = psutil.virtual_memory().available
            if rss > limit or available < MIN_AVAILABLE_BYTES:
                log(f"memory guard: process tree {rss / 2**20:,.0f} MiB (limit {limit / 2**20:,.0f}), "
                    f"machine available {available / 2**20:,.0f} MiB -> restarting from committed work")
                exit_for_restart()
            time.sleep(MEMORY_POLL_SECONDS)

    threading.Thread(target=watch, daemon=True, name="memory-guard").start()


SUPERVISOR_GONE_SECONDS = 10.0  # to stop as on Ctrl-C once the supervisor is gone, before being cut short


def watch_supervisor() -> None:
    """When the supervisor dies without stopping this process (kill -9 of the tokmix command, the OOM killer),
    stop as Ctrl-C stops a run: the stage process must not write on, holding the lock, for no one. If the
    stages do not end in SUPERVISOR_GONE_SECONDS (a call that signals cannot interrupt), end at once."""
    supervisor = os.getppid()

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(MEMORY_POLL_SECONDS)
        log(f"the tokmix command (pid {supervisor}) is gone: stopping; committed work is kept")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(SUPERVISOR_GONE_SECONDS)
        end_descendants(stop_tracker=False)
        os._exit(ERROR_EXIT_CODE)

    threading.Thread(target=watch, daemon=True, name="supervisor-watch").start()
