"""Where work units and shards run: a local process pool, or Ray tasks on a cluster. Both run the same
top-level functions on the same arguments, so the executor never changes the output."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from tokmix.errors import TokmixError


def _init_worker() -> None:
    # parallelism comes from the pool and the backend's own threads, not from HF's rayon pool per process
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # glibc gives arrow buffers back; jemalloc hoards


class LocalExecutor:
    """A pool of spawned processes (spawn: no inherited locks or file handles from the coordinator)."""

    def __init__(self, workers: int):
        self.workers = workers
        self.pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker)

    def submit(self, fn: Callable, *args: Any) -> Future:
        return self.pool.submit(fn, *args)

    @staticmethod
    def wait_any(pending: set[Future]) -> set[Future]:
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        return done

    @staticmethod
    def result(future: Future) -> Any:
        return future.result()

    def pids(self) -> list[int]:
        return [p.pid for p in (self.pool._processes or {}).values()]

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for p in (self.pool._processes or {}).values():
                p.kill()
        self.pool.shutdown(wait=not cancel, cancel_futures=cancel)

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=exc[0] is not None)


def make_executor(kind: str, workers: int) -> LocalExecutor:
    if kind == "local":
        return LocalExecutor(workers)
    raise TokmixError(f"unknown executor {kind!r}; choose 'local'")
