"""Parquet sources: only the text column is read, a row group at a time; a work unit's piece is one or a few
row groups. Text bytes are counted from the footers alone."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokmix.sources.files import open_file
from tokmix.sources.parquet_pages import row_group_values
from tokmix.sources.pieces import HugeText, Piece, Places, Sample, bad, document_id, reading
from tokmix.text import crc32

PARQUET_READ_ROWS = 1024
PARQUET_READ_BYTES = 1 << 20  # Arrow batches of ~1 MiB: its buffers stay in cache and are reused by malloc
HEAVY_ROW_GROUP_BYTES = 64 << 20  # text in a row group's column past which a few rows are read one at a time
LENGTH_PREFIX_BYTES = 4  # each plain-encoded string's length prefix, inside the column's uncompressed size


def claims(path: str) -> bool:
    return path.lower().endswith(".parquet")


def pieces(path: str, mirrors, unit_bytes: int) -> Iterator[Piece]:
    """Runs of whole row groups of about `unit_bytes` (the last run takes what is left)."""
    with open_file(path, mirrors) as f:
        meta = pq.ParquetFile(f).metadata
        f.seek(0, os.SEEK_END)
        file_bytes = f.tell()
    start, size, row, first_row, held = 0, 0, 0, 0, 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        size += rg.total_byte_size
        row += rg.num_rows
        if rg.total_byte_size > HEAVY_ROW_GROUP_BYTES and rg.num_rows <= PARQUET_READ_ROWS:  # read whole (texts)
            held = max(held, rg.total_byte_size)
        if size >= unit_bytes or g == meta.num_row_groups - 1:
            yield Piece(path, "parquet", start, g + 1, first_row, size, file_bytes, held)
            start, size, first_row, held = g + 1, 0, row, 0


def ids(path: str, field: str, stream: str, mirrors, rows: list[int]) -> list[str | int]:
    """The ids (column `field`) of the documents at `rows` (ascending) of the file: the id column alone is read."""
    with open_file(path, mirrors) as f:
        pf = pq.ParquetFile(f)
        if field not in pf.schema_arrow.names:
            raise bad(stream, path, "schema", f"no id column {field!r} (columns: {pf.schema_arrow.names})")
        column = pf.read(columns=[field], use_threads=False).column(0)
    if rows and rows[-1] >= len(column):
        raise bad(stream, path, f"row {rows[-1]}", "not in the file any more (it holds fewer rows)")
    values = column.take(pa.array(rows, pa.int64())).to_pylist()
    return [document_id(v, field, stream, path, f"row {r}") for v, r in zip(values, rows)]


def texts(piece: Piece, field: str, stream: str, mirrors, huge: int | None,
          skip_huge: bool = False, places: Places | None = None) -> Iterator[str | HugeText]:
    """The piece's documents, row by row; with `huge`, see tokmix.sources.units.read_texts."""
    lists = text_lists(piece, field, stream, mirrors, huge, skip_huge, places)
    try:
        for documents in lists:
            yield from documents
    finally:
        lists.close()


def unit_text_lists(pieces: tuple[Piece, ...], field: str, stream: str, mirrors, huge: int | None,
                    places: Places | None = None) -> Iterator[list[str | HugeText]]:
    """A unit's parquet pieces' documents (units.read_texts' order and errors), an Arrow batch at a time, for
    the encoder: each non-ASCII text holds its UTF-8 where tokmix._scan can keep it (_native_texts)."""
    for i, piece in enumerate(pieces):
        if places is not None:
            places.piece = i
        with reading(piece.path, stream, mirrors):
            yield from text_lists(piece, field, stream, mirrors, huge, False, places, keep_utf8=True)


