"""What the supervisor (tokmix.runner) and the stage process it starts (tokmix.pipeline) share, below both so
that neither imports the other: the run's options, the exit code of a stage process that failed, the log line
and the SIGTERM handler."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from tokmix.cache import resolve as resolve_cache
from tokmix.shards import UNIT_BYTES

ERROR_EXIT_CODE = 2


def default_unit_bytes() -> int:
    """The unit size a new run cuts its streams with: TOKMIX_UNIT_BYTES, else UNIT_BYTES (a resume keeps the one
    its run recorded: tokmix.identity's "unit size")."""
    return int(os.environ.get("TOKMIX_UNIT_BYTES", UNIT_BYTES))


@dataclass
class RunOptions:
    """How to run; none of it changes the output bytes."""

    workers: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    max_memory: int = 1 << 30
    keep_streams: bool = False
    mirrors: list[str] = field(default_factory=list)
    executor: str = "local"  # local | ray
    ray_address: str | None = None  # a running Ray cluster; without it --executor ray starts a local instance
    debug: bool = False
    # source bytes per work unit: the grain of parallelism and of resume (TOKMIX_UNIT_BYTES to tune)
    unit_bytes: int = field(default_factory=lambda: default_unit_bytes())
    log_seconds: float = 30.0  # without a terminal: a progress line per stage and stream this often
    log_format: str = "text"  # text | json: the lines on stdout without a terminal
    # the supervisor is a process of its own (the tokmix command), counted by the memory guard as top counts it;
    # under the Python API the supervisor is the caller's process, whose memory is not the run's
    guard_counts_supervisor: bool = False
    store: str | None = None  # the output is this store's URL; the run's state is in its local working folder
    # the token cache (tokmix.cache): a folder or URL, None for none; default TOKMIX_CACHE or ~/.cache/tokmix/units
    cache: str | None = field(default_factory=resolve_cache)
    cache_size: int | None = None  # the cache's cap in bytes (default: tokmix.cache.default_cap)
    # --executor processes: at most this many worker processes (the memory guard lowers it for its restart:
    # tokmix.pipeline.fewer_worker_processes); None for as many as --workers and --max-memory allow
    worker_processes: int | None = None


class _LogLines:
    """How this process writes its log lines: `[HH:MM:SS] message`, or one JSON object a line (--log-format
    json, set once by the supervisor and by the stage process from the run's options)."""

    format = "text"

    def __init__(self) -> None:
        self.lock = threading.Lock()  # the stages' threads and the progress lines: one whole line at a time

    def line(self, message: str, event: str = "log", **fields: object) -> str:
        if self.format == "json":
            return json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": event, **fields,
                               "message": message})
        return f"[{time.strftime('%H:%M:%S')}] {message}"

    def write(self, line: str) -> None:
        with self.lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def __call__(self, msg: str) -> None:
        self.write(self.line(msg))


log = _LogLines()


def interrupt(signum: int, frame: object) -> None:
    """A SIGTERM handler: stop as Ctrl-C does (committed work is kept)."""
    raise KeyboardInterrupt
