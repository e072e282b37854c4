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
