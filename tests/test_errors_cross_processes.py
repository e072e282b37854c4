"""tokmix's errors cross from a worker process to its parent whole: a process pool sends an exception back
pickled, and one that does not unpickle breaks the pool (BrokenProcessPool, the user's one line lost)."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tokmix.errors import TokmixError
from tokmix.format.commit import NotAFile
from tokmix.shards import REMAKE_REMEDY, DamagedFile
from tokmix.sources.pieces import SourceError

ERRORS = [
    lambda: NotAFile("/data/train.fifo", "a FIFO"),
    lambda: DamagedFile(Path("/out/tokmix-state/streams/web/000001.len"), "sha256 differs from its record"),
    lambda: DamagedFile(Path("/out/index.json"), "not JSON", REMAKE_REMEDY),
    lambda: SourceError("stream web: file a.parquet: row 3: 'text' is null"),
    lambda: TokmixError("one line"),
]


def _raise(i: int) -> None:
    raise ERRORS[i]()


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_an_error_raised_in_a_worker_process_reaches_the_parent_as_itself(i):
    want = ERRORS[i]()
    with ProcessPoolExecutor(1) as pool:
        with pytest.raises(type(want)) as got:
            pool.submit(_raise, i).result()
    assert str(got.value) == str(want)
    assert vars(got.value) == vars(want)
    again = pickle.loads(pickle.dumps(want))
    assert (type(again), str(again), vars(again)) == (type(want), str(want), vars(want))


VANISHED = r'''
import gc, multiprocessing as mp, _multiprocessing, sys, weakref
from tokmix.executors import quiet_vanished_semaphores
if sys.argv[1] == "hook":
    quiet_vanished_semaphores()
lock = mp.get_context("spawn").Lock()  # a pool's queues hold such locks
_multiprocessing.sem_unlink(lock._semlock.name)  # gone before its finalizer unlinks it
del lock
gc.collect()
class Other:
    pass
other = Other()
weakref.finalize(other, lambda: 1 / 0)  # any other exception in a finalizer is still printed
del other
gc.collect()
'''


@pytest.mark.parametrize("hook", [False, True])
def test_a_semaphore_gone_before_its_finalizer_prints_nothing(hook):
    """What a stage process installs (pipeline.child_main): CPython's traceback for a pool's semaphore already
    unlinked when its finalizer runs is dropped, beside a failed run's one line; other ones are not."""
    import subprocess
    import sys

    got = subprocess.run([sys.executable, "-W", "ignore:resource_tracker:UserWarning", "-c", VANISHED,
                          "hook" if hook else "plain"], capture_output=True, text=True, check=True).stderr
    assert ("ZeroDivisionError" in got) and (("_cleanup" in got) != hook), got
