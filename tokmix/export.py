"""Exports of a finished run for other trainers: a Megatron-LM indexed dataset (.bin + .idx, one entry per
document) and llm.c token files (one per train shard and per holdout). Everything is streamed in chunks and
committed atomically, so memory stays bounded whatever the run's size and a killed export leaves no file
half-written under its final name.

Megatron: the train token stream (shard 0 whole, every later shard without its first token, which repeats the
previous shard's last) is cut where the provenance index says documents meet (a run without one: before each
doc_prefix, after each doc_suffix), so each document appears once with its delimiters as in the shards: the
documents concatenated are the train stream token for token. The last document is cut where the run's last block
ends, as in the shards. Tokens are written as Megatron's preprocess writes them: uint16 for a vocabulary under
65,500 ids, int32 from there on (DType.optimal_dtype in megatron/core/datasets/indexed_dataset.py). Holdouts are
written the same way as `<prefix>_val_<domain>`.

llm.c: each train shard and holdout is copied token for token behind llm.c's 256-int32 header: "gpt-2"'s
(magic 20240520, version 1) for uint16 tokens, "llama-3"'s (20240801, version 7) for uint32 ones
(HEADERS_INFO in llm.c's dev/data/data_common.py).
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from tokmix import shards
from tokmix.data import TrainBlocks, check_token_file, read_run_index
from tokmix.errors import TokmixError
from tokmix.format.commit import commit, tmp_name
from tokmix.format.records import TokenFileEntry
from tokmix.provenance import file_documents, sources_of

FORMATS = ("megatron", "llmc")

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
# Megatron's DType enum (megatron/core/datasets/indexed_dataset.py): the .idx names the token dtype by code
MEGATRON_DTYPE_CODE = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
MEGATRON_UINT16_BELOW = 65_500  # Megatron's preprocess writes uint16 tokens for fewer ids than this, else int32

LLMC_HEADER_INTS = 256
# llm.c dev/data/data_common.py HEADERS_INFO: "gpt-2" (uint16 tokens) and "llama-3" (uint32 tokens)
LLMC_MAGIC_VERSION = {np.dtype(np.uint16): (20240520, 1), np.dtype(np.uint32): (20240801, 7)}
LLMC_PREFIX = "tokmix_"


class _AtomicFile:
    """A file written under a temporary name and renamed into place on a clean exit; removed on an error."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = tmp_name(path)

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.tmp, "wb")
        return self.f

    def __exit__(self, exc_type, exc, tb) -> None:
        self.f.close()
        if exc_type is None:
            commit(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)


def train_stream(blocks: TrainBlocks, chunk_bytes: int = shards.READ_CHUNK_BYTES) -> Iterator[np.ndarray]:
    """The run's train tokens in order, each once: the overlap token heading shard k+1 is checked against the
    last token of shard k and dropped."""
    last = None
    for path in blocks.files:
        first = True
        for chunk in shards.iter_token_chunks(path, blocks.dtype, chunk_bytes):
            tail = int(chunk[-1])
            if first and last is not None:
                if int(chunk[0]) != last:
                    raise TokmixError(
                        f"{path}: first token {int(chunk[0])} is not the previous shard's last token {last}: "
                        "the shards do not chain"
                    )
                chunk = chunk[1:]
            first = False
            if len(chunk):
                yield chunk
            last = tail


def _holdout_files(out_dir: Path) -> list[tuple[str, Path, int]]:
    index = read_run_index(out_dir)
    dtype = np.dtype(index.dtype)
    out = []
    for domain, entry in index.val.items():
        path = out_dir / entry.file
        check_token_file(path, int(entry.tokens), dtype)
        out.append((domain, path, int(entry.tokens)))
    return out


# ---------------------------------------------------------------------- Megatron-LM
def megatron_token_dtype(vocab_size: int) -> np.dtype:
    """The dtype Megatron's preprocess would write this vocabulary's tokens in."""
    return np.dtype("<u2" if vocab_size < MEGATRON_UINT16_BELOW else "<i4")


