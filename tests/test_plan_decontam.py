"""`tokmix plan` with [decontaminate]: with action "drop" the documents a benchmark item takes are none of a
stream's supply (the run drops them before tokenizing), so a stream that only the dropped documents would fill
is named short by the plan, with the count the run itself runs out at; with "report" they stay in the supply."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.corpus import make_inputs
from tokmix.plan import make_plan
from tokmix.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
SHARES = {"dclm": 0.2, "edu": 0.2, "code_py": 0.5, "code_other": 0.1}


@pytest.fixture(scope="module")
def recipes(tmp_path_factory) -> dict[str, Path]:
    """A corpus whose code_py budget (half of 100 steps) is ~60% of its train files' tokens, and a benchmark
    made of the documents of two of its three train files: without them its supply is short of the budget."""
    root = tmp_path_factory.mktemp("plan-decontam")
    plain = make_inputs(root, doc_limit=300, rows_per_group=16, steps=100)
    text = plain.read_text()
    for stream, share in SHARES.items():
        text = re.sub(rf'(\[streams\.{stream}\]\ndomain = "\w+"\nshare = )[0-9.]+', rf"\g<1>{share}", text)
    plain.write_text(text)
    bench = root / "own.jsonl"
    docs = [t for k in (0, 1) for t in pq.read_table(root / "corpus" / "code_py" / f"part-{k}.parquet")["text"]
            .to_pylist() if t]
    bench.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    out = {"plain": plain}
    for action in ("drop", "report"):
        out[action] = root / f"{action}.toml"
        out[action].write_text(text + f'\n[decontaminate]\naction = "{action}"\n[decontaminate.benchmarks.own]\n'
                                      f'files = ["{bench}"]\n')
    return out


def test_a_stream_short_once_its_contaminated_documents_are_dropped_is_named_short(recipes, tmp_path):
    plain = make_plan(load_recipe(recipes["plain"]), out=tmp_path / "plain")
    assert plain.ok and plain.streams["code_py"].train.exact, plain.problems
    drop = make_plan(load_recipe(recipes["drop"]), out=tmp_path / "drop")
    code = drop.streams["code_py"]
    assert code.short and code.train.exact and code.train.tokens < code.budget < plain.streams["code_py"].train.tokens
    assert [p for p in drop.problems if p.startswith("stream code_py is likely to run short")] == [
        f"stream code_py is likely to run short: its 3 train file(s) hold {code.train.tokens:,} tokens once "
        f"[decontaminate] drops what it takes, its budget is {code.budget:,} (about "
        f"{code.budget / code.train.tokens - 1:.0%} more text needed): add train files or lower its share or the "
        f"number of blocks, or let its documents repeat: max_epochs = {code.passes}"]
    assert drop.contamination["code_py"][2] > 0

    # the run agrees: it runs out at the very count the plan gave (the sample read every file whole)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TOKMIX_CACHE", None)
    failed = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipes["drop"]), "--out",
                             str(tmp_path / "run"), "--no-cache"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    said = re.search(rf"stream code_py: source files ran out at {code.train.tokens:,} tokens of a budget of "
                     rf"{code.budget:,} \(benchmark decontamination dropped ([\d,]+) of its documents, ([\d,]+) "
                     r"tokens\); about", failed.stderr)
    assert said, failed.stderr[-2000:]  # what the run took, as the plan counted it
    assert int(said[1].replace(",", "")) == drop.contamination["code_py"][2] and int(said[2].replace(",", "")) > 0

    # "report" keeps them: the supply is the plain recipe's
    report = make_plan(load_recipe(recipes["report"]), out=tmp_path / "report")
    assert report.ok and report.streams["code_py"].train.tokens == plain.streams["code_py"].train.tokens
    assert report.contamination == drop.contamination


def test_the_contamination_note_says_min_matches(recipes, tmp_path):
    """min_matches = 2: the note counts the documents sharing 2 distinct n-grams with one item, and says so."""
    two = recipes["report"].with_name("two.toml")  # (the recipe's paths are its folder's)
    two.write_text(recipes["report"].read_text().replace('action = "report"', 'action = "report"\nmin_matches = 2'))
    plans = {m: make_plan(load_recipe(r), out=tmp_path / "out") for m, r in ((1, recipes["report"]), (2, two))}
    for m, plan in plans.items():
        notes = [n for n in plan.notes if n.startswith("decontaminate: stream code_py:")]
        share = "a 13-gram" if m == 1 else "2 distinct 13-grams"
        found, docs = plan.contamination["code_py"][2], plan.contamination["code_py"][0]
        assert notes and notes[0].startswith(f"decontaminate: stream code_py: {found:,} of {docs:,} sampled "
                                             f"documents share {share} with a benchmark item: the run would count")
    assert 0 < plans[2].contamination["code_py"][2] <= plans[1].contamination["code_py"][2]
