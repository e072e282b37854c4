"""Work units: a stream's files cut into contiguous pieces, in canonical order, each format's pieces and
documents found by its kind (one module per format: parquet, jsonl, text); and the documents read back out
of a unit, batched for the tokenizer and hashed for decontamination."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import pyarrow as pa

from tokmix.errors import TokmixError
from tokmix.shards import UNIT_BYTES, unit_name
from tokmix.sources import jsonl, parquet
from tokmix.sources import text as plain
from tokmix.sources.pieces import HugeText, Piece, Places, reading

BATCH_DOCS = 1024
BATCH_BYTES = 8 << 20  # one batch of text handed to the tokenizer; a larger document is a batch alone
FORMATS: dict[str, ModuleType] = {"parquet": parquet, "jsonl": jsonl, "text": plain}  # first that claims a file


@dataclass(frozen=True)
class Unit:
    stream: str
    index: int
    pieces: tuple[Piece, ...]

    @property
    def name(self) -> str:
        return unit_name(self.index)

    @property
    def size(self) -> int:
        return sum(p.size for p in self.pieces)

    @property
    def held(self) -> int:
        """The most bytes of text its reader holds at once, as far as metadata tells (Piece.held)."""
        return max((p.held for p in self.pieces), default=0)

    def describe(self) -> list[list]:
        return [[p.path, p.kind, p.start, p.stop] for p in self.pieces]

    def file_bytes(self) -> list[int]:
        return [p.file_bytes for p in self.pieces]


def file_kind(path: str) -> str:
    return next(kind for kind, module in FORMATS.items() if module.claims(path))


def document_ids(kind: str, path: str, field: str, stream: str, mirrors, places: list[int]) -> list[str | int]:
    """The ids of the documents at `places` (rows or lines, ascending) of one source file, from field `field`."""
    try:
        return FORMATS[kind].ids(path, field, stream, mirrors, places)
    except FileNotFoundError:
        raise TokmixError(f"stream {stream}: file {path}: not found (its documents' ids are read from it once "
                          "the shards are written)") from None


def file_pieces(path: str, mirrors, unit_bytes: int, stream: str) -> Iterator[Piece]:
    """The file's pieces, by its format; a missing or unreadable file is one line naming the stream."""
    try:
        yield from FORMATS[file_kind(path)].pieces(path, mirrors, unit_bytes)
    except FileNotFoundError:
        raise TokmixError(f"stream {stream}: file {path}: not found") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise TokmixError(f"stream {stream}: file {path}: cannot read: {e}") from None


def plan_units(
    stream: str, files: list[str], mirrors: list[tuple[str, str]], unit_bytes: int = UNIT_BYTES
) -> Iterator[Unit]:
    """The stream's work units in canonical order, planned lazily: only the files a run reaches are opened.
    Pieces that are a whole file (a plain-text file, a JSONL file of one piece, an empty one included) are grouped
    up to `unit_bytes`, so that 10,000 small files do not make 10,000 units."""
    index, group, group_bytes = 0, [], 0
    for path in files:
        for piece in file_pieces(path, mirrors, unit_bytes, stream):
            if _whole_file(piece):
                group.append(piece)
                group_bytes += piece.size
                if group_bytes >= unit_bytes:
                    yield Unit(stream, index, tuple(group))
                    index, group, group_bytes = index + 1, [], 0
                continue
            if group:
                yield Unit(stream, index, tuple(group))
                index, group, group_bytes = index + 1, [], 0
            yield Unit(stream, index, (piece,))
            index += 1
    if group:
        yield Unit(stream, index, tuple(group))


def _whole_file(piece: Piece) -> bool:
    return piece.kind == "text" or (piece.kind == "jsonl" and piece.start == 0 and piece.stop in (-1, piece.file_bytes))


def read_texts(unit_or_piece: Unit | Piece, field: str, stream: str, mirrors, huge: int | None = None,
               skip_huge: bool = False, places: Places | None = None) -> Iterator[str | HugeText]:
    """Every document text of a unit (or one piece) in order, empty ones included. With `huge`, a parquet or
    plain-text document or JSONL text of more bytes comes as a HugeText, or, with `skip_huge` (a sample that
    needs no such document), is skipped without being read whole: a parquet row group of more than
    HEAVY_ROW_GROUP_BYTES of text, a longer JSONL line, a larger text file. `places`, when given, is told where
    each document lies (Places)."""
    pieces = unit_or_piece.pieces if isinstance(unit_or_piece, Unit) else (unit_or_piece,)
    for i, piece in enumerate(pieces):
        if places is not None:
            places.piece = i
        with reading(piece.path, stream, mirrors):
            yield from FORMATS[piece.kind].texts(piece, field, stream, mirrors, huge, skip_huge, places)


def iter_file_texts(paths: list[str], field: str, stream: str, mirrors, huge: int | None = None,
                    skip_huge: bool = False, places: Places | None = None) -> Iterator[str | HugeText]:
    """Documents of whole files in order (the holdout stage reads files this way)."""
    for path in paths:
        for piece in file_pieces(path, mirrors, 1 << 62, stream):
            yield from read_texts(piece, field, stream, mirrors, huge, skip_huge, places)


def batches(
    texts: Iterator[str], huge: int = 1 << 62, max_chars: Callable[[int], int] | None = None
) -> Iterator[list[str]]:
    """Group non-empty texts into tokenizer batches bounded in count and size; a text longer than `huge`
    characters is a batch alone. `max_chars(chars yielded so far)`, asked at the start of each batch, bounds
    its size further."""
    batch, size, limit, yielded = [], 0, BATCH_BYTES, 0
    for text in texts:
        if not text:
            continue
        if not batch and max_chars is not None:
            limit = min(BATCH_BYTES, max(1, max_chars(yielded)))
        if len(text) > huge:
            if batch:
                yield batch
            yield [text]
            batch, size, yielded = [], 0, yielded + size + len(text)
            continue
        batch.append(text)
        size += len(text)
        if len(batch) >= BATCH_DOCS or size >= limit:
            yield batch
            batch, size, yielded = [], 0, yielded + size
    if batch:
        yield batch


def text_hashes(texts: list[str]) -> np.ndarray:
    """64-bit hashes of documents' exact UTF-8 bytes (no normalisation): the decontamination key."""
    digests = b"".join(hashlib.blake2b(t.utf8() if isinstance(t, HugeText) else t.encode("utf-8"),
                                       digest_size=8).digest() for t in texts)
    return np.frombuffer(digests, dtype=np.uint64)


def text_keys(texts: list, crcs: np.ndarray) -> np.ndarray:
    """A 64-bit key of each document that its exact copies share: its length in characters (the low 32 bits of
    it) above `crcs`, the CRC-32 of its UTF-8 bytes (tokmix.provenance.text_crc32; the reader gives them with
    provenance, so the key costs no pass over the text, and computed they are ~3.6x cheaper than text_hashes).
    Two texts with keys apart differ; a key in common is only a reason to compare their hashes."""
    chars = np.fromiter((t.chars() if isinstance(t, HugeText) else len(t) for t in texts), np.uint64, len(texts))
    return ((chars & np.uint64(0xFFFFFFFF)) << np.uint64(32)) | np.asarray(crcs).astype(np.uint64)
