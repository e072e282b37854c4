"""`tokmix validate`, one check at a time: a copy of a real finished run gets exactly one thing wrong (a holdout
byte, an id equal to the vocabulary size, an overlap token, a first delimiter, a per-stream count, ...) and the
command must print exactly the line(s) naming it and exit 1. Where a corruption of a file would also change its
checksum, the index is given the new checksum, so that the check under test is the only one that can see it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tokmix.cli import app
from tokmix.provenance import read_docs
from tokmix.shards import file_checksum, read_json, write_record


@pytest.fixture
def run(finished_run, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    return out


def validate(out: Path) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["validate", str(out)])
    return result.exit_code, result.stderr.splitlines()


def index_of(out: Path) -> dict:
    return json.loads((out / "index.json").read_text())


def edit_index(out: Path, change) -> None:
    index = index_of(out)
    change(index)
    (out / "index.json").write_text(json.dumps(index, indent=2))


def set_tokens(out: Path, name: str, edits: dict[int, int], checksum: bool = True) -> None:
    """Tokens of file `name` set at positions (negative from the end); its checksum in the index (and a shard's
    digest derived from the units, in tokmix-state/expected.json) follows them when `checksum`, so only the check
    under test sees the change."""
    path = out / name
    tokens = np.fromfile(path, dtype=index_of(out)["dtype"])
    for position, value in edits.items():
        tokens[position] = value
    tokens.tofile(path)
    if checksum:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        edit_index(out, lambda index: [e.update(checksum=digest) for e in [*index["shards"], *index["val"].values()]
                                       if e["file"] == name])
        expected = read_json(out / "tokmix-state/expected.json", sealed=True)
        if name in expected["shards"]:  # and the digest derived from the units, resealed
            write_record(out / "tokmix-state/expected.json", {**expected, "shards": {**expected["shards"],
                                                                                     name: digest}})


def test_the_untouched_copy_is_valid(run):
    code, lines = validate(run)
    assert (code, lines) == (0, [])


def test_a_missing_shard(run):
    (run / "train_001.bin").unlink()
    # the next shard has no previous last token to compare with: only the missing file is named
    assert validate(run) == (1, ["train_001.bin: missing"])


def test_a_shard_that_is_not_whole_tokens(run):
    with open(run / "train_002.bin", "ab") as f:
        f.write(b"\0")
    assert validate(run) == (1, ["train_002.bin: 12803 bytes is not a whole number of uint16 tokens"])


def test_a_truncated_shard_is_named_by_its_count_and_its_checksum(run):
    path = run / "train_003.bin"
    path.write_bytes(path.read_bytes()[:-2])
    assert validate(run) == (1, ["train_003.bin: 3,328 tokens, expected 3,329 (52 blocks)",
                                 "train_003.bin: sha256 checksum differs from index.json (file changed or corrupt)"])


def test_a_shard_token_count_in_the_index(run):
    edit_index(run, lambda index: index["shards"][2].update(tokens=6400))
    assert validate(run) == (1, ["train_002.bin: 6,401 tokens, expected 6,401 (100 blocks)"])


def test_a_shard_block_count_in_the_index(run):
    edit_index(run, lambda index: index["shards"][3].update(blocks=51))
    assert validate(run) == (1, ["train_003.bin: 3,329 tokens, expected 3,265 (51 blocks)",
                                 "train_003.bin: tokens_by_stream sums to 3,328, expected 3,264"])


def test_an_id_equal_to_the_vocabulary_size_in_a_shard(run):
    vocab = index_of(run)["vocab_size"]
    set_tokens(run, "train_001.bin", {500: vocab})
    assert validate(run) == (1, [f"train_001.bin: token id {vocab} out of range (vocabulary {vocab:,})"])


def test_the_largest_id_is_in_range(run):
    vocab = index_of(run)["vocab_size"]
    set_tokens(run, "train_001.bin", {500: vocab - 1})
    assert validate(run) == (0, [])


def test_a_flipped_shard_byte_names_its_block(run):
    set_tokens(run, "train_000.bin", {17 * 64 + 5: 7, 40 * 64: 9}, checksum=False)
    assert validate(run) == (1, ["train_000.bin: sha256 checksum differs from index.json (file changed or corrupt): "
                                 "block 17 (tokens 1,088-1,152), block 40 (tokens 2,560-2,624)"])


def test_the_first_delimiter_of_the_first_shard(run):
    set_tokens(run, "train_000.bin", {0: 5})
    assert validate(run) == (1, ["train_000.bin: does not start with <|endoftext|>"])


def test_the_overlap_token_between_shards(run):
    last = int(np.fromfile(run / "train_001.bin", dtype=np.uint16)[-1])
    set_tokens(run, "train_002.bin", {0: last + 1})
    assert validate(run) == (1, [f"train_002.bin: first token {last + 1} does not repeat the previous shard's last "
                                 f"token {last}"])


def test_the_overlap_token_of_the_earlier_shard(run):
    first = int(np.fromfile(run / "train_003.bin", dtype=np.uint16)[0])
    set_tokens(run, "train_002.bin", {-1: first + 1})
    assert validate(run) == (1, [f"train_003.bin: first token {first} does not repeat the previous shard's last "
                                 f"token {first + 1}"])


def test_a_per_stream_token_count_of_a_shard(run):
    edit_index(run, lambda index: index["shards"][1]["tokens_by_stream"].update(
        edu=index["shards"][1]["tokens_by_stream"]["edu"] + 1))
    assert validate(run) == (1, ["train_001.bin: tokens_by_stream sums to 6,401, expected 6,400",
                                 "index.json: total.tokens_by_stream does not equal the sum over shards",
                                 "index.json: shards hold a different number of tokens than blocks x seq_len + 1"])


def test_the_first_shard_counts_its_first_token(run):
    """Shard 0 counts all its tokens by stream; every later one leaves out the token it repeats."""
    edit_index(run, lambda index: index["shards"][0]["tokens_by_stream"].update(
        dclm=index["shards"][0]["tokens_by_stream"]["dclm"] - 1))
    code, lines = validate(run)
    assert (code, lines[0]) == (1, "train_000.bin: tokens_by_stream sums to 6,400, expected 6,401")


def test_the_total_per_stream_count(run):
    edit_index(run, lambda index: index["total"]["tokens_by_stream"].update(
        code_py=index["total"]["tokens_by_stream"]["code_py"] + 1))
    assert validate(run) == (1, ["index.json: total.tokens_by_stream does not equal the sum over shards"])


def test_the_total_block_count(run):
    edit_index(run, lambda index: index.update(blocks=index["blocks"] - 1))
    assert validate(run) == (1, ["index.json: shards hold a different number of tokens than blocks x seq_len + 1"])


def test_a_missing_holdout(run):
    (run / "val_edu.bin").unlink()
    assert validate(run) == (1, ["val_edu.bin: missing (holdout edu)"])


def test_a_holdout_byte(run):
    path = run / "val_code.bin"
    data = bytearray(path.read_bytes())
    data[1000] ^= 0x01  # the low byte of token 500: still an id in range
    path.write_bytes(bytes(data))
    assert validate(run) == (1, ["val_code.bin: sha256 checksum differs from index.json (file changed or corrupt)"])


def test_a_holdout_token_count(run):
    edit_index(run, lambda index: index["val"]["dclm"].update(tokens=index["val"]["dclm"]["tokens"] + 1))
    assert validate(run) == (1, ["val_dclm.bin: 3,001 tokens, index.json says 3,002"])


def test_a_truncated_holdout(run):
    path = run / "val_dclm.bin"
    path.write_bytes(path.read_bytes()[:-2])
    assert validate(run) == (1, ["val_dclm.bin: 3,000 tokens, index.json says 3,001",
                                 "val_dclm.bin: sha256 checksum differs from index.json (file changed or corrupt)"])


def test_an_id_equal_to_the_vocabulary_size_in_a_holdout(run):
    vocab = index_of(run)["vocab_size"]
    set_tokens(run, "val_edu.bin", {-1: vocab})
    assert validate(run) == (1, [f"val_edu.bin: token id {vocab} out of range (vocabulary {vocab:,})"])


def test_the_first_delimiter_of_a_holdout(run):
    set_tokens(run, "val_dclm.bin", {0: 3})
    assert validate(run) == (1, ["val_dclm.bin: does not start with <|endoftext|>"])


def test_an_index_that_is_not_json(run):
    (run / "index.json").write_text('{"shards": [')
    code, lines = validate(run)
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"{run / 'index.json'}: not valid JSON (")


def test_an_index_without_shards(run):
    edit_index(run, lambda index: index.update(shards=[]))
    assert validate(run) == (1, [f"{run}: no index.json with shards (the run has not finished assembling)"])


def test_a_share_off_its_target_is_a_warning_not_a_failure(run):
    edit_index(run, lambda index: index["mix"]["target_share_by_stream"].update(edu=0.30))
    result = CliRunner().invoke(app, ["validate", str(run)])
    assert result.exit_code == 0 and result.stderr == ""
    realized = index_of(run)["total"]["share_by_stream"]["edu"]
    assert f"warning: stream edu: realized share {realized:.4f} vs target 0.3000" in result.stdout


def test_two_swapped_tokens_name_their_block(run):
    """The block fingerprints weigh each position differently: a swap within a block changes it too."""
    tokens = np.fromfile(run / "train_001.bin", dtype=np.uint16)
    at = next(p for p in range(10 * 64, 11 * 64 - 1) if tokens[p] != tokens[p + 1])
    set_tokens(run, "train_001.bin", {at: int(tokens[at + 1]), at + 1: int(tokens[at])}, checksum=False)
    assert validate(run) == (1, ["train_001.bin: sha256 checksum differs from index.json (file changed or corrupt): "
                                 "block 10 (tokens 640-704)"])


# ---------------------------------------------------------------------------- the provenance index
def edit_documents(out: Path, name: str, change, checksum: bool = True) -> None:
    """The records of provenance index `name` changed by `change`; its checksum in the index follows when
    `checksum`, so only the check under test sees the change."""
    path = out / name
    records = read_docs(path)
    change(records)
    records.tofile(path)
    if checksum:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        edit_index(out, lambda index: [e["provenance"].update(checksum=digest) for e in
                                       [*index["shards"], *index["val"].values()] if e["provenance"]["file"] == name])


def test_a_missing_provenance_index(run):
    (run / "train_001.docs").unlink()
    assert validate(run) == (1, ["train_001.docs: missing (the provenance index of train_001.bin)"])


def test_a_flipped_byte_of_a_provenance_index(run):
    def flip(records):
        records["crc32"][3] ^= 1 << 9

    edit_documents(run, "train_002.docs", flip, checksum=False)
    assert validate(run) == (1, ["train_002.docs: sha256 checksum differs from index.json (file changed or corrupt)"])


def test_a_truncated_provenance_index(run):
    path = run / "val_edu.docs"
    path.write_bytes(path.read_bytes()[:-16])
    code, lines = validate(run)
    assert code == 1 and lines[1].startswith("val_edu.docs: ") and "bytes, index.json records" in lines[1]
    assert lines[0] == "val_edu.docs: sha256 checksum differs from index.json (file changed or corrupt)"


def test_two_document_lengths_moved_in_a_provenance_index(run):
    """One token moved from a document to the next: the same total, but not where the shard's documents start."""
    def move(records):
        records["tokens"][4] += 1
        records["tokens"][5] -= 1

    edit_documents(run, "train_001.docs", move)
    starts = np.cumsum(read_docs(run / "train_001.docs")["tokens"], dtype=np.int64)
    assert validate(run) == (1, [f"train_001.docs: its documents do not start where train_001.bin's delimiters do "
                                 f"(first at token {int(starts[4]) - 1:,})"])


