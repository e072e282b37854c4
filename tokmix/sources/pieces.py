"""What every source format shares: a piece of a file (the grain of a work unit), a document too large to be
one Python string, and the error that names the stream, the file and the place in it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tokmix.errors import TokmixError
from tokmix.sources.files import remote_errors
from tokmix.text import utf8_pieces


@dataclass(frozen=True)
class Piece:
    """A contiguous part of one file: parquet row groups [start, stop), JSONL bytes [start, stop), or the
    whole file (start = 0, stop = -1) for compressed JSONL and plain text."""

    path: str
    kind: str  # "parquet" | "jsonl" | "text"
    start: int = 0
    stop: int = -1
    first_row: int = 0  # row (parquet) number of the piece's first document, for messages
    size: int = 0  # source bytes it holds (uncompressed, estimated for compressed files): for scheduling
    file_bytes: int = 0  # its whole file's size when planned: a resume refuses a file that has another now
    # the most bytes of text its reader holds at once, as far as the file's metadata tells (a text file; a heavy
    # parquet row group, read whole): for scheduling (tokmix.stages.alone_share); 0 for JSONL (lines do not show)
    held: int = 0



class Places:
    """Where the documents a reader yields lie, for the provenance index: the reader adds each one's place
    (parquet: row in the file; JSONL: line in the piece, 0-based; text: 0) before yielding it, the consumer
    takes them in the same order with `take()`. `lines`: the lines of each JSONL piece read (by piece number),
    where the pieces after it in the same file start counting. With `checksums`, `take()` gives a third value,
    the CRC-32 of the document's UTF-8 bytes where the reader has those bytes (a parquet reader: from Arrow's
    buffer, sparing an encode per document), else -1 (the consumer computes it from the text).

    `kept`: only the non-empty documents' places are kept (the reader says which are empty), and the consumer
    takes a batch of them at once as an array (`take_kept`): the streams stage, whose batches hold the non-empty
    texts in order, spares a Python step and a tuple per document."""

    def __init__(self, checksums: bool = False, kept: bool = False):
        self.piece = 0  # the unit's piece being read
        self.runs: deque[list[int]] = deque()  # [piece, first place, count]
        self.lines: dict[int, int] = {}
        self.checksums: deque[int] | None = deque() if checksums else None
        # with `kept`: the non-empty documents' pieces, places and checksums (-1: none), from `taken` on
        self.kept: tuple[list[int], list[int], list[int]] | None = ([], [], []) if kept else None
        self.taken = 0

    def add(self, place: int, count: int = 1, checksums: list[int] | None = None, empty=None) -> None:
        """`count` documents from `place` on; `empty` (with `kept`): whether the one document is empty, or a bool
        array of which of the `count` are (None: none is)."""
        if not count:
            return
        if self.kept is not None:
            self._keep(place, count, checksums, empty)
            return
        self.runs.append([self.piece, place, count])
        if self.checksums is not None:
            self.checksums.extend(checksums if checksums is not None else [-1] * count)

    def _keep(self, place: int, count: int, checksums: list[int] | None, empty) -> None:
        pieces, places, crcs = self.kept
        if count == 1 and not isinstance(empty, np.ndarray):
            if not empty:
                pieces.append(self.piece)
                places.append(place)
                crcs.append(checksums[0] if checksums is not None else -1)
            return
        if empty is not None and empty.any():
            at = np.flatnonzero(~empty)
            places.extend((at + place).tolist())
            crcs.extend(np.asarray(checksums)[at].tolist() if checksums is not None else [-1] * len(at))
            pieces.extend([self.piece] * len(at))
            return
        places.extend(range(place, place + count))
        crcs.extend(checksums if checksums is not None else [-1] * count)
        pieces.extend([self.piece] * count)

    def take(self) -> tuple[int, int] | tuple[int, int, int]:
        """(piece, place) of the next document; with checksums, (piece, place, CRC-32 or -1)."""
        run = self.runs[0]
        found = run[0], run[1]
        run[1], run[2] = run[1] + 1, run[2] - 1
        if not run[2]:
            self.runs.popleft()
        return found if self.checksums is None else (*found, self.checksums.popleft())

    def take_kept(self, n: int) -> np.ndarray:
        """With `kept`: the next `n` non-empty documents' (piece, place, CRC-32 or -1), an (n, 3) int64 array."""
        a, b = self.taken, self.taken + n
        out = np.empty((n, 3), dtype=np.int64)
        for column, values in enumerate(self.kept):
            out[:, column] = values[a:b]
        self.taken = b
        if b >= 1 << 14:  # what was taken goes, a few batches at a time
            for values in self.kept:
                del values[:b]
            self.taken = 0
        return out


class SourceError(TokmixError):
    pass


def document_id(value: object, field: str, stream: str, path: str, where: str) -> str | int:
    """A document's own id as the source has it: a string or an integer, anything else named."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    kind = "null" if value is None else f"a {type(value).__name__}, not a string or an integer"
    raise bad(stream, path, where, f"id field {field!r} is {kind}")


class HugeText:
    """A document too large to hold as one Python string (200 MB of text with a single emoji is 800 MB as a
    str): its UTF-8 bytes, which the tokenizing worker turns into str pieces one at a time."""

    def __init__(self, data, path: str, stream: str):
        self.data, self.path, self.stream = data, path, stream

    def __len__(self) -> int:
        return len(self.data)

    def pieces(self) -> Iterator[str]:
        try:
            yield from utf8_pieces(self.data)
        except UnicodeDecodeError as e:
            where = f"byte {e.start} of a {len(self):,}-byte document"
            raise bad(self.stream, self.path, where, "invalid UTF-8") from None

    def utf8(self):
        return self.data

    def chars(self) -> int:
        """Its length in characters, as the str it holds would have: the bytes that start a character (any but
        a UTF-8 continuation byte), counted a slice at a time."""
        data = memoryview(self.data).cast("B")
        return sum(int(np.count_nonzero((np.frombuffer(data[at:at + CHAR_SLICE], np.uint8) & 0xC0) != 0x80))
                   for at in range(0, len(data), CHAR_SLICE))


CHAR_SLICE = 16 << 20  # HugeText.chars's slices: a 200 MB document's count holds 16 MB of numpy at a time


def bad(stream: str, path: str, where: str, what: str) -> SourceError:
    return SourceError(f"stream {stream}: file {path}: {where}: {what}")



@dataclass
class Sample:
    """The first documents of a file, about a limit's worth of bytes (`tokmix plan` tokenizes them)."""

    texts: list[str]
    used: int  # bytes of the file, counted as its format's byte_count counts them, that the texts came from
    whole: bool  # the texts are all of the file's documents


@contextmanager
def reading(path: str, stream: str, mirrors):
    """Reading a file's documents: a missing, corrupt or unreadable file, or a remote one that fails, is one
    line naming the stream and the file."""
    try:
        with remote_errors(path, mirrors):
            yield
    except FileNotFoundError:
        raise bad(stream, path, "open", "file not found") from None
    except (pa.ArrowException, OSError) as e:
        raise bad(stream, path, "read", f"corrupt or unreadable ({e})") from None
