"""tokmix's outputs against oracles written here from the format's description (DESIGN.md) and the test corpus
itself, never from tokmix's own arithmetic: each stream's content and budget, each holdout, the seeded
interleave, decontamination with every holdout document planted into train files; and resumes over damaged
intermediates. The real run they read is tests/conftest.py's `finished_run` (copied before any change)."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

import tokmix
from tokmix import TokmixError
from tokmix.shards import file_checksum, read_json, write_record

EOT = 0


@pytest.fixture(scope="module")
def inputs(finished_run) -> dict:
    """The recipe's numbers, the split file, and an encoder that tokenizes as the reference script does."""
    root = finished_run.parent
    recipe = tokmix.load_recipe(root / "recipe.toml")
    tok = Tokenizer.from_file(str(root / "tokenizer/tokenizer.json"))
    tok.encode_special_tokens = True  # a literal "<|endoftext|>" in a document is text
    return {"root": root, "recipe": recipe, "split": json.loads((root / "data/file_splits.json").read_text()),
            "tok": tok, "index": json.loads((finished_run / "index.json").read_text())}


def texts(path: Path) -> list[str]:
    return pq.read_table(path, columns=["text"])["text"].to_pylist()


def stream_paths(inputs: dict, stream: str, part: str) -> list[Path]:
    domain = inputs["recipe"].streams[stream].domain
    return [inputs["root"] / f for f in inputs["split"][domain][part] if f.startswith(f"corpus/{stream}/")]


def documents(inputs: dict, stream: str, part: str, skip_empty: bool,
              drop: frozenset[str] = frozenset()) -> list[tuple[str, np.ndarray]]:
    """(text, EOT + ids) of a stream's train or holdout files in split order, texts in `drop` left out."""
    out = []
    for path in stream_paths(inputs, stream, part):
        batch = [t for t in texts(path) if (t or not skip_empty) and t not in drop]
        for text, enc in zip(batch, inputs["tok"].encode_batch(batch)):
            out.append((text, np.array([EOT, *enc.ids], dtype=np.uint16)))
    return out


def numbers(inputs: dict) -> tuple[int, int, int]:
    """(blocks, seq_len, train tokens) from the recipe's layout."""
    layout = inputs["recipe"].layout
    blocks = (layout.steps + layout.margin_steps) * layout.seqs_per_step
    return blocks, layout.seq_len, blocks * layout.seq_len + 1


def stream_contents(inputs: dict, drop: frozenset[str] = frozenset()) -> dict[str, list[np.ndarray]]:
    """Each stream's documents (texts in `drop` left out) up to and including the one that crosses its budget:
    share x train tokens x slack, rounded down, plus one."""
    _, _, train = numbers(inputs)
    out = {}
    for name, spec in inputs["recipe"].streams.items():
        budget = int(spec.share * train * inputs["recipe"].layout.stream_slack) + 1
        docs, got = [], 0
        for _, ids in documents(inputs, name, "train", skip_empty=True, drop=drop):
            docs.append(ids)
            got += len(ids)
            if got >= budget:
                break
        out[name] = docs
    return out


def holdout_read(inputs: dict, domain: str) -> list[tuple[str, str, np.ndarray]]:
    """(stream, text, ids) of every holdout document the holdout stage reads: per stream of the domain, in file
    order, empty ones included, up to and including the one that crosses its part (share within the domain) of
    holdout tokens + 1."""
    recipe, need = inputs["recipe"], inputs["recipe"].holdout.tokens + 1
    names = [n for n, s in recipe.streams.items() if s.domain == domain]
    read = []
    for name in names:
        budget, got = need * recipe.streams[name].share / sum(recipe.streams[n].share for n in names), 0
        for text, ids in documents(inputs, name, "holdout", skip_empty=False):
            read.append((name, text, ids))
            got += len(ids)
            if got >= budget:
                break
    return read