def test_a_provenance_index_whose_tokens_are_not_its_files(run):
    def grow(records):
        records["tokens"][-1] += 3

    edit_documents(run, "val_code.docs", grow)
    assert validate(run) == (1, ["val_code.docs: its documents hold 3,004 tokens, val_code.bin 3,001"])


def test_a_source_past_the_table_in_a_provenance_index(run):
    sources = len(index_of(run)["provenance"]["sources"])

    def retarget(records):
        records["source"][2] = sources

    edit_documents(run, "train_000.docs", retarget)
    assert validate(run) == (1, [f"train_000.docs: document 2 names source {sources}, the table has {sources}"])


def test_a_shard_edited_with_its_record_and_index_is_not_what_the_units_make(run):
    """Two tokens of a shard swapped, and its checksum made anew in index.json and in its record: every check of
    the files against each other passes, but the shard is not what the committed units and the seed produce
    (the sha256 the run derived from them while they existed, kept in tokmix-state/expected.json)."""
    tokens = np.fromfile(run / "train_001.bin", dtype=np.uint16)
    at = next(p for p in range(10 * 64, 11 * 64 - 1) if tokens[p] != tokens[p + 1])
    set_tokens(run, "train_001.bin", {at: int(tokens[at + 1]), at + 1: int(tokens[at])}, checksum=False)
    digest = file_checksum(run / "train_001.bin")
    edit_index(run, lambda index: index["shards"][1].update(checksum=digest))
    record = run / "tokmix-state/shards/train_001.bin.json"
    write_record(record, {**read_json(record, sealed=True), "checksum": digest})
    assert validate(run) == (1, ["train_001.bin: not what the committed units and the seed produce (sha256 differs "
                                 "from the one derived from them, tokmix-state/expected.json): block 10 (tokens "
                                 "640-704)"])


