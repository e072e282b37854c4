"""The provenance index (tokmix.provenance): every document of every train shard and holdout traced to its
source file and place, checked against the source itself by an independent reader (pyarrow for parquet rows,
the file's own lines for JSONL) and against the tokens in the shard. One real run serves every test: parquet
and JSONL streams (blank lines, files cut into several units), holdout copies dropped from a train file, and a
stream repeated in three passes."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

import tokmix
from tests.corpus import make_inputs
from tokmix.data import TrainBlocks
from tokmix.format.records import HoldoutEntry, Index, ShardRecord
from tokmix.provenance import DOC_DTYPE, file_documents, sources_of, text_crc32
from tokmix.sources.parquet import utf8_crc32s
from tokmix.tokens import Delimiters
from tokmix.trace import token_block, trace_blocks

UNIT_BYTES = 4000  # JSONL files cut into several units: a piece's lines continue its file's earlier pieces'


def mixed_corpus(root: Path) -> Path:
    """The test corpus with edu as JSONL (blank and whitespace lines between records), two of dclm's holdout
    documents copied into its first train file (decontamination drops them), and max_epochs = 4 (dclm's train
    documents are too few for its budget: it makes 3 passes)."""
    recipe = make_inputs(root, doc_limit=100, rows_per_group=8, decontaminate=True)
    held = pq.read_table(root / "corpus/dclm/part-3.parquet").to_pylist()
    first = root / "corpus/dclm/part-0.parquet"
    rows = pq.read_table(first).to_pylist()
    pq.write_table(pa.Table.from_pylist(rows[:5] + held[:2] + rows[5:]), first, row_group_size=8)
    for path in root.glob("corpus/edu/*.parquet"):
        lines = []
        for i, row in enumerate(pq.read_table(path).to_pylist()):
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
            lines += ["\n" if i % 2 else "   \n"] if i % 3 == 1 else []
        path.with_suffix(".jsonl").write_text("".join(lines), encoding="utf-8")
        path.unlink()
    for name in ("data/file_splits.json", "recipe.toml"):
        path = root / name
        path.write_text(re.sub(r"(corpus/edu/[^\"]*)\.parquet", r"\1.jsonl", path.read_text()))
    recipe.write_text(re.sub(r"(files = \[.*\])", r"\1\nmax_epochs = 4", recipe.read_text()))
    return recipe


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("provenance")
    recipe = mixed_corpus(root)
    tokmix.run(tokmix.load_recipe(recipe), root / "out", workers=2, keep_streams=True, unit_bytes=UNIT_BYTES)
    return root / "out"


def source_text(kind: str, path: str, place: int, field: str = "text") -> str:
    """A document read back by a reader of the test's own: pyarrow's row, or the JSON of the file's line."""
    if kind == "parquet":
        return pq.read_table(path, columns=[field]).column(field)[place].as_py()
    assert kind == "jsonl"
    return json.loads(Path(path).read_bytes().split(b"\n")[place])[field]


def framed(tokenizer: Tokenizer, delimiters: Delimiters, text: str) -> list[int]:
    return [*delimiters.prefix, *tokenizer.encode(text).ids, *delimiters.suffix]


def entry_of(entry: dict) -> ShardRecord | HoldoutEntry:
    """index.json's entry of a token file, as tokmix reads it."""
    return ShardRecord.from_json(entry) if "blocks" in entry else HoldoutEntry.from_json(entry)


def token_files(index: dict) -> list[tuple[dict, list]]:
    """(entry, its table of sources) of every train shard and holdout."""
    train = sources_of(index["provenance"]["sources"])
    holdouts = [(e, sources_of(e["provenance"]["sources"])) for e in index["val"].values()]
    return [(e, train) for e in index["shards"]] + holdouts


def test_the_parquet_readers_checksums_are_the_texts_crc32():
    """The CRC-32s a parquet reader takes from Arrow's buffer (sparing an encode per document) are text_crc32's of
    the texts: non-ASCII, empty, a slice of a batch, large_string, string_view (a file written from one reads
    back as one) and a dictionary-decoded column alike."""
    texts = ["", "plain", "Grüße — 東京 👨‍👩‍👧", "x" * 70_000 + "é", "", "last"]
    for column in (pa.array(texts), pa.array(texts, pa.large_string()), pa.array(texts, pa.string_view()),
                   pa.array(texts).dictionary_encode().dictionary_decode()):
        for piece in (column, column.slice(2, 3), column.slice(5)):
            assert utf8_crc32s(piece) == text_crc32(piece.to_pylist()).tolist()
            assert utf8_crc32s(piece) == [zlib.crc32(t.encode("utf-8")) for t in piece.to_pylist()]