def text_lists(piece: Piece, field: str, stream: str, mirrors, huge: int | None,
               skip_huge: bool = False, places: Places | None = None, keep_utf8: bool = False
               ) -> Iterator[list[str | HugeText]]:
    """texts(), an Arrow batch at a time (empty texts included): the streams stage batches them for the
    tokenizer without a Python step per document. `keep_utf8`: see _batch_texts."""
    with open_file(piece.path, mirrors) as f:
        pf = pq.ParquetFile(f)
        if field not in pf.schema_arrow.names:
            raise bad(stream, piece.path, "schema", f"no column {field!r} (columns: {pf.schema_arrow.names})")
        column_type = pf.schema_arrow.field(field).type
        if pa.types.is_dictionary(column_type):  # a dictionary-encoded column: its values are the texts
            column_type = column_type.value_type
        if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
            raise bad(stream, piece.path, f"column {field!r}", f"type {column_type} is not a string type")
        row = piece.first_row
        schema = pf.metadata.schema
        column_index = next(i for i in range(len(schema)) if schema.column(i).path == field)
        for group in range(piece.start, piece.stop):
            meta = pf.metadata.row_group(group)
            heavy = huge is not None and meta.column(column_index).total_uncompressed_size > HEAVY_ROW_GROUP_BYTES
            if heavy and skip_huge:
                row += meta.num_rows
                continue
            if heavy and meta.num_rows <= PARQUET_READ_ROWS:
                batches = (row_group_values(f, pf.metadata, group, column_index)
                           or _rows_one_at_a_time(f, pf.metadata, group, field))
            else:
                rows = _batch_rows(meta, column_index)
                # decoded on this thread, not handed to Arrow's pool for the one column: faster (measured:
                # docs/benchmarks.md, "Choices measured in the code")
                batches = (b.column(0) for b in pf.iter_batches(batch_size=rows, row_groups=[group], columns=[field],
                                                                use_threads=False))
            for column in batches:
                texts, crcs, lengths = _batch_texts(column, piece, field, stream, huge, row,
                                                    places is not None and places.checksums is not None, keep_utf8)
                if places is not None:
                    places.add(row, len(column), crcs, empty=lengths == 0)
                yield texts
                row += len(column)


def _rows_one_at_a_time(f, metadata: pq.FileMetaData, group: int, field: str) -> list[pa.Array]:
    """A row group of a few huge documents that tokmix.sources.parquet_pages does not read (a layout it leaves to
    pyarrow), one row per Arrow batch: pyarrow then sizes each value's buffer
    to the value (a batch that goes on past a huge value doubles its buffer, copying the value). Its pages
    are streamed unbuffered, and the whole group is read before any of its documents is tokenized, so the
    reader's page buffers are gone by then: a 200 MB value peaks at ~600 MiB of transient buffers, not ~800."""
    light = pq.ParquetFile(f, metadata=metadata, pre_buffer=False, buffer_size=1 << 20)
    rows = light.iter_batches(batch_size=1, row_groups=[group], columns=[field], use_threads=False)
    return [b.column(0) for b in rows]


