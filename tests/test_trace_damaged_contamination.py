"""`tokmix trace` on a finished [decontaminate] run whose contamination.json is missing, damaged or another
file than index.json names: one line naming it and the remedy that works, `tokmix run` again (the run remakes it
from its units' records; --restart, which trace used to advise, would redo the whole run), never "in no train
shard ... and no benchmark item took it" for a document an item did take. And `trace --id` of a document that
decontamination dropped says so. Real runs (a corpus with HumanEval planted, tests/test_decontam), real CLI
processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.corpus import make_corpus, train_test_tokenizer, write_recipe, write_split
from tests.test_decontam import ROWS_PER_GROUP, UNIT_BYTES, decontaminate_section, humaneval, plant, tokmix_run

REMEDY = "the run's `tokmix run` command, run again, remakes it"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    files = make_corpus(root, doc_limit=200, rows_per_group=ROWS_PER_GROUP)
    plant(files, humaneval())
    for stream, paths in files.items():  # ids unique across the run's files, for trace --id
        for path in paths:
            table = pq.read_table(path)
            ids = pa.array([f"{stream}/{path.stem}/{n}" for n in range(table.num_rows)])
            pq.write_table(table.set_column(table.schema.get_field_index("id"), "id", ids), path,
                           row_group_size=ROWS_PER_GROUP)
    write_split(root, files)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    plain = write_recipe(root, "tokenizer/tokenizer.json", decontaminate=True, steps=50).read_text()
    recipe = root / "decontam.toml"
    recipe.write_text(plain.replace('domain = "', 'id_field = "id"\ndomain = "') + decontaminate_section())
    done = tokmix_run(recipe, root / "out", 2, UNIT_BYTES)
    assert done.returncode == 0, done.stderr[-3000:]
    return recipe, root / "out"


def tokmix(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokmix.cli", *map(str, args)], capture_output=True, text=True)


def trace(*args):
    """tokmix trace through its CLI, in this process (a process of its own costs ~1 CPU-s of imports)."""
    from typer.testing import CliRunner

    from tokmix.cli import app

    return CliRunner().invoke(app, ["trace", *map(str, args)], env={"COLUMNS": "400"})


def one_line(result) -> str:
    assert result.exit_code == 2, result.output[-2000:]
    assert len(result.output.strip().splitlines()) == 1, result.output
    return result.output.strip()


def taken_place(out) -> tuple[str, int, str]:
    """A source document decontamination dropped: file, row, and the item that took it."""
    record = json.loads((out / "contamination.json").read_text())
    item = record["items"][0]
    return item["places"][0]["file"], item["places"][0]["place"], item["id"]


def test_a_missing_or_damaged_contamination_record_is_one_line_and_the_run_remakes_it(run):
    recipe, out = run
    record = out / "contamination.json"
    kept = record.read_bytes()
    file, row, item = taken_place(out)
    where = f"{file}:row {row}"
    assert item in trace(out, "--source", where).output
    record.unlink()
    assert one_line(trace(out, "--source", where)) == (
        f"error: {record}: missing (index.json names it in benchmark_decontamination); {REMEDY}")
    remade = tokmix("run", recipe, "--out", out, "--workers", "2")  # the remedy named, taken
    assert remade.returncode == 0, remade.stderr[-2000:]
    assert record.read_bytes() == kept and item in trace(out, "--source", where).output
    damages = {
        "truncated": "damaged (not whole JSON: truncated or overwritten)",
        # sealed and whole, but not the bytes index.json names (another run's record would be the same)
        "another file": "damaged (sha256 differs from index.json's benchmark_decontamination)",
        "a FIFO": f"damaged (a FIFO, not a file tokmix wrote); remove it: {REMEDY}",  # the run stops at one too
    }
    for case, why in damages.items():
        record.unlink()
        if case == "truncated":
            record.write_bytes(kept[: len(kept) // 2])
        elif case == "another file":
            record.write_text(json.dumps(json.loads(kept), indent=1))
        else:
            os.mkfifo(record)
        said = why if case == "a FIFO" else f"{why}; {REMEDY}"
        assert one_line(trace(out, "--source", where)) == f"error: {record}: {said}", case
    record.unlink()
    record.write_bytes(kept)


def test_trace_id_of_a_document_decontamination_dropped_says_so(run):
    _, out = run
    file, row, _ = taken_place(out)
    wanted = pq.read_table(file, columns=["id"])["id"][row].as_py()
    entry = json.loads((out / "index.json").read_text())["benchmark_decontamination"]
    assert one_line(trace(out, "--id", wanted)) == (
        f"error: {out}: no document has the id '{wanted}' in the shards or holdouts; benchmark decontamination "
        f"dropped {entry['documents']:,} document(s), whose ids the run does not keep: `tokmix inspect {out} "
        "--contamination` lists them by file and row")
    kept = trace(out, "--step", "0", "--json")  # a document in the shards is found, as before
    doc = json.loads(kept.output)[0]["documents"][0]
    found = trace(out, "--id", doc["id"], "--json")
    assert found.exit_code == 0 and doc["where"] in {d["where"] for d in json.loads(found.output)}
