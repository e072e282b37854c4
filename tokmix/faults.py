"""Fault injection for the crash-safety tests: named points inside every stage where a run can be made to
kill itself. `TOKMIX_FAULT=assemble:after-rename:3` SIGKILLs the whole process group (supervisor, stage
process and workers) the 3rd time a process passes that point; `...:3:restart` instead exits the stage
process with the restart code, as the memory guard does (its on_restart hooks too); `...:3:pause` writes
"paused" to the FIFO named by TOKMIX_PAUSE_FIFO and waits for a signal; `...:3:hold` writes it too, then waits
until the test writes "resume" into the FIFO (the run goes on from the point: a test changes the world at a
known moment); and `...:3:die` SIGKILLs this process alone (a worker lost as the OOM killer loses one: its
stage process or Ray carries on). A point may name where it is (`streams:after-unit@code_py:1` counts code_py's
units only). With TOKMIX_FAULT_ONCE=PATH a fault fires in one process only, the first to create PATH (it writes
its pid there): a Ray task rerun elsewhere passes the point again, and the test knows from the file that the
fault was reached. Several specs may be given, comma-separated. Without TOKMIX_FAULT a fault point costs one
dictionary lookup."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

RESTART_EXIT_CODE = 75
# what a process must inherit for its fault points to fire (Ray tasks get them through their runtime env)
ENV_VARS = ("TOKMIX_FAULT", "TOKMIX_PAUSE_FIFO", "TOKMIX_FAULT_ONCE")

POINTS = (
    "tokenizer:training",  # in the trainer's process, its first document read
    "tokenizer:after-train",
    "backend:checking",  # in the backend check's process
    "holdout:after-write",  # val_<domain>.bin renamed, index.json not yet updated
    "holdout:after-index",
    "streams:unit-mid-write",  # half of a batch of a unit's tokens written (tokmix.tokens.TokenFileWriter)
    "streams:unit-before-rename",  # a unit's tokens written under the temporary name
    "streams:unit-before-record",  # tokens and lengths committed, the unit's record not yet
    "streams:after-unit",  # the coordinator got a committed unit
    "cache:after-take-file",  # a file of a token cache entry linked or copied into the run's units folder
    "cache:fill-before-rename",  # a cache entry made in the cache's tmp/, not yet renamed into entries/
    "cache:holdout-fill-before-rename",  # the same for an entry of a stream's holdout documents
    "cache:benchmark-set-fill-before-rename",  # the same for a built benchmark set's entry
    "cache:after-take-set-file",  # an array of a built benchmark set's entry linked or copied into the run's
    "streams:before-meta",
    "streams:after-meta",
    "assemble:mid-write",  # half of a gathered part of a shard written
    "assemble:before-rename",  # a shard fully written under its temporary name
    "assemble:after-rename",  # the shard visible, its record not yet written
    "assemble:after-record",
    "assemble:before-index",
    "validate:before",
    "cleanup:before",  # validated, intermediates not yet removed
    "runner:before-restart",  # the supervisor between a stage process's restart exit and the next start
    "publish:before-index",  # a store's run validated, its index.json not yet uploaded
    "report:before-write",  # tokmix report, its figures computed
    "write:middle",  # half of a file's bytes written (tokmix.shards.write_bytes: every file but token files)
)

_counts: dict[str, int] = {}


def end_descendants(seconds: float = 10.0, stop_tracker: bool = True) -> None:
    """Kill every process this one started, and their own (a tokenizer trainer, a backend check, worker
    processes, a local Ray instance): none may outlive the stage process, holding memory, the CPU or the
    terminal's pipes. multiprocessing's resource tracker goes last and is stopped, not killed: it removes the
    semaphores the pools left, once no process holds its pipe. Called from a thread other than the main one,
    which may still be tearing a pool down, `stop_tracker=False`: the tracker would unlink that pool's semaphores
    under it (a 'sem_unlink: No such file' traceback per semaphore on stderr); it ends by itself once this
    process has exited."""
    from multiprocessing import resource_tracker

    import psutil

    tracker = resource_tracker._resource_tracker
    children = [c for c in psutil.Process().children(recursive=True) if c.pid != tracker._pid]
    for child in children:
        try:
            child.kill()
        except psutil.Error:  # gone already
            pass
    psutil.wait_procs(children, timeout=seconds)
    if not stop_tracker:
        return
    try:
        tracker._stop()  # closes its pipe and waits for it (Python >= 3.8)
    except Exception:  # noqa: BLE001 - another version's tracker: it stops by itself once its pipe is closed
        pass


_before_restart: list[Callable[[], None]] = []


def on_restart(hook: Callable[[], None]) -> None:
    """Run `hook` before every exit_for_restart of this process (the memory guard's: fewer worker processes)."""
    _before_restart.append(hook)


def exit_for_restart() -> None:
    """End this stage process at once for the supervisor to start a fresh one, after the on_restart hooks:
    workers first, so that none is left holding the output pipes or memory. (The memory guard's thread calls
    it, and a fault point in any thread: the tracker is left to end with this process.)"""
    for hook in _before_restart:
        hook()
    end_descendants(stop_tracker=False)
    sys.stdout.flush()
    os._exit(RESTART_EXIT_CODE)


def _specs() -> list[tuple[str, int, str]]:
    specs = []
    for spec in filter(None, os.environ.get("TOKMIX_FAULT", "").split(",")):
        stage, point, *rest = spec.split(":")
        hit = int(rest[0]) if rest else 1
        action = rest[1] if len(rest) > 1 else "kill"
        specs.append((f"{stage}:{point}", hit, action))
    return specs


def _first_to_fire() -> bool:
    """Under TOKMIX_FAULT_ONCE: True in the one process that creates the file, ever."""
    once = os.environ.get("TOKMIX_FAULT_ONCE")
    if not once:
        return True
    try:
        fd = os.open(once, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def fault_point(name: str, where: str | None = None) -> None:
    """Kill, restart, pause or die here if TOKMIX_FAULT asks for this point (or for `name@where`)."""
    if "TOKMIX_FAULT" not in os.environ:
        return
    keys = (name, f"{name}@{where}") if where else (name,)
    for key in keys:
        _counts[key] = _counts.get(key, 0) + 1
    for point, hit, action in _specs():
        if point in keys and _counts[point] == hit and _first_to_fire():
            _fire(action)


def _fire(action: str) -> None:
    sys.stdout.flush()
    if action == "restart":
        exit_for_restart()
    if action == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if action in ("pause", "hold"):  # tell the test through its FIFO
        with open(os.environ["TOKMIX_PAUSE_FIFO"], "w") as f:
            f.write("paused")
        if action == "pause":  # then wait for its signal
            while True:
                signal.pause()
        said = ""
        while said != "resume":  # hold: wait for its word through the same FIFO (each open blocks for it)
            with open(os.environ["TOKMIX_PAUSE_FIFO"]) as f:
                said = f.read()
        return
    os.killpg(os.getpgid(0), signal.SIGKILL)
