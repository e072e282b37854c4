"""JSONL documents' own ids ([streams.X] id_field) that are integers outside 64 bits: orjson, which reads a line
first, makes such an integer a float (2**64 -> 1.8446744073709552e+19), so they were refused at the end of a run as
"a float". They are read exactly (json, integers of any size), written exactly to the .ids files and found by
`trace --id`; one longer than Python converts (4,300 digits) is named in one line; a real float is still refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reference import GOLDEN
from tests.test_document_ids import ids_in, lines_of
from tokmix.errors import TokmixError
from tokmix.provenance import read_docs, sources_of
from tokmix.sources import document_ids

BIG = [2**63 + 5, 2**64, 2**64 + 7, -(2**63) - 1, -(2**64) - 3, 10**40]  # orjson: exact, then floats
OUTSIDE = [2**64, -(2**63) - 1, 10**40]  # the run's code_py ids (its shards hold a few of its documents)


def test_integers_outside_64_bits_are_read_exactly(tmp_path):
    path = tmp_path / "part.jsonl"
    lines = [json.dumps({"text": f"doc {n}", "id": v}) for n, v in enumerate(BIG)]
    lines += ['{"text": "a float", "id": 1e30}', '{"text": "another", "id": 1.5}',
              '{"id": ' + "9" * 5000 + ', "text": "long"}', '{"text": "long elsewhere", "n": ' + "7" * 5000 +
              ', "id": 184467440737095516160}']
    path.write_text("\n".join(lines) + "\n")
    got = document_ids("jsonl", str(path), "id", "web", [], list(range(len(BIG))))
    assert got == BIG and all(type(v) is int for v in got)
    assert document_ids("jsonl", str(path), "id", "web", [], [len(BIG) + 3]) == [184467440737095516160]
    for line in (len(BIG), len(BIG) + 1):
        with pytest.raises(TokmixError, match=rf"^stream web: file .*part\.jsonl: line {line + 1}: id field 'id' is "
                                              r"a float, not a string or an integer$"):
            document_ids("jsonl", str(path), "id", "web", [], [line])
    limit = sys.get_int_max_str_digits()
    with pytest.raises(TokmixError, match=rf"^stream web: file .*part\.jsonl: line {len(BIG) + 3}: id field 'id' is "
                                          rf"an integer of 5,000 digits: over the {limit:,} Python reads and writes "
                                          r"\(a string id has no such limit\)$"):
        document_ids("jsonl", str(path), "id", "web", [], [len(BIG) + 2])


def test_a_run_keeps_big_integer_ids_exactly_and_trace_finds_them(tmp_path):
    for part in ("corpus", "data", "tokenizer"):
        shutil.copytree(GOLDEN / part, tmp_path / part)
    for path in sorted((tmp_path / "corpus" / "code_py").glob("*.jsonl")):
        k = int(path.stem.split("-")[1])
        records = [json.loads(line) if line.strip() else None for line in lines_of(path)]
        ids = [v + (1000 * k + n) * (1 if v > 0 else -1) for n, v in ((n, OUTSIDE[n % 3]) for n in range(len(records)))]
        lines = [json.dumps({**r, "id": v}) if r else "" for r, v in zip(records, ids)]
        path.write_text("\n".join(lines) + "\n")
    recipe = (GOLDEN / "recipe.toml").read_text().replace("[streams.code_py]\n", '[streams.code_py]\nid_field = "id"\n')
    (tmp_path / "recipe.toml").write_text(recipe)
    done = subprocess.run([sys.executable, "-m", "tokmix", "run", "recipe.toml", "--out", "run", "--workers", "2"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "run"
    index = json.loads((run / "index.json").read_text())
    sources = sources_of(index["provenance"]["sources"])
    seen = []
    for entry in index["shards"]:
        ids = ids_in(run / entry["provenance"]["ids"]["file"])
        for record, got in zip(read_docs(run / entry["provenance"]["file"]), ids):
            source = sources[int(record["source"])]
            if source.stream == "code_py":
                want = json.loads(lines_of(Path(source.file))[int(record["place"])])["id"]
                assert got == want and type(got) is int
                seen.append(got)
            else:
                assert got is None
    assert seen and all(not -(2**63) <= v < 2**64 for v in seen), seen  # each one orjson makes a float
    from tokmix.trace import find_id

    wanted = seen[0]
    assert {d.id for d in find_id(run, str(wanted))} == {wanted}
