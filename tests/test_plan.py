"""tokmix.plan on the demo corpus: the supply estimate against real token counts, the run-short and holdout
warnings against what a real run does, and a plan that writes nothing."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import pytest
from rich.console import Console

from tokmix import plan as plan_module
from tokmix.backends import choose_backend, make_encoder
from tokmix.demo import build_demo_corpus
from tokmix.errors import TokmixError
from tokmix.plan import make_plan, render_plan
from tokmix.recipe import load_recipe
from tokmix.runner import run
from tokmix.sources import iter_file_texts, load_or_create_split, stream_files
from tokmix.text import clean_surrogates
from tokmix.tokenizer import train_tokenizer

TRAINED = "[tokenizer.train]\nvocab_size = 4096\n"
TOKENIZER_TEXT_CHARS = 300_000  # per stream: enough for a 4096-id BPE in ~1.5 s


def recipe_variant(recipe: Path, name: str, replacements: dict[str, str]) -> Path:
    """A copy of the demo recipe beside it (relative paths keep working) with some lines replaced."""
    text = recipe.read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    path = recipe.with_name(name)
    path.write_text(text)
    return path


def train_demo_tokenizer(recipe_path: Path, dest: Path) -> Path:
    """A byte-level BPE like the demo run's, from the first train documents of each stream."""
    recipe = load_recipe(recipe_path)
    split = load_or_create_split(recipe, [])

    def texts():
        for name, spec in recipe.streams.items():
            reader = iter_file_texts(stream_files(recipe, split, name, "train"), spec.text_field, name, [])
            taken = 0
            for text in reader:
                if taken >= TOKENIZER_TEXT_CHARS:
                    break
                taken += len(text)
                yield text

    train_tokenizer(texts(), 4096, 2, dest)
    return dest


def real_train_tokens(recipe_path: Path, tokenizer: Path) -> dict[str, int]:
    """Every train document of every stream tokenized, EOT counted: what the estimate estimates. The fastest
    backend that reproduces HF's ids (checked by choose_backend) keeps this under a second."""
    recipe = load_recipe(recipe_path)
    split = load_or_create_split(recipe, [])
    encoder = make_encoder(tokenizer, choose_backend(tokenizer)[0])
    counts = {}
    for name, spec in recipe.streams.items():
        files = stream_files(recipe, split, name, "train")
        texts = [clean_surrogates(t) for t in iter_file_texts(files, spec.text_field, name, []) if t]
        _, lengths = encoder.encode_batch(texts)
        counts[name] = int(lengths.sum()) + len(texts)
    return counts


Demo = namedtuple("Demo", "root recipe trained tokenizer real")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Demo:
    root = tmp_path_factory.mktemp("plan")
    trained = build_demo_corpus(root / "corpus")
    tokenizer = train_demo_tokenizer(trained, root / "tokenizer.json")
    recipe = recipe_variant(trained, "given.toml", {TRAINED: f'[tokenizer]\npath = "{tokenizer}"\n'})
    return Demo(root, recipe, trained, tokenizer, real_train_tokens(recipe, tokenizer))


def test_supply_estimate_is_within_ten_percent_of_the_real_token_counts(demo):
    plan = make_plan(load_recipe(demo.recipe), out=demo.root / "out")
    assert plan.ok, plan.problems
    assert not plan.streams["code_py"].train.exact  # a real estimate: the sample did not read everything
    for name, real in demo.real.items():
        assert plan.streams[name].train.tokens == pytest.approx(real, rel=0.10), name
    total = sum(s.train.tokens for s in plan.streams.values())
    assert total == pytest.approx(sum(demo.real.values()), rel=0.05)


def test_a_small_sample_still_estimates_within_ten_percent(demo):
    plan = make_plan(load_recipe(demo.recipe), out=demo.root / "out", sample_bytes=128 << 10)
    assert not any(s.train.exact for s in plan.streams.values())
    total = sum(s.train.tokens for s in plan.streams.values())
    assert total == pytest.approx(sum(demo.real.values()), rel=0.10)


