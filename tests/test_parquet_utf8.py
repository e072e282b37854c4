"""A parquet text column's value that is not UTF-8 (pyarrow reads a string column's bytes unchecked) is named with its
stream, file and row by the reader the streams stage uses, also in a batch that holds a huge document (kept as
Arrow bytes, its own reader names its bad byte)."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokmix.errors import TokmixError
from tokmix.sources import Places, plan_units
from tokmix.sources.parquet import unit_text_lists


def _file(tmp_path, values: list[bytes]):
    path = tmp_path / "web.parquet"
    pq.write_table(pa.table({"text": pa.array(values, pa.binary()).view(pa.string())}), path, row_group_size=3)
    return path


@pytest.mark.parametrize("huge", [1 << 20, 8])
def test_the_streams_reader_names_the_row(tmp_path, huge):
    # rows 0-2 in the first row group; the bad one is row 4, in the second, after a document of 12 bytes (huge at 8)
    path = _file(tmp_path, [b"one", b"two", b"three", b"twelve bytes", b"bad \xff", b"after"])
    unit = next(plan_units("web", [str(path)], [], 1 << 40))
    with pytest.raises(TokmixError, match=r"^stream web: file \S+web.parquet: row 4: invalid UTF-8") as caught:
        for _ in unit_text_lists(unit.pieces, "text", "web", [], huge, Places(checksums=True, kept=True)):
            pass
    again = pickle.loads(pickle.dumps(caught.value))  # as a worker process hands it back
    assert str(again) == str(caught.value)


def test_valid_texts_read_as_before(tmp_path):
    texts = ["", "plain", "Grüße — 東京", "x" * 100]
    path = _file(tmp_path, [t.encode() for t in texts])
    unit = next(plan_units("web", [str(path)], [], 1 << 40))
    read = [t for texts in unit_text_lists(unit.pieces, "text", "web", [], 1 << 20) for t in texts]
    assert read == texts
