"""Plain text sources: any file that is neither parquet nor JSONL is one document, its bytes UTF-8."""

from __future__ import annotations

from collections.abc import Iterator

from tokmix.errors import TokmixError
from tokmix.sources.files import file_size, open_file
from tokmix.sources.pieces import HugeText, Piece, Places, Sample, bad


def claims(path: str) -> bool:
    return True  # the last format asked: any file


def pieces(path: str, mirrors, unit_bytes: int) -> Iterator[Piece]:
    """The whole file (tokmix.sources.units groups small ones into one unit)."""
    size = file_size(path, mirrors)
    yield Piece(path, "text", size=size, file_bytes=size, held=size)


def ids(path: str, field: str, stream: str, mirrors, places: list[int]) -> list[str | int]:
    """A text file is one document, with no field to hold an id."""
    raise bad(stream, path, "file", f"a plain text file has no id field {field!r} (ids come from JSONL fields and "
              "parquet columns)")


def texts(piece: Piece, field: str, stream: str, mirrors, huge: int | None,
          skip_huge: bool = False, places: Places | None = None) -> Iterator[str | HugeText]:
    """The file's one document; with `huge`, see tokmix.sources.units.read_texts."""
    if skip_huge and huge is not None and piece.size > huge:
        return
    with open_file(piece.path, mirrors) as f:
        data = f.read()
    if places is not None:
        places.add(0, empty=not data)
    if huge is not None and len(data) > huge:
        yield HugeText(data, piece.path, stream)
        return
    try:
        yield data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(stream, piece.path, f"byte {e.start}", "invalid UTF-8") from None


def sample(path: str, field: str, stream: str, mirrors, limit: int) -> Sample:
    """The file's first `limit` bytes, undecodable bytes replaced (a sample only counts)."""
    try:
        with open_file(path, mirrors) as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise TokmixError(f"stream {stream}: file {path}: not found") from None
    whole = len(data) <= limit
    return Sample([data[:limit].decode("utf-8", "replace")], min(len(data), limit), whole)


def byte_count(path: str, field: str, mirrors) -> int:
    return file_size(path, mirrors)
