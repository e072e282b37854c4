"""The interleave: which stream each document of the train run comes from, in train order. "global" is the
reference's (one label per document, shuffled with np.random.default_rng(seed): the i-th label s is stream s's
i-th document); "chunked" shuffles chunks of about CHUNK_DOCS documents, each on its own seed, so any range is
computed from the per-stream counts alone. The assemble stage writes the shards in this order; the report
replays it to tell the streams' documents apart in the shards."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from tokmix.tokens import read_array

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
    shuffle, written once to `path` by the driver (one byte per document); "balanced" is written to `path` in
    one streaming pass over the streams' document lengths (its `docs`: the documents of each stream it
    labels, up to the run's end); "chunked" is computed per range."""

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
        # "global" and "balanced": a local file or an object on a store
        return read_array(self.path, np.uint8, start, stop - start)


def interleave_labels(docs: list[int], seed: int, kind: str) -> np.ndarray:
    """Every document's stream, in train order, for either interleave (what a report reads)."""
    if kind == "chunked":
        return chunked_order(tuple(docs), seed, 0, sum(docs))
    return interleave_order(docs, seed)


# ---------------------------------------------------------------------------- the balanced interleave
@dataclass(frozen=True)
class Mix:
    """Every stream's target tokens along the run: piecewise linear in the run's token position, one share per
    stream per piece. Fixed shares are one piece; a schedule is one piece per phase's constant stretch and one
    per step of a ramp. The last piece goes on past the run's end."""

    starts: tuple[int, ...]  # the token position where each piece starts (the first: 0)
    shares: tuple[tuple[float, ...], ...]  # per piece, every stream's share (summing to 1)

    @classmethod
    def fixed(cls, shares: list[float]) -> Mix:
        return cls((0,), (tuple(float(s) for s in shares),))

    @property
    def streams(self) -> int:
        return len(self.shares[0])

    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        starts = np.array(self.starts, dtype=np.float64)
        shares = np.array(self.shares, dtype=np.float64)
        cum = np.zeros((len(starts), shares.shape[1]))  # each stream's target where each piece starts
        cum[1:] = np.cumsum(shares[:-1] * np.diff(starts)[:, None], axis=0)
        return starts, shares, cum

    def target(self, positions: np.ndarray, s: int | None = None) -> np.ndarray:
        """Every stream's target tokens at the token `positions` (float64, [positions, streams]); with `s`,
        stream s's alone ([positions], the same floats)."""
        starts, shares, cum = self._tables()
        piece = np.maximum(np.searchsorted(starts, positions, side="right") - 1, 0)
        into = np.asarray(positions, dtype=np.float64) - starts[piece]
        if s is None:
            return cum[piece] + shares[piece] * into[:, None]
        return cum[piece, s] + shares[piece, s] * into

    def reach(self, s: int, amounts: np.ndarray) -> np.ndarray:
        """The first token position at which stream s's target reaches each of `amounts` (inf: never)."""
        starts, shares, cum = self._tables()
        ends = cum[1:, s]  # the target at each finite piece's end
        piece = np.searchsorted(ends, amounts, side="left")
        share, base = shares[piece, s], cum[piece, s]
        with np.errstate(divide="ignore", invalid="ignore"):
            at = starts[piece] + (amounts - base) / share
        return np.where(share > 0, at, np.where(amounts <= base, starts[piece], np.inf))


BALANCED_WINDOW = 1 << 14  # documents of each stream read ahead by the balanced order
_NEVER = float(np.finfo(np.float64).max)  # the finish of a document its stream's target never reaches (below inf)


class _Head:
    """One stream's next documents for the balanced order, read ahead a window at a time: (finish, length,
    start), the positions at which the stream's target reaches each document's end and start (the fluid
    schedule's finish and start; a finish never reached is _NEVER, so that such a document still compares
    below a stream out of documents, whose finish is inf)."""

    def __init__(self, s: int, take, docs: int, mix: Mix):
        self.s, self.take, self.left, self.mix = s, take, docs, mix
        self.tokens = 0  # the stream's tokens in the documents read so far

    def window(self):
        """An iterator over the stream's next documents (empty when it has none left)."""
        n = min(BALANCED_WINDOW, self.left)
        if n <= 0:
            return iter(())
        lengths = np.asarray(self.take(n), dtype=np.int64)
        ends = self.tokens + np.cumsum(lengths)
        ends_f = ends.astype(np.float64)
        start = self.mix.reach(self.s, ends_f - lengths).tolist()
        finish = np.minimum(self.mix.reach(self.s, ends_f), _NEVER).tolist()
        self.tokens, self.left = int(ends[-1]), self.left - n
        return zip(finish, lengths.tolist(), start)


