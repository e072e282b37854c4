"""The streams stage's holdout-copy membership (tokmix.stages.streams.among, _sorted_set) against np.isin."""

import numpy as np

from tokmix.stages.streams import _sorted_set, among


def test_among_is_isin_on_hashes_and_lengths():
    rng = np.random.default_rng(7)
    for size in (0, 1, 2, 5, 1000):
        held = np.unique(rng.integers(0, 2**64 - 1, size, dtype=np.uint64, endpoint=True))
        held[-1:] = np.uint64(2**64 - 1) if size else held[-1:]  # the largest hash there is
        values = np.concatenate([held[::2], rng.integers(0, 2**64 - 1, 300, dtype=np.uint64, endpoint=True),
                                 np.array([0, 2**63, 2**64 - 1], dtype=np.uint64)])
        assert (among(values, held) == np.isin(values, held)).all()
        lengths = np.unique(rng.integers(0, 5000, size))
        chars = np.concatenate([lengths, rng.integers(-1, 6000, 300), [0, 4999, 5000, 10**9]])
        assert (among(chars, lengths) == np.isin(chars, lengths)).all()
    assert among(np.empty(0, np.uint64), np.array([3], np.uint64)).shape == (0,)


def test_a_holdout_array_out_of_order_is_sorted_before_it_is_searched():
    shuffled = np.array([9, 3, 3, 2**64 - 1, 0], dtype=np.uint64)
    held = _sorted_set(shuffled)
    assert held.tolist() == [0, 3, 9, 2**64 - 1]
    assert among(np.array([3, 4, 2**64 - 1], np.uint64), held).tolist() == [True, False, True]
    ordered = np.array([1, 5, 8], dtype=np.int64)
    assert _sorted_set(ordered) is ordered
