"""One benchmark run at a time over a folder of bench/work: every worktree links the same bench/work, so a
second run waits for the first instead of deleting or overwriting its outputs and caches under it."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO


def hold(folder: Path, name: str) -> IO:
    """Take `folder`/`name`.lock (waiting, and saying so, while another process holds it); the lock lasts as long
    as the returned file stays open, i.e. until the process exits."""
    lock = (folder / f"{name}.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"waiting for another bench/{name}.py run over {folder} ...", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
    return lock