def balanced_chunks(takes: list, docs: list[int], mix: Mix, seed: int, tokens: int,
                    chunk: int = 1 << 20):
    """The balanced interleave, in train order, `chunk` documents at a time: (labels uint8, lengths int64) until
    the documents cover `tokens` tokens, then (no labels, the lengths of every stream's next document: the
    bound's longest document counts them). `takes[s](n)` gives stream s's next n document lengths (it has
    `docs[s]`).

    The rule (worst-case fair queueing): at each document boundary P, a stream is eligible when its tokens so
    far are at most its target at P; of the eligible ones, the one whose next document would be finished first
    by the fluid mix (the position where its target reaches its tokens plus that document) is taken, ties to
    the stream first in a seeded order. docs/format.md proves |tokens_s(P) - target_s(P)| <= the longest
    document at every boundary. Memory: BALANCED_WINDOW lengths per stream and one chunk of labels.

    The rule is one Python step per document (2,070,027 at the full GPT-U-20M layout), kept small: the streams
    are held in their seeded order (the first of equal finishes is the first found, no rank compared), P is a
    float (exact below 2**53; float comparisons are about twice as fast as mixed int/float ones), each stream's
    next document is one tuple from an iterator, and the labels go to a bytearray."""
    n = len(takes)
    rank = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2,))).permutation(n).tolist()
    order = sorted(range(n), key=rank.__getitem__)  # place r in the seeded order holds stream order[r]
    heads = [_Head(s, takes[s], docs[s], mix) for s in order]
    inf = float("inf")
    gone = (inf, 0, inf)  # a stream out of documents: never eligible, never taken
    ahead = [h.window() for h in heads]
    finish, length, start = (list(x) for x in zip(*(next(a, gone) for a in ahead)))
    places = range(n)
    labels, took = bytearray(), []  # places, turned into streams by `stream_of` a chunk at a time
    stream_of = np.array(order, dtype=np.uint8)
    P, end = 0.0, float(tokens)
    while P < end:
        best, best_f = -1, inf
        for r in places:
            if start[r] <= P and finish[r] < best_f:
                best, best_f = r, finish[r]
        if best < 0:  # nothing eligible: only when a stream ran out of documents (the bound no longer holds)
            for r in places:
                if finish[r] < best_f:  # any stream with documents left
                    best, best_f = r, finish[r]
            if best < 0:
                break
        L = length[best]
        labels.append(best)
        took.append(L)
        P += L
        head = next(ahead[best], None)
        if head is None:  # its window is used up
            ahead[best] = heads[best].window()
            head = next(ahead[best], gone)
        finish[best], length[best], start[best] = head
        if len(labels) == chunk:
            yield stream_of[np.frombuffer(labels, dtype=np.uint8)], np.array(took, dtype=np.int64)
            labels, took = bytearray(), []
    if labels:
        yield stream_of[np.frombuffer(labels, dtype=np.uint8)], np.array(took, dtype=np.int64)
    pending = [length[r] for r in map(order.index, range(n)) if finish[r] < inf]  # every stream's next document,
    if pending:  # which the bound counts
        yield np.empty(0, dtype=np.uint8), np.array(pending, dtype=np.int64)


class Deviation:
    """Every stream's deviation from its target, tokens_s(P) - target_s(P), at every document boundary P of an
    order fed chunk by chunk, up to the run's `end`: the worst above (more than its target) and below, and the
    longest document; and every stream's tokens before each of the token positions `marks` (the phases' ends:
    a document cut by one counts its tokens on both sides)."""

    def __init__(self, mix: Mix, end: int, marks: tuple[int, ...] = ()):
        self.mix, self.end, self.marks = mix, end, tuple(marks)
        n = mix.streams
        self.tokens = np.zeros(n, dtype=np.int64)
        self.position = 0
        self.over = np.zeros(n)
        self.under = np.zeros(n)
        self.longest = 0
        self.at_marks: list[list[int]] = []

    def feed(self, labels: np.ndarray, lengths: np.ndarray) -> None:
        """Take the next documents of the order. A stream's target never decreases along the run (also in
        float64: each piece starts at the previous one's end value), so between two of its documents its
        deviation only falls: its worst above is at the end of one of its documents (or the chunk's first
        boundary), its worst below just before one (or at the chunk's last boundary). Only those boundaries
        are computed: O(documents) per chunk, not O(documents x streams)."""
        if not len(labels):  # the streams' next documents after the order's end
            self.longest = max(self.longest, int(lengths.max(initial=0)))
            return
        ends = self.position + np.cumsum(lengths)
        kept = int(np.searchsorted(ends, self.end, side="right"))  # boundaries inside the run: ends[:kept]
        tokens = self.tokens.copy()
        for s in range(self.mix.streams):
            mine = np.flatnonzero(labels == s)
            own = self.tokens[s] + np.cumsum(lengths[mine])  # the stream's tokens at the end of each of its documents
            after = mine < kept
            before = (mine >= 1) & (mine <= kept)  # the boundary before it, inside the run
            if kept:
                first, last = int(ends[0]), int(ends[kept - 1])
                at_first = own[0] if len(mine) and mine[0] == 0 else self.tokens[s]
                at_last = own[after][-1] if after.any() else self.tokens[s]
                high = np.concatenate([[at_first], own[after]]), np.concatenate([[first], ends[mine[after]]])
                low = (np.concatenate([own[before] - lengths[mine[before]], [at_last]]),
                       np.concatenate([ends[mine[before]] - lengths[mine[before]], [last]]))
                self.over[s] = max(self.over[s], (high[0] - self.mix.target(high[1], s)).max())
                self.under[s] = max(self.under[s], -(low[0] - self.mix.target(low[1], s)).min())
            if len(mine):
                tokens[s] = own[-1]
        self.longest = max(self.longest, int(lengths.max()))
        while len(self.at_marks) < len(self.marks) and self.marks[len(self.at_marks)] <= ends[-1]:
            m = self.marks[len(self.at_marks)]
            d = int(np.searchsorted(ends, m, side="left"))  # the document holding token m - 1, or ending at m
            before = self.tokens + [int(lengths[:d][labels[:d] == s].sum()) for s in range(self.mix.streams)]
            before[labels[d]] += m - (int(ends[d]) - int(lengths[d]))
            self.at_marks.append(before.tolist())
        self.tokens, self.position = tokens, int(ends[-1])

    def to_index(self, names: list[str]) -> dict:
        return {
            "bound_tokens": self.longest,
            "over_by_stream": {n: round(float(v), 1) for n, v in zip(names, self.over)},
            "under_by_stream": {n: round(float(v), 1) for n, v in zip(names, self.under)},
            "tokens_at_marks": self.at_marks,
        }
