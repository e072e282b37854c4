"""tokmix.report on a real demo run: a valid, self-contained HTML file whose images are PNGs, built both from
the kept intermediates and from the shards alone, and the shard scan agreeing with the units it replaces."""

from __future__ import annotations

import base64
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import demo_copy
from tests.test_plan import TRAINED, recipe_variant
from tokmix.errors import TokmixError
from tokmix.provenance import DOC_DTYPE
from tokmix.recipe import load_recipe
from tokmix.report import _unit_records, gather, scan_shards, write_report
from tokmix.runner import run
from tokmix.shards import Layout, read_index

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VOID = {"meta", "img", "br", "hr", "link", "input"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_inputs) -> tuple[Path, Path]:
    """The demo run with its intermediates, and a copy of it without them. The tokenizer is trained beforehand
    on a part of the train text (1.5 s rather than the run's 4 s on all of it; tests/conftest.py's demo_inputs)."""
    root = tmp_path_factory.mktemp("report")
    trained, tokenizer = demo_copy(demo_inputs, root)
    recipe = recipe_variant(trained, "given.toml", {TRAINED: f'[tokenizer]\npath = "{tokenizer}"\n'})
    kept = root / "kept"
    run(load_recipe(recipe), kept, keep_streams=True, workers=2)
    bare = root / "bare"
    shutil.copytree(kept, bare, ignore=shutil.ignore_patterns("streams"))
    return kept, bare


class Page(HTMLParser):
    """Checks that tags nest and close, and collects the images and any external reference."""

    def __init__(self):
        super().__init__()
        self.open: list[str] = []
        self.images: list[str] = []
        self.external: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        for key in ("src", "href"):
            if attrs.get(key) and not attrs[key].startswith("data:"):
                self.external.append(attrs[key])
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        if not self.open or self.open[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.open[-1] if self.open else None}>")
        else:
            self.open.pop()


def check_page(path: Path) -> Page:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>")
    page = Page()
    page.feed(text)
    page.close()
    assert not page.errors and not page.open, (page.errors, page.open)
    assert not page.external
    assert len(page.images) == 7  # the mix, per shard, per step, lengths, bytes per token, throughput, holdouts
    assert "Share per step" in text
    for src in page.images:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        assert base64.b64decode(src[len(prefix) :], validate=True).startswith(PNG_MAGIC)
    return page


def test_report_from_kept_intermediates_is_valid_html_with_png_plots(runs, tmp_path):
    kept, _ = runs
    path = write_report(kept, tmp_path / "report.html")
    check_page(path)
    text = path.read_text(encoding="utf-8")
    assert "from the units&#x27; .len files" in text
    for name in ("docstrings", "comments", "code_py", "code_c", "val_prose.bin", "val_code.bin"):
        assert name in text


def test_report_from_the_shards_alone(runs, tmp_path):
    _, bare = runs
    path = write_report(bare, tmp_path / "sub" / "report.html")
    check_page(path)
    assert "from the shards" in path.read_text(encoding="utf-8")
    # each shard's documents by stream, counted here from its provenance index with numpy alone
    index, page = read_index(bare), path.read_text(encoding="utf-8")
    streams = np.array([source[0] for source in index.provenance.sources])
    for shard in index.shards:
        of = streams[np.fromfile(bare / shard.provenance.file, DOC_DTYPE)["source"]]
        total = sum(shard.tokens_by_stream.values())
        for name, tokens in shard.tokens_by_stream.items():
            assert f"{tokens / total:.2%} ({int(np.sum(of == name)):,} docs)" in page, (shard.file, name)


def test_shard_scan_agrees_with_the_units_it_replaces(runs):
    """The documents found in the shards, given their streams by replaying the interleave, are each stream's
    first documents, with the lengths the units recorded; the tokens per stream are index.json's."""
    kept, _ = runs
    index = read_index(kept)
    scanned = scan_shards(kept, index, None)
    assert scanned["tokens"] == index.total.tokens_by_stream
    for name, lengths in scanned["lengths"].items():
        _, unit_lengths = _unit_records(Layout(kept), name)
        assert len(lengths) >= index.mix.documents_used[name] - 1
        assert np.array_equal(lengths, unit_lengths[: len(lengths)]), name


def test_bytes_per_token_from_the_scan(runs):
    _, bare = runs
    _, facts = gather(bare)
    for f in facts.values():
        assert f.lengths_from == "shards"
        assert 2.5 < f.text_bytes / f.tokens_in_shards < 4.5  # a 4096-id BPE on English and code


def test_missing_matplotlib_is_a_clear_error(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(TokmixError, match="needs matplotlib, a tokmix dependency: pip install matplotlib$"):
        write_report(runs[0], tmp_path / "report.html")
    assert not (tmp_path / "report.html").exists()


def test_report_without_intermediates_and_without_the_scan(runs, tmp_path):
    _, bare = runs
    path = write_report(bare, tmp_path / "report.html", scan=False)
    check_page(path)
    assert "not available: the intermediates are gone" in path.read_text(encoding="utf-8")
