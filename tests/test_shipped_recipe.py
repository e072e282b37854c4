"""recipes/gpt-u-20m.toml as shipped: it parses, names no file outside the repository, trains its tokenizer
on its train split, and plans through --mirror on local copies laid out as its Hub datasets are."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from tests.reference import GOLDEN, REPO
from tokmix.cli import app
from tokmix.recipe import load_recipe

RECIPE = REPO / "recipes" / "gpt-u-20m.toml"
# each Hub dataset of the recipe: (its prefix, the folders its globs reach, the text column, golden texts)
DATASETS = {
    "dclm": ("hf://datasets/mlfoundations/dclm-baseline-1.0-parquet",
             ["filtered/OH_eli5/global-shard_01_of_10/local-shard_0_of_10"], "text", "dclm"),
    "edu": ("hf://datasets/HuggingFaceFW/fineweb-edu", ["sample/10BT"], "text", "edu"),
    "star": ("hf://datasets/bigcode/starcoderdata", ["python", "c", "cpp", "java", "javascript"], "content",
             "code_other"),
}


def golden_texts(stream: str) -> list[str]:
    lines = b"".join(p.read_bytes() for p in sorted((GOLDEN / "corpus" / stream).glob("*.jsonl"))).split(b"\n")
    return [json.loads(line)["text"] for line in lines if line.strip()]


def test_the_shipped_recipe_trains_its_tokenizer_and_names_nothing_outside_the_repository():
    recipe = load_recipe(RECIPE)
    assert recipe.tokenizer.path is None and recipe.tokenizer.train.vocab_size == 32000
    assert Path(recipe.splits_path).resolve().parent == RECIPE.parent
    assert all(f.startswith("hf://datasets/") for s in recipe.streams.values() for f in s.files)


def test_the_shipped_recipe_plans_through_mirrors(tmp_path):
    mirrors = []
    for name, (prefix, folders, column, stream) in DATASETS.items():
        for folder in folders:
            place = tmp_path / name / folder
            place.mkdir(parents=True)
            texts = golden_texts(stream)
            for k in range(2):  # one holdout file, one train file per glob
                pq.write_table(pa.table({column: texts[k::2]}), place / f"part-{k}.parquet")
        mirrors += ["--mirror", f"{prefix}={tmp_path / name}"]
    result = CliRunner().invoke(app, ["plan", str(RECIPE), "--out", str(tmp_path / "out"), *mirrors],
                                env={"COLUMNS": "200"})
    # a few KB of text cannot fill 2.68B tokens: the plan says so (exit 1), stream by stream
    assert result.exit_code == 1, result.output
    assert "tokenizer  trained by the run (vocab 32,000)" in result.stdout
    for stream in ("dclm", "edu", "code_py", "code_other"):
        assert f"problem: stream {stream} is likely to run short" in result.stdout
    assert not (RECIPE.parent / "gpt-u-20m-splits.json").exists()  # a plan writes nothing


def test_the_local_recipe_in_the_readme_finds_its_files(tmp_path):
    """recipes/local.toml (the README's recipe to copy) beside parquet and .jsonl.zst files at its globs."""
    import zstandard

    shutil.copy(REPO / "recipes" / "local.toml", tmp_path / "my-recipe.toml")
    (tmp_path / "data" / "web").mkdir(parents=True)
    texts = golden_texts("dclm")
    for k in range(3):
        pq.write_table(pa.table({"text": texts[k::3]}), tmp_path / "data" / "web" / f"part-{k}.parquet")
    for k, lang in enumerate(["python", "c"]):
        (tmp_path / "data" / "code" / lang).mkdir(parents=True)
        lines = "".join(json.dumps({"content": t}) + "\n" for t in golden_texts("code_other")[k::2])
        (tmp_path / "data" / "code" / lang / "part.jsonl.zst").write_bytes(zstandard.compress(lines.encode()))
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "my-recipe.toml"), "--out", str(tmp_path / "out")],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output  # a few KB for 668M tokens: short, and it says so
    assert "tokenizer  trained by the run (vocab 32,000)" in result.stdout
    assert "problem: stream web is likely to run short: its 2 train file(s)" in result.stdout
    assert "problem: stream code is likely to run short: its 1 train file(s)" in result.stdout


def test_the_shipped_recipe_without_the_hub_is_one_line_naming_the_url_and_mirror(tmp_path):
    """No Hub to reach (a closed port on this machine stands for a machine without network)."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1"}
    proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "plan", str(RECIPE), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "hf://datasets/" in proc.stderr and "--mirror hf://datasets/" in proc.stderr, proc.stderr
