"""The interleave: which stream each document of the train run comes from, in train order. "global" is the
reference's (one label per document, shuffled with np.random.default_rng(seed): the i-th label s is stream s's
i-th document); "chunked" shuffles chunks of about CHUNK_DOCS documents, each on its own seed, so any range is
computed from the per-stream counts alone. The assemble stage writes the shards in this order; the report
replays it to tell the streams' documents apart in the shards."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from tokmix.shards import read_array

CHUNK_DOCS = 1 << 20  # documents per chunk of the "chunked" interleave


def interleave_order(docs_per_stream: list[int], seed: int) -> np.ndarray:
    """The stream (its position in the recipe) of every document in train order: one label per document,
    shuffled with np.random.default_rng(seed), as the reference does. One byte per document, in one process."""
    order = np.empty(sum(docs_per_stream), dtype=np.uint8)  # filled in place: no second copy at the peak
    for s, (lo, hi) in enumerate(itertools.pairwise(np.cumsum([0, *docs_per_stream]).tolist())):
        order[lo:hi] = s
    np.random.default_rng(seed).shuffle(order)
    return order


def _chunk_starts(docs: tuple[int, ...], chunks: int, c: int) -> list[int]:
    """Documents of each stream in the first c chunks of the chunked interleave: stream s's n documents are
    spread so that chunks [0, c) hold floor(n * c / chunks) of them, every one exactly once."""
    return [n * c // chunks for n in docs]


def chunked_order(docs: tuple[int, ...], seed: int, start: int, stop: int) -> np.ndarray:
    """Documents [start, stop) of the chunked interleave: the documents cut into chunks of ~CHUNK_DOCS,
    each holding every stream's share of them (to within one document), shuffled on its own by the chunk's
    child of SeedSequence(seed) (spawn_key (chunk,): independent of the global order's stream, also for a run
    of one chunk). Any range is computed from the counts alone."""
    total = sum(docs)
    chunks = max(1, -(-total // CHUNK_DOCS))
    c = min(start * chunks // max(total, 1), chunks - 1)
    while c > 0 and sum(_chunk_starts(docs, chunks, c)) > start:
        c -= 1
    while c < chunks and sum(_chunk_starts(docs, chunks, c + 1)) <= start:
        c += 1
    pieces, at = [], sum(_chunk_starts(docs, chunks, c))
    while at < stop and c < chunks:
        lo, hi = _chunk_starts(docs, chunks, c), _chunk_starts(docs, chunks, c + 1)
        labels = np.concatenate([np.full(b - a, s, dtype=np.uint8) for s, (a, b) in enumerate(zip(lo, hi))])
        np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(c,))).shuffle(labels)
        pieces.append(labels[max(start - at, 0) : stop - at])
        at, c = at + len(labels), c + 1
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.uint8)


@dataclass(frozen=True)
class Labels:
    """The stream of each document in train order, read a range at a time. "global" is the reference's
    shuffle, written once to `path` by the driver (one byte per document); "chunked" is computed per range."""

    kind: str
    docs: tuple[int, ...]  # documents of each stream
    seed: int
    path: str | None = None

    @property
    def total(self) -> int:
        return sum(self.docs)

    def read(self, start: int, stop: int) -> np.ndarray:
        stop = min(stop, self.total)
        if start >= stop:
            return np.empty(0, dtype=np.uint8)
        if self.kind == "chunked":
            return chunked_order(self.docs, self.seed, start, stop)
        return read_array(self.path, np.uint8, start, stop - start)  # a local file or an object on a store


def interleave_labels(docs: list[int], seed: int, kind: str) -> np.ndarray:
    """Every document's stream, in train order, for either interleave (what a report reads)."""
    if kind == "chunked":
        return chunked_order(tuple(docs), seed, 0, sum(docs))
    return interleave_order(docs, seed)
