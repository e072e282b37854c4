"""What the train shards must be, from the committed units and the seed alone: every shard's sha256, derived in
one sequential pass over the interleave (the seed's order of stream labels) and the units' .len and .tok
files, without assemble's plan (its boundaries, cursors and tasks). The run's validate stage derives them
while the units exist and keeps them, sealed, in tokmix-state/expected.json, which `tokmix validate` checks the
shard bytes against once the units are gone: a shard edited together with its record and index.json is seen.

Memory: one chunk of labels and lengths (INTERLEAVE_CHUNK documents), one GATHER_TOKENS buffer and a read
buffer per stream, whatever the run's size (plus, for the reference's global interleave, its labels: one
byte per document, as assemble holds them while it shuffles)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from tokmix.errors import TokmixError
from tokmix.interleave import Mix, balanced_chunks, chunked_order, interleave_order
from tokmix.shards import CHECKSUM, train_name, write_record
from tokmix.stages import Context
from tokmix.stages.assemble import INTERLEAVE_CHUNK, LengthReader, TokenReader
from tokmix.unit_files import UnitFiles

GATHER_TOKENS = 8 << 20  # tokens read before they are hashed


class _Cutter:
    """Hashes the run's token sequence into shards: shard k is tokens [start_k, ends[k]), and shard k + 1 starts
    at ends[k] - 1 (the overlap token is hashed into both)."""

    def __init__(self, ends: list[int]):
        self.ends, self.at, self.hash = ends, 0, hashlib.new(CHECKSUM)
        self.digests: list[str] = []

    def feed(self, tokens: np.ndarray) -> None:
        i = 0
        while i < len(tokens) and len(self.digests) < len(self.ends):
            take = min(len(tokens) - i, self.ends[len(self.digests)] - self.at)
            self.hash.update(tokens[i : i + take])
            self.at, i = self.at + take, i + take
            if self.at == self.ends[len(self.digests)]:
                self.digests.append(self.hash.hexdigest())
                self.hash = hashlib.new(CHECKSUM)
                self.hash.update(tokens[i - 1 : i])


def _balanced(units: list[tuple[str, ...]], docs: list[int], mix: Mix, seed: int, tokens: int):
    readers = [LengthReader(paths, 0) for paths in units]
    try:
        yield from balanced_chunks([r.take for r in readers], docs, mix, seed, tokens, INTERLEAVE_CHUNK)
    finally:
        for reader in readers:
            reader.close()


def _label_reader(docs: list[int], seed: int, kind: str, units: list[tuple[str, ...]], mix: Mix | None,
                  tokens: int) -> Callable[[int, int], np.ndarray]:
    """Documents [start, stop) of the interleave, computed here from the counts and the seed (the balanced one
    from the units' .len files, read in order: one chunk at a time), never read from the labels file assemble
    wrote."""
    if kind == "balanced":
        chunks = _balanced(units, docs, mix, seed, tokens)
        return lambda start, stop: next((c for c, _ in chunks if len(c)), np.empty(0, np.uint8))
    if kind == "chunked":
        return lambda start, stop: chunked_order(tuple(docs), seed, start, min(stop, sum(docs)))
    order = interleave_order(docs, seed)
    return lambda start, stop: order[start:stop]


def expected_digests(units: list[tuple[str, ...]], docs: list[int], seed: int, kind: str, dtype: np.dtype,
                     seq_len: int | list[int], blocks: list[int], mix: Mix | None = None) -> list[str]:
    """The sha256 of each shard of `blocks` blocks, from each stream's units (paths without suffix, in order),
    its documents in the run and the seed (and for the balanced interleave, its targets' `mix`)."""
    seq_lens = seq_len if isinstance(seq_len, list) else [seq_len] * len(blocks)  # per shard (a phase's own)
    ends = (np.cumsum(np.array(blocks, dtype=np.int64) * np.array(seq_lens, dtype=np.int64)) + 1).tolist()
    labels = _label_reader(docs, seed, kind, units, mix, ends[-1])
    lengths = [LengthReader(paths, 0) for paths in units]
    tokens = [TokenReader(paths, 0, dtype.itemsize) for paths in units]
    cutter, gathered, pending, at_doc, needed = _Cutter(ends), np.empty(GATHER_TOKENS, dtype=dtype), 0, 0, ends[-1]
    try:
        while needed > 0:
            chunk = labels(at_doc, at_doc + INTERLEAVE_CHUNK)
            if not len(chunk):
                raise TokmixError(f"the units hold fewer tokens than the {ends[-1]:,} the shards need")
            took = np.empty(len(chunk), dtype=np.int64)
            for s in range(len(units)):
                where = chunk == s
                took[where] = lengths[s].take(int(np.count_nonzero(where)))
            new_run = np.ones(len(chunk), dtype=bool)
            new_run[1:] = chunk[1:] != chunk[:-1]
            starts = np.flatnonzero(new_run)
            for s, n in zip(chunk[starts].tolist(), np.add.reduceat(took, starts).tolist()):
                n = min(n, needed)
                needed -= n
                while n > 0:
                    k = min(n, GATHER_TOKENS - pending)
                    tokens[s].read_into(gathered[pending : pending + k])
                    n, pending = n - k, pending + k
                    if pending == GATHER_TOKENS:
                        cutter.feed(gathered)
                        pending = 0
                if not needed:
                    break
            at_doc += len(chunk)
        cutter.feed(gathered[:pending])
    finally:
        for reader in (*lengths, *tokens):
            reader.close()
    return cutter.digests


def record_expected(ctx: Context, metas: dict[str, dict]) -> dict[str, str]:
    """Derive every shard's sha256 from the committed units and the seed, keep it sealed in
    tokmix-state/expected.json (with the seed, the interleave and a digest of the units' checksums it was derived
    from) and return it, by shard file."""
    recipe, names = ctx.recipe, list(ctx.recipe.streams)
    blocks = recipe.shard_blocks
    units = [tuple(str(ctx.layout.units(n) / u["name"]) for u in metas[n]["units"]) for n in names]
    starts, shares = recipe.mix_pieces
    digests = expected_digests(units, [metas[n]["docs"] for n in names], recipe.seed, recipe.layout.interleave,
                               ctx.dtype, recipe.shard_seq_lens, blocks, Mix(starts, shares))
    from_units = {}
    for n in names:  # what the digests were derived from (the units were checked as the stage process started)
        h = hashlib.new(CHECKSUM)
        for u in metas[n]["units"]:
            h.update(UnitFiles(ctx.layout.units(n), u["name"]).read_record()["tok_sha256"].encode())
        from_units[n] = h.hexdigest()
    shards = {train_name(k): d for k, d in enumerate(digests)}
    write_record(ctx.layout.expected, {
        "seed": recipe.seed,
        "interleave": recipe.layout.interleave,
        "tokens": recipe.shard_tokens_list,
        "units_tok_sha256": from_units,  # sha256 over each stream's units' tok_sha256, in order
        "shards": shards,
    })
    return shards
