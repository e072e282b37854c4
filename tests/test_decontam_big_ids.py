"""A benchmark's own ids ([decontaminate.benchmarks.X] id_field) that are integers outside 64 bits: orjson, which
reads a JSONL line first, makes such an integer a float (2**64 -> 1.8446744073709552e+19), so the benchmark was
refused as "a float". They are read exactly (json, integers of any size, as a stream's ids are: tokmix.sources.jsonl),
recorded exactly in contamination.json and shown by inspect and trace; one longer than Python converts (4,300
digits) is named in one line; a real float is still refused."""

from __future__ import annotations

import json
import sys

import pytest

from tests.corpus import make_corpus, train_test_tokenizer, write_recipe, write_split
from tests.test_decontam import NGRAM, ROWS_PER_GROUP, UNIT_BYTES, humaneval, plant, tokmix_run
from tests.test_trace_without_provenance import cli
from tokmix.errors import TokmixError
from tokmix.shards import read_json
from tokmix.sources.benchmarks import iter_items

OUTSIDE = [2**64, -(2**63) - 1, 10**40]  # each one orjson makes a float


def big_id(i: int) -> int:
    """Item i's id: outside 64 bits, each distinct."""
    value = OUTSIDE[i % 3]
    return value + i if value > 0 else value - i


def items_of(path, id_field="id"):
    return list(iter_items("evalset", [str(path)], ["text"], id_field, [], {}))


def test_integers_outside_64_bits_are_read_exactly(tmp_path):
    path = tmp_path / "items.jsonl"
    values = [2**63 + 5, 2**64, 2**64 + 7, -(2**63) - 1, -(2**64) - 3, 10**40, 17, "q-3"]
    lines = [json.dumps({"text": f"item {n}", "id": v}) for n, v in enumerate(values)]
    lines.append('{"text": "digits elsewhere", "n": ' + "7" * 5000 + ', "id": 184467440737095516160}')
    path.write_text("\n".join(lines) + "\n")
    assert [item.id for item in items_of(path)] == [str(v) for v in values] + ["184467440737095516160"]
    for value in ("1.5", "1e30", "-2.0e19"):
        path.write_text('{"text": "a", "id": 3}\n{"text": "b", "id": ' + value + "}\n")
        with pytest.raises(TokmixError, match=r"^benchmark evalset: file .*items\.jsonl: line 2: id field 'id' is a "
                                              r"float, not a string or an integer$"):
            items_of(path)
    path.write_text('{"text": "a", "id": ' + "9" * 5000 + "}\n")
    limit = sys.get_int_max_str_digits()
    with pytest.raises(TokmixError, match=rf"^benchmark evalset: file .*items\.jsonl: line 1: id field 'id' is an "
                                          rf"integer of 5,000 digits: over the {limit:,} Python reads and writes "
                                          r"\(a string id has no such limit\)$"):
        items_of(path)
    path.write_text('{"text": ' + "9" * 5000 + ', "id": 1}\n')  # (a field, not the id: json reads the line)
    with pytest.raises(TokmixError, match=r"line 1: field 'text' is int, not text or a list of texts$"):
        items_of(path)


def test_a_run_records_big_integer_ids_exactly_and_inspect_and_trace_show_them(tmp_path):
    """Through the CLI: HumanEval planted into the corpus (tests/test_decontam's plant), its benchmark file a
    JSONL whose task ids are integers outside 64 bits; contamination.json names each item found by its exact id,
    and `inspect --contamination` and `trace --source` print it."""
    files = make_corpus(tmp_path, doc_limit=200, rows_per_group=ROWS_PER_GROUP)
    problems = humaneval()
    plant(files, problems)
    write_split(tmp_path, files)
    train_test_tokenizer(files, tmp_path / "tokenizer" / "tokenizer.json")
    bench = tmp_path / "humaneval-big-ids.jsonl"
    bench.write_text("".join(json.dumps({**p, "task_id": big_id(i)}) + "\n" for i, p in enumerate(problems)))
    recipe = tmp_path / "big-ids.toml"
    recipe.write_text(write_recipe(tmp_path, "tokenizer/tokenizer.json", decontaminate=True, steps=50).read_text()
                      + f'\n[decontaminate]\nngram = {NGRAM}\n[decontaminate.benchmarks.humaneval]\nfiles = '
                      f'["{bench}"]\nfields = ["prompt", "canonical_solution"]\nid_field = "task_id"\n')
    done = tokmix_run(recipe, tmp_path / "out", 2, UNIT_BYTES)
    assert done.returncode == 0, done.stderr[-3000:]
    record = read_json(tmp_path / "out" / "contamination.json", sealed=True)
    assert len(record["items"]) >= 10
    assert [item["id"] for item in record["items"]] == [str(big_id(item["index"])) for item in record["items"]]
    found = [big_id(item["index"]) for item in record["items"]]
    assert any(v >= 2**64 for v in found) and any(v < -(2**63) for v in found)
    shown = cli("inspect", str(tmp_path / "out"), "--contamination")
    assert shown.exit_code == 0, shown.output[-2000:]
    assert all(item["id"] in shown.output for item in record["items"])
    item = record["items"][0]
    place = item["places"][0]
    traced = cli("trace", str(tmp_path / "out"), "--source", f"{place['file']}:row {place['place']}")
    assert traced.exit_code == 0, traced.output[-2000:]
    assert item["id"] in " ".join(traced.output.split())
