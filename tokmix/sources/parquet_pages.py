"""A heavy parquet row group's text column decoded from its pages by tokmix: each page is read, decompressed with
Arrow's codec and its values kept as slices of the decompressed page, so a 300 MB value costs its compressed and
its decompressed page, not also pyarrow's copy of it into an array (~3x the value: docs/benchmarks.md). Only a flat
string column of PLAIN or dictionary pages (v1 or v2) with a codec Arrow has: anything else, a null or invalid
UTF-8 is None, and the caller reads the group with pyarrow (which names what is wrong)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokmix.wire import read_varint

CODECS = {"UNCOMPRESSED": None, "SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd",
          "LZ4_RAW": "lz4_raw"}  # Parquet's LZ4 (Hadoop's framing) is not Arrow's lz4: left to pyarrow
PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY = 0, 2, 3, 8  # parquet.thrift's Encoding
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3  # PageType
HEADER_WINDOW = 64 << 10  # bytes read for a page header, doubled while it runs past them (statistics)


class Unsupported(Exception):
    """A layout this decoder does not read (pyarrow then reads the row group)."""


def row_group_values(f, metadata: pq.FileMetaData, group: int, column: int) -> list[pa.Array] | None:
    """The row group's values of `column`, one 1-row large_string array per row over the pages' own buffers,
    or None where pyarrow must read them."""
    schema = metadata.schema.column(column)
    chunk = metadata.row_group(group).column(column)
    if (schema.max_repetition_level or schema.max_definition_level > 1 or chunk.physical_type != "BYTE_ARRAY"
            or chunk.compression not in CODECS):
        return None
    codec = CODECS[chunk.compression]
    try:
        values = list(_chunk_values(f, chunk, codec and pa.Codec(codec), schema.max_definition_level))
    except (Unsupported, IndexError, KeyError, ValueError, OSError, pa.ArrowException):
        return None
    if len(values) != metadata.row_group(group).num_rows:
        return None
    arrays = [pa.Array.from_buffers(pa.large_string(), 1, [None, pa.py_buffer(np.array([0, len(v)], np.int64)), v])
              for v in values]
    try:
        for array in arrays:
            array.validate(full=True)  # UTF-8, as pyarrow's reader checks it
    except pa.ArrowInvalid:
        return None
    return arrays


def _chunk_values(f, chunk, codec: pa.Codec | None, max_def: int) -> Iterator[pa.Buffer]:
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    pos, end, dictionary = start, start + chunk.total_compressed_size, None
    while pos < end:
        header, pos = _page_header(f, pos, end)
        kind, size, compressed = header[1], header[2], header[3]
        f.seek(pos)
        raw = f.read(compressed)
        pos += compressed
        if len(raw) != compressed:
            raise Unsupported("short page")
        if kind == DICTIONARY_PAGE:
            page = _decompress(codec, raw, size)
            del raw
            if header[7].get(2, PLAIN) not in (PLAIN, PLAIN_DICTIONARY):
                raise Unsupported("dictionary encoding")
            dictionary = list(_plain(page, 0, header[7][1]))
        elif kind == DATA_PAGE:
            page = _decompress(codec, raw, size)
            del raw
            info, at = header[5], 0
            if max_def:
                if info.get(3) != RLE:
                    raise Unsupported("levels encoding")
                length = int.from_bytes(memoryview(page)[:4], "little")
                levels = _hybrid(memoryview(page), 4, 4 + length, 1, info[1])
                if min(levels, default=max_def) != max_def:
                    raise Unsupported("a null")
                at = 4 + length
            yield from _page_values(page, at, info[1], info[2], dictionary)
        elif kind == DATA_PAGE_V2:
            info = header[8]
            if info.get(2, 0):
                raise Unsupported("a null")
            levels = info.get(5, 0) + info.get(6, 0)
            body = memoryview(raw)[levels:]
            page = _decompress(codec if info.get(7, True) else None, body, size - levels)
            del raw, body
            yield from _page_values(page, 0, info[1], info[4], dictionary)
        elif kind != INDEX_PAGE:
            raise Unsupported(f"page type {kind}")


def _decompress(codec: pa.Codec | None, raw, size: int) -> pa.Buffer:
    if codec is None:
        if len(raw) != size:
            raise Unsupported("sizes")
        return pa.py_buffer(raw)
    return codec.decompress(raw, decompressed_size=size)


def _page_values(page: pa.Buffer, at: int, count: int, encoding: int, dictionary: list | None) -> Iterator[pa.Buffer]:
    if encoding == PLAIN:
        yield from _plain(page, at, count)
    elif encoding in (PLAIN_DICTIONARY, RLE_DICTIONARY) and dictionary is not None:
        data = memoryview(page)
        for i in _hybrid(data, at + 1, len(data), data[at], count):
            yield dictionary[i]
    else:
        raise Unsupported(f"encoding {encoding}")


def _plain(page: pa.Buffer, at: int, count: int) -> Iterator[pa.Buffer]:
    """PLAIN byte arrays: a 4-byte little-endian length, then the bytes; each a slice of the page (no copy)."""
    data = memoryview(page)
    for _ in range(count):
        length = int.from_bytes(data[at:at + 4], "little")
        if at + 4 + length > len(data):
            raise Unsupported("value past its page")
        yield page.slice(at + 4, length)
        at += 4 + length


def _hybrid(data: memoryview, pos: int, end: int, width: int, count: int) -> list[int]:
    """`count` values of Parquet's RLE / bit-packed hybrid encoding at data[pos:end], `width` bits each."""
    out: list[int] = []
    while len(out) < count and pos < end:
        run, pos = read_varint(data, pos)
        if run & 1:  # groups of 8 bit-packed values, least significant bit first
            size = (run >> 1) * width
            bits = np.unpackbits(np.frombuffer(data[pos:pos + size], np.uint8), bitorder="little")
            out.extend(bits.reshape(-1, width).dot(1 << np.arange(width)).tolist() if width else [0] * (run >> 1) * 8)
            pos += size
        else:
            nbytes = (width + 7) // 8
            out.extend([int.from_bytes(data[pos:pos + nbytes], "little")] * (run >> 1))
            pos += nbytes
    if len(out) < count:
        raise Unsupported("levels short")
    return out[:count]


