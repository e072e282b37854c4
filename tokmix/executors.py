"""Where work units and shards run: threads of the stage process, worker processes of this machine, or Ray tasks
on a cluster. All run the same top-level functions on the same arguments, so the executor never changes the
output. Ray is an optional
extra, imported only by RayExecutor."""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import multiprocessing as mp
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any

from tokmix.errors import TokmixError
from tokmix.faults import ENV_VARS as FAULT_ENV_VARS

WORKER_ENV = {
    # a Ray worker runs one task per CPU: parallelism comes from the tasks, not from HF's rayon pool per process
    "TOKENIZERS_PARALLELISM": "false",
    "ARROW_DEFAULT_MEMORY_POOL": "system",  # glibc gives arrow buffers back; jemalloc hoards
}
EXECUTORS = ("local", "processes", "ray")
NO_RAY = "the Ray executor needs Ray: pip install 'tokmix[ray]'"
RAY_MAX_RETRIES = 3  # reruns of a task whose worker process or node died; its writes are idempotent
RAY_CONNECT_SECONDS = 10  # ray.init retries an unreachable GCS address for minutes: check it first
# What the memory guard counts of the tree beside the stage process and its workers, when tokmix is the command:
# the supervisor (~47 MiB) and multiprocessing's resource tracker (~13 MiB).
SUPERVISOR_BYTES = 64 << 20
STAGE_PROCESS_BYTES = 256 << 20  # the stage process itself, in the streams and assemble stages
# What one local worker process may hold at its peak: an interpreter with numpy and pyarrow, its encoder's tables
# (fastokens' take ~1.3 KiB an id), and a unit's text and ids. Measured (docs/benchmarks.md, "Worker processes'
# memory"): a worker's peak over a run, 222-230 MiB with a 32k BPE, 273-289 with cl100k's ranks, 368-377 with
# o200k's, 285-293 with DeepSeek-V3's tokenizer.json: 84-101% of what encoder_process_bytes counts.
WORKER_PROCESS_BYTES = 224 << 20  # the least a worker is counted for
PROCESS_BASE_BYTES = 110 << 20
UNIT_WORK_BYTES = 80 << 20
ENCODER_BYTES_PER_ID = 1300


class LocalExecutor:
    """Threads of the stage process sharing one encoder: the least memory (one copy of the encoder), but one
    GIL. Every backend encodes with the GIL released, yet around each call CPython converts text between
    Arrow's UTF-8 and `str` with it held, ~16-17% of a worker's time (docs/scaling.md): past ~6 cores the
    threads queue for it. The default: on a few cores the fastest and the leanest."""

    def __init__(self, workers: int, name: str = "tokmix-worker"):
        self.workers = workers
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix=name)

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


