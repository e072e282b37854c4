"""Committing a file on a local (or shared) filesystem: written under a temporary name, its data on disk, then
renamed into place; in an output directory's top level, published only over a name tokmix marked as its own.
The object store's way (an upload that appears whole at its close) is tokmix.store's; both are behind
tokmix.store.storage()."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

from tokmix.errors import TokmixError

STATE_DIR = "tokmix-state"  # the run's own bookkeeping: resolved recipe, lock, holdout hashes
PUBLISHED_DIR = "published"  # in STATE_DIR: NAME.mark per top-level name tokmix has written a file under (publish)
TEMPS_DIR = "temporary"  # in STATE_DIR: NAME.tmp-PID per top-level temporary file, made before it (tmp_name)
TMP = re.compile(r"(.+)\.tmp-\d+")  # a file being written under its temporary name (tmp_name)


def tmp_name(path: Path) -> Path:
    """The temporary name `path` is written under. The pid keeps two writers (a killed run's leftover and its
    retry) from sharing one. At a run's top level, where the user's own files live, the name is recorded first
    (an empty file of that name in tokmix-state/temporary/): the sweep after a kill removes only recorded ones,
    never a file of the user's that happens to be named like one (tokmix.ownership)."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    if (path.parent / STATE_DIR / PUBLISHED_DIR).is_dir():  # a run's top level (made as every run starts)
        temps = path.parent / STATE_DIR / TEMPS_DIR
        temps.mkdir(exist_ok=True)
        os.close(os.open(temps / tmp.name, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    return tmp


def tmp_recorded(tmp: Path) -> Path:
    """Where tmp_name recorded a top-level temporary file."""
    return tmp.parent / STATE_DIR / TEMPS_DIR / tmp.name


def drop_tmp(tmp: Path) -> None:
    """A temporary file given up (or renamed away: only its record is left to remove)."""
    tmp.unlink(missing_ok=True)
    tmp_recorded(tmp).unlink(missing_ok=True)


def commit(tmp: Path, path: Path, durable: bool = True) -> None:
    """Make a fully written file visible under its final name: data on disk first, then the rename. Not
    `durable`: no fsync, so after a power loss the file may be there but empty."""
    if durable:
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    publish(tmp, path)


def publish(tmp: Path, path: Path) -> None:
    """Move `tmp` to its final name `path`. In an output directory's top level (what consumers read: shards,
    holdouts, index.json, tokenizer.json) never over a file tokmix did not put there: a name tokmix recorded
    (Layout.record) but has not created yet may meanwhile hold a file of the user's. So a name is marked as
    published (tokmix-state/published/NAME) before its first file appears, that first file is linked in (which
    fails if anything is there), and only a name already marked is replaced. Elsewhere (the state folder, the
    intermediates' folders, whose names are tokmix's; a folder that is no run) a plain rename."""
    marks = path.parent / STATE_DIR / PUBLISHED_DIR  # made by every run as it starts (Ownership.adopt_published)
    if not marks.is_dir():
        os.replace(tmp, path)
        return
    mark = mark_of(marks, path.name)
    if mark.exists():  # tokmix's name: what it wrote there before is replaced (a damaged or older version)
        os.replace(tmp, path)
        drop_tmp(tmp)
        return
    mark_published(mark)
    try:
        os.link(tmp, path)
    except FileExistsError:
        drop_tmp(tmp)
        raise TokmixError(f"{path}: exists but tokmix did not create it (put there after the run named it, before "
                          "it wrote it); move it away and run the same command again") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        if path.exists() or path.is_symlink():  # no hard links on this filesystem: check, then rename
            drop_tmp(tmp)
            raise TokmixError(f"{path}: exists but tokmix did not create it; move it away and run the same "
                              "command again") from None
        os.replace(tmp, path)
        drop_tmp(tmp)
        return
    drop_tmp(tmp)


def place(tmp: Path, path: Path, replace: bool = False) -> None:
    """Move a written temporary file to `path`, never over anything there unless `replace` (a file the caller
    knows is tokmix's): linked in, which fails if a file appeared meanwhile, then its temporary name removed."""
    try:
        if replace:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise TokmixError(f"{path}: exists and tokmix did not write it (put there meanwhile); nothing written "
                              "over it") from None
    finally:
        tmp.unlink(missing_ok=True)


def publish_new(path: Path, data: bytes, replace: bool = False) -> None:
    """`data` as the file `path` outside any run's folder (a report, an export), durably, under a temporary name
    created exclusively (never a file of the user's) and placed (place)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tokmix-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write_in_halves(f, data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    place(Path(tmp), path, replace)


# ---------------------------------------------------------------------------- only regular files are read
class NotAFile(TokmixError):
    """A path that tokmix would read is not a regular file (a FIFO, a device, a socket, a directory; with
    `follow=False` a link): reading it could block forever or never end, so it is refused before it is opened."""

    def __init__(self, path: str | os.PathLike, kind: str):
        self.path, self.kind = path, kind
        super().__init__(f"{path}: is {kind}, not a regular file; tokmix reads only regular files")

    def __reduce__(self):  # raised in a worker process, it crosses back pickled: rebuilt from its own arguments
        return type(self), (self.path, self.kind)


def not_regular(mode: int) -> str | None:
    """What a file of this mode is, in words, when it is not a regular file."""
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a link")):
        if test(mode):
            return kind
    return None if stat.S_ISREG(mode) else "not a regular file"


def check_regular(path: str | os.PathLike, follow: bool = True) -> os.stat_result:
    """The file's stat, NotAFile unless it is a regular file: stat only, nothing is opened (opening a FIFO for
    reading blocks until a writer comes; a device may never end). FileNotFoundError passes."""
    st = os.stat(path) if follow else os.lstat(path)
    kind = not_regular(st.st_mode)
    if kind is not None:
        linked = f" (through a link to {os.path.realpath(path)})" if follow and os.path.islink(path) else ""
        raise NotAFile(path, kind + linked)
    return st


def open_regular(path: str | os.PathLike, follow: bool = True, flags: int = os.O_RDONLY) -> int:
    """A descriptor of a regular file (opened with `flags`, for reading by default): checked by stat first (unless
    it may be created), opened non-blocking (a FIFO swapped in between opens at once rather than waiting for a
    writer) and checked again on the descriptor."""
    if not flags & os.O_CREAT:
        check_regular(path, follow)
    flags |= os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a link (not followed), or a socket
            raise NotAFile(path, "a link" if e.errno == errno.ELOOP else "a socket") from None
        raise
    kind = not_regular(os.fstat(fd).st_mode)
    if kind is not None:
        os.close(fd)
        raise NotAFile(path, kind)
    os.set_blocking(fd, True)
    return fd


def read_regular(path: str | os.PathLike, follow: bool = True) -> bytes:
    """A regular file's bytes (open_regular)."""
    with os.fdopen(open_regular(path, follow), "rb") as f:
        return f.read()


def check_input_file(path: str | os.PathLike, what: str = "") -> None:
    """A user's input file (recipe, split file, tokenizer) named by a local path or file:// URL: NotAFile unless
    it is a regular file (stat only); a missing file and other URLs pass, for the reader to name."""
    path = str(path).removeprefix("file://")
    if "://" in path:
        return
    try:
        check_regular(path)
    except FileNotFoundError:
        return
    except NotAFile as e:
        raise NotAFile(f"{what} {path}".strip(), e.kind) from None


def mark_of(marks: Path, name: str) -> Path:
    # an empty file, named apart from the file it marks (a reader of every *.json under a run parses JSON)
    return marks / f"{name}.mark"


def mark_published(mark: Path) -> None:
    """The mark, on disk before the name's first file appears (the folder fsynced: its entry too)."""
    mark.parent.mkdir(exist_ok=True)
    os.close(os.open(mark, os.O_WRONLY | os.O_CREAT, 0o644))
    fd = os.open(mark.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_in_halves(f: BinaryIO, data: bytes | memoryview, fault: str = "write:middle") -> None:
    """One write, as two: the crash-safety tests kill a run between the halves (fault point `fault`), which
    leaves a half-written file wherever one can be."""
    half = len(data) // 2
    f.write(data[:half])
    if "TOKMIX_FAULT" in os.environ:  # imported only then: a training job imports this module and numpy alone
        from tokmix.faults import fault_point

        fault_point(fault)
    f.write(data[half:])


SYNC_FILE_RANGE_WRITE = 2


def _sync_file_range():
    """Linux's sync_file_range: start writing a file's dirty pages back without waiting for them. Advisory
    (its errors are ignored: the fsync of the commit is what makes a file durable); None elsewhere."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError, TypeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return call


_SYNC_FILE_RANGE = _sync_file_range()


def start_writeback(f: BinaryIO) -> None:
    """What is written so far starts going to disk (on Linux), so that the fsync of the commit waits for little."""
    if _SYNC_FILE_RANGE is not None:
        f.flush()
        _SYNC_FILE_RANGE(f.fileno(), 0, 0, SYNC_FILE_RANGE_WRITE)