# ---------------------------------------------------------------------------- Thrift's compact protocol
class _Short(Exception):
    """The header runs past the bytes read for it."""


def _page_header(f, pos: int, end: int) -> tuple[dict, int]:
    """The PageHeader at `pos` (its fields by id) and where the page's data starts."""
    window = HEADER_WINDOW
    while True:
        f.seek(pos)
        data = memoryview(f.read(min(window, end - pos)))
        try:
            header, used = _struct(data, 0)
            return header, pos + used
        except (_Short, IndexError):
            if window >= end - pos:
                raise Unsupported("page header") from None
            window *= 2



def _int(data: memoryview, pos: int) -> tuple[int, int]:
    z, pos = read_varint(data, pos)
    return (z >> 1) ^ -(z & 1), pos


def _struct(data: memoryview, pos: int) -> tuple[dict, int]:
    fields, last = {}, 0
    while True:
        byte = data[pos]
        pos += 1
        if byte == 0:
            return fields, pos
        if byte >> 4:
            last += byte >> 4
        else:
            last, pos = _int(data, pos)
        fields[last], pos = _value(data, pos, byte & 0x0F)


def _value(data: memoryview, pos: int, kind: int):
    """One value of compact type `kind`; binaries (statistics' min and max) are skipped, not copied."""
    if kind in (1, 2):  # a struct field's bool is its type
        return kind == 1, pos
    if kind == 3:
        return data[pos], pos + 1
    if kind in (4, 5, 6):
        return _int(data, pos)
    if kind == 7:
        return None, pos + 8
    if kind == 8:
        n, pos = read_varint(data, pos)
        if pos + n > len(data):
            raise _Short
        return None, pos + n
    if kind in (9, 10):
        head = data[pos]
        n, elem, pos = head >> 4, head & 0x0F, pos + 1
        if n == 15:
            n, pos = read_varint(data, pos)
        items = []
        for _ in range(n):
            item, pos = (data[pos] == 1, pos + 1) if elem in (1, 2) else _value(data, pos, elem)
            items.append(item)
        return items, pos
    if kind == 11:
        n, pos = read_varint(data, pos)
        if not n:
            return {}, pos
        types, pos = data[pos], pos + 1
        for i in range(2 * n):
            kind = types >> 4 if i % 2 == 0 else types & 0x0F
            pos = pos + 1 if kind in (1, 2) else _value(data, pos, kind)[1]
        return None, pos
    if kind == 12:
        return _struct(data, pos)
    raise Unsupported(f"thrift type {kind}")