def test_the_crc32_is_zlibs_whichever_library_computes_it():
    """The .src and .docs CRC-32s are zlib's (what a reader without tokmix checks a document by), whether ISA-L's
    crc32 (isal, a dependency where its wheels exist) or zlib's computes them: every length around its vector
    widths, at every alignment of the buffer, and a running value continued."""
    import isal.isal_zlib

    from tokmix import provenance

    assert provenance.crc32 is isal.isal_zlib.crc32  # a dependency here: the fast path is the one tested (tokmix.text)
    data = np.random.default_rng(29).integers(0, 256, 70_000, dtype=np.uint8).tobytes()
    view = memoryview(data)
    for start in range(0, 65):
        for size in (0, 1, 7, 15, 16, 31, 63, 64, 65, 255, 256, 1023, 4097, 65_536):
            part = view[start:start + size]
            assert provenance.crc32(part) == zlib.crc32(part)
    assert provenance.crc32(view[100:], provenance.crc32(view[:100])) == zlib.crc32(data)


def test_a_units_places_are_taken_in_order_past_the_trim_of_what_was_taken():
    """Places(kept=True) as the streams stage reads a unit of more documents than it keeps before it trims what
    was taken (16,384): batches and single documents of three pieces, some empty, taken in batches of other sizes
    while reading goes on; every non-empty document's (piece, place, CRC-32 or -1), in order."""
    from tokmix.sources.pieces import Places

    rng = np.random.default_rng(27)
    places, expected, got = Places(checksums=True, kept=True), [], []
    for piece in range(3):
        places.piece, place = piece, 0
        for _ in range(40):
            n = int(rng.integers(1, 1500))
            empty, crcs = rng.random(n) < 0.1, rng.integers(0, 1 << 32, n).tolist()
            places.add(place, n, crcs, empty=empty)  # a parquet batch
            expected += [(piece, place + i, crcs[i]) for i in range(n) if not empty[i]]
            place += n
            for _ in range(5):  # JSONL lines
                gone = bool(rng.random() < 0.3)
                places.add(place, empty=gone)
                expected += [] if gone else [(piece, place, -1)]
                place += 1
            take = min(int(rng.integers(1, 2500)), len(expected) - len(got))
            got += [tuple(row) for row in places.take_kept(take).tolist()]
    got += [tuple(row) for row in places.take_kept(len(expected) - len(got)).tolist()]
    assert len(expected) > 3 * (1 << 14) and got == expected


def test_every_document_of_every_shard_and_holdout_is_its_source_text_at_its_tokens(mixed_run):
    index = json.loads((mixed_run / "index.json").read_text())
    tokenizer = Tokenizer.from_file(index["tokenizer"])
    tokenizer.encode_special_tokens = True  # a literal "<|endoftext|>" in a document is text
    delimiters = Delimiters.from_index(Index.from_json(index))
    seen = {"dropped": sum(index["decontamination"]["dropped_by_stream"].values()), "passes": set(), "jsonl": 0}
    for entry, sources in token_files(index):
        docs = file_documents(mixed_run, entry_of(entry), sources)
        tokens = np.fromfile(mixed_run / entry["file"], dtype=index["dtype"])
        assert (mixed_run / entry["provenance"]["file"]).stat().st_size == DOC_DTYPE.itemsize * len(docs.records)
        for i, record in enumerate(docs.records):
            source = sources[int(record["source"])]
            text = source_text(source.kind, source.file, int(record["place"]))
            assert zlib.crc32(text.encode("utf-8")) == int(record["crc32"]), (source, int(record["place"]))
            whole = framed(tokenizer, delimiters, text)[docs.skip if i == 0 else 0 :]
            start, end = int(docs.starts[i]), int(docs.ends[i])
            assert tokens[start:end].tolist() == whole[: end - start], (entry["file"], i, source)
            assert end - start == len(whole) or i in (0, len(docs.records) - 1)  # only the ends are cut
            seen["passes"].add(source.pass_no)
            if source.kind == "jsonl":  # a line past its file's first unit, after blank lines
                before = Path(source.file).read_bytes().split(b"\n")[: int(record["place"])]
                seen["jsonl"] += sum(map(len, before)) > UNIT_BYTES and any(not b.strip() for b in before)
    assert seen["dropped"] == 2 and seen["passes"] == {1, 2, 3} and seen["jsonl"]