@pytest.mark.parametrize("damage", ["another seed", "its seal broken"])
def test_the_kept_digests_are_themselves_checked(run, damage):
    path = run / "tokmix-state/expected.json"
    expected = read_json(path, sealed=True)
    if damage == "another seed":
        write_record(path, {**expected, "seed": expected["seed"] + 1})
        want = [f"index.json: seed {expected['seed']} and 4 shard(s), but the shards were derived with seed "
                f"{expected['seed'] + 1} and 4 shard(s) (tokmix-state/expected.json)"]
    else:
        path.write_text(path.read_text().replace('"seed": ', '"seed": 1'))
        want = [f"{path}: damaged (its record was changed): the shards cannot be checked against the units they "
                "were made of"]
    assert validate(run) == (1, want)


def test_a_run_without_kept_digests_says_what_was_not_checked(run):
    """A run of a tokmix before the digests were kept: no expected.json, and an index that does not name it (one
    that names it and lost it fails: test_untrusted_state)."""
    (run / "tokmix-state/expected.json").unlink()
    index = json.loads((run / "index.json").read_text())
    del index["derived_digests"]
    (run / "index.json").write_text(json.dumps(index))
    result = CliRunner().invoke(app, ["validate", str(run)])
    assert result.exit_code == 0
    assert "note: no tokmix-state/expected.json: the shards were checked against index.json, not against what the " \
           "committed units and the seed produce" in result.stdout