def test_each_stream_ends_at_the_document_that_crosses_its_budget(inputs, finished_run):
    assert inputs["index"]["decontamination"]["dropped_by_stream"] == dict.fromkeys(inputs["recipe"].streams, 0)
    _, _, train = numbers(inputs)
    for name, docs in stream_contents(inputs).items():
        meta = inputs["index"]["mix"]["streams"][name]
        budget = int(inputs["recipe"].streams[name].share * train * inputs["recipe"].layout.stream_slack) + 1
        assert (meta["budget"], meta["docs"], meta["tokens"]) == (budget, len(docs), sum(map(len, docs))), name
        record = json.loads((finished_run / f"streams/{name}/stream.json").read_text())
        units = [np.fromfile(finished_run / f"streams/{name}/units/{u['name']}.tok", dtype=np.uint16)
                 for u in record["units"]]
        written = np.concatenate(units)
        assert np.array_equal(written[: meta["tokens"]], np.concatenate(docs)), name


def test_the_train_stream_is_the_seeded_interleave_of_the_streams(inputs, finished_run):
    """One stream label per document shuffled with np.random.default_rng(seed); the i-th label s is stream s's
    i-th document; shard k holds blocks_k x seq_len + 1 tokens, its first repeating shard k-1's last."""
    contents = stream_contents(inputs)
    names = list(inputs["recipe"].streams)
    labels = np.concatenate([np.full(len(contents[n]), s, dtype=np.uint8) for s, n in enumerate(names)])
    np.random.default_rng(inputs["recipe"].seed).shuffle(labels)
    nexts = dict.fromkeys(range(len(names)), 0)
    order = []
    for s in labels.tolist():
        order.append(contents[names[s]][nexts[s]])
        nexts[s] += 1
    blocks, seq_len, train = numbers(inputs)
    stream = np.concatenate(order)[:train]
    per_shard = inputs["recipe"].layout.shard_tokens // seq_len
    first = 0
    for k, n in enumerate([per_shard] * (blocks // per_shard) + [blocks % per_shard] * bool(blocks % per_shard)):
        shard = np.fromfile(finished_run / f"train_{k:03d}.bin", dtype=np.uint16)
        assert np.array_equal(shard, stream[first * seq_len : (first + n) * seq_len + 1]), k
        first += n
    assert not (finished_run / f"train_{k + 1:03d}.bin").exists()
    ends = np.cumsum([len(d) for d in order])
    used = labels[: int(np.searchsorted(ends, train - 1, side="right")) + 1]  # documents with a token in the run
    assert inputs["index"]["mix"]["documents_used"] == {n: int((used == s).sum()) for s, n in enumerate(names)}


def test_each_holdout_is_the_seeded_shuffle_of_its_streams_documents(inputs, finished_run):
    need = inputs["recipe"].holdout.tokens + 1
    for domain in inputs["split"]:
        docs = [(name, ids) for name, _, ids in holdout_read(inputs, domain)]
        random.Random(inputs["recipe"].seed).shuffle(docs)
        want = np.concatenate([ids for _, ids in docs])[:need]
        assert len(want) == need, domain
        assert np.array_equal(np.fromfile(finished_run / f"val_{domain}.bin", dtype=np.uint16), want), domain


def test_every_planted_holdout_document_is_dropped(inputs, tmp_path):
    """Every holdout document the holdout stage reads (the one that crosses its budget included) is planted at
    the start of its stream's first train file, and one of code's also into dclm's (holdouts of all domains are
    checked against every stream): dropped equals planted, stream by stream, and no planted copy reaches a
    unit. Not counted: the document after each crossing one (never read, so no holdout document), planted
    too, and a copy placed right after the document where edu's content ends (it is past the stream)."""
    root = tmp_path / "c"
    shutil.copytree(inputs["root"], root, ignore=shutil.ignore_patterns("out"))
    read = {d: holdout_read(inputs, d) for d in inputs["split"]}
    held = {text for domain in read.values() for _, text, _ in domain}
    planted = {name: [] for name in inputs["recipe"].streams}
    for domain in read.values():
        for name, text, _ in domain:
            if text:  # an empty text is no document in training: nothing to plant
                planted[name].append(text)
    kept = {}
    for name in planted:
        taken = sum(1 for d in read.values() for n, _, _ in d if n == name)
        kept[name] = next(t for t, _ in documents(inputs, name, "holdout", skip_empty=False)[taken:]
                          if t and t not in held)
    planted["dclm"].append(next(t for n, t, _ in read["code"] if t and n == "code_py"))
    for name, extra in planted.items():
        path = stream_paths(inputs, name, "train")[0]
        column = [*extra, kept[name], *texts(path)]
        pq.write_table(pa.table({"text": column}), root / path.relative_to(inputs["root"]), row_group_size=16)
    planted_inputs = {**inputs, "root": root}
    edu_end, seen = len(stream_contents(planted_inputs, drop=frozenset(held))["edu"]), 0
    for path in stream_paths(planted_inputs, "edu", "train"):  # a copy right after edu's last document
        column = texts(path)
        at = next((i for i, t in enumerate(column) if t and t not in held and (seen := seen + 1) == edu_end), None)
        if at is not None:
            column.insert(at + 1, planted["edu"][0])
            pq.write_table(pa.table({"text": column}), path, row_group_size=16)
            break
    else:
        raise AssertionError("edu's last document not found")
    index = tokmix.run(tokmix.load_recipe(root / "recipe.toml"), tmp_path / "out", workers=2, keep_streams=True)
    assert index["decontamination"]["dropped_by_stream"] == {name: len(extra) for name, extra in planted.items()}
    assert all(len(extra) > 5 for extra in planted.values())
    contents = stream_contents(planted_inputs, drop=frozenset(held))
    for name, docs in contents.items():
        units = [np.fromfile(tmp_path / f"out/streams/{name}/units/{u['name']}.tok", dtype=np.uint16) for u in
                 json.loads((tmp_path / f"out/streams/{name}/stream.json").read_text())["units"]]
        want = np.concatenate(docs)
        assert np.array_equal(np.concatenate(units)[: len(want)], want), name


def test_copies_are_exact_texts_not_normalised():
    from tokmix.sources import text_hashes
    from tokmix.stages.streams import holdout_copies

    hashes = np.unique(text_hashes(["the held out document"]))
    texts_ = ["the held out document", " the held out document", "the held out document\n", "The held out document"]
    assert holdout_copies(texts_, hashes, None).tolist() == [True, False, False, False]


def test_a_unit_without_its_lengths_file_is_redone(finished_run, inputs, tmp_path):
    """A unit whose .len is missing (killed between its token file and its lengths) is not committed."""
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    want = {p.name: p.read_bytes() for p in finished_run.glob("*.bin")}
    (out / "streams/edu/units/000000.len").unlink()
    _forget_after_streams(out, "edu")
    tokmix.run(inputs["recipe"], out, workers=1, keep_streams=True)
    assert {p.name: p.read_bytes() for p in out.glob("*.bin")} == want


def test_a_shard_of_the_wrong_size_is_rewritten(finished_run, inputs, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    want = (out / "train_002.bin").read_bytes()
    (out / "train_002.bin").write_bytes(want[:-2])
    (out / "tokmix-state/done.json").unlink()
    tokmix.run(inputs["recipe"], out, workers=1, keep_streams=True)
    assert (out / "train_002.bin").read_bytes() == want


def test_a_damaged_shard_of_the_right_size_is_rewritten(finished_run, inputs, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    want = (out / "train_001.bin").read_bytes()
    data = bytearray(want)
    data[200] ^= 1  # the shard keeps its size: only its record's checksum tells
    (out / "train_001.bin").write_bytes(bytes(data))
    (out / "tokmix-state/done.json").unlink()
    tokmix.run(inputs["recipe"], out, workers=1, keep_streams=True)
    assert (out / "train_001.bin").read_bytes() == want


def test_a_shard_changed_with_its_record_is_rewritten_from_the_units(finished_run, inputs, tmp_path):
    """A shard and its record changed together (the record's seal and checksum made anew) pass assemble's check;
    the validate stage derives every shard's sha256 from the committed units and the seed, finds this one is not
    what they make, and has it written again: the run ends identical to the clean one."""
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    index = json.loads((out / "index.json").read_text())
    shard = out / "train_001.bin"
    tokens = np.fromfile(shard, dtype=index["dtype"])
    tokens[100] = (tokens[100] + 1) % index["vocab_size"]
    tokens.tofile(shard)
    record_path = out / "tokmix-state/shards" / (shard.name + ".json")
    record = read_json(record_path, sealed=True)
    write_record(record_path, {**record, "checksum": file_checksum(shard)})
    (out / "tokmix-state/done.json").unlink()
    tokmix.run(inputs["recipe"], out, workers=1, keep_streams=True)
    assert shard.read_bytes() == (finished_run / shard.name).read_bytes()


def test_a_finished_run_run_again_remakes_a_shard_edited_with_its_record_and_index(finished_run, inputs, tmp_path,
                                                                                  capfd):
    """The same edit after the run finished, index.json's checksum made anew too: a second run compares index.json
    with the digests derived from the units before they were removed, remakes the shard and ends identical (it
    used to say the run was complete)."""
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    shard = out / "train_002.bin"
    tokens = np.fromfile(shard, dtype=inputs["index"]["dtype"])
    tokens[[7, 8]] = tokens[[8, 7]] if tokens[7] != tokens[8] else (tokens[7] + 1, tokens[8])
    tokens.tofile(shard)
    digest = file_checksum(shard)
    record_path = out / "tokmix-state/shards" / (shard.name + ".json")
    write_record(record_path, {**read_json(record_path, sealed=True), "checksum": digest})
    index = json.loads((out / "index.json").read_text())
    index["shards"][2]["checksum"] = digest
    (out / "index.json").write_text(json.dumps(index, indent=2))
    tokmix.run(inputs["recipe"], out, workers=1, keep_streams=True)
    assert "train_002.bin: not what the committed units and the seed produce (expected.json); remaking it" \
        in capfd.readouterr().out
    assert shard.read_bytes() == (finished_run / shard.name).read_bytes()


def test_a_run_that_fails_validation_says_so(finished_run, inputs, tmp_path):
    """A unit changed with its record (its checksums and seal made anew) holds an id past the vocabulary: the
    shards are remade from it, and validate sees the id; the run ends with its line."""
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    index = json.loads((out / "index.json").read_text())
    units = out / "streams/edu/units"
    tok = np.fromfile(units / "000000.tok", dtype=index["dtype"])
    tok[100] = index["vocab_size"]
    tok.tofile(units / "000000.tok")
    record = read_json(units / "000000.json", sealed=True)
    write_record(units / "000000.json", {**record, "tok_sha256": file_checksum(units / "000000.tok")})
    for path in [*out.glob("train_*.bin"), *out.glob("tokmix-state/shards/*.json"), out / "tokmix-state/done.json"]:
        path.unlink()
    with pytest.raises(TokmixError, match=rf"validation failed: train_\d+.bin: token id {index['vocab_size']} "
                                          "out of range"):
        tokmix.run(inputs["recipe"], out, workers=1, keep_streams=True)


def test_a_resume_keeps_the_unit_size_the_run_started_with(finished_run, inputs, tmp_path):
    """Units are numbered by how files were cut: a resume with another unit size keeps the first cut."""
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    want = {p.name: p.read_bytes() for p in finished_run.glob("*.bin")}
    units = sorted(p.name for p in (out / "streams/dclm/units").iterdir())
    assert "000001.json" in units  # dclm's budget takes two units: the first is committed, the second redone
    _forget_after_streams(out, "dclm")
    (out / "streams/dclm/units/000001.json").unlink()
    tokmix.run(inputs["recipe"], out, workers=1, keep_streams=True, unit_bytes=5_000)
    assert sorted(p.name for p in (out / "streams/dclm/units").iterdir()) == units
    assert {p.name: p.read_bytes() for p in out.glob("*.bin")} == want


def test_file_checksum_is_sha256_of_the_whole_file(tmp_path):
    from tokmix.shards import CHECKSUM_BUFFER_BYTES, file_checksum

    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * (CHECKSUM_BUFFER_BYTES // 256 * 2 + 3))  # more than two reads of it
    assert file_checksum(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def _forget_after_streams(out: Path, stream: str) -> None:
    """As if the run had been killed while `stream` was tokenizing: its record, the shards and what follows gone."""
    (out / f"streams/{stream}/stream.json").unlink()
    for path in [*out.glob("train_*.bin"), *out.glob("tokmix-state/shards/*"), out / "tokmix-state/done.json",
                 out / "tokmix-state/documents_used.json"]:
        path.unlink(missing_ok=True)