def test_the_index_is_committed_with_its_checksum_and_the_units_hold_places(mixed_run):
    index = json.loads((mixed_run / "index.json").read_text())
    for entry, _ in token_files(index):
        docs = entry["provenance"]
        assert hashlib.sha256((mixed_run / docs["file"]).read_bytes()).hexdigest() == docs["checksum"]
    assert index["provenance"]["record"] == [["source", "<u4"], ["place", "<u4"], ["tokens", "<u4"],
                                             ["crc32", "<u4"]]
    assert sorted(mixed_run.glob("streams/*/units/*.src"))


def test_provenance_off_writes_no_index_and_the_same_token_files(mixed_run, tmp_path):
    recipe = mixed_run.parent / "recipe.toml"
    off = recipe.with_name("recipe-off.toml")
    off.write_text(recipe.read_text().replace("[layout]", "[layout]\nprovenance = false"))
    out = tmp_path / "out"
    tokmix.run(tokmix.load_recipe(off), out, workers=1, keep_streams=True, unit_bytes=UNIT_BYTES)
    assert {p.name: p.read_bytes() for p in out.glob("*.bin")} == \
           {p.name: p.read_bytes() for p in mixed_run.glob("*.bin")}
    assert not list(out.glob("*.docs")) and not list(out.glob("streams/*/units/*.src"))
    index = json.loads((out / "index.json").read_text())
    assert "provenance" not in index
    assert not [e for e in [*index["shards"], *index["val"].values()] if "provenance" in e]