def test_plan_numbers_follow_the_recipe(demo):
    recipe = load_recipe(demo.recipe)
    plan = make_plan(recipe, out=demo.root / "out")
    assert [s.budget for s in plan.streams.values()] == [recipe.budget(n) for n in recipe.streams]
    assert sum(plan.shards) == recipe.blocks and len(plan.shards) == 4
    assert plan.dtype.name == "uint16"
    itemsize = 2
    assert plan.disk.shards == (recipe.train_tokens + len(plan.shards) - 1) * itemsize
    assert plan.disk.holdouts == 2 * (recipe.holdout.tokens + 1) * itemsize
    assert plan.disk.intermediates >= sum(recipe.budget(n) for n in recipe.streams) * itemsize
    assert set(plan.holdouts) == {"prose", "code"}
    for h in plan.holdouts.values():
        assert sum(plan.streams[n].holdout_need for n in h.streams) >= h.tokens
    text = _render(plan)
    assert "plan ok" in text and "docstrings" in text and "free on" in text


def _render(plan) -> str:
    console = Console(record=True, width=160)
    console.print(render_plan(plan))
    return console.export_text()


def test_a_recipe_that_trains_its_tokenizer_is_estimated_at_four_bytes_per_token(demo):
    plan = make_plan(load_recipe(demo.trained), out=demo.root / "fresh-out")
    assert "4 bytes/token" in plan.tokenizer_note
    assert plan.ok
    for name, real in demo.real.items():  # a rough guess, but the right order of magnitude
        assert 0.5 < plan.streams[name].train.tokens / real < 2
    # the table says which figures are the guess, not measured (it showed 3.999, the EOTs counted in)
    rows = [line for line in _render(plan).splitlines() if any(f"│ {n} " in line for n in demo.real)]
    assert len(rows) == 2 * len(demo.real)  # streams and holdouts tables
    assert all("~" in row for row in rows)
    assert sum("4 (guess)" in row for row in rows) == len(demo.real) and "3.99" not in _render(plan)
    assert all(s.train.guessed and not s.train.exact for s in plan.streams.values())


def test_plan_computes_a_missing_split_without_writing_it(demo):
    recipe = recipe_variant(demo.recipe, "nosplit.toml", {'splits = "file_splits.json"': 'splits = "new_splits.json"'})
    plan = make_plan(load_recipe(recipe), out=demo.root / "out")
    assert "not there yet" in plan.split_note
    assert not (recipe.parent / "new_splits.json").exists()
    assert plan.streams["code_c"].train_files and plan.streams["code_c"].holdout_files


def test_run_short_warning_fires_and_the_real_run_runs_out(demo, tmp_path):
    steps = load_recipe(demo.recipe).layout.steps
    recipe = recipe_variant(demo.recipe, "short.toml", {f"steps = {steps}\n": f"steps = {steps * 3}\n"})
    plan = make_plan(load_recipe(recipe), out=tmp_path / "out")
    assert not plan.ok
    short = [p for p in plan.problems if "likely to run short" in p]
    assert len(short) == 4 and short[0].startswith("stream docstrings")
    assert "SHORT" in _render(plan) and "problem(s)" in _render(plan)
    with pytest.raises(TokmixError, match="ran out"):
        run(load_recipe(recipe), tmp_path / "out", workers=1)


def test_a_holdout_that_cannot_be_filled_is_a_problem(demo):
    recipe = recipe_variant(demo.recipe, "bigholdout.toml", {"tokens = 20000\n": "tokens = 200000\n"})
    plan = make_plan(load_recipe(recipe), out=demo.root / "out")
    assert not plan.ok
    assert any(p.startswith("holdout prose cannot be filled: stream docstrings") for p in plan.problems)
    assert any(p.startswith("holdout code cannot be filled: stream code_c") for p in plan.problems)
    assert not any("likely to run short" in p for p in plan.problems)


def test_too_little_disk_space_is_a_problem(demo, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(plan_module.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
    plan = make_plan(load_recipe(demo.recipe), out=demo.root / "no" / "such" / "dir")
    assert plan.disk.path == demo.root  # the nearest folder that exists
    assert [p for p in plan.problems if p.startswith("not enough disk space")]


def test_a_missing_text_column_is_a_clear_error(demo):
    recipe = recipe_variant(
        demo.recipe,
        "badfield.toml",
        {'files = ["prose/docstrings/*.parquet"]\n': 'files = ["prose/docstrings/*.parquet"]\ntext_field = "body"\n'},
    )
    with pytest.raises(
        TokmixError, match=r"stream docstrings: file .*docstrings_000.parquet: schema: no column 'body'"
    ):
        make_plan(load_recipe(recipe), out=demo.root / "out")
