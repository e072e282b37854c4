"""[decontaminate] over JSONL training streams (issue 29): a gzip one (each file one unit) and a plain one cut into
byte ranges, with blank lines and empty texts between the documents. contamination.json's place of each dropped
document is its line in the file (0-based; trace's `:line N` is 1-based) whatever the unit size (ranges of a few
lines, or every file grouped into one unit), the planted problems are found at the lines they were written to,
and `tokmix trace --source FILE:line N` names the item."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.corpus import make_inputs, plant_humaneval
from tests.test_decontam import NGRAM, humaneval, oracle_contaminated, oracle_grams, oracle_words
from tokmix.shards import read_json

ROOT = Path(__file__).resolve().parents[1]
PLANTS = {"code_py": [2, 15], "edu": [3, 40], "dclm": [5]}  # parquet rows; code_py and edu become JSONL
AS_JSONL = {"code_py": ".jsonl.gz", "edu": ".jsonl"}


def tokmix(*args: str, unit_bytes: int = 9000) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": str(unit_bytes)}
    env.pop("TOKMIX_CACHE", None)
    return subprocess.run([sys.executable, "-m", "tokmix.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def jsonl_lines(texts: list[str]) -> tuple[list[str], dict[int, int]]:
    """The documents as JSONL lines with a blank line before every 7th and an empty text before every 11th;
    and the line (0-based) of each row."""
    lines, line_of = [], {}
    for i, text in enumerate(texts):
        if i % 7 == 3:
            lines.append("")
        if i % 11 == 5:
            lines.append(json.dumps({"text": ""}))
        line_of[i] = len(lines)
        lines.append(json.dumps({"text": text, "row": i}))
    return lines, line_of


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("decontam-jsonl")
    recipe = make_inputs(root, doc_limit=300, rows_per_group=16, steps=60)
    plant_humaneval(root, recipe, 16, PLANTS)
    split_path = root / "data" / "file_splits.json"
    split = json.loads(split_path.read_text())
    text = recipe.read_text()
    lines_of = {}
    for stream, suffix in AS_JSONL.items():
        for path in sorted((root / "corpus" / stream).glob("*.parquet")):
            lines, line_of = jsonl_lines(pq.read_table(path)["text"].to_pylist())
            data = ("\n".join(lines) + "\n").encode()
            new = path.with_suffix(suffix)
            new.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
            path.unlink()
            lines_of[str(new)] = line_of
            old = str(path.relative_to(root))
            for entry in split.values():
                for part in ("train", "holdout"):
                    entry[part] = [str(new.relative_to(root)) if f == old else f for f in entry[part]]
        text = text.replace(f"corpus/{stream}/*.parquet", f"corpus/{stream}/*{suffix}")
    split_path.write_text(json.dumps(split, indent=2))
    recipe.write_text(text)
    outs = {}
    for unit_bytes in (3000, 1 << 22):  # ranges of a few lines; every file of a stream in one unit
        out = root / f"out-{unit_bytes}"
        done = tokmix("run", str(recipe), "--out", str(out), "--workers", "2", "--no-cache", unit_bytes=unit_bytes)
        assert done.returncode == 0, done.stderr[-3000:]
        outs[unit_bytes] = out
    return {"root": root, "outs": outs, "lines_of": lines_of}


def file_lines(path: str) -> list[str]:
    data = gzip.decompress(Path(path).read_bytes()) if path.endswith(".gz") else Path(path).read_bytes()
    return data.decode().split("\n")


def test_each_place_is_the_line_of_a_document_holding_the_item(corpus):
    problems = humaneval()
    items = [oracle_grams(oracle_words(p["prompt"] + "\n" + p["canonical_solution"]), NGRAM) for p in problems]
    lengths = {NGRAM} | {len(next(iter(i))) for i in items if i and len(next(iter(i))) < NGRAM}
    records = {u: read_json(out / "contamination.json", sealed=True) for u, out in corpus["outs"].items()}
    assert records[3000] == records[1 << 22]
    places = [(item["id"], p) for item in records[3000]["items"] for p in item["places"]]
    jsonl = [(i, p) for i, p in places if p["file"].endswith(tuple(AS_JSONL.values()))]
    assert len(jsonl) >= 3
    for item_id, place in jsonl:
        line = file_lines(place["file"])[place["place"]]
        found = oracle_contaminated(json.loads(line)["text"], items, lengths)
        assert item_id in [problems[i]["task_id"] for i in found], (place, line[:200])
    # the planted rows the budget reaches: found at the lines they were written to
    planted = {(p["file"], p["place"]) for _, p in jsonl}
    first = {stream: str(corpus["root"] / "corpus" / stream / f"part-0{suffix}") for stream, suffix in AS_JSONL.items()}
    assert (first["code_py"], corpus["lines_of"][first["code_py"]][2]) in planted
    assert (first["edu"], corpus["lines_of"][first["edu"]][3]) in planted


def test_trace_names_the_item_of_a_dropped_jsonl_line(corpus):
    out = corpus["outs"][3000]
    record = read_json(out / "contamination.json", sealed=True)
    item, place = next((i, p) for i in record["items"] for p in i["places"] if p["file"].endswith(".jsonl"))
    shown = tokmix("trace", str(out), "--source", f"{place['file']}:line {place['place'] + 1}")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    said = " ".join(shown.stdout.split())  # (rich wraps at the terminal's width)
    assert "dropped by benchmark decontamination: not in the shards" in said and item["id"] in said
