"""Every user error is one line on stderr and exit 2, never a traceback or an "internal error": each case is a
real recipe, real files and a real `tokmix` process. Also what must not be an error (a file:// tokenizer, a
dictionary-encoded parquet column), and no in-band marker: a document whose text equals a string tokmix used
internally is that text."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from tests.corpus import make_inputs

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def tokmix(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokmix.cli", *map(str, args)], capture_output=True, text=True,
                          env=env or ENV, cwd=cwd, timeout=600)


def one_line(proc: subprocess.CompletedProcess) -> str:
    """The error line of a failed command, checked to be the only thing on stderr."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err and "internal error" not in err, err
    assert err.startswith("error: "), err
    return err.removeprefix("error: ")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user-errors")
    make_inputs(root, doc_limit=200, rows_per_group=16)
    return root


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory) -> Path:
    """A finished run of the corpus's recipe, to compare with and to report on."""
    out = tmp_path_factory.mktemp("finished") / "run"
    proc = tokmix("run", corpus / "recipe.toml", "--out", out, "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def same_shards(out: Path, finished: Path) -> None:
    names = sorted(p.name for p in finished.glob("*.bin"))
    assert names and names == sorted(p.name for p in out.glob("*.bin"))
    for name in names:
        assert (out / name).read_bytes() == (finished / name).read_bytes(), name


def recipe_with(corpus: Path, tmp_path: Path, *changes: tuple[str, str]) -> Path:
    """A copy of the corpus's recipe (in the corpus, so its relative paths hold) with text replaced."""
    text = (corpus / "recipe.toml").read_text()
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    path = corpus / f"recipe-{tmp_path.name}.toml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------- refused before anything is written
@pytest.mark.parametrize("change, message", [
    (("seed = 1234", "seed = -1"), "seed: Input should be greater than or equal to 0"),
    (("share = 0.45", 'share = "0.45"'), 'streams.dclm.share: Input should be a valid number, got "0.45"'),
    (("seq_len = 64", "seq_len = true"), "layout.seq_len: Input should be a valid integer, got true"),
    (("steps = 40", "steps = 40.0"), "layout.steps: Input should be a valid integer, got 40.0"),
    (("decontaminate = false", 'decontaminate = "no"'), 'holdout.decontaminate: Input should be a valid boolean'),
])
def test_recipe_types_are_strict(corpus, tmp_path, change, message):
    recipe = recipe_with(corpus, tmp_path, change)
    err = one_line(tokmix("run", recipe, "--out", tmp_path / "out"))
    assert f"{recipe}: {message}" in err
    assert not (tmp_path / "out").exists(), "refused at load, before the output directory is made"


def test_a_recipe_that_is_binary_or_a_directory_is_one_line(corpus, tmp_path):
    binary = tmp_path / "recipe.toml"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    assert one_line(tokmix("run", binary, "--out", tmp_path / "o")) == \
        f"{binary}: not a recipe: byte 136 is not UTF-8 text (a TOML file is)"
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    assert one_line(tokmix("run", folder, "--out", tmp_path / "o")) == f"{folder}: is a directory, not a recipe file"
    assert one_line(tokmix("plan", folder)) == f"{folder}: is a directory, not a recipe file"


def test_splits_naming_a_directory_is_one_line(corpus, tmp_path):
    recipe = recipe_with(corpus, tmp_path, ('splits = "data/file_splits.json"', 'splits = "data"'))
    for command in (["run", recipe, "--out", tmp_path / "o"], ["plan", recipe]):
        assert one_line(tokmix(*command)) == \
            f"split file {corpus / 'data'}: is a directory; [holdout] splits names the split file (JSON)"


@pytest.mark.parametrize("value", [".", "", "1..5GiB", "lots"])
def test_a_size_that_is_not_one_is_one_line(corpus, tmp_path, value):
    err = one_line(tokmix("run", corpus / "recipe.toml", "--out", tmp_path / "o", "--max-memory", value))
    assert err == f"--max-memory {value!r}: not a size such as 1GiB or 512MiB"


def test_a_missing_tokenizer_file_is_named(corpus, tmp_path):
    recipe = recipe_with(corpus, tmp_path, ("tokenizer/tokenizer.json", "tokenizer/nope.json"))
    assert one_line(tokmix("run", recipe, "--out", tmp_path / "o", "--workers", "1")) == \
        f"tokenizer {corpus / 'tokenizer' / 'nope.json'}: file not found"
    assert not (tmp_path / "o" / "tokenizer.json").exists(), "no tokenizer is trained in its place"


def test_a_tokenizer_with_an_id_past_its_vocabulary_is_refused(corpus, tmp_path):
    data = json.loads((corpus / "tokenizer" / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    token = max(vocab, key=vocab.get)
    vocab[token] = 5000  # 800 tokens, one of them at id 5000
    path = tmp_path / "gap.json"
    path.write_text(json.dumps(data))
    assert Tokenizer.from_file(str(path)).encode(token.replace("Ġ", " ")).ids == [5000]
    recipe = recipe_with(corpus, tmp_path, ('path = "tokenizer/tokenizer.json"', f'path = "{path}"'))
    assert one_line(tokmix("run", recipe, "--out", tmp_path / "o", "--workers", "1")) == \
        f"tokenizer {path}: token {token!r} has id 5,000, past its vocabulary of 800 tokens (ids 0-799); " \
        "renumber its tokens without gaps"


# ---------------------------------------------------------------------------- hf:// without a network
def test_hf_sources_without_a_network_name_the_url_and_the_mirror(corpus, tmp_path):
    url = "hf://datasets/tokmix-tests/no-such-corpus/web/*.parquet"
    recipe = recipe_with(corpus, tmp_path, ('files = ["corpus/dclm/*.parquet"]', f'files = ["{url}"]'),
                         ('splits = "data/file_splits.json"', f'splits = "{tmp_path}/splits.json"'))
    env = {**ENV, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}  # nothing listens on port 9
    for command in (["plan", recipe], ["run", recipe, "--out", tmp_path / "o", "--workers", "1"]):
        err = one_line(tokmix(*command, env=env))
        assert err.startswith(f"{url}: unreachable ("), err
        assert err.endswith("check the network, or read a local copy with --mirror "
                            "hf://datasets/tokmix-tests/no-such-corpus=LOCAL_DIR"), err


# ---------------------------------------------------------------------------- printed as text, not markup
def test_messages_are_printed_as_text_whatever_brackets_they_hold(corpus, tmp_path):
    recipe = recipe_with(corpus, tmp_path, ('files = ["corpus/dclm/*.parquet"]',
                                            'files = ["corpus/dclm/*.parquet"]\ntext_field = "[/]"'))
    err = one_line(tokmix("run", recipe, "--out", tmp_path / "o", "--workers", "1"))
    assert err == f"stream dclm: file {corpus / 'corpus/dclm/part-0.parquet'}: schema: no column '[/]' " \
                  "(columns: ['id', 'text'])"
    bracketed = tmp_path / "data [v2]" / "recipe.toml"
    bracketed.parent.mkdir()
    bracketed.write_text("seed = [bold]")
    assert one_line(tokmix("run", bracketed, "--out", tmp_path / "o2")).startswith(f"{bracketed}: not valid TOML")


def test_brackets_in_a_path_are_kept(tmp_path):
    run = tmp_path / "run [v2]"
    run.mkdir()
    proc = tokmix("validate", run)
    assert proc.returncode == 1 and proc.stderr.strip() == f"{run}: no index.json with shards (the run has not " \
        "finished assembling)", proc.stderr


# ---------------------------------------------------------------------------- bad source files
def test_a_dictionary_encoded_text_column_is_read(corpus, finished, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus, root, ignore=shutil.ignore_patterns("recipe-*"))
    for path in sorted((root / "corpus" / "dclm").glob("*.parquet")):
        table = pq.read_table(path)
        column = table.schema.get_field_index("text")
        pq.write_table(table.set_column(column, "text", table["text"].dictionary_encode()), path,
                       row_group_size=16)
    assert pa.types.is_dictionary(pq.read_schema(root / "corpus/dclm/part-0.parquet").field("text").type)
    proc = tokmix("run", root / "recipe.toml", "--out", tmp_path / "dict", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    same_shards(tmp_path / "dict", finished)


def _jsonl_recipe(root: Path, lines_by_file: list[list[str]], text_field: str = "text") -> Path:
    """A one-stream recipe over JSONL files (the last one held out) and a tokenizer copied beside it."""
    (root / "web").mkdir(parents=True)
    for k, lines in enumerate(lines_by_file):
        (root / "web" / f"part-{k}.jsonl").write_text("".join(line + "\n" for line in lines))
    recipe = root / "recipe.toml"
    recipe.write_text(f"""seed = 7
[tokenizer]
path = "tokenizer.json"
[layout]
seq_len = 32
steps = 4
seqs_per_step = 2
shard_tokens = 320
[holdout]
tokens = 40
eval_windows = 1
decontaminate = false
[streams.web]
domain = "web"
share = 1.0
files = ["web/*.jsonl"]
text_field = "{text_field}"
""")
    return recipe


PROSE = [json.dumps({"text": f"document {i}: the quick brown fox jumps over the lazy dog " * 3}) for i in range(60)]
# a second file's documents: a byte copy of a held-out file is refused as a train file (test_untrusted_state)
OTHER = [json.dumps({"text": f"note {i}: a slow red hen walks past the sleeping cat " * 3}) for i in range(60)]


def test_a_deeply_nested_json_line_is_named_with_its_line_and_cause(corpus, tmp_path):
    deep = '{"text": "fine", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"
    recipe = _jsonl_recipe(tmp_path, [PROSE[:2] + [deep] + PROSE[2:], PROSE, OTHER])
    shutil.copy(corpus / "tokenizer" / "tokenizer.json", tmp_path)
    err = one_line(tokmix("run", recipe, "--out", tmp_path / "o", "--workers", "1"))
    assert err == f"stream web: file {tmp_path / 'web' / 'part-0.jsonl'}: line 3: JSON nested too deeply to read " \
                  "(over 1,024 levels of arrays or objects)"


# ---------------------------------------------------------------------------- --debug
def test_debug_shows_the_stage_process_traceback(corpus, tmp_path):
    recipe = recipe_with(corpus, tmp_path, ("tokenizer/tokenizer.json", "tokenizer/nope.json"))
    proc = tokmix("run", recipe, "--out", tmp_path / "o", "--workers", "1", "--debug")
    assert proc.returncode == 2
    assert "NoneType: None" not in proc.stderr
    assert "in build_context" in proc.stderr and "in load_tokenizer" in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: tokenizer ")


# ---------------------------------------------------------------------------- what must work
def test_a_file_url_tokenizer_is_the_local_file(corpus, finished, tmp_path):
    url = f"file://{corpus / 'tokenizer' / 'tokenizer.json'}"
    recipe = recipe_with(corpus, tmp_path, ('path = "tokenizer/tokenizer.json"', f'path = "{url}"'))
    proc = tokmix("run", recipe, "--out", tmp_path / "url", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    same_shards(tmp_path / "url", finished)


# ---------------------------------------------------------------------------- no in-band markers
def test_a_text_equal_to_an_internal_marker_is_that_text(corpus, tmp_path):
    """A JSONL line longer than the huge-document threshold (4 MiB), whose text is what tokmix once put in place
    of a huge value, must give that text as its document, never another field's huge value."""
    marker = "\x00tokmix-huge-value-0"
    line = json.dumps({"text": marker, "meta": "zz " * (2 << 20)})  # meta: 6 MiB, past the 4 MiB threshold
    empty = json.dumps({"text": "", "meta": "yy " * (2 << 20)})  # an empty text stays an empty (skipped) one
    recipe = _jsonl_recipe(tmp_path, [[line, empty] + PROSE, PROSE, OTHER])
    shutil.copy(corpus / "tokenizer" / "tokenizer.json", tmp_path)
    out = tmp_path / "out"
    proc = tokmix("run", recipe, "--out", out, "--workers", "1", "--keep-streams")
    assert proc.returncode == 0, proc.stderr[-2000:]
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    units = sorted((out / "streams" / "web" / "units").glob("*.tok"))
    tokens = np.fromfile(units[0], dtype=np.uint16)
    lengths = np.fromfile(units[0].with_suffix(".len"), dtype="<u4")
    first = tok.decode(tokens[1 : lengths[0]].tolist())
    assert first == marker, first[:80]
    assert lengths.max() < 200, "no huge value was tokenized"


# ---------------------------------------------------------------------------- a really full file system
@pytest.fixture
def small_filesystem(tmp_path):
    """A 128 KiB tmpfs: the holdouts (and their provenance indexes: a tmpfs page each) fit, the streams stage
    does not. Mounting needs root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (this test runs as a user that is not)")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_filesystem_is_one_line_and_the_run_resumes_identical(corpus, finished, small_filesystem):
    out = small_filesystem / "out"
    env = {**ENV, "TOKMIX_UNIT_BYTES": "20000"}
    err = one_line(tokmix("run", corpus / "recipe.toml", "--out", out, "--workers", "1", env=env))
    assert err.startswith(f"no space left writing {out}/"), err
    assert err.endswith("(No space left on device); committed work is kept: free some space and run the same "
                        "command again to resume"), err
    kept = {p.name: p.read_bytes() for p in out.glob("val_*.bin")}
    assert len(kept) == 3, "the holdouts, finished before the disk filled, are kept"
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_filesystem)], check=True)
    proc = tokmix("run", corpus / "recipe.toml", "--out", out, "--workers", "1", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    same_shards(out, finished)
    assert {name: (out / name).read_bytes() for name in kept} == kept


def test_a_filesystem_full_before_the_run_starts_is_one_line(corpus, finished, small_filesystem):
    filler = small_filesystem / "filler"
    with open(filler, "wb") as f, pytest.raises(OSError):
        f.write(b"x" * (1 << 20))  # fills the 96 KiB
    out = small_filesystem / "out"
    err = one_line(tokmix("run", corpus / "recipe.toml", "--out", out, "--workers", "1"))
    assert err.startswith("no space left writing ") and "committed work is kept" in err, err
    filler.unlink()
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_filesystem)], check=True)
    assert tokmix("run", corpus / "recipe.toml", "--out", out, "--workers", "1").returncode == 0
    same_shards(out, finished)
