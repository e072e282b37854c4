"""Committing a file on a local (or shared) filesystem: written under a temporary name, its data on disk, then
renamed into place; in an output directory's top level, published only over a name tokmix marked as its own.
The object store's way (an upload that appears whole at its close) is tokmix.store's; both are behind
tokmix.store.storage()."""

from __future__ import annotations

import ctypes
import errno
import os
import re
from pathlib import Path
from typing import BinaryIO

from tokmix.errors import TokmixError

STATE_DIR = "tokmix-state"  # the run's own bookkeeping: resolved recipe, lock, holdout hashes
PUBLISHED_DIR = "published"  # in STATE_DIR: NAME.mark per top-level name tokmix has written a file under (publish)
TMP = re.compile(r"(.+)\.tmp-\d+")  # a file being written under its temporary name (tmp_name)


def tmp_name(path: Path) -> Path:
    # the pid keeps two writers (a killed run's leftover and its retry) from sharing a temporary file
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


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
    marks = path.parent / STATE_DIR / PUBLISHED_DIR  # made by every run as it starts (Layout.adopt_published)
    if not marks.is_dir():
        os.replace(tmp, path)
        return
    mark = mark_of(marks, path.name)
    if mark.exists():  # tokmix's name: what it wrote there before is replaced (a damaged or older version)
        os.replace(tmp, path)
        return
    mark_published(mark)
    try:
        os.link(tmp, path)
    except FileExistsError:
        tmp.unlink(missing_ok=True)
        raise TokmixError(f"{path}: exists but tokmix did not create it (put there after the run named it, before "
                          "it wrote it); move it away and run the same command again") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        if path.exists() or path.is_symlink():  # no hard links on this filesystem: check, then rename
            tmp.unlink(missing_ok=True)
            raise TokmixError(f"{path}: exists but tokmix did not create it; move it away and run the same "
                              "command again") from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


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
