"""Where work units and shards run: threads of the stage process, or Ray tasks on a cluster. Both run the same
top-level functions on the same arguments, so the executor never changes the output. Ray is an optional
extra, imported only by RayExecutor."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import signal
import socket
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from tokmix.errors import TokmixError

WORKER_ENV = {
    # a Ray worker runs one task per CPU: parallelism comes from the tasks, not from HF's rayon pool per process
    "TOKENIZERS_PARALLELISM": "false",
    "ARROW_DEFAULT_MEMORY_POOL": "system",  # glibc gives arrow buffers back; jemalloc hoards
}
EXECUTORS = ("local", "ray")
NO_RAY = "the Ray executor needs Ray: pip install 'tokmix[ray]'"
RAY_MAX_RETRIES = 3  # reruns of a task whose worker process or node died; its writes are idempotent
RAY_CONNECT_SECONDS = 10  # ray.init retries an unreachable GCS address for minutes: check it first


class LocalExecutor:
    """Threads of the stage process sharing one encoder. Every backend encodes with the GIL released, one
    thread per call (tokmix.stages.ENCODER_THREADS), so `workers` threads keep as many cores encoding while
    their units are read and written in between; one process holds one copy of the encoder (a process pool
    held one per worker and paid for pickling every result)."""

    def __init__(self, workers: int):
        self.workers = workers
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="tokmix-worker")

    def submit(self, fn: Callable, *args: Any) -> Future:
        return self.pool.submit(fn, *args)

    @staticmethod
    def wait_any(pending: set[Future]) -> set[Future]:
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        return done

    @staticmethod
    def result(future: Future) -> Any:
        return future.result()

    def close(self, cancel: bool = False) -> None:
        """On an error the queued tasks are dropped; the running ones end with the stage process, which exits
        at once (their temporary files are removed by the next run)."""
        self.pool.shutdown(wait=not cancel, cancel_futures=cancel)

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=exc[0] is not None)


class RayExecutor:
    """Ray tasks, on a private local Ray instance (no address) or on a running cluster. Ray's fault tolerance
    does the retrying: a task whose worker process or node dies is run again, up to RAY_MAX_RETRIES times
    (unit and shard writes are atomic and idempotent, so a rerun is safe); an exception raised by the task
    itself is bad input, not a crash, so it is never retried and surfaces as it was raised."""

    def __init__(self, workers: int, address: str | None = None):
        try:
            import ray
        except ImportError:
            raise TokmixError(NO_RAY) from None
        self.ray, self.workers = ray, workers
        self.names: dict = {}  # ObjectRef in flight -> its function's name, for cancel and messages
        self.remotes: dict[Callable, Any] = {}
        # ray's own convention: RAY_ADDRESS (set by `ray job submit`) when no address is given
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.owns = not ray.is_initialized()  # a caller's own ray.init is used as it is, and left running
        if self.owns:
            self._init()

    def _init(self) -> None:
        where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
        _check_reachable(self.address)
        sigterm = signal.getsignal(signal.SIGTERM)
        try:
            if self.address:
                self.ray.init(address=self.address, logging_level=logging.WARNING)
            else:  # "local": a private instance, never a cluster someone else started on this machine
                self.ray.init(
                    address="local", num_cpus=self.workers, include_dashboard=False, logging_level=logging.WARNING
                )
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise TokmixError(f"cannot start or reach {where}: {_first_line(e)}") from None
        finally:  # ray.init makes SIGTERM a sys.exit; the stage process's own handler stops a run cleanly
            if threading.current_thread() is threading.main_thread() and sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)

    def submit(self, fn: Callable, *args: Any) -> Any:
        if fn not in self.remotes:
            # the function travels by reference (module and name): workers import tokmix themselves
            self.remotes[fn] = self.ray.remote(fn).options(
                max_retries=RAY_MAX_RETRIES, retry_exceptions=False, runtime_env={"env_vars": WORKER_ENV}
            )
        ref = self.remotes[fn].remote(*args)
        self.names[ref] = fn.__name__
        return ref

    def wait_any(self, pending: set) -> set:
        """At least one finished task; one at a time keeps what the driver holds at the window's size."""
        ready, _ = self.ray.wait(list(pending), num_returns=1)
        return set(ready)

    def result(self, ref: Any) -> Any:
        name = self.names.pop(ref, "a task")
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as e:  # raised by the task itself: re-raise the original
            if isinstance(e.cause, TokmixError):
                raise e.cause from None  # the one-line message, as the local executor gives it
            if isinstance(e.cause, Exception):
                raise e.cause from e  # a bug: its own type and message; --debug shows the worker's traceback
            raise
        except self.ray.exceptions.RayError as e:  # Ray gave up: retries spent, node lost, out of memory
            raise TokmixError(
                f"Ray could not run {name} (after up to {RAY_MAX_RETRIES} retries): "
                f"{type(e).__name__}: {_first_line(e)}"
            ) from e

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for ref in self.names:
                self.ray.cancel(ref)  # KeyboardInterrupt in the task: its writer removes its temporary file
        self.names.clear()
        if self.owns and self.ray.is_initialized():
            self.ray.shutdown()  # a local instance stops; a cluster stays up, only this driver disconnects

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=exc[0] is not None)


def _first_line(e: BaseException) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def _unknown(kind: str) -> TokmixError:
    return TokmixError(f"unknown executor {kind!r}; choose " + " or ".join(map(repr, EXECUTORS)))


def _check_reachable(address: str | None) -> None:
    """A HOST:PORT address that nothing answers at fails now: ray.init would retry it for minutes."""
    host_port = re.fullmatch(r"([\w.-]+):(\d+)", address or "")
    if host_port:
        try:
            socket.create_connection((host_port[1], int(host_port[2])), timeout=RAY_CONNECT_SECONDS).close()
        except OSError as e:
            raise TokmixError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def check_executor(kind: str, address: str | None = None) -> None:
    """Fail before any work is done when the executor is unknown, its extra is not installed or the Ray
    address answers nothing."""
    if kind not in EXECUTORS:
        raise _unknown(kind)
    if kind == "ray" and importlib.util.find_spec("ray") is None:
        raise TokmixError(NO_RAY)
    if kind == "ray":
        _check_reachable(address or os.environ.get("RAY_ADDRESS"))


def make_executor(kind: str, workers: int, address: str | None = None) -> LocalExecutor | RayExecutor:
    """`address` is the Ray cluster to connect to; without it, Ray runs a local instance of `workers` CPUs."""
    if kind == "local":
        return LocalExecutor(workers)
    if kind == "ray":
        return RayExecutor(workers, address)
    raise _unknown(kind)
