"""The output format: file names in the output directory, token dtype, document delimiters, block arithmetic, atomic
writes and index.json. Every producer and consumer of shards goes through this module, and it imports
nothing of the pipeline, so a training job that reads shards needs numpy alone.

A shard of `blocks` blocks holds `blocks * seq_len + 1` tokens; its last token is repeated as the first
token of the next shard, so block j of a shard is `tokens[j * seq_len : j * seq_len + seq_len + 1]`.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

EOT_ID = 0
EOT_TOKEN = "<|endoftext|>"
INDEX_NAME = "index.json"
STREAMS_DIR = "streams"  # intermediates: one folder per stream of committed work units
STATE_DIR = "tokmix-state"  # the run's own bookkeeping: resolved recipe, lock, holdout hashes
CHECKSUM = "sha256"
UNIT_BYTES = 16 << 20  # intermediates: source bytes per work unit, the grain of parallelism and of resume
READ_CHUNK_BYTES = 64 << 20  # sequential reads of this size keep checksums and validation streaming


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
        if len(ids) >= 64 * len(lengths):  # documents of 64+ tokens: a copy per document, ~2x a boolean mask
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
    def from_index(cls, index: dict[str, Any]) -> Delimiters:
        """A run's delimiters from its index.json (one written before they were recorded: the reference's)."""
        found = index.get("delimiters")
        if found is None:
            return cls((int(index.get("eot_id", EOT_ID)),), ())
        return cls(tuple(found["prefix"]), tuple(found["suffix"]))


REFERENCE_DELIMITERS = Delimiters()


def train_name(k: int) -> str:
    return f"train_{k:03d}.bin"


def val_name(domain: str) -> str:
    return f"val_{domain}.bin"


def shard_tokens(blocks: int, seq_len: int) -> int:
    return blocks * seq_len + 1


def shard_blocks(total_blocks: int, blocks_per_shard: int) -> list[int]:
    """Blocks of each shard: full shards, then the remainder."""
    full, rest = divmod(total_blocks, blocks_per_shard)
    return [blocks_per_shard] * full + ([rest] if rest else [])


class Layout:
    """Where everything lives in one output directory."""

    def __init__(self, out_dir: str | os.PathLike):
        self.root = Path(out_dir)

    @property
    def index(self) -> Path:
        return self.root / INDEX_NAME

    @property
    def streams(self) -> Path:
        return self.root / STREAMS_DIR

    @property
    def state(self) -> Path:
        return self.root / STATE_DIR

    def train(self, k: int) -> Path:
        return self.root / train_name(k)

    def val(self, domain: str) -> Path:
        return self.root / val_name(domain)

    def stream(self, name: str) -> Path:
        return self.streams / name

    def shard_record(self, shard_file: str) -> Path:
        """What the assemble stage recorded of a shard it committed (tokens by stream, checksum)."""
        return self.state / "shards" / f"{shard_file}.json"

    def read_index(self) -> dict[str, Any]:
        return read_index(self.root)

    def write_index(self, index: dict[str, Any]) -> None:
        write_json(self.index, index)


def read_index(out_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(out_dir) / INDEX_NAME
    return json.loads(path.read_text()) if path.exists() else {}


def _tmp_name(path: Path) -> Path:
    # the pid keeps two writers (a killed run's leftover and its retry) from sharing a temporary file
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


def commit(tmp: Path, path: Path, durable: bool = True) -> None:
    """Make a fully written file visible under its final name: data on disk first, then the rename. Not
    `durable`: no fsync, so after a power loss the file may be there but empty."""
    if durable:
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_in_halves(f: BinaryIO, data: bytes | memoryview, fault: str = "write:middle") -> None:
    """One write, as two: the crash-safety tests kill a run between the halves (fault point `fault`), which
    leaves a half-written file wherever one can be."""
    half = len(data) // 2
    f.write(data[:half])
    if "TOKMIX_FAULT" in os.environ:  # imported only then: a training job imports this module and numpy alone
        from tokmix.faults import fault_point

        fault_point(fault)
    f.write(data[half:])


def write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            _write_in_halves(f, data)
        commit(tmp, path, durable)
    except OSError as e:  # a full disk: the message names the file being written, which the OS does not
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None


def write_json(path: Path, obj: Any) -> None:
    write_bytes(path, json.dumps(obj, indent=2).encode())


def write_tokens(path: Path, tokens: np.ndarray) -> None:
    write_bytes(path, tokens.tobytes())


def write_npy(path: Path, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array)
    write_bytes(path, buf.getvalue())


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


class TokenFileWriter:
    """Appends token arrays to a temporary file; `close()` commits it under its final name. What is written
    starts going to disk at once (on Linux), while the checksum is computed and the next tokens gathered,
    so the fsync of the commit waits for little."""

    def __init__(self, path: Path, dtype: np.dtype, checksum: bool = True, fault: str = "write:middle"):
        self.path, self.dtype, self.fault = path, np.dtype(dtype), fault  # fault: the point inside each write
        self.tmp = _tmp_name(path)
        self.f = open(self.tmp, "wb")
        self.tokens = 0
        self.hash = hashlib.new(CHECKSUM) if checksum else None

    def write(self, tokens: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(tokens, dtype=self.dtype)).cast("B")  # no copy when it is one
        try:
            _write_in_halves(self.f, data, self.fault)
        except OSError as e:  # a full disk: say which file
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        if _SYNC_FILE_RANGE is not None:
            self.f.flush()
            _SYNC_FILE_RANGE(self.f.fileno(), 0, 0, SYNC_FILE_RANGE_WRITE)
        if self.hash is not None:
            self.hash.update(data)
        self.tokens += len(tokens)

    def close(self, before_commit: Callable[[], None] | None = None) -> str | None:
        """Commit the file; returns its checksum (None without). `before_commit` runs between writing and
        renaming."""
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        if before_commit:
            before_commit()
        os.replace(self.tmp, self.path)
        return self.hash.hexdigest() if self.hash is not None else None

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)


def read_tokens(path: Path, dtype: np.dtype | str, mmap: bool = True) -> np.ndarray:
    """The file's tokens, memory-mapped read-only by default. A plain ndarray over the mapping, not an
    np.memmap: slicing a memmap runs Python code for every slice, which per-document gathers pay for."""
    if mmap:
        if os.path.getsize(path) == 0:
            return np.empty(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r").view(np.ndarray)
    return np.fromfile(path, dtype=dtype)


def iter_token_chunks(path: Path, dtype: np.dtype | str, chunk_bytes: int = READ_CHUNK_BYTES):
    """Large sequential reads of a token file, each chunk a whole number of tokens."""
    dtype = np.dtype(dtype)
    step = chunk_bytes - chunk_bytes % dtype.itemsize
    with open(path, "rb") as f:
        while data := f.read(step):
            yield np.frombuffer(data, dtype=dtype)


def file_checksum(path: Path) -> str:
    h = hashlib.new(CHECKSUM)
    with open(path, "rb") as f:
        while data := f.read(READ_CHUNK_BYTES):
            h.update(data)
    return h.hexdigest()


def remove_tmp_files(directory: Path) -> None:
    """Temporary files left by a killed writer are never visible under a final name; a resume sweeps them
    from the whole output directory before anything else runs."""
    if directory.is_dir():
        for p in directory.rglob("*.tmp-*"):
            p.unlink(missing_ok=True)


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
        # einsum: no temporary of the products, ~2.5x faster than multiplying then summing
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


def fingerprints_path(root: Path, shard_file: str) -> Path:
    return root / STATE_DIR / "blocks" / f"{shard_file}.fingerprints"
