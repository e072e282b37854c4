"""A document too large to encode whole is cut where a word ends and whitespace starts and encoded piece by
piece; its ids must equal encoding it whole (checked against HF, the oracle), and a run writes them."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import tokmix
from tests.corpus import make_corpus, train_test_tokenizer, write_recipe, write_split
from tokmix.backends import can_cut_documents, make_encoder
from tokmix.text import document_pieces

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tok")
    files = make_corpus(root, doc_limit=300)
    return train_test_tokenizer(files, root / "tokenizer.json", vocab=1000)


TEXTS = {
    "code": "".join(p.read_text(errors="replace") for p in sorted(STDLIB.glob("*.py"))[:12]),
    "one long word then space": "x" * 30_000 + " " + "y" * 10,
    "leading whitespace run": " " * 30_000 + "a b",
    "separators Python calls space": "!\x1c" * 10_000 + " end",
    "ideographic spaces": "word\u3000" * 6_000,
    "CRLF and tabs": "line\t\tvalue\r\n" * 3_000,
    "non-Latin": "Привет мир, 東京 タワー, مرحبا بالعالم " * 800,
}


@pytest.mark.parametrize("name", list(TEXTS))
def test_pieces_give_the_ids_of_the_whole_document(tokenizer, name):
    text = TEXTS[name]
    pieces = list(document_pieces(text, 4_000))
    assert "".join(pieces) == text
    hf = make_encoder(tokenizer, "hf")
    whole, _ = hf.encode_batch([text])
    ids, _ = hf.encode_batch(pieces)
    assert np.array_equal(ids, whole)
    if name == "code":
        assert len(pieces) > 10


def test_only_tokenizers_whose_regex_splits_there_are_cut(tokenizer, tmp_path):
    assert can_cut_documents(tokenizer)
    spec = json.loads(tokenizer.read_text())
    spec["normalizer"] = {"type": "NFKC"}
    (tmp_path / "nfkc.json").write_text(json.dumps(spec))
    assert not can_cut_documents(tmp_path / "nfkc.json")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_run_with_a_20_mb_document_writes_its_whole_encoding(tmp_path, fmt):
    """A 20 MB document with an emoji (a 80 MB Python string, were it one) among small ones: as a parquet
    value, and as a JSONL line whose text is decoded in pieces (escapes, quotes and non-ASCII included)."""
    files = make_corpus(tmp_path)
    tok = train_test_tokenizer(files, tmp_path / "tokenizer" / "tokenizer.json")
    huge = (TEXTS["code"] * 25)[: (20 << 20) - 40] + ' "quoted" \\ tab\t 😀 ünï'
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = files["edu"][0]
    texts = pq.read_table(path)["text"].to_pylist()
    texts = texts[:3] + [huge] + texts[3:]
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), path, row_group_size=64)
    else:
        path.unlink()
        files["edu"][0] = path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    write_split(tmp_path, files)
    recipe = write_recipe(tmp_path, "tokenizer/tokenizer.json", blocks=800)
    if fmt == "jsonl":
        recipe.write_text(recipe.read_text().replace('"corpus/edu/*.parquet"', '"corpus/edu/*.*"'))
    tokmix.run(tokmix.load_recipe(recipe), tmp_path / "out", workers=1, keep_streams=True)
    units = sorted((tmp_path / "out/streams/edu/units").glob("*.tok"))
    tokens = np.concatenate([np.fromfile(u, dtype=np.uint16) for u in units])
    fast = make_encoder(tok, "fastokens")  # id-identical to HF (tests/test_backends.py); HF takes minutes here
    want, _ = fast.encode_batch([huge])
    starts = np.flatnonzero(tokens == 0)
    lengths = np.diff(np.append(starts, len(tokens)))
    (at,) = np.flatnonzero(lengths == len(want) + 1)  # exactly one document has the huge one's length
    assert np.array_equal(tokens[starts[at] + 1 : starts[at] + lengths[at]], want.astype(np.uint16))


def test_a_unit_too_large_for_a_workers_share_of_the_budget_runs_alone(tmp_path, capfd):
    """With 2 workers and --max-memory 640 MiB a worker's share is 192 MiB: a 110 MB document (a text file, a
    unit of its own) may peak at twice its bytes, so it is sent only once the units in flight are done, and none
    after it until it is (said once in the log). The run's bytes are those of one worker."""
    files = make_corpus(tmp_path)
    train_test_tokenizer(files, tmp_path / "tokenizer" / "tokenizer.json")
    path = tmp_path / "corpus" / "edu" / "part-0.txt"
    path.write_text((TEXTS["code"] * ((110 << 20) // len(TEXTS["code"]) + 1))[: 110 << 20])
    files["edu"].insert(0, path)
    write_split(tmp_path, files)
    recipe = write_recipe(tmp_path, "tokenizer/tokenizer.json", blocks=800)
    recipe.write_text(recipe.read_text().replace('"corpus/edu/*.parquet"', '"corpus/edu/*.*"'))
    tokmix.run(tokmix.load_recipe(recipe), tmp_path / "two", workers=2, max_memory=640 << 20)
    log = capfd.readouterr().out
    assert log.count("runs alone") == 1
    assert "edu: unit 000000 (one read of 110 MiB) runs alone: over a worker's share of --max-memory (192 MiB)" in log
    tokmix.run(tokmix.load_recipe(recipe), tmp_path / "one", workers=1, max_memory=640 << 20)
    assert "runs alone" not in capfd.readouterr().out  # one worker: nothing to hold back
    for shard in sorted((tmp_path / "one").glob("train_*.bin")):
        assert (tmp_path / "two" / shard.name).read_bytes() == shard.read_bytes()