def _batch_rows(group: pq.RowGroupMetaData, column_index: int) -> int:
    """Rows per Arrow batch for about PARQUET_READ_BYTES of text: pyarrow builds a batch's text with up to
    ~3x its size in transient buffers."""
    size = max(group.column(column_index).total_uncompressed_size, 1)
    return max(1, min(PARQUET_READ_ROWS, group.num_rows * PARQUET_READ_BYTES // size))


def _offsets(column: pa.Array) -> tuple[np.ndarray, pa.Buffer | None]:
    """A string or binary column's value offsets into its data buffer (len(column) + 1 of them), and that buffer.
    A column of another layout (a string or binary view, as a file written from one reads back) is cast to
    offsets and bytes first."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
            or pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        column = column.cast(pa.large_binary())
    wide = pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type)
    offsets = np.frombuffer(column.buffers()[1], np.int64 if wide else np.int32)
    return offsets[column.offset:column.offset + len(column) + 1], column.buffers()[2]


def _native_texts():
    """tokmix._scan's arrow_texts where it is built with this reader's TEXTS_ABI and TOKMIX_NATIVE is not "0"
    (read at each call, as tokmix.ngrams reads it), else None: the same texts and checksums then come from
    to_pylist and tokmix.text.crc32."""
    if _SCAN is None or os.environ.get("TOKMIX_NATIVE") == "0":
        return None
    return _SCAN.arrow_texts


def _load_scan():
    try:
        from tokmix import _scan
    except ImportError:  # not built, or a .so that does not load: tokmix.ngrams names it
        return None
    return _scan if getattr(_scan, "TEXTS_ABI", None) == TEXTS_ABI else None


TEXTS_ABI = 1  # tokmix/_scan.c's TOKMIX_TEXTS_ABI (its arrow_texts' arguments and results): bump both together
_SCAN = _load_scan()


def _batch_texts(column: pa.Array, piece: Piece, field: str, stream: str, huge: int | None, row: int,
                 checksums: bool, keep_utf8: bool) -> tuple[list[str | HugeText], list[int] | None, np.ndarray]:
    """One batch's documents (`row`: the file's row number of its first), their CRC-32s when asked, and their
    byte lengths. Where tokmix._scan is built, one compiled pass makes the strs (CPython's UTF-8 decode of each
    value, as to_pylist's) and the checksums from the batch's offsets and buffer, and with `keep_utf8` each
    non-ASCII str keeps its UTF-8, which the encoder then copies instead of encoding the str again."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    offsets, data = _offsets(column)
    lengths = np.diff(offsets)
    native = _native_texts()
    if native is None or column.null_count or (huge is not None and len(lengths) and lengths.max() > huge):
        crcs = _crc32s(offsets, data) if checksums else None
        return _column_texts(column, piece, field, stream, huge, row), crcs, lengths
    try:
        texts, crcs = native(offsets, data, offsets.itemsize, checksums, keep_utf8)
    except UnicodeDecodeError as e:
        raise bad(stream, piece.path, f"row {row + _first_not_utf8(column, huge)}",
                  f"invalid UTF-8 ({e.reason})") from None
    return texts, crcs, lengths


def utf8_crc32s(column: pa.Array) -> list[int]:
    """CRC-32 (zlib's) of each value's bytes, read from Arrow's buffer: for a string column the value of
    tokmix.provenance.text_crc32 on its texts, without encoding each str again (that encode was ~3/4 of the
    checksums' time, docs/benchmarks.md)."""
    return _crc32s(*_offsets(column))


def _crc32s(offsets: np.ndarray, data: pa.Buffer | None) -> list[int]:
    view = memoryview(data) if data is not None else memoryview(b"")
    offsets = offsets.tolist()
    return [crc32(view[a:b]) for a, b in zip(offsets, offsets[1:])]


def _longest(column: pa.Array) -> int:
    """The byte length of the column's longest value, from its offsets (pyarrow.compute would do it too, but
    importing it costs each stage process ~0.1 CPU-second)."""
    if not len(column):
        return 0
    return int(np.diff(_offsets(column)[0]).max())


def _column_texts(column: pa.Array, piece: Piece, field: str, stream: str, huge: int | None,
                  row: int) -> list[str | HugeText]:
    """One batch's documents; `row` is the file's row number of its first."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.null_count:
        first = column.is_null().index(True).as_py()
        raise bad(stream, piece.path, f"row {row + first}", f"{field!r} is null")
    try:  # pyarrow reads a string column's bytes unchecked: a value that is not UTF-8 fails its str here
        if huge is None or _longest(column) <= huge:
            return column.to_pylist()
        # documents past `huge` bytes stay Arrow bytes, never one Python string: a slice of the column's buffer
        # (a scalar of the column, `for value in column`, held a copy of its 300 MB value: docs/benchmarks.md)
        offsets, data = _offsets(column)
        return [HugeText(data.slice(a, b - a), piece.path, stream) if b - a > huge else column[i].as_py()
                for i, (a, b) in enumerate(zip(offsets.tolist(), offsets[1:].tolist()))]
    except UnicodeDecodeError as e:
        raise bad(stream, piece.path, f"row {row + _first_not_utf8(column, huge)}",
                  f"invalid UTF-8 ({e.reason})") from None


def _first_not_utf8(column: pa.Array, huge: int | None) -> int:
    """The first value of the column that is not UTF-8, a document past `huge` bytes left to its reader (its
    pieces name the byte: tokmix.text.utf8_pieces)."""
    offsets, data = _offsets(column)
    view = memoryview(data) if data is not None else memoryview(b"")
    for i, (a, b) in enumerate(zip(offsets.tolist(), offsets[1:].tolist())):
        if huge is not None and b - a > huge:
            continue
        try:
            str(view[a:b], "utf-8")
        except UnicodeDecodeError:
            return i
    return 0


def sample(path: str, field: str, stream: str, mirrors, limit: int) -> Sample:
    """The first rows, about `limit` bytes of text; one huge row is cut so that it alone does not decide."""
    with open_file(path, mirrors) as f:
        groups = pq.ParquetFile(f).metadata.num_row_groups
    piece = Piece(path, "parquet", 0, groups)
    found, used = [], 0
    with reading(path, stream, mirrors):
        for text in texts(piece, field, stream, mirrors, None):
            if used >= limit:
                return Sample(found, used, False)
            text = text[: limit * 2]
            found.append(text)
            used += len(text.encode("utf-8", "surrogatepass"))
    return Sample(found, used, True)


def byte_count(path: str, field: str, mirrors) -> int:
    """Text bytes of the column from the footer alone: uncompressed size less the strings' length prefixes."""
    with open_file(path, mirrors) as f:
        meta = pq.ParquetFile(f).metadata
    columns = [i for i in range(meta.num_columns) if meta.schema.column(i).path == field]
    if not columns:
        return 0  # the sample reports the missing column with the run's own message
    total = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        total += max(0, rg.column(columns[0]).total_uncompressed_size - LENGTH_PREFIX_BYTES * rg.num_rows)
    return total