# ---------------------------------------------------------------------------- tokmix trace
def tokmix_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command as a user runs it, in `cwd` (source paths under it are shown relative to it)."""
    return subprocess.run([sys.executable, "-m", "tokmix.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_random_blocks_are_their_traced_documents_read_again_from_the_sources(mixed_run):
    """Every token of a block is its traced documents' tokens: each text read again by trace from its source,
    checked against its CRC-32, framed by the delimiters, cut where the block cuts it."""
    index = json.loads((mixed_run / "index.json").read_text())
    tokenizer = Tokenizer.from_file(index["tokenizer"])
    tokenizer.encode_special_tokens = True
    delimiters, loader = Delimiters.from_index(Index.from_json(index)), TrainBlocks(mixed_run)
    blocks = sorted(np.random.default_rng(7).choice(loader.blocks, 12, replace=False).tolist())
    for block in trace_blocks(mixed_run, [*blocks, loader.blocks - 1], text=True):
        got = loader.block(block.block).tolist()
        assert [d.start for d in block.documents] == np.cumsum([0] + [d.tokens for d in block.documents])[:-1].tolist()
        rebuilt = []
        for doc in block.documents:
            assert doc.text_ok and doc.text == source_text(doc.kind, doc.file, doc.place)
            ids = framed(tokenizer, delimiters, doc.text)
            rebuilt += ids[doc.offset : doc.offset + doc.tokens]
            if doc.offset == 0 and doc.tokens == len(ids):  # whole in the block: decoded, it is its text
                piece = tokenizer.decode(got[doc.start : doc.start + doc.tokens], skip_special_tokens=False)
                assert piece == "<|endoftext|>" + doc.text
        assert rebuilt == got, block.block


def test_trace_step_gives_the_blocks_of_that_rank_and_step_as_the_loader_does(mixed_run):
    for rank in range(2):
        proc = tokmix_cli("trace", str(mixed_run), "--step", "5", "--rank", str(rank), "--world-size", "2", "--json")
        assert proc.returncode == 0, proc.stderr
        traced = json.loads(proc.stdout)
        x, _ = TrainBlocks(mixed_run, rank, 2).batch(5)
        assert len(traced) == len(x)
        for row, block in zip(x, traced):
            shard = np.fromfile(mixed_run / block["file"], dtype=np.uint16)
            assert shard[block["first_token"] : block["first_token"] + 64].tolist() == row.tolist()
            assert sum(d["tokens"] for d in block["documents"]) == 65
    table = tokmix_cli("trace", str(mixed_run), "--step", "5", cwd=mixed_run.parent)
    assert table.returncode == 0 and "document tokens" in table.stdout
    assert "corpus/dclm/part-0.parquet:row" in table.stdout  # paths under the working directory: relative


def test_trace_token_marks_the_document_that_holds_it(mixed_run):
    loader = TrainBlocks(mixed_run)
    shard1 = int(loader.first_block[1]) * 64  # the first token of shard 1: the overlap token, shard 0's last
    for token in (0, shard1, shard1 + 1, loader.blocks * 64):
        block, at = token_block(mixed_run, token)
        traced = trace_blocks(mixed_run, [block])[0]
        holder = [d for d in traced.documents if d.start <= at < d.start + d.tokens]
        assert len(holder) == 1
        stream = np.concatenate([np.fromfile(p, np.uint16)[k > 0 :] for k, p in enumerate(loader.files)])
        assert loader.block(block)[at] == stream[token]
    proc = tokmix_cli("trace", str(mixed_run), "--token", str(shard1))
    assert proc.returncode == 0 and "▶" in proc.stdout
    assert "does not exist" in tokmix_cli("trace", str(mixed_run), "--token", str(10**9)).stderr


def test_trace_text_names_a_document_whose_source_changed(mixed_run, tmp_path):
    """--text reads through --mirror (here: a copy of the corpus in which one JSONL line was edited): the
    edited document is shown CHANGED, the others ok."""
    corpus = mixed_run.parent / "corpus"
    copy = tmp_path / "corpus"
    shutil.copytree(corpus, copy)
    docs = trace_blocks(mixed_run, range(TrainBlocks(mixed_run).blocks))
    edu = next(d for b in docs for d in b.documents if d.kind == "jsonl" and d.place > 0)
    path = copy / Path(edu.file).relative_to(corpus)
    lines = path.read_bytes().split(b"\n")
    record = json.loads(lines[edu.place])
    record["text"] = record["text"].replace("e", "E", 1)
    lines[edu.place] = json.dumps(record).encode()
    path.write_bytes(b"\n".join(lines))
    block = next(b for b in docs if edu in b.documents)
    proc = tokmix_cli("trace", str(mixed_run), "--shard", str(block.shard), "--block", str(block.block_in_shard),
                      "--text", "--mirror", f"{corpus}={copy}", cwd=mixed_run.parent)
    assert proc.returncode == 0, proc.stderr
    assert "CHANGED" in proc.stdout and f"line {edu.place + 1}" in proc.stdout
    assert proc.stdout.count("ok ") == len(block.documents) - 1


# ---------------------------------------------------------------------------- boundaries for training
def test_document_segments_from_the_index_are_where_the_delimiters_are(mixed_run):
    """Every step, both ranks: each row's segment starts from the index are 0 and the rows' document-start
    delimiters (the default doc_prefix, <|endoftext|>); cu_seqlens and position ids follow from them."""
    loader = TrainBlocks(mixed_run, 1, 2)
    delimiters = Delimiters.from_index(loader.index)
    for step in range(loader.physical_steps):
        x, _ = loader.batch(step)
        segments = loader.segments(step)
        for row, starts in zip(x, segments.starts):
            assert starts.tolist() == sorted({0, *delimiters.starts(row, None).tolist()})
        bounds = [r * 64 + s for r, starts in enumerate(segments.starts) for s in starts.tolist()]
        assert segments.cu_seqlens.dtype == np.int32
        assert segments.cu_seqlens.tolist() == [*bounds, len(x) * 64]
        assert segments.max_seqlen == int(np.diff(segments.cu_seqlens).max())
        flat = segments.position_ids.reshape(-1)
        assert flat[bounds].tolist() == [0] * len(bounds)
        assert all(flat[i] == flat[i - 1] + 1 for i in range(1, len(flat)) if i not in set(bounds))
    assert any(len(s) > 1 for step in range(loader.physical_steps) for s in loader.segments(step).starts)


# ---------------------------------------------------------------------------- the Megatron export
def test_the_megatron_export_has_one_sequence_per_source_document(mixed_run, tmp_path):
    """Read back by the test's own .idx reader: each sequence is one document of the index, the whole of its
    source text framed by the delimiters (the run's last cut where the blocks end), across shard boundaries too."""
    from tests.test_export import read_megatron
    from tokmix.export import export_megatron, train_stream

    index = json.loads((mixed_run / "index.json").read_text())
    tokenizer = Tokenizer.from_file(index["tokenizer"])
    tokenizer.encode_special_tokens = True
    delimiters = Delimiters.from_index(Index.from_json(index))
    export_megatron(mixed_run, tmp_path / "gptu")
    _, doc_index, sequences = read_megatron(tmp_path / "gptu")
    assert doc_index.tolist() == list(range(len(sequences) + 1))
    stream = np.concatenate(list(train_stream(TrainBlocks(mixed_run))))
    assert np.array_equal(np.concatenate(sequences), stream)
    sources = sources_of(index["provenance"]["sources"])
    origins = []  # each document of the train stream once: a shard's first continues the previous shard's last
    for k, entry in enumerate(index["shards"]):
        records = file_documents(mixed_run, entry_of(entry), sources).records
        origins += [(int(r["source"]), int(r["place"])) for r in records[1 if k else 0 :]]
    assert len(origins) == len(sequences)
    for n, ((source, place), sequence) in enumerate(zip(origins, sequences)):
        s = sources[source]
        whole = framed(tokenizer, delimiters, source_text(s.kind, s.file, place))
        assert sequence.tolist() == (whole if n < len(sequences) - 1 else whole[: len(sequence)])
    for domain, entry in index["val"].items():
        _, _, held = read_megatron(tmp_path / f"gptu_val_{domain}")
        assert [len(d) for d in held] == file_documents(mixed_run, entry_of(entry), []).records["tokens"].tolist()


def test_a_damaged_index_is_refused_by_the_export_trace_and_the_loader(mixed_run, tmp_path):
    """One token moved from a document to the next keeps the index's total: its checksum names it."""
    from tokmix.export import export_megatron

    out = tmp_path / "out"
    shutil.copytree(mixed_run, out, ignore=shutil.ignore_patterns("streams"))
    records = np.fromfile(out / "train_001.docs", DOC_DTYPE)
    records["tokens"][3] += 1
    records["tokens"][4] -= 1
    records.tofile(out / "train_001.docs")
    damaged = f"{out / 'train_001.docs'}: damaged (sha256 differs from index.json)"
    with pytest.raises(tokmix.TokmixError, match=re.escape(damaged)):
        export_megatron(out, tmp_path / "gptu")
    with pytest.raises(tokmix.TokmixError, match=re.escape(damaged)):
        trace_blocks(out, [TrainBlocks(out).first_block[1]])
    with pytest.raises(tokmix.TokmixError, match=re.escape(damaged)):
        TrainBlocks(out).block_starts(int(TrainBlocks(out).first_block[1]))
    assert not list(tmp_path.glob("gptu*"))


# ---------------------------------------------------------------------------- report and inspect
def documents_in(out: Path, index: dict, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Shard k's records and each one's first token, read here with numpy alone."""
    records = np.fromfile(out / index["shards"][k]["provenance"]["file"], DOC_DTYPE)
    return records, np.cumsum(records["tokens"].astype(np.int64)) - records["tokens"]


def test_inspect_shows_a_blocks_documents_with_their_sources(mixed_run):
    index = json.loads((mixed_run / "index.json").read_text())
    records, starts = documents_in(mixed_run, index, 2)
    block = int(starts[len(starts) // 2]) // 64  # a block where a document starts
    proc = tokmix_cli("inspect", str(mixed_run), "--shard", "2", "--block", str(block), cwd=mixed_run.parent)
    assert proc.returncode == 0, proc.stderr
    lo, hi = block * 64, block * 64 + 65
    for record, start in zip(records, starts):
        if start < hi and start + int(record["tokens"]) > lo:
            stream, _, kind, file = index["provenance"]["sources"][int(record["source"])]
            place = int(record["place"]) + (kind == "jsonl")
            where = f"{Path(file).relative_to(mixed_run.parent)}:{'row' if kind == 'parquet' else 'line'} {place}"
            assert where in proc.stdout


def test_a_finished_runs_damaged_index_is_remade_with_its_shard_by_the_same_command(mixed_run, tmp_path):
    """A second `tokmix run` over a finished run checks every file against index.json: a .docs file changed
    since is remade (with its shard), and the run ends as it was."""
    out = tmp_path / "out"
    shutil.copytree(mixed_run, out)
    want = {p.name: p.read_bytes() for p in [*mixed_run.glob("*.bin"), *mixed_run.glob("*.docs")]}
    records = np.fromfile(out / "train_002.docs", DOC_DTYPE)
    records["crc32"][0] ^= 1
    records.tofile(out / "train_002.docs")
    (out / "val_edu.docs").unlink()
    proc = tokmix_cli("run", str(mixed_run.parent / "recipe.toml"), "--out", str(out), "--workers", "2",
                      "--keep-streams")
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    assert "train_002.docs: missing or damaged (sha256 differs from index.json); remaking it" in said
    assert "val_edu.docs: missing or damaged" in said
    assert {p.name: p.read_bytes() for p in [*out.glob("*.bin"), *out.glob("*.docs")]} == want
