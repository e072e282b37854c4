"""A cached unit judged against the holdout set of the run that takes it: a unit an earlier run kept a document
of that is a holdout document now, or dropped one that no longer is, is tokenized again, so that a run with a
cache writes the bytes it writes without one (tokmix.stages.streams._same_copies, by text keys and hashes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokmix
from tests.corpus import make_inputs
from tests.test_cache import outputs
from tokmix.sources import text_hashes

SMALL, LARGE = 3000, 9000  # holdout tokens: edu's holdout (a domain of its own) reads more of its file with LARGE


def held(out: Path) -> set[int]:
    """The hashes of edu's holdout documents as the run's holdout stage read them."""
    return set(np.load(out / "tokmix-state" / "holdout_edu.hashes.npy").tolist())


def with_holdout(recipe: Path, tokens: int) -> Path:
    path = recipe.with_name(f"holdout-{tokens}.toml")
    path.write_text(recipe.read_text().replace("tokens = 3000", f"tokens = {tokens}"))
    return path


def run(recipe: Path, out: Path, cache: Path | None) -> dict:
    return tokmix.run(tokmix.load_recipe(recipe), out, workers=2, cache=str(cache) if cache else None)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """A corpus whose first edu train file starts with copies of two of edu's holdout documents: one that both
    holdouts read (`early`), one that only the LARGE one reads (`late`)."""
    root = tmp_path_factory.mktemp("corpus")
    recipe = make_inputs(root, decontaminate=True)
    small, large = with_holdout(recipe, SMALL), with_holdout(recipe, LARGE)
    probe = tmp_path_factory.mktemp("probe")
    run(small, probe / "small", None)
    run(large, probe / "large", None)
    read_small, read_large = held(probe / "small"), held(probe / "large")
    texts = [t for t in pq.read_table(root / "corpus/edu/part-3.parquet")["text"].to_pylist() if len(t) > 40]
    hashes = text_hashes(texts).tolist()
    early = next(t for t, h in zip(texts, hashes) if h in read_small)
    late = next(t for t, h in zip(texts, hashes) if h in read_large and h not in read_small)
    train = root / "corpus/edu/part-0.parquet"
    pq.write_table(pa.table({"text": [early, late, *pq.read_table(train)["text"].to_pylist()]}), train,
                   row_group_size=64)
    return small, large, [early, late]


def test_a_unit_is_taken_from_the_cache_only_under_the_holdout_set_it_was_made_with(planted, tmp_path):
    small, large, _ = planted
    want = {}
    for recipe in (small, large):
        index = run(recipe, tmp_path / f"{recipe.stem}-alone", None)
        want[recipe.stem] = (outputs(tmp_path / f"{recipe.stem}-alone"), index["decontamination"]["dropped_by_stream"])
    # the smaller holdout drops the early copy alone, the larger one both
    assert want[large.stem][1]["edu"] == want[small.stem][1]["edu"] + 1

    cache = tmp_path / "cache"
    run(small, tmp_path / "cold", cache)
    # the larger holdout: the unit that kept the late copy is tokenized again (it is a holdout document now),
    # every other unit is the cache's
    index = run(large, tmp_path / "large", cache)
    assert (outputs(tmp_path / "large"), index["decontamination"]["dropped_by_stream"]) == want[large.stem]
    took = index["cache"]
    assert 0 < took["units_from_cache"] < took["units"]
    assert took["by_stream"]["edu"]["tokens_tokenized"] > 0
    assert all(took["by_stream"][s]["tokens_tokenized"] == 0 for s in took["by_stream"] if s != "edu")
    # and the smaller again: the unit's new entry dropped the late copy, which is no holdout document now
    index = run(small, tmp_path / "small", cache)
    assert (outputs(tmp_path / "small"), index["decontamination"]["dropped_by_stream"]) == want[small.stem]
    assert index["cache"]["by_stream"]["edu"]["tokens_tokenized"] > 0


def test_a_cached_unit_records_its_kept_documents_by_key_and_its_dropped_ones_by_hash(planted, tmp_path):
    """The entry of the unit holding the copies, made under the larger holdout: no key of a kept document is a
    holdout document's, and its dropped hashes are the two copies'."""
    from tokmix.provenance import text_crc32
    from tokmix.sources import text_keys

    _, large, (early, late) = planted
    cache = tmp_path / "cache"
    run(large, tmp_path / "out", cache)
    state = tmp_path / "out" / "tokmix-state"
    held_keys, held_hashes = (np.load(state / f"holdout.{kind}.npy") for kind in ("keys", "hashes"))
    entries = [json.loads(p.read_text()) for p in cache.glob("entries/*/*/entry.json")]
    first = [e for e in entries if e["parts"].get("stream") == "edu" and e["parts"].get("unit") == "000000"]
    assert len(first) == 1, [e["parts"] for e in entries]
    folder = next(cache.glob(f"entries/*/{first[0]['key']}"))
    kept = np.fromfile(folder / first[0]["extra"]["keys"]["file"], np.uint64)
    dropped = np.fromfile(folder / first[0]["extra"]["dropped"]["file"], np.uint64)
    assert len(kept) == first[0]["unit"]["docs"] and not np.isin(kept, held_keys).any()
    assert sorted(dropped.tolist()) == sorted(text_hashes([early, late]).tolist())
    copies = [early, late]
    assert np.isin(dropped, held_hashes).all() and np.isin(text_keys(copies, text_crc32(copies)), held_keys).all()
