"""One writer per output directory, whatever process does the writing. A run holds the kernel's lock (flock) on
`tokmix-state/lock` (the supervisor and the stage process, which inherits it); every task that writes (a unit, a
repeat unit, a shard: in a thread, a worker process or a Ray task) holds a shared lock on `tokmix-state/writers`
while it runs, and writes only while the lock file still names its run's token. A new run takes the run lock,
writes its own token, then must get the writers lock exclusively, once: a worker left writing by a killed stage
process makes it refuse; one that had not started writing finds another token and writes nothing."""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from tokmix.errors import TokmixError
from tokmix.shards import LOCK_NAME, WRITERS_NAME, Layout, NotAFile, open_regular, read_regular


def flock_holders(path: Path) -> list[int] | None:
    """The pids holding a flock on `path` (from /proc/locks: whoever took it, a process that inherited it is not
    listed apart), [] when none; None where the kernel does not say (no /proc/locks)."""
    try:
        inode = os.stat(path).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except FileNotFoundError:
        return [] if Path("/proc/locks").exists() else None
    except OSError:
        return None
    pids = []
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF" ("->" marks a waiter)
        fields = line.split()
        if "->" in fields or "FLOCK" not in fields:
            continue
        at = fields.index("FLOCK")
        pid, where = fields[at + 3], fields[at + 4]
        if where.rsplit(":", 1)[-1] == str(inode) and pid.isdigit():
            pids.append(int(pid))
    return pids


def _open(path: Path) -> int:
    """A lock file of tokmix's own, never followed through a link: the run writes its name into the lock file,
    and a link there would have it truncate whatever file the link names."""
    try:  # non-blocking: a FIFO put in its place opens at once, and is refused
        return open_regular(path, follow=False, flags=os.O_RDWR | os.O_CREAT)
    except NotAFile as e:
        raise _not_the_lock(path, e.kind) from None


def _not_the_lock(path: Path, kind: str) -> TokmixError:
    return TokmixError(f"{path}: is {kind}, not tokmix's lock file; remove {'the link' if kind == 'a link' else 'it'} "
                       "(tokmix makes the file itself)")


def read_holder(path: Path) -> tuple[list[str], str | None]:
    """What the lock file names: host, the supervisor's pid and, once started, the stage process's; and the run's
    token."""
    try:
        lines = read_regular(path, follow=False).decode(errors="replace").splitlines()
    except FileNotFoundError:
        return [], None
    except NotAFile as e:
        raise _not_the_lock(path, e.kind) from None
    holder = lines[0].split()[:3] if lines else []
    token = lines[1].removeprefix("run ").strip() if len(lines) > 1 and lines[1].startswith("run ") else None
    return holder, token


class RunLock:
    """The run's lock. Taking it is atomic (of runs started together, one gets it), it is released when the last
    process holding it ends (a killed run leaves nothing to break), and the stage process inherits it, so a run
    whose supervisor alone was killed still holds it while its stage process writes. The file also names the
    run that took it (host and pid) and its token: one taken on another host, over a shared filesystem that may
    not carry the kernel's locks between hosts, is not broken unless the user says so (`break_lock`, the CLI's
    --break-lock)."""

    def __init__(self, layout: Layout, break_lock: bool = False):
        self.layout, self.break_lock = layout, break_lock
        self.fd: int | None = None
        self.token = secrets.token_hex(8)
        self.took_over: str | None = None  # whose lock this run took over, for the log

    def __enter__(self) -> RunLock:
        fd = _open(self.layout.lock)
        try:
            holder = self._take(fd)
            self.fd = fd
            self._write(os.getpid())
            _no_writers_left(self.layout)
        except BaseException:
            self.fd = None
            os.close(fd)
            raise
        if holder:
            self.took_over = (f"{'the run on ' + holder[0] if holder[0] != socket.gethostname() else 'a run'} "
                              f"(pid {holder[1]})")
        return self

    def _take(self, fd: int) -> list[str]:
        """Lock `fd`; returns the holder the file still names (a run killed before releasing it), if any."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pids = read_holder(self.layout.lock)[0][1:]
            # the supervisor's pid, or its stage process's when the supervisor alone was killed
            pid = next((p for p in pids if psutil.pid_exists(int(p))), pids[0] if pids else None)
            who = f" (pid {pid})" if pid else ""
            raise TokmixError(f"{self.layout.root}: another tokmix run{who} is writing this directory") from None
        holder = read_holder(self.layout.lock)[0][:2]  # as it is now that it is ours
        if len(holder) == 2 and holder[1].isdigit() and holder[0] != socket.gethostname() and not self.break_lock:
            raise TokmixError(f"{self.layout.root}: locked by a tokmix run on host {holder[0]} (pid {holder[1]}), "
                              "which cannot be checked from here: if no run is writing this directory there, run "
                              "again with --break-lock")
        return holder if len(holder) == 2 and holder[1].isdigit() else []

    def _write(self, *pids: int) -> None:
        # written over, then cut to length: a run refused at this moment reads a holder, never an empty file
        data = f"{socket.gethostname()} {' '.join(map(str, pids))}\nrun {self.token}\n".encode()
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))
        os.fsync(self.fd)

    def name_stage_process(self, pid: int) -> None:
        """Name the stage process beside the supervisor: it holds the lock too (it inherits it), and may outlive
        a killed supervisor."""
        self._write(os.getpid(), pid)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # released: the file names no holder
            os.close(self.fd)
            self.fd = None


def _no_writers_left(layout: Layout) -> None:
    """Refuse while a process of an earlier run still writes (a worker whose stage process was killed): taken
    once, exclusively, after this run's token is in the lock file, so a worker that starts a task later sees it."""
    fd = _open(layout.writers)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pids = flock_holders(layout.writers) or []
        who = f" (pid {', '.join(map(str, pids))})" if pids else ""
        raise TokmixError(f"{layout.root}: a process of an earlier run{who} is still writing this directory (a "
                          "worker whose stage process was stopped): wait for it to end, or stop it, then run "
                          "again") from None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RunWriter:
    """What a task needs to write for its run: the run's state folder and the token its lock file names."""

    state: str
    token: str

    @classmethod
    def of(cls, layout: Layout) -> RunWriter | None:
        """None for a run on a store: its state folder is local to the driver, which workers on other hosts
        cannot lock (docs/reliability.md says what holds there)."""
        if layout.remote:
            return None
        token = read_holder(layout.lock)[1]
        return cls(str(layout.state), token) if token else None


@contextmanager
def writing(writer: RunWriter | None) -> Iterator[None]:
    """Hold the writers lock (shared) while a task writes, after checking that its run still holds the
    directory; None (a caller outside a run, e.g. a benchmark) writes unguarded."""
    if writer is None:
        yield
        return
    state = Path(writer.state)
    fd = _open(state / WRITERS_NAME)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only for a starting run's moment of checking
        if read_holder(state / LOCK_NAME)[1] != writer.token:
            raise TokmixError(f"{state.parent}: this run no longer holds the directory (another run took its lock); "
                              "nothing written")
        yield
    finally:
        os.close(fd)
