"""Conformance beyond test_conformance.py's configurations: the reference script (run for real through
tests/reference.py) and tokmix on JSONL input, on a second seed, with a vocabulary past 65,536 ids (tokmix
writes uint32; the reference, uint16-only, writes the same ids narrower), and with decontamination on, where
tokmix's input holds a planted copy of a holdout document and the reference's input is the same corpus
without it: the files must be identical, the copy dropped and counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from tests.corpus import make_corpus, train_test_tokenizer, write_recipe, write_split
from tests.reference import REFERENCE, run_reference
from tokmix.recipe import load_recipe

pytestmark = pytest.mark.skipif(REFERENCE is None, reason="the reference script is not beside this clone")
ROOT = Path(__file__).resolve().parents[1]


def inputs(root: Path, seed: int = 1234, decontaminate: bool = False) -> Path:
    """A small parquet corpus, split file, tokenizer and recipe under root; returns the recipe."""
    files = make_corpus(root, doc_limit=400, rows_per_group=16)
    write_split(root, files)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    return write_recipe(root, "tokenizer/tokenizer.json", decontaminate=decontaminate, seed=seed)


def as_jsonl(root: Path) -> None:
    for path in root.glob("corpus/*/*.parquet"):
        rows = pq.read_table(path).to_pylist()
        path.with_suffix(".jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                              encoding="utf-8")
        path.unlink()
    for name in ("data/file_splits.json", "recipe.toml"):
        (root / name).write_text((root / name).read_text().replace(".parquet", ".jsonl"))


def read_jsonl(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def widen_vocabulary(root: Path) -> int:
    """70,000 added tokens after the trained ones (none occurs in the corpus): ids stay small, the vocabulary
    needs uint32."""
    path = root / "tokenizer" / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    tok.add_tokens([f"<|unused_{k}|>" for k in range(70_000)])
    tok.save(str(path))
    return tok.get_vocab_size()


def tokmix_run(recipe: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--workers",
                           "2"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "index.json").read_text())


def assert_same_files(ours: Path, reference: Path, dtype: str = "uint16") -> None:
    names = sorted(p.name for p in reference.glob("*.bin"))
    assert [n for n in names if n.startswith("train_")] and [n for n in names if n.startswith("val_")]
    assert sorted(p.name for p in ours.glob("*.bin")) == names
    for name in names:
        want = np.fromfile(reference / name, dtype=np.uint16).astype(dtype)
        assert (ours / name).read_bytes() == want.tobytes(), name


# Two configurations per reference run (a run of the reference is ~12 processes): what one varies is
# independent of the other, and every comparison the four single-change tests made is still made.
def test_a_second_seed_with_a_vocabulary_past_65536_ids_written_as_uint32(tmp_path):
    recipe = inputs(tmp_path, seed=987_654)
    vocab = widen_vocabulary(tmp_path)
    assert vocab > 65_536
    reference = run_reference(tmp_path, load_recipe(recipe))
    index = tokmix_run(recipe, tmp_path / "tokmix-out")
    assert index["seed"] == json.loads((reference / "index.json").read_text())["seed"] == 987_654
    assert (index["dtype"], index["vocab_size"]) == ("uint32", vocab)
    assert_same_files(tmp_path / "tokmix-out", reference, dtype="<u4")


def test_jsonl_input_with_decontamination_dropping_exactly_the_planted_copy(tmp_path):
    """JSONL input, and decontamination on: tokmix, over a corpus where a holdout document was copied into a
    train file, writes what the reference writes from the corpus without the copy."""
    reference_root, ours = tmp_path / "reference", tmp_path / "ours"
    recipe = inputs(reference_root)
    as_jsonl(reference_root)
    run_reference(reference_root, load_recipe(recipe))
    recipe = inputs(ours, decontaminate=True)
    as_jsonl(ours)
    held = next(t for t in read_jsonl(ours / "corpus/edu/part-3.jsonl") if len(t) > 40)
    train = ours / "corpus/edu/part-0.jsonl"
    planted = json.dumps({"id": -1, "text": held}, ensure_ascii=False) + "\n"
    train.write_text(planted + train.read_text(encoding="utf-8"), encoding="utf-8")
    index = tokmix_run(recipe, ours / "tokmix-out")
    assert index["decontamination"]["dropped_by_stream"] == {"dclm": 0, "edu": 1, "code_py": 0, "code_other": 0}
    assert_same_files(ours / "tokmix-out", reference_root / "data" / "tokens")
