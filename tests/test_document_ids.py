"""Documents' own ids ([streams.X] id_field): kept beside the provenance index of every shard and holdout, as the
source files hold them (string ids in JSONL, integer ids in JSONL, string ids in a parquet column, none for a
stream without an id_field), shown and looked up by `tokmix trace`, returned by the loader and the exports.
One run of the golden corpus, given ids, through the command line; every id checked against the source line or
row its document's provenance record names, read here with json and pyarrow."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tests.reference import GOLDEN
from tokmix.cli import app
from tokmix.data import TrainBlocks
from tokmix.errors import TokmixError
from tokmix.provenance import read_docs, sources_of
from tokmix.sources import document_ids

ID_FIELDS = {"dclm": "id", "code_py": "id", "code_other": "doc_id"}  # edu keeps none


def lines_of(path: Path) -> list[str]:
    """A JSONL file's lines, cut at "\n" alone (its texts hold U+2028 and other characters splitlines() cuts at)."""
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


def ids_in(path: Path) -> list:
    return [json.loads(line) for line in lines_of(path)]


def _with_ids(root: Path) -> None:
    """dclm: string ids (`<urn:uuid:...>`, as FineWeb's); code_py: integers; code_other as parquet files with a
    string id column; edu as it is."""
    for path in sorted((root / "corpus").glob("*/*.jsonl")):
        stream, k = path.parent.name, int(path.stem.split("-")[1])
        records = [json.loads(line) if line.strip() else None for line in lines_of(path)]
        if stream == "dclm":
            lines = [json.dumps({"id": f"<urn:uuid:{k}-{n:04d}>", **r}) if r else "" for n, r in enumerate(records)]
            path.write_text("\n".join(lines) + "\n")
        elif stream == "code_py":
            lines = [json.dumps({**r, "id": 1000 * k + n}) if r else "" for n, r in enumerate(records)]
            path.write_text("\n".join(lines) + "\n")
        elif stream == "code_other":
            texts = [r["text"] for r in records if r]
            pq.write_table(pa.table({"doc_id": [f"c{k}/{n}" for n in range(len(texts))], "text": texts}),
                           path.with_suffix(".parquet"), row_group_size=4)
            path.unlink()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ids")
    for part in ("corpus", "data", "tokenizer"):
        shutil.copytree(GOLDEN / part, root / part)
    _with_ids(root)
    split = json.loads((root / "data" / "file_splits.json").read_text())
    for part in split["code"].values():
        part[:] = [f.replace(".jsonl", ".parquet") if "code_other" in f else f for f in part]
    (root / "data" / "file_splits.json").write_text(json.dumps(split))
    recipe = (GOLDEN / "recipe.toml").read_text().replace("code_other/*.jsonl", "code_other/*.parquet")
    for stream, field in ID_FIELDS.items():
        head = f"[streams.{stream}]\n"
        recipe = recipe.replace(head, f"{head}id_field = \"{field}\"\n")
    (root / "recipe.toml").write_text(recipe)
    proc = subprocess.run([sys.executable, "-m", "tokmix", "run", "recipe.toml", "--out", "run", "--workers", "2"],
                          cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return root / "run"


def source_id(kind: str, path: str, field: str, place: int):
    """A document's id read here from its source: the JSONL line's field, the parquet row's column."""
    if kind == "jsonl":
        return json.loads(lines_of(Path(path))[place])[field]
    return pq.read_table(path, columns=[field]).column(0)[place].as_py()


def test_every_document_keeps_the_id_its_source_line_or_row_holds(run):
    index = json.loads((run / "index.json").read_text())
    assert index["provenance"]["id_fields"] == ID_FIELDS
    assert index["provenance"]["record"][0] == ["source", "<u4"]  # the 16-byte records as they were
    entries = [(e, sources_of(index["provenance"]["sources"])) for e in index["shards"]]
    entries += [(e, sources_of(e["provenance"]["sources"])) for e in index["val"].values()]
    kinds = set()
    for entry, sources in entries:
        records = read_docs(run / entry["provenance"]["file"])
        ids = ids_in(run / entry["provenance"]["ids"]["file"])
        assert len(ids) == len(records) == entry["provenance"]["ids"]["documents"]
        for record, got in zip(records, ids):
            source = sources[int(record["source"])]
            field = ID_FIELDS.get(source.stream)
            want = None if field is None else source_id(source.kind, source.file, field, int(record["place"]))
            assert got == want and type(got) is type(want), (entry["file"], source, int(record["place"]))
            kinds.add((source.stream, type(got).__name__))
    assert kinds >= {("dclm", "str"), ("code_py", "int"), ("code_other", "str"), ("edu", "NoneType")}


def _cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_trace_shows_ids_and_finds_a_document_by_its_id(run):
    loader = TrainBlocks(run)
    ids = ids_in(run / "train_001.ids")
    docs = read_docs(run / "train_001.docs")
    i = next(i for i, v in enumerate(ids) if isinstance(v, str) and v.startswith("<urn") and i > 0)
    found = json.loads(_cli("trace", str(run), "--id", ids[i], "--json"))
    assert [(d["file"], d["index"], d["stream"]) for d in found] == [("train_001.bin", i, "dclm")]
    start = int(np.cumsum(docs["tokens"])[i] - docs["tokens"][i])
    first = int(loader.first_block[1]) + start // loader.seq_len
    assert found[0]["blocks"][0] == first and found[0]["steps"][0] == first // loader.seqs_per_step
    shown = _cli("trace", str(run), "--id", ids[i])
    assert f"documents with the id '{ids[i]}'" in shown and "train_001.bin" in shown
    # the block the lookup names holds it, id and all
    block = json.loads(_cli("trace", str(run), "--token", str(first * loader.seq_len + 1), "--json"))[0]
    assert ids[i] in [d["id"] for d in block["documents"]]
    # an integer id, typed as digits
    number = next(v for k in range(4) for v in ids_in(run / f"train_00{k}.ids") if isinstance(v, int))
    assert json.loads(_cli("trace", str(run), "--id", str(number), "--json"))[0]["id"] == number
    result = CliRunner().invoke(app, ["trace", str(run), "--id", "no-such-id"])
    assert result.exit_code == 2 and "no document has the id 'no-such-id'" in result.output


def test_a_steps_trace_opens_with_its_summary(run):
    step = 5
    shown = _cli("trace", str(run), "--step", str(step))
    blocks = json.loads(_cli("trace", str(run), "--step", str(step), "--json"))
    documents = {(b["shard"], d["index"]) for b in blocks for d in b["documents"]}
    streams = {d["stream"] for b in blocks for d in b["documents"]}
    files = {d["file"] for b in blocks for d in b["documents"]}
    head = shown.splitlines()[0]
    assert head.startswith(f"step {step}: {len(documents)} document(s), ") and \
        f"from {len(streams)} stream(s) and {len(files)} source file(s)" in head, head
    assert shown.index(head) < shown.index("block ")  # before the per-block tables


def test_the_loader_and_the_exports_return_the_ids(run, tmp_path):
    loader = TrainBlocks(run)
    traced = json.loads(_cli("trace", str(run), "--step", "3", "--json"))
    assert loader.document_ids(3) == [[d["id"] for d in b["documents"]] for b in traced]
    _cli("export", str(run), "--format", "megatron", str(tmp_path / "mega" / "gptu"))
    idx = (tmp_path / "mega" / "gptu.idx").read_bytes()
    sequences = struct.unpack("<Q", idx[18:26])[0]
    exported = ids_in(tmp_path / "mega" / "gptu.ids")
    assert len(exported) == sequences
    shard_ids = [ids_in(run / f"train_00{k}.ids") for k in range(4)]
    assert exported == shard_ids[0] + [x for ids in shard_ids[1:] for x in ids[1:]]
    _cli("export", str(run), "--format", "llmc", str(tmp_path / "llmc"))
    assert (tmp_path / "llmc" / "tokmix_train_002.ids").read_bytes() == (run / "train_002.ids").read_bytes()


def test_a_missing_or_unusable_id_is_one_line_naming_stream_file_and_place(tmp_path):
    path = tmp_path / "part.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n{"text": "y", "url": "u"}\n{"id": 1.5, "text": "z"}\n')
    assert document_ids("jsonl", str(path), "id", "web", [], [0]) == ["a"]
    with pytest.raises(TokmixError, match=r"^stream web: file .*part\.jsonl: line 2: no id field 'id' \(fields: "
                                          r"\['text', 'url'\]\)$"):
        document_ids("jsonl", str(path), "id", "web", [], [0, 1])
    with pytest.raises(TokmixError, match=r"line 3: id field 'id' is a float, not a string or an integer$"):
        document_ids("jsonl", str(path), "id", "web", [], [2])
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "p.parquet")
    with pytest.raises(TokmixError, match=r"p\.parquet: schema: no id column 'id' \(columns: \['text'\]\)$"):
        document_ids("parquet", str(tmp_path / "p.parquet"), "id", "web", [], [0])


def test_a_damaged_ids_file_is_named_and_the_same_command_remakes_it(run):
    """(Last of the module: it damages the module's run, and the run command puts it back.)"""
    path = run / "train_002.ids"
    whole = path.read_bytes()
    path.write_bytes(whole.replace(b"<urn:uuid:", b"<urn:uuiD:", 1))
    try:
        result = CliRunner().invoke(app, ["validate", str(run)])
        assert result.exit_code != 0 and "train_002.ids: damaged (sha256 differs from index.json)" in result.output
        result = CliRunner().invoke(app, ["trace", str(run), "--id", "no-such-id"])
        assert result.exit_code == 2 and "train_002.ids: damaged" in result.output, result.output
        proc = subprocess.run([sys.executable, "-m", "tokmix", "run", "recipe.toml", "--out", "run"], cwd=run.parent,
                              capture_output=True, text=True)
        assert proc.returncode == 0 and "train_002.ids: missing or damaged" in proc.stdout, proc.stderr
        assert path.read_bytes() == whole
    finally:
        path.write_bytes(whole)
