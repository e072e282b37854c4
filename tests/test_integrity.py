"""Integrity: a run never builds on a damaged intermediate. Each committed file (a unit's tokens and document
lengths, the holdout hashes, every record) carries a checksum in its commit record, checked when a stage
process reads it; a damaged one is remade from its source, and the run ends byte-identical to a clean one. A
state file that cannot be remade is named with the remedy. A finished run's second invocation verifies the
checksums of what it would call complete. Real runs, real files damaged on disk, real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import make_inputs
from tokmix.shards import Layout, read_json, write_record

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": "20000"}  # several units per file


def tokmix(*args: object, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**ENV, "TOKMIX_FAULT": fault} if fault else ENV
    return subprocess.run([sys.executable, "-m", "tokmix.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, start_new_session=True, timeout=600)


def run(recipe: Path, out: Path, *more: str, fault: str | None = None) -> subprocess.CompletedProcess:
    return tokmix("run", recipe, "--out", out, "--workers", "2", *more, fault=fault)


def shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_inputs(tmp_path_factory.mktemp("integrity"), doc_limit=300, rows_per_group=16, decontaminate=True)


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory) -> Path:
    """A finished run, uninterrupted (each test damages a copy of it)."""
    out = tmp_path_factory.mktemp("finished") / "out"
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def clean(finished) -> dict[str, bytes]:
    """The shards of the uninterrupted run: what every damaged run must end with (`finished` is that run)."""
    return shards(finished)


def killed_at(corpus: Path, tmp_path_factory, fault: str) -> Path:
    """A run SIGKILLed at a fault point (each test damages a copy of it)."""
    out = tmp_path_factory.mktemp("killed") / "out"
    killed = run(corpus, out, fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def streamed(corpus, tmp_path_factory) -> Path:
    """A run killed as assembly starts: every stream's units committed, no shard yet."""
    out = killed_at(corpus, tmp_path_factory, "assemble:before-rename:1")
    assert list(out.glob("streams/*/units/*.tok")) and not list(out.glob("train_*.bin"))
    return out


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(run_dir, out)
    return out


def flip_bit(path: Path, byte: int) -> None:
    data = bytearray(path.read_bytes())
    data[byte] ^= 0x04
    path.write_bytes(bytes(data))


def unit(out: Path, stream: str = "edu", k: int = 1) -> Path:
    """The k-th committed unit of a stream (counted from the end when negative), without its suffix."""
    names = sorted(p.stem for p in (out / "streams" / stream / "units").glob("*.json"))
    return out / "streams" / stream / "units" / names[k]


