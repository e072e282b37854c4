"""The streams stage batches a parquet unit's documents an Arrow batch at a time (streams.list_batches): the same
batches as sources.batches gives over the same documents one at a time, with huge documents alone, limited units'
size bounds and empty texts, and the same documents read from a real parquet file. Its reader makes a batch's
texts and checksums in one compiled pass (tokmix._scan.arrow_texts): the same strs as pyarrow's to_pylist and the
same CRC-32s as tokmix.text.crc32 (ASCII, multi-byte, emoji, empty texts, sliced batches, large_string; nulls and
invalid UTF-8 refused with today's line), each non-ASCII str holding its UTF-8 for the encoder, and the same unit
files as the reader without it (TOKMIX_NATIVE=0)."""

from __future__ import annotations

import random
import sys
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.corpus import train_test_tokenizer
from tokmix import _scan
from tokmix.errors import TokmixError
from tokmix.sources import Places, batches, plan_units, read_texts
from tokmix.sources import parquet as parquet_source
from tokmix.sources.parquet import _offsets, unit_text_lists
from tokmix.stages.streams import UnitTask, list_batches, tokenize_unit
from tokmix.text import crc32


def _random_lists(rng: random.Random) -> list[list[str]]:
    lists = []
    for _ in range(rng.randrange(0, 12)):
        lists.append([rng.choice(["", "a" * rng.randrange(1, 40), "é" * rng.randrange(1, 9000)])
                      for _ in range(rng.randrange(0, 700))])
    return lists


def test_same_batches_as_one_document_at_a_time():
    rng = random.Random(7)
    for case in range(100):
        lists = _random_lists(rng)
        huge = rng.choice([1 << 62, 30, 5000])
        # a limited unit's bound: a function of the characters yielded so far, asked at each batch's start
        step = rng.randrange(1, 50_000)

        def bound(read, step=step):
            return max(1, 200_000 - read) if read < 200_000 else step

        one = list(batches(iter([t for texts in lists for t in texts]), huge, bound))
        assert list(list_batches(iter(lists), huge, bound)) == one, case
        assert list(list_batches(iter(lists), huge)) == list(batches(iter([t for x in lists for t in x]), huge))


def test_a_parquet_unit_reads_the_same(tmp_path):
    rng = random.Random(3)
    texts = [rng.choice(["", "x" * rng.randrange(1, 3000), "日本語" * rng.randrange(1, 500)]) for _ in range(5000)]
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=700)
    unit = next(plan_units("s", [str(path)], [], 1 << 40))
    places_one, places_many = Places(checksums=True, kept=True), Places(checksums=True, kept=True)
    one = list(batches(read_texts(unit, "text", "s", [], 1 << 20, places=places_one), 1 << 20))
    many = list(list_batches(unit_text_lists(unit.pieces, "text", "s", [], 1 << 20, places_many), 1 << 20))
    assert many == one
    assert sum(map(len, many)) == sum(1 for t in texts if t)
    n = sum(map(len, many))
    assert (places_many.take_kept(n) == places_one.take_kept(n)).all()


WORDS = ["plain", "Grüße", "東京の夜", "emoji 🎉🧪", "naïve café", "\u0000nul", "𝔘𝔫𝔦", "a\u00a0b", "é", "ü", "x" * 70,
         "Ωμέγα " * 30, "", " ", "\n"]


def _texts(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 12))) for _ in range(n)]


def _cached_utf8(text: str) -> bool:
    """Whether the str holds its UTF-8 in CPython's cache: getsizeof counts that cache's bytes."""
    fresh = (text + "!")[:-1]  # an equal str with no cache
    return sys.getsizeof(text) == sys.getsizeof(fresh) + len(text.encode()) + 1


def _arrow(column: pa.Array, checksums: bool = True, keep: bool = True):
    offsets, data = _offsets(column)
    return _scan.arrow_texts(offsets, data, offsets.itemsize, checksums, keep)


def test_the_compiled_pass_gives_to_pylists_strs_and_the_crc32s(tmp_path):
    assert parquet_source._native_texts() is not None, "tokmix._scan is stale or not built"
    rng = random.Random(11)
    texts = _texts(rng, 3000)
    for kind in (pa.string(), pa.large_string()):
        path = tmp_path / f"{kind}.parquet"
        pq.write_table(pa.table({"text": pa.array(texts, kind)}), path, row_group_size=700)
        for batch in pq.ParquetFile(path).iter_batches(batch_size=333):
            column = batch.column(0)
            for piece in (column, column.slice(17, 100), column.slice(300), column.slice(5, 0)):
                got, crcs = _arrow(piece)
                assert got == piece.to_pylist()
                assert [type(t) for t in got] == [str] * len(got)
                assert crcs == [crc32(t.encode()) for t in got] == [zlib.crc32(t.encode()) for t in got]
                assert _arrow(piece, False, False) == (got, None)
                if _scan.UTF8_PREFILL:
                    assert all(_cached_utf8(t) for t in got if not t.isascii() and len(t) > 1)
                # the encoder's own read of the cached UTF-8 (str.encode takes the cache where it is filled)
                assert [t.encode() for t in got] == [t.encode() for t in piece.to_pylist()]


