"""Guarantee 1: from the same files, split, tokenizer, recipe numbers and seed, tokmix writes val_*.bin and
train_*.bin byte-identical to the reference script (shared/reference/prepare_tokens.py), checked two ways:

- golden, from the repository alone: tests/golden/ holds small JSONL inputs (cut once from CPython 3.11's
  stdlib docstrings, comments, functions and C headers, plus empty texts, a literal <|endoftext|>, non-ASCII
  text, odd whitespace and a document longer than a shard), a committed tokenizer, its split file and recipe,
  and in reference/ the sha256 of every file the reference wrote from them and its index.json. tokmix runs on
  them and must write the same bytes and numbers;
- live, where the reference script is present (CI lays shared/ beside the repository): the reference runs
  for real on the golden inputs and must still write exactly the recorded files (so the goldens cannot go
  stale: scripts/record_goldens.py records them again), and on a larger parquet corpus from this machine's
  Python beside tokmix, file by file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import make_corpus, train_test_tokenizer, write_recipe, write_split
from tests.reference import (
    GOLDEN,
    REFERENCE,
    assert_same_index_numbers,
    digests,
    run_reference,
    stable_json,
)
from tokmix.format.records import FORMAT_VERSION
from tokmix.recipe import load_recipe
from tokmix.shards import read_index

GOLDEN_DIGESTS = GOLDEN / "reference" / "sha256.json"
GOLDEN_INDEX = GOLDEN / "reference" / "index.json"
needs_reference = pytest.mark.skipif(
    REFERENCE is None, reason="the reference script is not beside this clone (CI lays ../shared/reference); "
                              "test_golden_* check the same claim against its recorded output")


def golden_inputs(root: Path) -> Path:
    """A copy of the golden inputs (the runs must not write into the repository); returns its recipe."""
    shutil.copytree(GOLDEN, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("reference"))
    return root / "recipe.toml"


def run_tokmix(recipe: Path, out: Path) -> Path:
    """The installed command, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out),
                           "--workers", "2"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


# ---------------------------------------------------------------------------- golden: the repository alone
@pytest.fixture(scope="module")
def golden_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("golden")
    return run_tokmix(golden_inputs(root), root / "tokmix-out")


def test_golden_shards_and_holdouts_are_the_references_bytes(golden_run):
    want = {name: digest for name, digest in json.loads(GOLDEN_DIGESTS.read_text()).items() if "/" not in name
            and name.endswith(".bin")}
    assert sorted(want) == ["train_000.bin", "train_001.bin", "train_002.bin", "train_003.bin", "val_code.bin",
                            "val_dclm.bin", "val_edu.bin"]
    got = {name: digest for name, digest in digests(golden_run).items() if name in want}
    assert got == want
    assert sorted(p.name for p in golden_run.glob("*.bin")) == sorted(want)


def test_golden_index_records_the_references_numbers(golden_run):
    reference = json.loads(GOLDEN_INDEX.read_text())
    assert_same_index_numbers(json.loads((golden_run / "index.json").read_text()), reference)


def test_golden_index_read_as_records_is_written_back_byte_for_byte(golden_run):
    """tokmix's own index.json, read through its typed records (tokmix.format.records) and written again, is the
    same bytes: every key is one the records know, in the order they write."""
    text = (golden_run / "index.json").read_text()
    index = read_index(golden_run)
    assert index.format_version == FORMAT_VERSION and not index.extra and not index.shards[0].extra
    assert json.dumps(index.to_json(), indent=2) == text


def test_golden_files_are_the_ones_recorded():
    """The recorded index is the recorded digest's index, and names the committed inputs."""
    recorded = json.loads(GOLDEN_DIGESTS.read_text())
    assert recorded["index.json"] == digests(GOLDEN / "reference")["index.json"]
    split = json.loads((GOLDEN / "data" / "file_splits.json").read_text())
    for files in split.values():
        assert all((GOLDEN / f).is_file() for f in files["train"] + files["holdout"])


# ---------------------------------------------------------------------------- live: the reference runs here
@needs_reference
def test_the_reference_still_writes_the_goldens(tmp_path):
    recipe = golden_inputs(tmp_path)
    out = run_reference(tmp_path, load_recipe(recipe))
    assert digests(out) == json.loads(GOLDEN_DIGESTS.read_text())
    assert stable_json(json.loads((out / "index.json").read_text())) == json.loads(GOLDEN_INDEX.read_text())


@pytest.fixture(scope="module")
def twin_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("conformance")
    files = make_corpus(root)
    write_split(root, files)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    recipe = write_recipe(root, "tokenizer/tokenizer.json", decontaminate=False)
    reference_out = run_reference(root, load_recipe(recipe))
    return reference_out, run_tokmix(recipe, root / "tokmix-out")


@needs_reference
def test_every_output_file_is_byte_identical_to_the_reference(twin_runs):
    reference_out, out = twin_runs
    names = sorted(p.name for p in reference_out.glob("*.bin"))
    assert [n for n in names if n.startswith("train_")] == ["train_000.bin", "train_001.bin", "train_002.bin",
                                                            "train_003.bin"]
    assert {"val_dclm.bin", "val_edu.bin", "val_code.bin"} <= set(names)
    assert sorted(p.name for p in out.glob("*.bin")) == names
    for name in names:
        assert (out / name).read_bytes() == (reference_out / name).read_bytes(), name


@needs_reference
def test_index_records_the_same_numbers_as_the_reference(twin_runs):
    reference, ours = (json.loads((d / "index.json").read_text()) for d in twin_runs)
    assert_same_index_numbers(ours, reference)