# ---------------------------------------------------------------------------- damaged units are remade
def test_a_flipped_bit_in_a_committed_unit_is_remade_from_its_source(corpus, clean, streamed, tmp_path):
    out = copy_of(streamed, tmp_path)
    tok = unit(out, "dclm", -1).with_suffix(".tok")
    flip_bit(tok, tok.stat().st_size // 2)
    proc = run(corpus, out, "--keep-streams")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"unit {tok.with_suffix('')}: damaged (sha256 of {tok.name} differs from its record); remade from its " \
           "source" in proc.stdout
    assert shards(out) == clean
    assert tokmix("validate", out).returncode == 0


@pytest.mark.parametrize("attempt", range(3))
def test_a_truncated_unit_lengths_file_is_remade_from_its_source(corpus, clean, streamed, tmp_path, attempt):
    out = copy_of(streamed, tmp_path)
    lengths = unit(out, ["dclm", "edu", "code_other"][attempt], -1).with_suffix(".len")
    lengths.write_bytes(lengths.read_bytes()[: -4 * (attempt + 1)])
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"unit {lengths.with_suffix('')}: damaged (sha256 of {lengths.name} differs from its record); remade " \
           "from its source" in proc.stdout
    assert shards(out) == clean


def test_a_truncated_unit_token_file_is_remade_not_a_short_shard(corpus, clean, streamed, tmp_path):
    out = copy_of(streamed, tmp_path)
    tok = unit(out, "dclm", 0).with_suffix(".tok")
    tok.write_bytes(tok.read_bytes()[:-64])
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"unit {tok.with_suffix('')}: damaged" in proc.stdout
    assert shards(out) == clean


def test_an_edited_unit_record_is_remade_and_not_blamed_on_the_source_file(corpus, clean, streamed, tmp_path):
    out = copy_of(streamed, tmp_path)
    record_path = unit(out, "code_py", 0).with_suffix(".json")
    record = json.loads(record_path.read_text())
    record["size"] += 1  # what a resume compares with the source file's size
    record["tokens"] -= 5
    record_path.write_text(json.dumps(record))
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"unit {record_path.with_suffix('')}: damaged (its record was changed); remade from its source" \
        in proc.stdout
    assert "changed since this run started" not in proc.stdout + proc.stderr
    assert shards(out) == clean


@pytest.mark.parametrize("damage", ["truncated", "not JSON"])
def test_a_damaged_unit_record_or_stream_record_is_remade(corpus, clean, streamed, tmp_path, damage):
    out = copy_of(streamed, tmp_path)
    for path in (unit(out, "dclm", -1).with_suffix(".json"), out / "streams" / "edu" / "stream.json"):
        path.write_bytes(path.read_bytes()[:10] if damage == "truncated" else b"\x00\xff garbage")
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shards(out) == clean


def test_damaged_holdout_hashes_are_remade(corpus, clean, streamed, tmp_path):
    out = copy_of(streamed, tmp_path)
    hashes = out / "tokmix-state" / "holdout_edu.hashes.npy"
    flip_bit(hashes, hashes.stat().st_size - 3)
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "holdout edu: damaged (sha256 of holdout_edu.hashes.npy differs from its record); remade" in proc.stdout
    assert shards(out) == clean


def test_holdouts_made_before_text_keys_are_remade_and_named_so(corpus, clean, streamed, tmp_path):
    """A run an earlier tokmix began (its holdout records name a lengths file, not a keys file) resumes: each
    holdout is made again, said so without calling it damaged, and the shards are the same."""
    out = copy_of(streamed, tmp_path)
    state = out / "tokmix-state"
    for keys in sorted(state.glob("holdout_*.keys.npy")):
        domain = keys.name[len("holdout_"):-len(".keys.npy")]
        record_path = state / f"holdout_{domain}.json"
        record = read_json(record_path, sealed=True)
        lengths = state / f"holdout_{domain}.lengths.npy"
        lengths.write_bytes(b"an earlier version's lengths")
        record[lengths.name] = record.pop(keys.name)
        write_record(record_path, record)
        keys.unlink()
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for domain in ("dclm", "edu", "code"):
        assert f"holdout {domain}: made by an earlier tokmix, without its documents' text keys; remade" in proc.stdout
        assert (state / f"holdout_{domain}.keys.npy").exists()
    assert "damaged" not in proc.stdout
    assert shards(out) == clean


# ---------------------------------------------------------------------------- damaged shards
@pytest.fixture(scope="module")
def assembled(corpus, tmp_path_factory) -> Path:
    """A run killed after its second shard was committed and recorded."""
    return killed_at(corpus, tmp_path_factory, "assemble:after-record:2")


def test_a_committed_shard_damaged_before_the_resume_is_rewritten(corpus, clean, assembled, tmp_path):
    out = copy_of(assembled, tmp_path)
    # a shard with its record: with two workers the kill may also leave one committed before its record, which
    # a resume rewrites without calling it damaged
    layout = Layout(out)
    done = sorted(p for p in out.glob("train_*.bin") if layout.shard_record(p.name).exists())
    assert done
    flip_bit(done[0], 100)
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{done[0].name}: damaged (sha256 differs from its record); rewritten" in proc.stdout
    assert shards(out) == clean


@pytest.fixture(scope="module")
def finished_kept(corpus, tmp_path_factory) -> Path:
    """A finished run that kept its intermediates."""
    out = tmp_path_factory.mktemp("finished-kept") / "out"
    assert run(corpus, out, "--keep-streams").returncode == 0
    return out


def test_a_finished_run_again_verifies_checksums_and_remakes_a_damaged_shard(corpus, clean, finished, tmp_path):
    out = copy_of(finished, tmp_path)
    again = run(corpus, out)
    assert again.returncode == 0
    assert f"already complete: sha256 of {len(clean) - 3} shard(s) and 3 holdout(s) verified; nothing to do" \
        in again.stdout
    flip_bit(out / "train_001.bin", 1001)
    validate = tokmix("validate", out)
    assert validate.returncode == 1 and "train_001.bin: sha256 checksum differs from index.json" in validate.stderr
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train_001.bin: damaged (sha256 differs from index.json); remaking it" in proc.stdout
    assert "already complete" not in proc.stdout
    assert shards(out) == clean
    assert tokmix("validate", out).returncode == 0


# ---------------------------------------------------------------------------- state files that cannot be remade
@pytest.fixture(scope="module")
def midstream(corpus, tmp_path_factory) -> Path:
    """A run killed while its streams are being tokenized."""
    return killed_at(corpus, tmp_path_factory, "streams:after-unit:2")


@pytest.mark.parametrize("name", ["recipe.json", "unit_bytes.json", "tokenizer.checksum.json"])
def test_a_damaged_identity_record_is_named_with_the_remedy(corpus, midstream, tmp_path, name):
    out = copy_of(midstream, tmp_path)
    path = out / "tokmix-state" / name
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    proc = run(corpus, out)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err and "internal error" not in err, err
    assert err.startswith(f"error: {path}: damaged (") and err.endswith("use --restart to start over"), err
    assert run(corpus, out, "--restart").returncode == 0


def _truncate_resume_and_compare(corpus, clean, out: Path, name: str) -> None:
    """Cut a state file (or index.json) to 7 bytes, run again: it is remade, the shards are a clean run's."""
    path = out / ("index.json" if name == "index.json" else f"tokmix-state/{name}")
    path.write_bytes(path.read_bytes()[:7])
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shards(out) == clean
    assert tokmix("validate", out).returncode == 0


@pytest.mark.parametrize("name", ["done.json", "index.json", "timings.json"])
def test_a_damaged_state_file_of_a_finished_run_is_remade(corpus, clean, finished_kept, tmp_path, name):
    out = copy_of(finished_kept, tmp_path)
    _truncate_resume_and_compare(corpus, clean, out, name)


@pytest.fixture(scope="module")
def assembled_all(corpus, tmp_path_factory) -> Path:
    """A run killed once every shard and the index were written, before validation."""
    return killed_at(corpus, tmp_path_factory, "validate:before:1")


@pytest.mark.parametrize("name", ["index.json", "backend.json", "documents_used.json", "shards/train_001.bin.json",
                                  "timings.json"])
def test_a_damaged_state_file_of_a_stopped_run_is_remade(corpus, clean, assembled_all, tmp_path, name):
    out = copy_of(assembled_all, tmp_path)
    _truncate_resume_and_compare(corpus, clean, out, name)


def test_every_command_names_a_damaged_index_in_one_line(corpus, finished, tmp_path):
    out = tmp_path / "run [v2]"
    shutil.copytree(finished, out)
    (out / "index.json").write_bytes((out / "index.json").read_bytes()[:100])
    for command in ("validate", "status", "inspect", "report"):
        proc = tokmix(command, out)
        err = proc.stderr.strip()
        assert proc.returncode in (1, 2) and "\n" not in err and "Traceback" not in err, (command, err[-2000:])
        assert f"{out / 'index.json'}: " in err and ("damaged" in err or "not valid JSON" in err), (command, err)
