"""The one varint of the binary formats tokmix reads itself: a SentencePiece model's protobuf (tokmix.backends) and
a parquet page header's Thrift compact protocol (tokmix.sources.parquet_pages) both write an unsigned integer as
LEB128, seven bits a byte, low bits first, the high bit set on every byte but the last."""

from __future__ import annotations


def read_varint(data, pos: int) -> tuple[int, int]:
    """The varint at `pos` of `data` (bytes, or a memoryview of signed or unsigned bytes) and the position after it;
    IndexError past the end."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:  # not `byte < 0x80`: a memoryview of a pyarrow buffer gives signed bytes
            return value, pos
        shift += 7
