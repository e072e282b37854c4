"""`tokmix trace` on a run made with [layout] provenance = false and [decontaminate] (issue 29 item 3): a real
run of the corpus with HumanEval problems planted (tests/test_decontam's plant). --source still says why a dropped
document is not in the shards (contamination.json names its places), and what it cannot show without the
provenance index it says in one line instead of refusing every question alike."""

from __future__ import annotations

import json

import pytest

from tests.corpus import make_corpus, train_test_tokenizer, write_recipe, write_split
from tests.test_decontam import ROWS_PER_GROUP, UNIT_BYTES, decontaminate_section, humaneval, plant, tokmix_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("noprov")
    files = make_corpus(root, doc_limit=200, rows_per_group=ROWS_PER_GROUP)
    plant(files, humaneval())
    write_split(root, files)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    plain = write_recipe(root, "tokenizer/tokenizer.json", decontaminate=True, steps=50, provenance="false")
    recipe = root / "decontam.toml"
    recipe.write_text(plain.read_text() + decontaminate_section())
    done = tokmix_run(recipe, root / "out", 2, UNIT_BYTES)
    assert done.returncode == 0, done.stderr[-3000:]
    index = json.loads((root / "out" / "index.json").read_text())
    assert "provenance" not in index and index["benchmark_decontamination"]["action"] == "drop"
    return root / "out"


def cli(*args: str):
    from typer.testing import CliRunner

    from tokmix.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})


def test_trace_source_says_why_a_dropped_document_is_not_in_the_shards(run):
    from tokmix.shards import read_json
    from tokmix.trace import find_source

    record = read_json(run / "contamination.json", sealed=True)
    assert record["items"]
    for item in record["items"]:
        for place in item["places"]:
            where = f"{place['file']}:row {place['place']}"
            doc = find_source(run, where)
            assert doc.found == [] and doc.action == "drop" and not doc.provenance
            assert {"benchmark": item["benchmark"], "index": item["index"], "id": item["id"],
                    "stream": place["stream"], "tokens": place["tokens"]} in doc.items
    place = record["items"][0]["places"][0]
    traced = cli("trace", str(run), "--source", f"{place['file']}:row {place['place']}")
    assert traced.exit_code == 0, traced.output[-2000:]
    said = " ".join(traced.output.split())
    assert "dropped by benchmark decontamination: not in the shards" in said and record["items"][0]["id"] in said


def test_what_trace_cannot_show_without_provenance_is_one_line(run):
    from tokmix.shards import read_json

    record = read_json(run / "contamination.json", sealed=True)
    taken = {(p["file"], p["place"]) for item in record["items"] for p in item["places"]}
    file = record["items"][0]["places"][0]["file"]
    row = next(r for r in range(100) if (file, r) not in taken)
    kept = cli("trace", str(run), "--source", f"{file}:row {row}")
    assert kept.exit_code == 2
    assert kept.output.strip() == (f"error: {file}:row {row}: no benchmark item took it (contamination.json); where "
                                   "it is in the shards, if it is, trace cannot show: "
                                   f"{run / 'index.json'} has no provenance index ([layout] provenance = false)")
    for args, what in ((["--step", "1"], "a block's documents"), (["--shard", "0"], "a block's documents"),
                       (["--id", "3"], "where a document's id is")):
        refused = cli("trace", str(run), *args)
        assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
        assert f"trace cannot show {what}; without it, it shows only why a document benchmark decontamination " \
               "took is not in the shards (--source FILE:row N, from contamination.json)" in refused.output