def test_the_crc32s_of_every_length_and_alignment():
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes()
    ends = np.cumsum(rng.integers(0, 300, 400))
    ends = np.concatenate([[0], ends[ends < len(data)], np.arange(0, 200) + 19_000, [len(data)]])
    for width in (np.int32, np.int64):
        offsets = np.sort(ends).astype(width)
        want = [zlib.crc32(data[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
        assert _scan.crc32s(offsets, data, offsets.itemsize) == want
    assert _scan.crc32s(np.array([0, 0], np.int32), None, 4) == [0]
    with pytest.raises(ValueError):
        _scan.crc32s(np.array([0, 9], np.int32), b"short", 4)


def test_the_reader_with_and_without_the_compiled_pass(tmp_path, monkeypatch):
    rng = random.Random(12)
    texts = _texts(rng, 2500)
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"text": pa.array(texts, pa.large_string())}), path, row_group_size=400)
    unit = next(plan_units("s", [str(path)], [], 1 << 40))

    def read(native: bool) -> tuple[list, np.ndarray]:
        monkeypatch.setenv("TOKMIX_NATIVE", "1" if native else "0")
        places = Places(checksums=True, kept=True)
        got = [t for lst in unit_text_lists(unit.pieces, "text", "s", [], 1 << 20, places) for t in lst]
        return got, places.take_kept(sum(1 for t in got if t))

    (fast, fast_places), (slow, slow_places) = read(True), read(False)
    assert fast == slow == texts and (fast_places == slow_places).all()
    if _scan.UTF8_PREFILL:
        assert any(_cached_utf8(t) for t in fast) and not any(_cached_utf8(t) for t in slow)


@pytest.mark.parametrize("native", ["1", "0"])
def test_nulls_and_invalid_utf8_are_named_by_row_either_way(tmp_path, monkeypatch, native):
    monkeypatch.setenv("TOKMIX_NATIVE", native)
    path = tmp_path / "web.parquet"
    pq.write_table(pa.table({"text": ["a", "Grüße", "b", "c", None, "d"]}), path, row_group_size=3)
    unit = next(plan_units("web", [str(path)], [], 1 << 40))
    with pytest.raises(TokmixError, match=r"^stream web: file \S+web.parquet: row 4: 'text' is null$"):
        list(unit_text_lists(unit.pieces, "text", "web", [], 1 << 20, Places(checksums=True, kept=True)))
    values = [b"ok", "Grüße".encode(), b"\xf0\x9f\x8e", b"\xed\xa0\x80", b"x"]  # a cut emoji; a surrogate
    for bad_row, reason in ((2, "unexpected end of data"), (3, "invalid continuation byte")):
        rows = [v for i, v in enumerate(values) if i in (0, 1, bad_row)]
        pq.write_table(pa.table({"text": pa.array(rows, pa.binary()).view(pa.string())}), path)
        unit = next(plan_units("web", [str(path)], [], 1 << 40))
        with pytest.raises(TokmixError, match=rf"^stream web: file \S+web.parquet: row 2: invalid UTF-8 \({reason}\)$"):
            list(unit_text_lists(unit.pieces, "text", "web", [], 1 << 20, Places(checksums=True, kept=True)))


def test_a_units_files_are_the_same_with_and_without_the_compiled_pass(tmp_path, monkeypatch):
    rng = random.Random(13)
    texts = _texts(rng, 1500)
    path = tmp_path / "corpus" / "s" / "part-0.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"text": texts}), path, row_group_size=200)
    tokenizer = str(train_test_tokenizer({"s": [path, path]}, tmp_path / "tokenizer" / "tokenizer.json"))
    unit = next(plan_units("s", [str(path)], [], 1 << 40))
    files = {}
    for native in ("1", "0"):
        monkeypatch.setenv("TOKMIX_NATIVE", native)
        out = tmp_path / native
        out.mkdir()
        record = tokenize_unit(UnitTask(unit, "text", tokenizer, "fastokens", "<u2", str(out), None, (), 4 << 20,
                                        provenance=True))
        files[native] = ({p.suffix: p.read_bytes() for p in out.glob(f"{unit.name}.*") if p.suffix != ".json"},
                         record["tok_sha256"], record["src_sha256"])
    assert files["1"] == files["0"]
    assert set(files["1"][0]) >= {".tok", ".len", ".src"}
