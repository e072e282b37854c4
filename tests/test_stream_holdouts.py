"""Holdouts chosen per stream in the recipe (`[streams.X] holdout_files = [...]`, a count, or
`holdout_fraction`) beside [holdout] holdout_files; the split file is written once from them and is then
authoritative. And `tokmix plan` shows what each stream gives its domain's holdout exactly as the run draws
it (the demo's code holdout: one code_py document, code_c nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tokmix
from tests.corpus import make_corpus, train_test_tokenizer, write_recipe
from tokmix import TokmixError
from tokmix.plan import make_plan
from tokmix.sources import create_split, load_or_create_split

PER_STREAM = {
    "dclm": 'holdout_files = ["corpus/dclm/part-1.parquet"]',  # by name, not the last file
    "edu": "holdout_fraction = 0.5",  # 4 files: the last 2
    "code_py": "holdout_files = 2",
    "code_other": "",  # [holdout] holdout_files (1): the last file
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stream_holdouts")
    files = make_corpus(root, doc_limit=300, rows_per_group=16)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    return root


def recipe_with(root: Path, per_stream: dict[str, str], name: str = "recipe.toml", splits: str = "split.json"):
    """tests.corpus's recipe with per-stream holdout keys and its own split file (not written yet)."""
    text = write_recipe(root, "tokenizer/tokenizer.json").read_text()
    text = text.replace('splits = "data/file_splits.json"', f'splits = "{splits}"')
    for stream, line in per_stream.items():
        text = text.replace(f'files = ["corpus/{stream}/*.parquet"]', f'files = ["corpus/{stream}/*.parquet"]\n{line}')
    path = root / name
    path.write_text(text)
    return tokmix.load_recipe(path)


def parts(entries: list[str], stream: str) -> list[str]:
    return [Path(e).name for e in entries if f"/{stream}/" in e]


def test_each_stream_holds_out_what_its_table_says(corpus):
    split = create_split(recipe_with(corpus, PER_STREAM), [])
    held = {s: parts(split[d]["holdout"], s) for s, d in
            [("dclm", "dclm"), ("edu", "edu"), ("code_py", "code"), ("code_other", "code")]}
    assert held == {"dclm": ["part-1.parquet"], "edu": ["part-2.parquet", "part-3.parquet"],
                    "code_py": ["part-2.parquet", "part-3.parquet"], "code_other": ["part-3.parquet"]}
    assert parts(split["dclm"]["train"], "dclm") == ["part-0.parquet", "part-2.parquet", "part-3.parquet"]
    assert parts(split["code"]["train"], "code_py") == ["part-0.parquet", "part-1.parquet"]


@pytest.mark.parametrize("line, message", [
    ('holdout_files = ["corpus/dclm/nope-*.parquet"]',
     r"stream dclm: holdout_files entry 'corpus/dclm/nope-\*.parquet' matches none of the stream's 4 file\(s\)"),
    ('holdout_files = ["corpus/dclm/*.parquet"]',
     r"stream dclm: 4 file\(s\) match .* holds out 4: keep at least one to train on"),
    ("holdout_files = 4", r"stream dclm: 4 file\(s\) match .* and holdout_files=4 holds out 4"),
    ("holdout_fraction = 0.9", r"stream dclm: .* and holdout_fraction=0.9 holds out 4"),
])
def test_a_holdout_rule_that_cannot_be_met_names_the_stream(corpus, line, message):
    with pytest.raises(TokmixError, match=message):
        create_split(recipe_with(corpus, {"dclm": line}), [])


@pytest.mark.parametrize("line, message", [
    ("holdout_files = 1\nholdout_fraction = 0.5", "streams.dclm: give holdout_files or holdout_fraction, not both"),
    ("holdout_fraction = 1.0", "streams.dclm.holdout_fraction: Input should be less than 1"),
    ("holdout_files = 0", "streams.dclm: holdout_files must be at least 1, got 0"),
    ("holdout_files = []", "streams.dclm: holdout_files: name at least one file"),
])
def test_bad_holdout_keys_are_one_line_recipe_errors(corpus, line, message):
    with pytest.raises(TokmixError, match=message):
        recipe_with(corpus, {"dclm": line}, name="bad.toml")


def test_the_split_file_is_written_once_then_authoritative(corpus, tmp_path):
    recipe = recipe_with(corpus, PER_STREAM, splits="once.json")
    first = load_or_create_split(recipe, [])
    written = (corpus / "once.json").read_bytes()
    changed = recipe_with(corpus, {"dclm": "holdout_files = 2"}, name="changed.toml", splits="once.json")
    assert load_or_create_split(changed, []) == first and (corpus / "once.json").read_bytes() == written
    plan = make_plan(changed, out=tmp_path)
    assert "exists; used as is" in plan.split_note
    assert "stream dclm: the recipe would hold out part-2.parquet, part-3.parquet" in plan.split_note


def test_a_run_trains_on_none_of_the_files_held_out_per_stream(corpus, tmp_path):
    recipe = recipe_with(corpus, PER_STREAM, name="run.toml", splits="run_split.json")
    index = tokmix.run(recipe, tmp_path, workers=2)
    split = json.loads((corpus / "run_split.json").read_text())
    for domain, entry in index["val"].items():
        assert entry["source_files"] == split[domain]["holdout"]
    # the code holdout draws on both streams' held files, each read up to its share
    code = index["val"]["code"]["tokens_by_stream"]
    assert code["code_py"] > 0 and code["code_other"] > 0 and sum(code.values()) == 3001
    # plan foretold exactly what each stream gives
    plan = make_plan(recipe, out=tmp_path)
    assert {d: h.gives for d, h in plan.holdouts.items()} == {d: v["tokens_by_stream"] for d, v in index["val"].items()}