def holdout_threads(workers: int) -> LocalExecutor:
    """Threads of the stage process for the holdout stage's reads, whatever the run's executor (they share the
    process's encoder): one per worker, at most this machine's cores (on Ray the workers are remote)."""
    return LocalExecutor(max(1, min(workers, os.cpu_count() or 1)), "tokmix-holdout")


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _start_child_process(parent: int, die_with_parent: bool = True) -> None:
    """A process the stage process started (a worker, a tokenizer trainer, a backend check): Ctrl-C reaches the
    whole process group, but stopping is the stage process's job (it kills what it started; a unit in flight
    leaves only a temporary file), so the child ignores it. A trainer or a check also dies with the stage
    process, whatever ends that one (kill -9, the OOM killer): the kernel sends it SIGKILL then (Linux), so it
    does not go on alone holding memory, a core and the terminal's pipes. A worker process is not tied so: one
    left by a killed stage process ends with its unit, and until then holds the writers' lock (tokmix.lock), which
    keeps a new run out of the directory."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not die_with_parent:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the stage process still kills its children as it ends
        pass
    if os.getppid() != parent:  # the stage process died before the line above
        os._exit(1)


def quiet_vanished_semaphores() -> None:
    """A process pool's semaphore already gone when its finalizer unlinks it (multiprocessing.synchronize's
    _cleanup, run as the pool's queues are collected after its workers were killed) makes CPython print an
    OSError traceback, "Exception ignored in: <Finalize object, dead>", beside a failed run's one line: the
    semaphore unlinked already (FileNotFoundError), or the resource tracker's pipe closed under it (EBADF in its
    unregister), seen in CI for a bad benchmark file built in a fresh process (a killed pool's teardown in
    Python 3.11's concurrent.futures). Nothing is left to clean, so exactly those are dropped; every other
    unraisable exception is printed as before."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, OSError) and _in_semaphore_cleanup(unraisable.exc_traceback):
            return
        previous(unraisable)

    sys.unraisablehook = hook


def _in_semaphore_cleanup(tb) -> bool:
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "_cleanup" and code.co_filename.endswith(os.path.join("multiprocessing", "synchronize.py")):
            return True
        tb = tb.tb_next
    return False


def kill_pool(pool: ProcessPoolExecutor) -> None:
    """Stop a process pool at once: queued tasks dropped, its processes killed."""
    for process in list((pool._processes or {}).values()):  # None once the pool is shut down
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


@contextmanager
def fresh_process() -> Iterator[ProcessPoolExecutor]:
    """A short-lived process: what it loads (every backend, HF's thread pool, a tokenizer trainer's tables)
    goes away with it instead of staying in the stage process's heap for the rest of the run. Its first
    submit starts it, with this process's environment as it is then. On an error or an interrupt it is
    killed, not waited for: a tokenizer trainer does not stop for Ctrl-C."""
    pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=_start_child_process,
                               initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:
        kill_pool(pool)
        raise
    pool.shutdown()


def _start_worker_process(parent: int, encoder: tuple[str, str] | None) -> None:
    """A local worker process (see _start_child_process). It builds its encoder (tokenizer path, backend) as it
    starts and encodes a line with it, so that what the memory guard sees of an idle worker is what it holds
    (fastokens fills some tables on its first call)."""
    _start_child_process(parent, die_with_parent=False)
    os.environ.update(WORKER_ENV)
    if encoder is not None:
        from tokmix.stages import shared_encoder

        try:
            shared_encoder(*encoder).encode_batch(["tokmix 2026"])
        except Exception:  # noqa: BLE001 - the first unit builds it again and reports why it cannot
            pass


def _started() -> None:
    """A task that only makes the pool start a process."""


_started_processes = 0  # worker processes of the running ProcessExecutor (one per stage process at most)


def started_worker_processes() -> int:
    """How many worker processes this stage process started (0 before its streams stage, or on another
    executor): the memory guard lowers the next start's --workers below it."""
    return _started_processes


class ProcessExecutor(LocalExecutor):
    """Worker processes of this machine, each with its own encoder and its own GIL: per-core throughput does not
    depend on the number of cores (the stage process only hands out task descriptions of ~1 KB and gets
    records back: tokens go from a worker straight to its unit file). Started with `spawn`, never `fork`: the
    stage process has threads (the memory guard, the encoder's pools). Each worker costs its own encoder and
    interpreter (encoder_process_bytes), so the memory budget bounds how many run (local_workers). They start
    at the first task, in the streams stage: never while the stage process's holdout stage holds an encoder of
    its own (it frees it before the streams stage)."""

    def __init__(self, workers: int, encoder: tuple[str, str] | None = None):
        self.workers, self.encoder = workers, encoder
        self.pool: ProcessPoolExecutor | None = None

    def submit(self, fn: Callable, *args: Any) -> Future:
        global _started_processes
        if self.pool is None:
            self.pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                            initializer=_start_worker_process, initargs=(os.getpid(), self.encoder))
            for _ in range(self.workers):  # the pool starts a process per task while none is idle: all of them now
                self.pool.submit(_started)
            _started_processes = self.workers
        return self.pool.submit(fn, *args)

    def result(self, future: Future) -> Any:
        try:
            return future.result()
        except BrokenProcessPool:  # killed from outside (the kernel's OOM killer, kill -9): not bad input
            raise TokmixError("a worker process died in the middle of a task (killed from outside, e.g. out of "
                              "memory); committed work is kept: run the same command again to resume") from None

    def close(self, cancel: bool = False) -> None:
        """On an error the queued tasks are dropped and the workers killed at once: a unit or shard in flight
        leaves only its temporary file, which the next run removes."""
        global _started_processes
        if self.pool is None:
            return
        if cancel:
            kill_pool(self.pool)
        else:
            self.pool.shutdown()
        _started_processes = 0


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
                max_retries=RAY_MAX_RETRIES, retry_exceptions=False, runtime_env={"env_vars": _task_env()}
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


def _task_env() -> dict[str, str]:
    """A Ray task's environment variables: WORKER_ENV, and the fault-injection variables this driver was given
    (a local worker process inherits them; a Ray worker, started by its node, would not)."""
    return {**WORKER_ENV, **{name: os.environ[name] for name in FAULT_ENV_VARS if name in os.environ}}


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


def worker_memory(workers: int, max_memory: int) -> int:
    """A worker's share of the tree's budget `max_memory`: what the stage process itself leaves, split evenly."""
    return (max_memory - STAGE_PROCESS_BYTES) // workers


def encoder_process_bytes(vocab_size: int) -> int:
    """What a worker process holding an encoder of `vocab_size` ids may hold at its peak, a unit in hand."""
    return max(WORKER_PROCESS_BYTES, PROCESS_BASE_BYTES + UNIT_WORK_BYTES + vocab_size * ENCODER_BYTES_PER_ID)


def local_workers(workers: int, max_memory: int, vocab_size: int = 0) -> int:
    """How many worker processes the memory budget holds, at most `workers` and at least one, beside the
    supervisor and the stage process (which holds no encoder once they run: ProcessExecutor)."""
    held = encoder_process_bytes(vocab_size)
    return max(1, min(workers, (max_memory - SUPERVISOR_BYTES - STAGE_PROCESS_BYTES) // held))


def make_executor(kind: str, workers: int, address: str | None = None,
                  encoder: tuple[str, str] | None = None) -> LocalExecutor | RayExecutor:
    """`workers` threads, worker processes (which build `encoder`, a tokenizer path and backend, as they start;
    the caller caps them to the memory budget: local_workers) or Ray CPUs. `address` is the Ray cluster to
    connect to; without it, Ray runs a local instance of `workers` CPUs."""
    if kind == "local":
        return LocalExecutor(workers)
    if kind == "processes":
        return ProcessExecutor(workers, encoder)
    if kind == "ray":
        return RayExecutor(workers, address)
    raise _unknown(kind)
