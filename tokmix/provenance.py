"""The provenance index: beside every train shard (train_000.docs) and holdout (val_<domain>.docs), one 16-byte
record per document in the order of the file's tokens: its source (an id into the run's table of (stream,
pass, kind, file) entries in index.json), its place in that file (parquet: row, JSONL: line, both 0-based;
plain text: 0, the file is one document), its tokens in this file (delimiters included; the first and last
document may be cut by the file's ends) and the CRC-32 of its text's UTF-8 bytes. No header: numpy reads a
file with `np.fromfile(path, DOC_DTYPE)`. With a stream's id_field, `train_000.ids` beside it holds each
document's own id, one JSON value a line in the same order (read_ids; written by tokmix.stages.ids). Imports
numpy, tokmix.text (its CRC-32: ISA-L's or zlib's) and tokmix.shards alone: the training side reads it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokmix.errors import TokmixError
from tokmix.format.records import Index, TokenFileEntry
from tokmix.shards import INDEX_NAME, as_path
from tokmix.text import crc32
from tokmix.tokens import read_array

DOC_DTYPE = np.dtype([("source", "<u4"), ("place", "<u4"), ("tokens", "<u4"), ("crc32", "<u4")])
# a unit's documents as the streams stage writes them (NNNNNN.src beside its .tok and .len): the pass-1 unit and
# its piece the document was read from (a repeat unit's documents are pass-1 units'), its pass, its place in
# the piece's file (JSONL: in the piece, made the file's by assemble) and its text's CRC-32
UNIT_DOC_DTYPE = np.dtype([("unit", "<u4"), ("piece", "<u2"), ("pass", "<u2"), ("place", "<u4"),
                           ("crc32", "<u4")])
PLACE_LIMIT = np.iinfo(np.uint32).max  # rows or lines of one file a place can name


def text_crc32(texts: list) -> np.ndarray:
    """CRC-32 of each text's UTF-8 bytes (a HugeText's own bytes): the cheapest hash of every document
    (docs/benchmarks.md)."""
    return np.fromiter((crc32(t.utf8() if hasattr(t, "utf8") else t.encode("utf-8")) for t in texts),
                       np.uint32, len(texts))


def check_place(place: int, stream: str, path: str) -> int:
    if place > PLACE_LIMIT:
        raise TokmixError(f"stream {stream}: file {path}: row or line {place:,} is past the provenance index's "
                          f"{PLACE_LIMIT:,}: split the file, or set [layout] provenance = false")
    return place


def read_docs(path: str | Path) -> np.ndarray:
    """A .docs file's records."""
    return read_array(path, DOC_DTYPE)  # a local file or an object on a store


@dataclass(frozen=True)
class Source:
    stream: str
    pass_no: int
    kind: str  # "parquet" | "jsonl" | "text": what the place counts (row, line, nothing)
    file: str

    def where(self, place: int) -> str:
        """`file:row 12` / `file:line 13` (lines 1-based, as editors show them) / `file`."""
        if self.kind == "parquet":
            return f"{self.file}:row {place}"
        if self.kind == "jsonl":
            return f"{self.file}:line {place + 1}"
        return self.file


def sources_of(entries: list[list]) -> list[Source]:
    """The index's table of sources ([stream, pass, kind, file] each)."""
    return [Source(s, int(p), k, f) for s, p, k, f in entries]


@dataclass(frozen=True)
class FileDocuments:
    """One token file's documents: their records, where each ends among the file's tokens, and how many tokens
    the first one had before the file (`skip`: it began in the previous shard)."""

    records: np.ndarray
    ends: np.ndarray  # int64: the token offset in the file after each document
    skip: int
    sources: list[Source]

    @property
    def starts(self) -> np.ndarray:
        """Where each document starts in the file (the first at 0, also when it began before)."""
        return self.ends - self.records["tokens"].astype(np.int64)

    def overlapping(self, lo: int, hi: int) -> np.ndarray:
        """Indices of the documents with a token in [lo, hi)."""
        first = int(np.searchsorted(self.ends, lo, side="right"))
        last = int(np.searchsorted(self.ends, hi - 1, side="right"))
        return np.arange(first, min(last, len(self.ends) - 1) + 1)

    def segments(self, lo: int, hi: int) -> np.ndarray:
        """Where documents start in the token range [lo, hi), as offsets from lo: 0 first (the range starts
        inside a document or at one), then every later document start before hi."""
        starts = self.ends[:-1]  # document i + 1 starts where document i ends
        inside = starts[(starts > lo) & (starts < hi)] - lo
        return np.concatenate([[0], inside]).astype(np.int64)


