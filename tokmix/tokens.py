"""Token arrays, the numpy side of the output format: the dtype of a vocabulary's ids, the delimiters that frame
every document, token files written and read (local or on a store), and the per-block fingerprints validation
compares. Names, records and commits are tokmix.shards', which imports no numpy: the commands that only read
records (status, the supervisor of a run) start without it.

A shard of `blocks` blocks holds `blocks * seq_len + 1` tokens; its last token is repeated as the first
token of the next shard, so block j of a shard is `tokens[j * seq_len : j * seq_len + seq_len + 1]`.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokmix.format.commit import write_in_halves
from tokmix.format.records import EOT_ID, Index
from tokmix.shards import CHECKSUM, READ_CHUNK_BYTES, open_read, write_bytes
from tokmix.store import ObjectPath, as_path, storage

LENGTH_DTYPE = np.dtype("<u4")  # a unit's .len file: tokens per document, its delimiters included


def dtype_for_vocab(vocab_size: int, forced: str = "auto") -> np.dtype:
    """uint16 while every id fits, uint32 beyond; `forced` pins one and refuses a vocabulary it cannot hold."""
    if forced == "auto":
        return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    dtype = np.dtype(forced)
    if vocab_size > np.iinfo(dtype).max + 1:
        raise ValueError(f"a vocabulary of {vocab_size:,} tokens does not fit {forced}")
    return dtype


@dataclass(frozen=True)
class Delimiters:
    """The special tokens framing every document, by id: `prefix` before its text, `suffix` after it. The
    reference's layout is prefix (0,), its <|endoftext|>, and no suffix. One id, the marker, shows where documents
    meet: the prefix's first (a document starts at it) or, with no prefix, the suffix's last (the next document
    starts after it). It occurs nowhere else: delimiters are special tokens, which text never encodes to."""

    prefix: tuple[int, ...] = (EOT_ID,)
    suffix: tuple[int, ...] = ()

    @property
    def per_document(self) -> int:
        """Tokens each document gets besides its text's."""
        return len(self.prefix) + len(self.suffix)

    @property
    def marker(self) -> int:
        return self.prefix[0] if self.prefix else self.suffix[-1]

    def frame(self, ids: np.ndarray, lengths: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """Flat ids of several documents (`lengths` tokens each) -> the same documents framed, in `dtype`."""
        n_pre, extra = len(self.prefix), self.per_document
        out = np.empty(len(ids) + extra * len(lengths), dtype=dtype)
        starts = np.cumsum(lengths + extra) - (lengths + extra)
        for j, token in enumerate(self.prefix):
            out[starts + j] = token
        for j, token in enumerate(self.suffix):
            out[starts + n_pre + lengths + j] = token
        if len(ids) >= 64 * len(lengths):  # documents of 64+ tokens: a copy per document beats a boolean mask
            ends = np.cumsum(lengths)
            for start, begin, end in zip((starts + n_pre).tolist(), (ends - lengths).tolist(), ends.tolist()):
                out[start : start + end - begin] = ids[begin:end]
        else:
            is_text = np.ones(len(out), dtype=bool)
            for j in range(n_pre):
                is_text[starts + j] = False
            for j in range(len(self.suffix)):
                is_text[starts + n_pre + lengths + j] = False
            out[is_text] = ids
        return out

    def starts(self, tokens: np.ndarray, previous: int | None) -> np.ndarray:
        """Where documents start among `tokens`, which follow the token `previous` (None: the run's first
        tokens, where a document starts by definition; with a prefix, the caller checks it is there)."""
        if self.prefix:
            return np.flatnonzero(tokens == self.marker)
        after = np.flatnonzero(tokens[:-1] == self.marker) + 1
        if previous is None or previous == self.marker:
            after = np.concatenate([[0], after])
        return after.astype(np.int64)

    def to_index(self) -> dict[str, list[int]]:
        return {"prefix": list(self.prefix), "suffix": list(self.suffix)}

    @classmethod
    def from_index(cls, index: Index) -> Delimiters:
        """A run's delimiters from its index.json (one written before they were recorded: the reference's)."""
        if index.delimiters is None:
            return cls((int(index.eot_id),), ())
        return cls(tuple(index.delimiters["prefix"]), tuple(index.delimiters["suffix"]))


REFERENCE_DELIMITERS = Delimiters()


def write_tokens(path: Path | ObjectPath, tokens: np.ndarray) -> None:
    storage(path).write_array(path, tokens)


def write_npy(path: Path, array: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, array)
    return write_bytes(path, buf.getvalue())


class TokenFileWriter:
    """Appends token arrays to a file that `close()` commits under its final name (locally: a temporary file,
    whose pages start going to disk at once, while the checksum is computed and the next tokens gathered, so
    the fsync of the commit waits for little; on a store: the object's upload)."""

    def __init__(self, path: Path | ObjectPath, dtype: np.dtype, checksum: bool = True, fault: str = "write:middle"):
        self.path, self.dtype, self.fault = path, np.dtype(dtype), fault  # fault: the point inside each write
        self.out = storage(path).create(path)
        self.tokens = 0
        self.hash = hashlib.new(CHECKSUM) if checksum else None

    def write(self, tokens: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(tokens, dtype=self.dtype)).cast("B")  # no copy when it is one
        try:
            write_in_halves(self.out.f, data, self.fault)
        except OSError as e:  # a full disk: say which file
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        self.out.written()
        if self.hash is not None:
            self.hash.update(data)
        self.tokens += len(tokens)

    def close(self, before_commit: Callable[[], None] | None = None) -> str | None:
        """Commit the file; returns its checksum (None without). `before_commit` runs between writing and
        renaming (for a store: before the upload completes)."""
        self.out.commit(before_commit)
        return self.hash.hexdigest() if self.hash is not None else None

    def abort(self) -> None:
        self.out.abort()


def read_tokens(path: Path | ObjectPath, dtype: np.dtype | str) -> np.ndarray:
    """The file's tokens, memory-mapped read-only (an object on a store is read whole)."""
    return storage(path).map(path, dtype)


def iter_token_chunks(path: Path, dtype: np.dtype | str, chunk_bytes: int = READ_CHUNK_BYTES):
    """Large sequential reads of a token file, each chunk a whole number of tokens."""
    dtype = np.dtype(dtype)
    step = chunk_bytes - chunk_bytes % dtype.itemsize
    with open_read(path, fetch=step) as f:
        while data := f.read(step):
            yield np.frombuffer(data, dtype=dtype)


def read_array(path: Path | ObjectPath | str, dtype: np.dtype | str, offset: int = 0, count: int = -1) -> np.ndarray:
    """`count` items (-1: all) of a file of `dtype` items from item `offset` on, local or on a store."""
    path = as_path(path)
    return storage(path).read_array(path, np.dtype(dtype), offset, count)


# ---------------------------------------------------------------------------- per-block fingerprints
FINGERPRINT_BLOCKS = 4096  # blocks fingerprinted per step: bounds memory whatever the shard size


def _weights(seq_len: int) -> np.ndarray:
    # odd weights: a change of any single token (by less than 2**32) always changes the block's sum mod 2**32
    return ((np.arange(seq_len, dtype=np.uint32) * 2 + 1) * np.uint32(0x9E3779B1)) | np.uint32(1)


def _row_fingerprints(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Fingerprints of consecutive seq_len-token rows (len(tokens) a multiple of seq_len), a bounded step at a
    time. All arithmetic is uint32, wrapping: the sum of token x weight mod 2**32."""
    rows, weights = len(tokens) // seq_len, _weights(seq_len)
    out = np.empty(rows, dtype=np.uint32)
    for lo in range(0, rows, FINGERPRINT_BLOCKS):
        hi = min(rows, lo + FINGERPRINT_BLOCKS)
        rows_lo_hi = tokens[lo * seq_len : hi * seq_len].reshape(hi - lo, seq_len)
        # einsum: no temporary of the products, faster than multiplying then summing (docs/benchmarks.md)
        out[lo:hi] = np.einsum("ij,j->i", rows_lo_hi, weights, dtype=np.uint32, casting="unsafe")
    return out


def block_fingerprints(path: Path, dtype: np.dtype | str, seq_len: int) -> np.ndarray:
    """A uint32 fingerprint of each block's first seq_len tokens (its last token is the next block's first),
    plus one for the shard's final token: enough to say which block a flipped byte is in."""
    tokens = read_tokens(path, dtype)
    blocks = (len(tokens) - 1) // seq_len
    last = int(tokens[-1]) if len(tokens) else 0
    return np.append(_row_fingerprints(tokens[: blocks * seq_len], seq_len), np.uint32(last))


class BlockFingerprinter:
    """block_fingerprints of a shard computed from its tokens as they are written, without reading it back."""

    def __init__(self, seq_len: int, dtype: np.dtype):
        self.seq_len, self.tokens, self.last = seq_len, 0, 0
        self.rows: list[np.ndarray] = []
        self.carry = np.empty(0, dtype=dtype)  # tokens after the last whole row

    def update(self, tokens: np.ndarray) -> None:
        if not len(tokens):
            return
        self.tokens += len(tokens)
        self.last = int(tokens[-1])
        if len(self.carry):  # complete the pending row first
            fill = min(self.seq_len - len(self.carry), len(tokens))
            self.carry, tokens = np.concatenate([self.carry, tokens[:fill]]), tokens[fill:]
            if len(self.carry) < self.seq_len:
                return
            self.rows.append(_row_fingerprints(self.carry, self.seq_len))
            self.carry = self.carry[:0]
        whole = len(tokens) - len(tokens) % self.seq_len
        self.rows.append(_row_fingerprints(tokens[:whole], self.seq_len))
        self.carry = tokens[whole:].copy()

    def result(self) -> np.ndarray:
        blocks = max(self.tokens - 1, 0) // self.seq_len
        rows = np.concatenate(self.rows) if self.rows else np.empty(0, dtype=np.uint32)
        return np.append(rows[:blocks], np.uint32(self.last))


