"""The whole pipeline on a small real corpus: determinism across worker counts, resume after completion and
after a deleted shard, the split file, recipe changes, a source that runs out, decontamination."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokmix
from tests.corpus import make_inputs
from tokmix import TokmixError
from tokmix.executors import local_workers

ROOT = Path(__file__).resolve().parents[1]


def outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted([*out.glob("*.bin"), *out.glob("*.docs")])}


def mtimes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(out.glob("*.bin"))}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    make_inputs(root, decontaminate=True)
    return root


@pytest.fixture(scope="module")
def two_workers(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("w2")
    tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), out, workers=2)
    return out


def test_one_and_two_workers_write_identical_bytes(corpus, two_workers, tmp_path):
    tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), tmp_path, workers=1)
    assert outputs(tmp_path) == outputs(two_workers)
    assert len([n for n in outputs(tmp_path) if n.startswith("train_")]) == 8  # shards and their indexes


def test_worker_processes_write_what_threads_write_whatever_their_number(corpus, two_workers, tmp_path):
    """--executor processes (each worker its own encoder and GIL), with one process and with three on two
    cores: the same bytes as two threads."""
    recipe = tokmix.load_recipe(corpus / "recipe.toml")
    tokmix.run(recipe, tmp_path / "one", workers=1, executor="processes")
    tokmix.run(recipe, tmp_path / "three", workers=3, executor="processes", unit_bytes=20_000)
    assert outputs(tmp_path / "one") == outputs(two_workers)
    assert outputs(tmp_path / "three") == outputs(two_workers)


def test_the_memory_budget_caps_the_worker_processes():
    assert local_workers(64, 1 << 30) == 3  # 64 cores, the default 1 GiB: 3 processes of a small vocabulary
    assert local_workers(64, 32 << 30) == 64
    assert local_workers(2, 1 << 30) == 2
    assert local_workers(8, 300 << 20) == 1  # always one


def test_index_matches_the_files(two_workers):
    index = json.loads((two_workers / "index.json").read_text())
    assert index["blocks"] == (40 + 4) * 8
    assert sum(s["blocks"] for s in index["shards"]) == index["blocks"]
    assert index["total"]["tokens"] == index["blocks"] * 64 + 1
    for shard in index["shards"]:
        assert (two_workers / shard["file"]).stat().st_size == 2 * shard["tokens"]
    assert not (two_workers / "streams").exists(), "intermediates are removed after validation"
    assert subprocess.run([sys.executable, "-m", "tokmix.cli", "validate", str(two_workers)]).returncode == 0


def test_a_second_run_after_completion_does_nothing(corpus, two_workers, capfd):
    before = mtimes(two_workers)
    tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), two_workers, workers=2)
    assert mtimes(two_workers) == before
    assert "nothing to do" in capfd.readouterr().out


@pytest.mark.parametrize("keep_streams", [True, False])
def test_a_deleted_shard_is_rewritten_alone_and_identical(corpus, two_workers, tmp_path, keep_streams):
    out = tmp_path / "out"
    shutil.copytree(two_workers, out)
    if keep_streams:  # intermediates still there: assemble alone rewrites the shard
        tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), out, workers=2, keep_streams=True, restart=True)
    want, before = outputs(out), mtimes(out)
    (out / "train_002.bin").unlink()
    tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), out, workers=2, keep_streams=keep_streams)
    assert outputs(out) == want
    after = mtimes(out)
    assert after.pop("train_002.bin") > before.pop("train_002.bin")
    assert after == before


@pytest.mark.parametrize("unit_bytes", [1, 20_000, 1 << 30])
def test_a_limited_unit_is_the_one_that_reaches_the_budget_and_ends_there(corpus, two_workers, tmp_path,
                                                                          unit_bytes):
    """A unit expected to reach its stream's budget waits for the units before it and is given the tokens left
    (its limit): it then ends at the document that reaches the budget, or holds fewer tokens and is not the last
    one used. Any cut writes the same shards."""
    tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), tmp_path, workers=2, keep_streams=True,
               unit_bytes=unit_bytes)
    assert outputs(tmp_path) == outputs(two_workers)
    limited = 0
    for meta_path in sorted(tmp_path.glob("streams/*/stream.json")):
        meta = json.loads(meta_path.read_text())
        records = {r["name"]: r for r in map(json.loads, map(Path.read_text, meta_path.parent.glob("units/*.json")))}
        *before, last = (records[u["name"]] for u in meta["units"])
        assert all(r["limit"] is None or r["tokens"] < r["limit"] for r in before), meta["name"]
        assert all(r["limit"] is None for r in records.values() if r["index"] > last["index"]), meta["name"]
        held = sum(r["tokens"] for r in before)
        assert held < meta["budget"] <= held + last["tokens"], meta["name"]  # the last unit holds the crossing
        if last["limit"] is not None:
            limited += 1
            assert last["limit"] == meta["budget"] - held, meta["name"]
            assert last["docs"] == meta["last_unit_docs"] and last["tokens"] >= last["limit"], meta["name"]
        else:  # not expected to reach the budget: tokenized whole, the stream uses the documents up to the crossing
            assert meta["last_unit_docs"] <= last["docs"], meta["name"]
    # Several units per stream: every stream's last unit was expected to reach the budget and given a limit. One
    # file per unit (unit_bytes=1): the 1-in-3-bytes guess holds back a stream's last file, which is then whole.
    assert limited == 4 or (unit_bytes == 1 and limited >= 1), limited


def test_a_unit_with_a_limit_is_the_prefix_of_the_whole_unit_up_to_the_document_that_reaches_it(corpus, tmp_path):
    from tokmix.sources import plan_units
    from tokmix.stages.streams import UnitTask, tokenize_unit

    unit = next(plan_units("dclm", [str(corpus / "corpus/dclm/part-1.parquet")], [], 1 << 30))
    tokenizer = str(corpus / "tokenizer/tokenizer.json")

    def run(name: str, limit: int | None) -> tuple[dict, np.ndarray, np.ndarray]:
        (tmp_path / name).mkdir()
        task = UnitTask(unit, "text", tokenizer, "hf", "<u2", str(tmp_path / name), None, (), 4 << 20, limit)
        record = tokenize_unit(task)
        tokens = np.fromfile(tmp_path / name / f"{unit.name}.tok", dtype="<u2")
        return record, tokens, np.fromfile(tmp_path / name / f"{unit.name}.len", dtype="<u4")

    whole, tokens, lengths = run("whole", None)
    ends = np.cumsum(lengths)
    for limit in (1, int(ends[0]), int(ends[0]) + 1, int(ends[len(ends) // 2]), int(ends[-1]), int(ends[-1]) + 1):
        record, got, got_lengths = run(f"limit-{limit}", limit)
        docs = min(int(np.searchsorted(ends, limit)) + 1, len(ends))  # the document that reaches the limit
        assert record["docs"] == docs and record["tokens"] == ends[docs - 1] == len(got), limit
        assert np.array_equal(got, tokens[: len(got)]) and np.array_equal(got_lengths, lengths[:docs]), limit
        assert record["limit"] == limit and whole["limit"] is None


def test_the_split_file_is_used_as_given_and_never_rewritten(corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus, root)
    split_path = root / "data" / "file_splits.json"
    split = json.loads(split_path.read_text())
    # hold out part-0 of dclm instead of part-3: the run must follow the file, whatever its order
    split["dclm"] = {"holdout": ["corpus/dclm/part-0.parquet"],
                     "train": [f"corpus/dclm/part-{k}.parquet" for k in (3, 2, 1)]}
    split_path.write_text(json.dumps(split, indent=1))
    written = split_path.read_bytes()
    index = tokmix.run(tokmix.load_recipe(root / "recipe.toml"), tmp_path / "out", workers=2)
    assert split_path.read_bytes() == written
    assert index["val"]["dclm"]["source_files"] == ["corpus/dclm/part-0.parquet"]


def test_a_missing_split_file_is_created_once(corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus, root)
    (root / "data" / "file_splits.json").unlink()
    tokmix.run(tokmix.load_recipe(root / "recipe.toml"), tmp_path / "out", workers=2)
    split = json.loads((root / "data" / "file_splits.json").read_text())
    assert split["code"]["holdout"] == ["corpus/code_py/part-3.parquet", "corpus/code_other/part-3.parquet"]
    assert split["dclm"]["train"] == [f"corpus/dclm/part-{k}.parquet" for k in range(3)]


def test_resuming_with_a_changed_recipe_is_refused_with_a_diff(corpus, two_workers, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(two_workers, out)
    text = (corpus / "recipe.toml").read_text()
    changed = corpus / "changed.toml"
    changed.write_text(text.replace("seed = 1234", "seed = 99").replace("share = 0.07", "share = 0.06")
                       .replace("share = 0.13", "share = 0.14"))
    with pytest.raises(TokmixError) as refused:
        tokmix.run(tokmix.load_recipe(changed), out, workers=2)
    assert str(refused.value) == (f"{out} was started with another recipe; resuming would mix two runs. Changed: "
                                  "seed: 1234 -> 99; streams.code_other.share: 0.13 -> 0.14; "
                                  "streams.code_py.share: 0.07 -> 0.06. Use --restart to start over")
    # what cannot change the bytes is not a change: workers, memory, the backend
    tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), out, workers=1, backend="hf", max_memory=2 << 30)
    index = tokmix.run(tokmix.load_recipe(changed), out, workers=2, restart=True)
    assert index["seed"] == 99


def test_a_source_that_runs_out_names_the_stream_and_the_shortfall(corpus, tmp_path):
    with pytest.raises(TokmixError, match=r"stream dclm: source files ran out at [\d,]+ tokens of a budget of "
                                          r"[\d,]+ \(1 copy of a holdout document dropped\); about [\d.,]+ [kM]B "
                                          "more text"):
        tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), tmp_path, workers=2, blocks=20_000)
    # the holdouts finished before the failure are kept
    assert (tmp_path / "val_dclm.bin").exists()


def test_holdout_copies_in_train_files_are_dropped_and_counted(corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus, root)
    held = pq.read_table(root / "corpus/edu/part-3.parquet")["text"].to_pylist()
    planted = [t for t in held if len(t) > 40][:5]
    train = root / "corpus/edu/part-0.parquet"
    texts = planted + pq.read_table(train)["text"].to_pylist()
    pq.write_table(pa.table({"text": texts}), train, row_group_size=64)
    index = tokmix.run(tokmix.load_recipe(root / "recipe.toml"), tmp_path / "out", workers=2, keep_streams=True)
    assert index["decontamination"]["dropped_by_stream"]["edu"] >= 5
    # none of the planted documents' tokens reach a unit file: compare their encodings
    from tokmix.backends import make_encoder

    encoder = make_encoder(root / "tokenizer/tokenizer.json", "hf")
    train_tokens = b"".join(p.read_bytes() for p in sorted((tmp_path / "out/streams/edu/units").glob("*.tok")))
    for text in planted:
        ids, _ = encoder.encode_batch([text])
        assert bytes([0, 0]) + ids.astype("<u2").tobytes() not in train_tokens
    # holdouts whose keys files are gone are remade (the keys decide which texts are hashed): the same result
    out, state = tmp_path / "out", tmp_path / "out/tokmix-state"
    first = outputs(out)
    for path in [*state.glob("holdout*.keys.npy"), state / "done.json", *out.glob("train_*.bin")]:
        path.unlink()
    shutil.rmtree(out / "streams")
    again = tokmix.run(tokmix.load_recipe(root / "recipe.toml"), out, workers=2)
    assert (state / "holdout.keys.npy").exists() and list(state.glob("holdout_*.keys.npy"))
    assert again["decontamination"] == index["decontamination"]
    assert outputs(out) == first


def test_only_texts_of_a_holdout_key_are_hashed_and_copies_are_found():
    from tokmix.provenance import text_crc32
    from tokmix.sources import HugeText, text_hashes, text_keys
    from tokmix.stages.streams import holdout_copies

    held = ["the held out document", "ünïcødé held out 😀", ""]
    hashes, keys = np.unique(text_hashes(held)), np.unique(text_keys(held, text_crc32(held)))
    texts = ["the held out document", "the held out documenT", "a train document", "ünïcødé held out 😀",
             HugeText(b"the held out document", "f", "s"), HugeText("ünïcødé held out 😀".encode(), "f", "s"),
             HugeText(b"other bytes", "f", "s"), ""]
    want = [True, False, False, True, True, True, False, True]
    assert holdout_copies(texts, hashes, keys).tolist() == want
    assert holdout_copies(texts, hashes, None).tolist() == want
    assert holdout_copies(texts, hashes, keys, text_keys(texts, text_crc32(texts))).tolist() == want
    # a key is each text's characters (a HugeText's counted from its UTF-8) above the CRC-32 of its bytes
    crcs = text_crc32(texts).astype(np.uint64)
    chars = np.array([len(t) for t in [*texts[:4], texts[0], texts[3], "other bytes", ""]], np.uint64)
    assert text_keys(texts, crcs).tolist() == ((chars << np.uint64(32)) | crcs).tolist()
    # a key in common is only a reason to hash: a text whose key is a holdout document's is no copy unless its
    # hash is one too
    forged = np.unique(np.concatenate([keys, text_keys(["a train document"], text_crc32(["a train document"]))]))
    assert holdout_copies(texts, hashes, forged).tolist() == want
    assert holdout_copies(texts, hashes, keys[:1]).tolist() == [t == "" for t in texts]


def test_cli_bad_input_is_one_line_and_debug_shows_the_traceback(corpus, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text((corpus / "recipe.toml").read_text().replace("share = 0.45", "share = 0.5"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(bad), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "shares sum to 1.05, not 1" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(bad), "--out", str(tmp_path / "o"),
                           "--debug"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_python_m_tokmix_is_the_command_and_says_its_version(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tokmix", "--version"], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (0, f"tokmix {tokmix.__version__}")
    proc = subprocess.run([sys.executable, "-m", "tokmix", "validate", str(tmp_path / "nothing")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 1 and f"{tmp_path / 'nothing'}: no index.json" in proc.stderr


def test_memory_guard_restarts_and_gives_up_without_progress(corpus, tmp_path):
    with pytest.raises(TokmixError, match="memory guard restarted the run 3 times without progress"):
        tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), tmp_path, workers=1, max_memory=1 << 20)


def test_validate_names_the_file_and_block_of_a_flipped_byte(two_workers, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(two_workers, out)
    shard = out / "train_001.bin"
    data = bytearray(shard.read_bytes())
    data[2 * (17 * 64 + 5)] ^= 0x01  # a bit of the 6th token of block 17
    shard.write_bytes(bytes(data))
    proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "validate", str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1
    assert "train_001.bin: sha256 checksum differs from index.json" in proc.stderr
    assert "block 17 (tokens 1,088-1,152)" in proc.stderr


def test_without_a_terminal_progress_is_plain_lines(corpus, tmp_path, capfd):
    tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), tmp_path, workers=2, log_seconds=0)
    out = capfd.readouterr().out
    assert "\x1b[" not in out, "no terminal control codes in a log file"
    import re

    lines = re.findall(r"\] streams (\w+): ([\d,]+) / ([\d,]+) tokens \([\d.]+%\), [\d.]+[kMG]? tok/s, ETA "
                       r"\d+:\d\d:\d\d; tree RSS [\d,]+ MiB of 1,024 MiB", out)
    assert {name for name, _, _ in lines} == {"dclm", "edu", "code_py", "code_other"}
    for stage in ("tokenizer", "holdout", "streams", "assemble", "validate"):
        assert f"] stage {stage}: started" in out and f"] stage {stage}: done in " in out


def test_cli_exports_a_real_run_for_llmc_and_megatron(two_workers, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for fmt, dest in (("llmc", tmp_path / "llmc"), ("megatron", tmp_path / "mega" / "gptu")):
        proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "export", str(two_workers), "--format", fmt,
                               str(dest)], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
    import numpy as np

    shard = np.fromfile(two_workers / "train_000.bin", dtype=np.uint16)
    exported = (tmp_path / "llmc" / "tokmix_train_000.bin").read_bytes()
    header = np.frombuffer(exported[:1024], dtype=np.int32)
    assert (header[0], header[1], header[2]) == (20240520, 1, len(shard))
    assert exported[1024:] == shard.tobytes()
    assert (tmp_path / "mega" / "gptu.bin").stat().st_size > 0 and (tmp_path / "mega" / "gptu.idx").exists()


@pytest.mark.parametrize("change, message", [
    (("corpus/edu/*.parquet", "corpus/edu/*.nothing"), r"stream edu: no train file in split file .* matches"),
    (('domain = "edu"', 'domain = "prose"'), r"stream edu: split file .* has no domain 'prose'"),
    (("[streams.code_other]", "[streams.edu]"), r"not valid TOML"),
])
def test_recipe_and_split_mistakes_are_one_line(corpus, tmp_path, change, message):
    bad = corpus / "bad.toml"
    bad.write_text((corpus / "recipe.toml").read_text().replace(*change))
    with pytest.raises(TokmixError, match=message) as e:
        tokmix.run(tokmix.load_recipe(bad), tmp_path, workers=1)
    assert "\n" not in str(e.value)


def test_a_glob_that_names_no_file_is_one_line_when_the_split_is_made(corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus, root)
    (root / "data" / "file_splits.json").unlink()
    bad = root / "recipe.toml"
    bad.write_text(bad.read_text().replace("corpus/edu/*.parquet", "corpus/edu/*.nothing"))
    with pytest.raises(TokmixError, match=r"stream edu: 0 file\(s\) match \['corpus/edu/\*.nothing'\]"):
        tokmix.run(tokmix.load_recipe(bad), tmp_path / "out", workers=1)


def test_a_folder_named_with_glob_brackets_is_named_by_escaping_them_and_the_mistake_says_how(corpus, tmp_path):
    """'corpus [v2]/edu/*.parquet' as a glob means "corpus v" or "corpus 2": it matches nothing, and the refusal
    gives the spelling that names the folder; with it, the split holds the folder's files by their real names."""
    from tokmix.sources.split import create_split

    root = tmp_path / "c"
    shutil.copytree(corpus, root)
    (root / "data" / "file_splits.json").unlink()
    (root / "corpus").rename(root / "corpus [v2]")
    recipe = root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('"corpus/', '"corpus [v2]/'))
    with pytest.raises(TokmixError, match=re.escape("stream dclm: 'corpus [v2]/dclm/*.parquet' matches no file: "
                                                    "in a pattern [...] is a set of characters") +
                       r".*\(files = \['corpus \[\[\]v2\]/dclm/\*\.parquet'\]\)$"):
        tokmix.run(tokmix.load_recipe(recipe), tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.bin"))
    recipe.write_text(recipe.read_text().replace('"corpus [v2]/', '"corpus [[]v2]/'))
    split = create_split(tokmix.load_recipe(recipe), [])
    names = sorted(f for part in split["edu"].values() for f in part)
    assert names == [f"corpus [v2]/edu/part-{i}.parquet" for i in range(4)]


def test_an_output_path_that_cannot_be_a_directory_is_one_line(corpus, tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(TokmixError, match=r"output directory .*a-file/out: cannot create it"):
        tokmix.run(tokmix.load_recipe(corpus / "recipe.toml"), tmp_path / "a-file" / "out", workers=1)


def test_a_chunked_interleave_run_holds_its_documents_in_the_chunked_order(corpus, two_workers, tmp_path):
    """interleave = "chunked" through the whole pipeline: the shards are the streams' documents (from the units
    kept) in the order chunked_order gives, whatever the workers, and validate accepts them."""
    from tokmix.interleave import interleave_labels

    root = tmp_path / "inputs"
    shutil.copytree(corpus, root)
    recipe = root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("[layout]\n", '[layout]\ninterleave = "chunked"\n'))
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        tokmix.run(tokmix.load_recipe(recipe), out, workers=workers, keep_streams=True)
        outs.append(out)
    assert outputs(outs[0]) == outputs(outs[1])
    assert outputs(outs[0]) != outputs(two_workers)
    index = json.loads((outs[0] / "index.json").read_text())
    assert index["mix"]["interleave"] == "chunked"
    streams = index["mix"]["streams"]
    docs = {}
    for name in streams:
        units = sorted((outs[0] / "streams" / name / "units").glob("*.tok"))
        tokens = np.concatenate([np.fromfile(u, dtype=np.uint16) for u in units])
        lengths = np.concatenate([np.fromfile(u.with_suffix(".len"), dtype="<u4") for u in units]).astype(np.int64)
        docs[name] = np.split(tokens, np.cumsum(lengths)[:-1])
    order = interleave_labels([streams[n]["docs"] for n in streams], index["seed"], "chunked")
    names, taken, flat = list(streams), dict.fromkeys(streams, 0), []
    for label in order.tolist():
        flat.append(docs[names[label]][taken[names[label]]])
        taken[names[label]] += 1
    flat = np.concatenate(flat)
    start = 0
    for shard in index["shards"]:
        got = np.fromfile(outs[0] / shard["file"], dtype=np.uint16)
        assert np.array_equal(got, flat[start : start + len(got)]), shard["file"]
        start += len(got) - 1
    assert subprocess.run([sys.executable, "-m", "tokmix.cli", "validate", str(outs[0])]).returncode == 0
