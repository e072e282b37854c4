"""The demo corpus built from this machine's Python: byte-identical when built twice, in the formats it
promises, with a recipe and a split that fit what it wrote (no stream asked for more than 70% of its train
text, every held-out file large enough for its part of the holdout)."""

from __future__ import annotations

import gzip
import json
import math
import sys
import sysconfig
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tokmix.demo import build_demo_corpus
from tokmix.errors import TokmixError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SMALL = 0.25  # near the smallest scale that builds (~2 MB, under a second); the full scale is tested once
BYTES_PER_TOKEN = 3.5  # the estimate the recipe was sized with


def texts(path: Path) -> list[str]:
    """Every document of a demo file, read the way its format says."""
    name = path.name
    if name.endswith(".parquet"):
        return pq.read_table(path, columns=["text"]).column("text").to_pylist()
    if ".jsonl" in name:
        data = path.read_bytes()
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        elif name.endswith(".zst"):
            data = zstandard.ZstdDecompressor().decompress(data)
        return [json.loads(line)["text"] for line in data.decode("utf-8").splitlines()]
    return [path.read_text(encoding="utf-8")]


def all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def stream_files(recipe_path: Path, recipe: dict, name: str) -> list[Path]:
    return sorted(p for pattern in recipe["streams"][name]["files"] for p in recipe_path.parent.glob(pattern))


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, dict]:
    path = build_demo_corpus(tmp_path_factory.mktemp("demo"), scale=SMALL)
    return path, tomllib.loads(path.read_text())


def test_build_is_deterministic(demo, tmp_path):
    recipe_path, _ = demo
    again = build_demo_corpus(tmp_path / "again", scale=SMALL)
    first, second = all_files(recipe_path.parent), all_files(again.parent)
    assert list(first) == list(second)
    for name in first:
        assert first[name] == second[name], f"{name} differs between two builds"


def test_rebuild_in_place_leaves_nothing_stale(demo, tmp_path):
    """A larger build followed by a smaller one in the same folder equals a fresh smaller build."""
    build_demo_corpus(tmp_path, scale=SMALL + 0.1)
    build_demo_corpus(tmp_path, scale=SMALL)
    assert all_files(tmp_path) == all_files(demo[0].parent)


def test_recipe_shape_and_shares(demo):
    path, recipe = demo
    assert path.name == "demo.toml"
    assert recipe["seed"] == 1234
    assert recipe["tokenizer"]["train"]["vocab_size"] == 4096
    layout = recipe["layout"]
    assert (layout["seq_len"], layout["seqs_per_step"], layout["margin_steps"]) == (256, 32, 10)
    assert layout["steps"] > 0 and layout["stream_slack"] == 1.002
    assert recipe["holdout"] == {
        "tokens": 20000,
        "eval_windows": 16,
        "splits": "file_splits.json",
        "holdout_files": 1,
    }
    streams = recipe["streams"]
    assert list(streams) == ["docstrings", "comments", "code_py", "code_c"]
    assert {n: s["domain"] for n, s in streams.items()} == {
        "docstrings": "prose",
        "comments": "prose",
        "code_py": "code",
        "code_c": "code",
    }
    assert math.isclose(sum(s["share"] for s in streams.values()), 1.0, abs_tol=1e-9)
    assert all(s["share"] > 0 for s in streams.values())
    blocks = (layout["steps"] + layout["margin_steps"]) * layout["seqs_per_step"]
    shard_blocks = layout["shard_tokens"] // layout["seq_len"]
    assert layout["shard_tokens"] % layout["seq_len"] == 0
    assert 3 <= math.ceil(blocks / shard_blocks) <= 4


def test_recipe_loads_in_tokmix(demo):
    from tokmix.recipe import load_recipe

    recipe = load_recipe(demo[0])
    assert recipe.domains == ["prose", "code"]