class _DocumentSplitter:
    """Fed the token stream chunk by chunk, returns the lengths of the documents each chunk completes. A
    document runs from where one starts (shards.Delimiters.starts) to where the next does; the last one is
    completed by `finish()`."""

    def __init__(self, delimiters: shards.Delimiters):
        self.delimiters = delimiters
        self.start: int | None = None  # where the open document began
        self.previous: int | None = None  # the token before this chunk
        self.tokens = 0
        self.documents = 0

    def feed(self, chunk: np.ndarray) -> np.ndarray:
        starts = self.delimiters.starts(chunk, self.previous) + self.tokens
        if self.start is None and (not len(starts) or starts[0] != 0):
            raise TokmixError(f"the token stream starts with {int(chunk[0])}, not a document's first delimiter "
                              f"({self.delimiters.marker})")
        self.previous = int(chunk[-1])
        self.tokens += len(chunk)
        if not len(starts):
            return starts
        lengths = np.diff(starts) if self.start is None else np.diff(starts, prepend=self.start)
        self.start = int(starts[-1])
        return self.count(lengths)

    def finish(self) -> np.ndarray:
        if self.start is None:
            raise TokmixError("no tokens to export")
        return self.count(np.array([self.tokens - self.start]))

    def count(self, lengths: np.ndarray) -> np.ndarray:
        if len(lengths) and int(lengths.max()) > np.iinfo(np.int32).max:
            raise TokmixError(f"a document of {int(lengths.max()):,} tokens exceeds Megatron's int32 lengths")
        self.documents += len(lengths)
        return lengths


def index_lengths(out_dir: Path, entries: list[TokenFileEntry], sources: list) -> Iterator[np.ndarray]:
    """The documents' lengths in the token stream of `entries` (the train shards, or one holdout) from their
    provenance index: a shard's first document goes on from the previous shard's last, which ends with the
    overlap token they share (counted once)."""
    carry = None
    for entry in entries:
        lengths = file_documents(out_dir, entry, sources).records["tokens"].astype(np.int64)
        if carry is not None:
            lengths[0] += carry - 1
        carry = int(lengths[-1])
        if len(lengths) > 1:
            yield lengths[:-1]
    if carry is not None:
        yield np.array([carry])


