"""A holdout's `bytes` and `eval_bytes` are the UTF-8 size of the text its targets spell (docs/training.md, bits per
byte), also for a SentencePiece model, whose pieces do not spell the text byte for byte (the "▁" before each
document, whitespace its normalizer removes). Checked against an independent count: every holdout document read
again from its source file by the holdout's provenance index, a whole document counted as its text's UTF-8 size,
a document cut by either end of the targets as its pieces' bytes by sentencepiece itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import sentencepiece

from tests.test_tokenizer_edge_cases import corpus, run_of  # noqa: F401 - the module's corpus fixture
from tokmix.provenance import DOC_DTYPE
from tokmix.tokens import read_tokens


def piece_bytes(sp: sentencepiece.SentencePieceProcessor, ids: np.ndarray) -> int:
    """The bytes sentencepiece's pieces hold: a byte piece one, a control or unknown piece none, a piece its text
    with "▁" read as a space."""
    total = 0
    for i in ids.tolist():
        if sp.is_byte(i):
            total += 1
        elif not (sp.is_control(i) or sp.is_unknown(i)):
            total += len(sp.id_to_piece(i).replace("\u2581", " ").encode())
    return total


def expected_bytes(root: Path, out: Path, entry: dict, sp, prefix: int, count: int) -> int:
    """The UTF-8 size of what the holdout's targets [0, count) spell, from its documents' source texts."""
    tokens = read_tokens(out / entry["file"], "uint16")
    records = np.frombuffer((out / entry["provenance"]["file"]).read_bytes(), DOC_DTYPE)
    sources = entry["provenance"]["sources"]
    lo, hi, start, total = 1, count + 1, 0, 0
    for record in records:
        text = pq.read_table(root / sources[record["source"]][3])["text"][int(record["place"])].as_py()
        ids = sp.encode(text)
        first, end = start + prefix, start + prefix + len(ids)
        assert tokens[first:min(end, len(tokens))].tolist() == ids[: max(0, min(end, len(tokens)) - first)]
        if lo <= first and end <= hi:
            total += len(text.encode())
        elif first < hi and end > lo:
            total += piece_bytes(sp, tokens[max(first, lo):min(end, hi)])
        start += int(record["tokens"])
    assert start == len(tokens)
    return total


@pytest.mark.parametrize("lines, prefix", [(['doc_prefix = "<s>"'], 1),
                                           (["doc_prefix = []", 'doc_suffix = "</s>"'], 0)], ids=["prefix", "suffix"])
def test_sentencepiece_holdout_bytes_are_the_texts_utf8_size(corpus, tmp_path, lines, prefix):  # noqa: F811
    model = corpus / "mistral.model"
    index = run_of(corpus, tmp_path / "run", "mistral", [f'sentencepiece = "{model}"', *lines])
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    for domain, entry in index["val"].items():
        out = tmp_path / "run"
        want = expected_bytes(corpus, out, entry, sp, prefix, entry["targets"])
        eval_want = expected_bytes(corpus, out, entry, sp, prefix, entry["eval_targets"])
        assert (entry["bytes"], entry["eval_bytes"]) == (want, eval_want), domain
        # the pieces' own count differs from the text's: one "▁" byte for each document the targets hold whole
        assert entry["bytes"] < piece_bytes(sp, read_tokens(out / entry["file"], "uint16")[1:]), domain
    assert json.loads((tmp_path / "run" / "index.json").read_text())["val"] == index["val"]
