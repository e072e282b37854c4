"""tokmix's own reader of a heavy row group's text pages (tokmix.sources.parquet_pages) gives pyarrow's values for
every codec, page version, dictionary or plain page, nullable or not, with or without statistics; a layout it
does not read (Parquet's LZ4, a null, invalid UTF-8, a nested column) is left to pyarrow (None)."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokmix.sources.parquet_pages import row_group_values

TEXTS = ["héllo 😀 " * 900, "", "b" * 70_000, "héllo 😀 " * 900, "x", "line\r\n\t\"quoted\""] * 25

LAYOUTS = list(itertools.product(["none", "snappy", "gzip", "zstd", "brotli"], [True, False], ["1.0", "2.0"],
                                 [True, False]))


def values(path, column: int = 0) -> list | None:
    with open(path, "rb") as f:
        metadata = pq.ParquetFile(f).metadata
        read = []
        for group in range(metadata.num_row_groups):
            arrays = row_group_values(f, metadata, group, column)
            if arrays is None:
                return None
            read += [a[0].as_py() for a in arrays]
    return read


@pytest.mark.parametrize("compression,dictionary,version,nullable", LAYOUTS)
def test_pages_give_pyarrows_values(tmp_path, compression, dictionary, version, nullable):
    schema = pa.schema([("id", pa.int64()), pa.field("text", pa.string(), nullable=nullable)])
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": range(len(TEXTS)), "text": TEXTS}, schema=schema), path, row_group_size=64,
                   compression=compression, use_dictionary=dictionary, data_page_version=version,
                   data_page_size=20_000, write_statistics=nullable)
    assert values(path, 1) == pq.read_table(path)["text"].to_pylist() == TEXTS


@pytest.mark.parametrize("case", ["parquet lz4", "a null", "invalid utf-8", "a list column"])
def test_layouts_it_does_not_read_are_left_to_pyarrow(tmp_path, case):
    path = tmp_path / "t.parquet"
    compression = "lz4" if case == "parquet lz4" else "snappy"
    column = {"parquet lz4": pa.array(TEXTS), "a null": pa.array(TEXTS[:3] + [None]),
              "invalid utf-8": pa.array([b"ok", b"\xff\xfe"], pa.binary()).cast(pa.string(), safe=False),
              "a list column": pa.array([["a", "b"], ["c"]])}[case]
    pq.write_table(pa.table({"text": column}), path, compression=compression)
    assert values(path) is None