def _write_megatron(chunks: Iterable[np.ndarray], dtype: np.dtype, delimiters: shards.Delimiters, prefix: Path,
                    chunk_bytes: int, documents: Iterator[np.ndarray] | None = None) -> list[Path]:
    """The .bin and .idx of a token stream: one sequence per document, its documents' lengths from `documents`
    (the provenance index) or, without, cut where the delimiters say."""
    bin_path, idx_path = prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx")
    limit = np.iinfo(dtype).max
    # document lengths are spooled to disk, 4 bytes a document, so a corpus of any size exports in bounded memory
    spool = idx_path.with_name(f"{idx_path.name}.lengths.tmp-{os.getpid()}")
    splitter = _DocumentSplitter(delimiters)
    try:
        with _AtomicFile(bin_path) as f, open(spool, "wb") as lengths:
            written = 0
            for chunk in chunks:
                if chunk.dtype != dtype and int(chunk.max()) > limit:
                    raise TokmixError(f"token id {int(chunk.max())} does not fit Megatron's {dtype.name}")
                if documents is None:
                    lengths.write(splitter.feed(chunk).astype("<i4").tobytes())
                f.write(chunk.astype(dtype, copy=False).tobytes())
                written += len(chunk)
            if documents is None:
                lengths.write(splitter.finish().astype("<i4").tobytes())
            else:
                held = 0
                for part in documents:
                    lengths.write(splitter.count(part).astype("<i4").tobytes())
                    held += int(part.sum())
                if held != written:
                    raise TokmixError(f"{prefix}: the provenance index's documents hold {held:,} tokens, the "
                                      f"token stream {written:,}")
        _write_megatron_index(idx_path, spool, splitter.documents, dtype, chunk_bytes // 8 or 1)
    finally:
        spool.unlink(missing_ok=True)
    return [bin_path, idx_path]


def _write_megatron_index(idx_path: Path, spool: Path, count: int, dtype: np.dtype, chunk: int) -> None:
    """The .idx: header, then int32 sequence lengths, int64 byte pointers, int64 document indices (count+1).
    One sequence per document, so the document indices are 0..count. Written `chunk` entries at a time."""
    lengths = np.memmap(spool, dtype="<i4", mode="r")
    with _AtomicFile(idx_path) as f:
        f.write(MEGATRON_MAGIC)
        f.write(struct.pack("<Q", MEGATRON_VERSION))
        f.write(struct.pack("<B", MEGATRON_DTYPE_CODE[np.dtype(dtype.name)]))
        f.write(struct.pack("<Q", count))  # sequences
        f.write(struct.pack("<Q", count + 1))  # entries of the document index, as Megatron's writer counts them
        for a in range(0, count, chunk):
            f.write(np.asarray(lengths[a : a + chunk]).tobytes())
        offset = 0
        for a in range(0, count, chunk):
            nbytes = lengths[a : a + chunk].astype("<i8") * dtype.itemsize
            pointers = np.cumsum(nbytes) - nbytes + offset
            f.write(pointers.astype("<i8").tobytes())
            offset += int(nbytes.sum())
        for a in range(0, count + 1, chunk):
            f.write(np.arange(a, min(a + chunk, count + 1), dtype="<i8").tobytes())
    del lengths


def export_megatron(
    out_dir: str | os.PathLike, out_prefix: str | os.PathLike, chunk_bytes: int = shards.READ_CHUNK_BYTES
) -> list[Path]:
    """`<out_prefix>.bin/.idx` from the train shards, `<out_prefix>_val_<domain>.bin/.idx` from each holdout.
    Returns the files written."""
    out_dir, prefix = Path(out_dir), Path(out_prefix)
    blocks = TrainBlocks(out_dir)
    index = read_run_index(out_dir)
    # an index without vocab_size: the largest vocabulary the run's dtype holds
    dtype = megatron_token_dtype(index.vocab_size or np.iinfo(blocks.dtype).max + 1)
    delimiters = shards.Delimiters.from_index(index)
    # documents where the provenance index says they are; a run without one is cut at its delimiters
    traced = index.provenance is not None
    documents = index_lengths(out_dir, index.shards, sources_of(index.provenance.sources)) if traced else None
    written = _write_megatron(train_stream(blocks, chunk_bytes), dtype, delimiters, prefix, chunk_bytes, documents)
    for domain, path, _ in _holdout_files(out_dir):
        chunks = shards.iter_token_chunks(path, blocks.dtype, chunk_bytes)
        entry = index.val[domain]
        documents = index_lengths(out_dir, [entry], sources_of(entry.provenance.sources)) if traced else None
        written += _write_megatron(chunks, dtype, delimiters, prefix.with_name(f"{prefix.name}_val_{domain}"),
                                   chunk_bytes, documents)
    return written


# ---------------------------------------------------------------------- llm.c
def _write_llmc(src: Path, dst: Path, tokens: int, dtype: np.dtype) -> Path:
    if dtype not in LLMC_MAGIC_VERSION:
        raise TokmixError(f"llm.c has no token format for {dtype.name}")
    if tokens >= 2**31:
        raise TokmixError(f"{src}: {tokens:,} tokens do not fit llm.c's int32 token count; use smaller shards")
    magic, version = LLMC_MAGIC_VERSION[dtype]
    header = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
    header[:3] = magic, version, tokens
    with _AtomicFile(dst) as f, open(src, "rb") as s:
        f.write(header.tobytes())
        shutil.copyfileobj(s, f, shards.READ_CHUNK_BYTES)  # shard tokens are already llm.c's little-endian ints
    return dst


def export_llmc(out_dir: str | os.PathLike, llmc_dir: str | os.PathLike) -> list[Path]:
    """`tokmix_train_XXX.bin` per train shard and `tokmix_val_<domain>.bin` per holdout in llmc_dir. Each shard
    keeps its overlap token: llm.c reads every file on its own and needs B*T + 1 tokens for B*T targets."""
    out_dir, llmc_dir = Path(out_dir), Path(llmc_dir)
    blocks = TrainBlocks(out_dir)
    written = []
    for k, path in enumerate(blocks.files):
        tokens = path.stat().st_size // blocks.dtype.itemsize
        written.append(_write_llmc(path, llmc_dir / (LLMC_PREFIX + shards.train_name(k)), tokens, blocks.dtype))
    for domain, path, tokens in _holdout_files(out_dir):
        written.append(_write_llmc(path, llmc_dir / (LLMC_PREFIX + shards.val_name(domain)), tokens, blocks.dtype))
    return written


def export(out_dir: str | os.PathLike, fmt: str, out: str | os.PathLike) -> list[Path]:
    """What `tokmix export DIR --format megatron|llmc OUT` runs: OUT is a path prefix for megatron, a directory
    for llmc. Returns the files written."""
    if fmt == "megatron":
        return export_megatron(out_dir, out)
    if fmt == "llmc":
        return export_llmc(out_dir, out)
    raise TokmixError(f"unknown export format {fmt!r}: one of {', '.join(FORMATS)}")