def test_parquet_streams(demo):
    path, recipe = demo
    for name in ("docstrings", "code_py"):
        files = stream_files(path, recipe, name)
        assert len(files) >= 3, name
        for f in files:
            meta = pq.ParquetFile(f)
            assert pa.types.is_string(meta.schema_arrow.field("text").type)
            assert meta.metadata.num_row_groups >= 2, f"{f.name}: one row group only"
            assert all(isinstance(t, str) for t in texts(f))
    docstrings = [t for f in stream_files(path, recipe, "docstrings") for t in texts(f)]
    assert 1 <= docstrings.count("") <= 10, "a few empty documents, for the pipeline to skip"


def test_jsonl_stream(demo):
    path, recipe = demo
    files = stream_files(path, recipe, "comments")
    assert {f.name.split(".", 1)[1] for f in files} == {"jsonl", "jsonl.gz", "jsonl.zst"}
    docs = [t for f in files for t in texts(f)]
    assert all(isinstance(t, str) and t for t in docs)
    assert sum("<|endoftext|>" in t for t in docs) == 1
    assert any(any(ord(c) > 127 for c in t) for t in docs), "pydoc's topics hold non-ASCII text"


def test_header_files_are_copies(demo):
    path, recipe = demo
    include = Path(sysconfig.get_paths()["include"])
    files = stream_files(path, recipe, "code_c")
    assert len(files) >= 3
    for f in files:
        rel = f.relative_to(path.parent / "code" / "c" / include.name)
        assert f.read_bytes() == (include / rel).read_bytes()


def test_split_covers_every_file_once(demo):
    path, recipe = demo
    split = json.loads((path.parent / "file_splits.json").read_text())
    assert list(split) == ["prose", "code"]
    for name, stream in recipe["streams"].items():
        files = {f.relative_to(path.parent).as_posix() for f in stream_files(path, recipe, name)}
        held = [p for p in split[stream["domain"]]["holdout"] if p in files]
        train = [p for p in split[stream["domain"]]["train"] if p in files]
        assert len(held) == 1, name
        assert sorted(held + train) == sorted(files), name


def check_sizes(path: Path, recipe: dict) -> dict[str, int]:
    """Text bytes per stream; asserts the recipe asks each stream for at most 70% of its train text and that
    each held-out file holds at least twice its stream's part of the holdout (tokens at 3.5 bytes)."""
    layout, streams = recipe["layout"], recipe["streams"]
    split = json.loads((path.parent / recipe["holdout"]["splits"]).read_text())
    run_tokens = (layout["steps"] + layout["margin_steps"]) * layout["seqs_per_step"] * layout["seq_len"] + 1
    sizes = {}
    for name, stream in streams.items():
        held_names = set(split[stream["domain"]]["holdout"])
        train_bytes = held_bytes = 0
        for f in stream_files(path, recipe, name):
            size = sum(len(t.encode()) for t in texts(f))
            if f.relative_to(path.parent).as_posix() in held_names:
                held_bytes += size
            else:
                train_bytes += size
        budget = stream["share"] * run_tokens * layout["stream_slack"]
        assert budget <= 0.7 * train_bytes / BYTES_PER_TOKEN, f"{name}: asks {budget:,.0f} tokens"
        domain_share = sum(s["share"] for s in streams.values() if s["domain"] == stream["domain"])
        part = (recipe["holdout"]["tokens"] + 1) * stream["share"] / domain_share
        assert held_bytes >= 2 * part * BYTES_PER_TOKEN, f"{name}: held-out file too small"
        sizes[name] = train_bytes + held_bytes
    return sizes


def test_recipe_fits_the_text(demo):
    check_sizes(*demo)


def test_full_scale(tmp_path):
    t0 = time.process_time()  # CPU time: the build is one process, and wall time varies with machine load
    path = build_demo_corpus(tmp_path)
    assert time.process_time() - t0 < 20
    sizes = check_sizes(path, tomllib.loads(path.read_text()))
    assert 4e6 < sum(sizes.values()) < 15e6, sizes


def test_too_small_a_scale_is_refused(tmp_path):
    with pytest.raises(TokmixError, match="scale"):
        build_demo_corpus(tmp_path, scale=0.05)
    with pytest.raises(TokmixError, match="scale"):
        build_demo_corpus(tmp_path, scale=0)