def file_documents(root: Path, entry: TokenFileEntry, sources: list[Source]) -> FileDocuments:
    """The documents of the token file `entry` (an index.json shard or val entry), checked against the entry:
    the index file's size, its sha256 and the tokens its documents hold."""
    docs = entry.provenance
    if not docs:
        raise TokmixError(f"{root / entry.file}: no provenance index (the run was made with provenance off, "
                          f"or by a tokmix before it)")
    path = root / docs.file
    if not path.is_file():
        raise TokmixError(f"{path}: missing (listed in {INDEX_NAME})")
    if path.stat().st_size != docs.documents * DOC_DTYPE.itemsize:
        raise TokmixError(f"{path}: {path.stat().st_size:,} bytes, {INDEX_NAME} records {docs.documents:,} "
                          f"documents of {DOC_DTYPE.itemsize} bytes")
    data = path.read_bytes()
    if docs.checksum and hashlib.sha256(data).hexdigest() != docs.checksum:
        raise TokmixError(f"{path}: damaged (sha256 differs from {INDEX_NAME}); run the same command again to "
                          "remake it")
    records = np.frombuffer(data, dtype=DOC_DTYPE)
    ends = np.cumsum(records["tokens"], dtype=np.int64)
    if not len(ends) or int(ends[-1]) != int(entry.tokens):
        raise TokmixError(f"{path}: its documents hold {int(ends[-1]) if len(ends) else 0:,} tokens, "
                          f"{entry.file} {int(entry.tokens):,}")
    return FileDocuments(records, ends, int(docs.skip), sources)


def read_ids(root: Path, entry: TokenFileEntry) -> list[str | int | None] | None:
    """The documents' own ids of the token file `entry` ([streams.X] id_field: `train_000.ids`, one JSON value a
    line in the order of its .docs records), checked against index.json's sha256 and count; None when the run
    kept none."""
    ids = entry.provenance.ids if entry.provenance is not None else None
    if ids is None:
        return None
    path = root / ids.file
    if not path.is_file():
        raise TokmixError(f"{path}: missing (listed in {INDEX_NAME})")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != ids.checksum:
        raise TokmixError(f"{path}: damaged (sha256 differs from {INDEX_NAME}); run the same command again to "
                          "remake it")
    # one value a line, "\n" alone ending it (an id may hold U+2028, which splitlines() would cut at)
    values = [json.loads(line) for line in data.decode("utf-8").split("\n")[:-1]]
    if len(values) != ids.documents:
        raise TokmixError(f"{path}: {len(values):,} ids, {INDEX_NAME} records {ids.documents:,} documents")
    return values


class RunDocuments:
    """A finished run's train documents, shard by shard (each shard's index read on first use), from its
    index.json."""

    def __init__(self, root: str | Path, index: Index):
        self.root, self.index = as_path(root), index
        if index.provenance is None:
            raise TokmixError(f"{self.root / INDEX_NAME}: no provenance index (the run was made with [layout] "
                              "provenance = false, or by a tokmix before it)")
        self.sources = sources_of(index.provenance.sources)
        self._shards: dict[int, FileDocuments] = {}
        self._ids: dict[int, list | None] = {}

    def shard(self, k: int) -> FileDocuments:
        if k not in self._shards:
            self._shards[k] = file_documents(self.root, self.index.shards[k], self.sources)
        return self._shards[k]

    def ids(self, k: int) -> list[str | int | None] | None:
        """Shard k's documents' own ids, or None when the run kept none."""
        if k not in self._ids:
            self._ids[k] = read_ids(self.root, self.index.shards[k])
        return self._ids[k]
