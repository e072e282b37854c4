"""The typed records of index.json (tokmix.format.records): read once with the defaults of an absent key, written
back as the same JSON; an index without a format version (the reference's) reads as today's format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokmix.format.records import FORMAT_VERSION, HoldoutEntry, Index, ShardRecord, UnitRecord
from tokmix.shards import DamagedFile, read_index
from tokmix.tokens import Delimiters

REFERENCE_INDEX = Path(__file__).parent / "golden" / "reference" / "index.json"


def test_the_references_index_reads_as_format_0_with_its_defaults():
    raw = json.loads(REFERENCE_INDEX.read_text())
    assert "format_version" not in raw and "delimiters" not in raw
    index = Index.from_json(raw)
    assert index.format_version == 0 and not index.has("format_version")
    assert index.dtype == raw.get("dtype", "uint16") and index.margin_steps == raw.get("margin_steps", 0)
    assert Delimiters.from_index(index) == Delimiters((raw["eot_id"],), ())
    assert [s.file for s in index.shards] == [s["file"] for s in raw["shards"]]
    assert all(isinstance(e, HoldoutEntry) for e in index.val.values())
    assert index.to_json() == raw  # nothing added, nothing lost: read and written again it is the same JSON


def test_an_absent_key_stays_absent_and_an_unknown_key_is_kept():
    raw = {"shards": [{"file": "train_000.bin", "tokens": 33, "blocks": 1, "added_later": [1]}], "val": {},
           "a_later_key": {"x": 1}}
    index = Index.from_json(raw)
    assert index.dtype == "uint16" and not index.has("dtype") and index.seq_len is None
    assert index.shards[0].extra == {"added_later": [1]} and index.shards[0].checksum is None
    assert json.dumps(index.to_json()) == json.dumps(raw)  # the same keys, in tokmix's order
    assert index.replace(seq_len=32).to_json()["seq_len"] == 32


def test_a_unit_record_writes_its_null_limit_and_its_pass_key():
    unit = UnitRecord(index=3, name="000003", pass_no=2, tokens=10, docs=1, size=5, limit=None)
    written = unit.to_json()
    assert written["pass"] == 2 and "pass_no" not in written and written["limit"] is None
    assert UnitRecord.from_json(written).to_json() == written


def test_tokmix_writes_the_format_version_first(tmp_path):
    index = Index(format_version=FORMAT_VERSION, seq_len=32, shards=[ShardRecord(file="train_000.bin")])
    assert next(iter(index.to_json())) == "format_version" and FORMAT_VERSION == 1
    (tmp_path / "index.json").write_text(json.dumps(index.to_json()))
    assert read_index(tmp_path) == index and read_index(tmp_path / "nothing") is None


def test_an_index_that_is_no_object_is_damaged(tmp_path):
    (tmp_path / "index.json").write_text("[1, 2]")
    with pytest.raises(DamagedFile, match="not a JSON object"):
        read_index(tmp_path)

