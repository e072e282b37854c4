"""Crash safety, for real: `tokmix run` in its own process group is SIGKILLed at named points inside every
stage (TOKMIX_FAULT makes it kill its whole group there), run again until it finishes, and every output
file is compared byte for byte with an uninterrupted run. Also: the restart protocol, Ctrl-C/SIGTERM, the
lock, a full disk, and tokenizer training that never reads a holdout file."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokmix
from tests.corpus import make_corpus, write_recipe, write_split
from tokmix.faults import POINTS
from tokmix.sources import Piece, Unit
from tokmix.stages.streams import _changed_source

ROOT = Path(__file__).resolve().parents[1]
UNIT_BYTES = 20_000  # several units per file, so kills land between units
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def tokmix_run(recipe: Path, out: Path, fault: str | None = None, unit_bytes: int = UNIT_BYTES, *args: str,
               **popen) -> subprocess.CompletedProcess:
    env = {**ENV, "TOKMIX_UNIT_BYTES": str(unit_bytes)}
    if fault:
        env["TOKMIX_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--workers",
                           "2", *args], capture_output=True, text=True, env=env, start_new_session=True, **popen)


def outputs(out: Path) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in sorted([*out.glob("*.bin"), *out.glob("*.docs")])}
    files["tokenizer.json"] = (out / "tokenizer.json").read_bytes()
    index = json.loads((out / "index.json").read_text())
    for volatile in ("throughput", "tokenizer"):
        index.pop(volatile)
    for meta in index["mix"]["streams"].values():
        for key in ("seconds_last_run", "tok_s_end_to_end", "tok_s_tokenizer_capacity"):
            meta.pop(key)
    files["index.json"] = json.dumps(index, sort_keys=True).encode()
    return files


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("faults")
    files = make_corpus(root, doc_limit=400, rows_per_group=16)
    write_split(root, files)
    recipe = write_recipe(root, "unused", decontaminate=True)
    text = recipe.read_text().replace('path = "unused"', "[tokenizer.train]\nvocab_size = 600")
    text = text.replace("[tokenizer]\n", "")
    recipe.write_text(text)
    return recipe


@pytest.fixture(scope="module")
def clean_dir(corpus, tmp_path_factory) -> Path:
    """An uninterrupted run, its intermediates kept: the expected bytes of every file a killed run may show."""
    out = tmp_path_factory.mktemp("clean")
    proc = tokmix_run(corpus, out, None, UNIT_BYTES, "--keep-streams")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def clean(clean_dir) -> dict[str, bytes]:
    return outputs(clean_dir)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> Path:
    """A run killed at its first point, its tokenizer trained (tokenizer:after-train): where every chain but
    first-hits (which kills a fresh run there itself) starts, each from a copy, instead of training the same
    tokenizer again in a fresh run of its own (~1.4 CPU-s a chain: two processes and the trainer)."""
    out = tmp_path_factory.mktemp("trained") / "out"
    killed = tokmix_run(corpus, out, "tokenizer:after-train:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (out / "tokenizer.json").exists() and not list(out.glob("val_*.bin"))
    return out


def expected_sizes(recipe: Path) -> dict[str, int]:
    """Bytes of every train and val file, from the recipe's numbers alone (uint16 tokens): shard k holds its
    blocks x seq_len + 1 tokens, a holdout its tokens + 1."""
    r = tokmix.load_recipe(recipe)
    layout = r.layout
    blocks = (layout.steps + layout.margin_steps) * layout.seqs_per_step
    per_shard = layout.shard_tokens // layout.seq_len
    plan = [per_shard] * (blocks // per_shard) + ([blocks % per_shard] if blocks % per_shard else [])
    sizes = {f"train_{k:03d}.bin": 2 * (b * layout.seq_len + 1) for k, b in enumerate(plan)}
    domains = {stream.domain for stream in r.streams.values()}
    return sizes | {f"val_{d}.bin": 2 * (r.holdout.tokens + 1) for d in domains}


def assert_every_visible_file_is_whole(out: Path, clean_dir: Path, recipe: Path) -> None:
    """After a kill: every file under a final name is complete. Train and val files have the size the recipe
    gives and the clean run's bytes; every JSON file parses, and index.json and the shard records say what the
    clean run's say; a unit's token and length files agree with each other and with the clean run's unit
    (which may have been cut at its limit, or not: one is a prefix of the other, ending at a document), and so
    do its documents' places; a provenance index is the clean run's."""
    sizes = expected_sizes(recipe)
    for path in sorted(p for p in out.rglob("*") if p.is_file() and ".tmp-" not in p.name):
        name, twin = path.relative_to(out).as_posix(), clean_dir / path.relative_to(out)
        data = path.read_bytes()
        if name in sizes:
            assert len(data) == sizes[name] and data == twin.read_bytes(), name
        elif path.suffix == ".json":
            record = json.loads(data)  # a half-written JSON file does not parse
            if name.startswith("tokmix-state/shards/"):
                assert record == json.loads(twin.read_text()), name
            if name == "index.json":
                want = json.loads(twin.read_text())
                assert {d: v for d, v in record["val"].items()} == {d: want["val"][d] for d in record["val"]}
                assert record.get("shards", want["shards"]) == want["shards"]
        elif path.suffix in (".tok", ".len"):
            _assert_unit_file_whole(path, twin)
        elif path.suffix in (".npy", ".fingerprints", ".docs") or name == "tokenizer.json":
            assert data == twin.read_bytes(), name
        elif path.suffix == ".src":  # a unit's document places: whole records, the clean unit's or a prefix of it
            want = twin.read_bytes()
            assert len(data) % 16 == 0 and (want.startswith(data) or data.startswith(want)), name


def _assert_unit_file_whole(path: Path, twin: Path) -> None:
    tok, lengths = path.with_suffix(".tok"), path.with_suffix(".len")
    want_tokens = twin.with_suffix(".tok").read_bytes()
    want_ends = 2 * np.cumsum(np.fromfile(twin.with_suffix(".len"), dtype="<u4"), dtype=np.int64)
    got = tok.read_bytes()
    assert want_tokens.startswith(got) or got.startswith(want_tokens), path
    if lengths.exists():
        ends = 2 * np.cumsum(np.fromfile(lengths, dtype="<u4"), dtype=np.int64)
        assert len(ends) and ends[-1] == len(got), f"{path}: its .len and .tok disagree"
        assert np.array_equal(ends[: len(want_ends)], want_ends[: len(ends)]), path
    else:  # only the token file committed: it ends where a document of the clean run's unit ends
        assert len(got) in set(want_ends.tolist()) or got.startswith(want_tokens), path


# Every point of POINTS is killed at its first hit, some at a later one (the token cache's points in
# tests/test_cache.py, with a cache: this suite runs without one; publish's in test_store.py; the trainer's, the
# backend check's and report's are where tests/test_leftovers.py stops a run). A chain kills a
# run at its first point, runs it again until the next point kills it, and so on, in stage order (every
# resume is itself killed), then resumes it to the end: first-hits from a fresh run, the others from a copy of
# `trained` (a run killed at tokenizer:after-train, first-hits' first point). Hit counts are per process: with 6
# units and 4 shards over 2 workers, each resume still has the work its point needs.
ELSEWHERE = ("runner:before-restart", "publish:before-index", "write:middle",  # the chains below, test_store.py
             "tokenizer:training", "backend:checking", "report:before-write")  # test_leftovers.py
FIRST_HITS = [f"{p}:1" for p in POINTS if p not in ELSEWHERE and not p.startswith("cache:")]
CHAINS = {
    "first-hits": FIRST_HITS,
    # later hits: the streams stage has 6 units, so one later streams point a chain, then an assemble point
    "later-hits-1": ["holdout:after-write:2", "streams:after-unit:3", "assemble:before-rename:2"],
    "later-hits-2": ["streams:unit-before-rename:4", "assemble:after-rename:2"],
    "later-hits-3": ["streams:unit-before-record:3"],
    "later-hits-4": ["streams:unit-mid-write:3"],
    # during the restart protocol: the stage process exits for a restart, then the supervisor is killed
    "restart-protocol": ["streams:after-unit:2:restart,runner:before-restart:1"],
    # in the middle of writing a file: the n-th write of some process (holdouts, records, index, a unit's tokens,
    # a shard)
    "mid-write": ["write:middle:1", "write:middle:5", "write:middle:13"],
}


@pytest.mark.parametrize("chain", list(CHAINS))
def test_kill_anywhere_then_resume_ends_identical(corpus, clean, clean_dir, trained, tmp_path, chain):
    if chain != "first-hits":
        shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    for fault in CHAINS[chain]:
        killed = tokmix_run(corpus, tmp_path, fault)
        assert killed.returncode == -signal.SIGKILL, (fault, killed.returncode, killed.stderr[-2000:])
        assert_every_visible_file_is_whole(tmp_path, clean_dir, corpus)
    resumed = tokmix_run(corpus, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert outputs(tmp_path) == clean
    assert not list(tmp_path.rglob("*.tmp-*")), "temporary files are swept"


def test_a_restart_exit_resumes_inside_the_same_command(corpus, clean, tmp_path):
    proc = tokmix_run(corpus, tmp_path, "streams:after-unit:2:restart")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "restarting the stage process" in proc.stdout
    assert outputs(tmp_path) == clean


def test_sigterm_stops_cleanly_and_says_how_to_resume(corpus, clean, tmp_path):
    env = {**ENV, "TOKMIX_UNIT_BYTES": str(UNIT_BYTES), "TOKMIX_FAULT": "streams:after-unit:2:pause"}
    fifo = tmp_path / "paused"
    env["TOKMIX_PAUSE_FIFO"] = str(fifo)
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "tokmix.cli", "run", str(corpus), "--out", str(tmp_path / "o"),
                             "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    with open(fifo) as f:  # blocks until the stage process stands at the pause point
        assert f.read() == "paused"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "committed work is kept" in stderr and "tokmix run" in stderr
    assert tokmix_run(corpus, tmp_path / "o").returncode == 0
    assert outputs(tmp_path / "o") == clean


def test_worker_processes_killed_or_stopped_leave_nothing_behind_and_resume(corpus, clean, tmp_path):
    """--executor processes: a SIGKILL of the whole group inside a worker process's unit, then SIGTERM while
    workers run: the stage process kills its workers (none outlives the run), and the resumed run is
    byte-identical to an uninterrupted one."""
    out, processes = tmp_path / "o", ("--executor", "processes")
    killed = tokmix_run(corpus, out, "streams:unit-before-rename:1", UNIT_BYTES, *processes)
    assert killed.returncode == -signal.SIGKILL or killed.returncode == 128 + signal.SIGKILL, killed.stderr[-2000:]
    assert list(out.rglob("*.tok.tmp-*")), "the kill landed inside a unit"
    fifo = tmp_path / "paused"
    os.mkfifo(fifo)
    env = {**ENV, "TOKMIX_UNIT_BYTES": str(UNIT_BYTES), "TOKMIX_FAULT": "streams:after-unit:2:pause",
           "TOKMIX_PAUSE_FIFO": str(fifo)}
    proc = subprocess.Popen([sys.executable, "-m", "tokmix.cli", "run", str(corpus), "--out", str(out), "--workers",
                             "2", *processes], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    with open(fifo) as f:  # blocks until the stage process stands at the pause point, its workers started
        assert f.read() == "paused"
    workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]
    assert workers, "no worker process"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "committed work is kept" in stderr
    assert not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "a worker outlived"
    assert tokmix_run(corpus, out, None, UNIT_BYTES, *processes).returncode == 0
    assert outputs(out) == clean


def test_a_restart_for_memory_starts_one_worker_process_fewer(corpus, clean, tmp_path):
    """The stage process of a run with two worker processes exits for a restart as the memory guard does (what
    its workers held passed the budget, more than local_workers counted them for): the next start, in the same
    command, runs one worker process, says so, and the output is an uninterrupted run's."""
    out = tmp_path / "o"
    env = {**ENV, "TOKMIX_UNIT_BYTES": str(UNIT_BYTES), "TOKMIX_FAULT": "streams:after-unit:2:restart",
           "TOKMIX_FAULT_ONCE": str(tmp_path / "fired")}
    proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(corpus), "--out", str(out), "--workers",
                           "2", "--executor", "processes"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "fired").exists()
    said = proc.stdout + proc.stderr
    assert "the next start runs 1 worker process instead of 2" in said
    assert said.index("the next start runs 1") < said.index("restarting the stage process")
    assert json.loads((out / "tokmix-state" / "options.json").read_text())["worker_processes"] == 1
    assert outputs(out) == clean


def test_a_second_run_on_the_same_directory_is_refused_and_a_stale_lock_taken_over(corpus, clean, tmp_path):
    state = tmp_path / "tokmix-state"
    state.mkdir()
    (state / "lock").write_text(f"{os.uname().nodename} {os.getpid()}")  # a live owner: this test process,
    with open(state / "lock") as held:  # holding the lock as a run does
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = tokmix_run(corpus, tmp_path)
    assert proc.returncode == 2
    assert f"another tokmix run (pid {os.getpid()}) is writing this directory" in proc.stderr
    dead = subprocess.Popen(["true"])
    dead.wait()
    (state / "lock").write_text(f"{os.uname().nodename} {dead.pid}")  # a killed run's: it holds nothing
    assert tokmix_run(corpus, tmp_path).returncode == 0
    assert outputs(tmp_path) == clean


def test_a_full_disk_is_one_clear_line_and_the_resumed_run_is_identical(corpus, clean, tmp_path):
    def small_files() -> None:  # no file may grow past 11 kB: the tokenizer and holdouts fit, units do not
        resource.setrlimit(resource.RLIMIT_FSIZE, (11_000, 11_000))

    proc = tokmix_run(corpus, tmp_path, preexec_fn=small_files)
    assert proc.returncode == 2
    assert "no space left writing" in proc.stderr and "committed work is kept" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    kept = sorted(p.name for p in tmp_path.glob("val_*.bin"))
    assert kept, "the holdouts finished before the failure are kept"
    assert tokmix_run(corpus, tmp_path).returncode == 0
    assert outputs(tmp_path) == clean


def test_tokenizer_training_never_reads_a_holdout_file(corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus.parent, root)
    split = json.loads((root / "data/file_splits.json").read_text())
    for entry in split.values():
        for name in entry["holdout"]:
            (root / name).write_bytes(b"not a parquet file")  # unreadable: any read fails loudly
    proc = tokmix_run(root / "recipe.toml", tmp_path / "o")
    assert (tmp_path / "o" / "tokenizer.json").exists(), "training finished without touching holdout files"
    assert proc.returncode == 2
    assert "corpus/dclm/part-3.parquet" in proc.stderr and "stream dclm" in proc.stderr


def _committed_units(out: Path) -> dict[str, bytes]:
    """Every committed unit's files (its record is the commit), by path."""
    names = [p.with_suffix("") for p in out.glob("streams/*/units/*.json")]
    return {str(p.relative_to(out)) + ext: p.with_suffix(ext).read_bytes() for p in names for ext in (".tok", ".len")}


def test_a_tokenizer_or_source_file_changed_since_the_run_started_is_refused(corpus, clean, tmp_path):
    """Killed mid-stream; then the tokenizer, or the train files, get other bytes: each resume is refused with one
    line naming the file, and keeps every committed unit; with the files restored it ends identical."""
    root, out = tmp_path / "c", tmp_path / "o"
    shutil.copytree(corpus.parent, root)
    recipe = root / "recipe.toml"
    assert tokmix_run(recipe, out, "streams:after-unit:3").returncode == -signal.SIGKILL
    committed = _committed_units(out)
    assert committed

    tokenizer = out / "tokenizer.json"  # the recipe has tokmix train it there
    original = tokenizer.read_bytes()
    changed = json.loads(original)
    changed["model"]["merges"] = changed["model"]["merges"][:-1]
    tokenizer.write_text(json.dumps(changed))
    proc = tokmix_run(recipe, out)
    assert proc.returncode == 2
    assert f"tokenizer {tokenizer}: changed since this run started (sha256 " in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert _committed_units(out) == committed
    tokenizer.write_bytes(original)

    split = json.loads((root / "data/file_splits.json").read_text())
    trains = [root / name for entry in split.values() for name in entry["train"]]
    for path in trains:  # the same rows in the same row groups, each text one character longer
        table = pq.read_table(path)
        texts = [t + "!" if t else t for t in table["text"].to_pylist()]
        pq.write_table(table.set_column(1, "text", pa.array(texts)), path, row_group_size=16)
    proc = tokmix_run(recipe, out)
    assert proc.returncode == 2
    assert re.search(r"stream \w+: file \S+/part-\d\.parquet: changed since this run started \([\d,]+ bytes when "
                     r"unit \d+ was written, now [\d,]+\)", proc.stderr), proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert _committed_units(out) == committed

    for path in trains:
        shutil.copy(corpus.parent / path.relative_to(root), path)
    assert tokmix_run(recipe, out).returncode == 0
    resumed = outputs(out)
    assert {name: resumed[name] for name in clean if name != "index.json"} == \
           {name: data for name, data in clean.items() if name != "index.json"}
    index = json.loads((out / "index.json").read_text())
    assert index["tokenizer_sha256"] == hashlib.sha256(original).hexdigest()
    assert index["tokmix_version"] == tokmix.__version__


def _as_jsonl(root: Path) -> Path:
    """The copied corpus under `root` with every parquet file turned into a JSONL file of the same records (its
    split file and recipe renamed to match); returns the recipe."""
    for path in root.glob("corpus/*/*.parquet"):
        lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in pq.read_table(path).to_pylist()]
        path.with_suffix(".jsonl").write_text("".join(lines), encoding="utf-8")
        path.unlink()
    for name in ("data/file_splits.json", "recipe.toml"):
        (root / name).write_text((root / name).read_text().replace(".parquet", ".jsonl"))
    return root / "recipe.toml"


def test_a_jsonl_file_that_changed_length_is_refused_where_its_committed_ranges_still_match(corpus, clean, tmp_path):
    """A JSONL file is cut into byte ranges, and a committed unit records its range: a file edited to another
    length is cut into the same ranges until its last one, so a resume whose committed units all end before it
    compared equal, and went on to read the shifted rest of the new version after the old version's units.
    Each unit now records its files' whole sizes."""
    root, out = tmp_path / "c", tmp_path / "o"
    shutil.copytree(corpus.parent, root)
    recipe = _as_jsonl(root)
    small = 4_000  # units of ~1k tokens: no stream's budget is held by the 3 units committed before the kill
    assert tokmix_run(recipe, out, "streams:after-unit:3", unit_bytes=small).returncode == -signal.SIGKILL
    committed = _committed_units(out)
    reached: dict[Path, int] = {}  # how far into each file the committed units went
    for record in (json.loads(p.read_text()) for p in out.glob("streams/*/units/*.json")):
        for path, _, _, stop in record["pieces"]:
            reached[Path(path)] = max(reached.get(Path(path), 0), stop)
    changed = [path for path, stop in reached.items() if stop < path.stat().st_size]
    assert changed, "some file's committed units end before it does"
    originals = {path: path.read_bytes() for path in changed}
    for path in changed:  # its first document one character longer: the cuts after it move by a byte
        path.write_bytes(originals[path].replace(b'"text": "', b'"text": "!', 1))
    proc = tokmix_run(recipe, out, unit_bytes=small)
    assert proc.returncode == 2, proc.stderr
    assert re.search(r"stream \w+: file \S+/part-\d\.jsonl: changed since this run started \([\d,]+ bytes when "
                     r"unit \d+ was written, now [\d,]+\)", proc.stderr), proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert _committed_units(out) == committed

    for path, data in originals.items():
        path.write_bytes(data)
    assert tokmix_run(recipe, out, unit_bytes=small).returncode == 0
    resumed = outputs(out)
    assert {name: resumed[name] for name in clean if name != "index.json"} == \
           {name: data for name, data in clean.items() if name != "index.json"}, "the same bytes as from parquet"


def test_a_changed_file_among_grouped_small_files_is_named_with_its_unit():
    """Small text files grouped into one unit: the message names the file whose size changed; a file added to
    the group names the unit's first file and how many more, not thousands of paths."""
    unit = Unit("code", 4, tuple(Piece(f"/data/{k}.txt", "text", size=10) for k in range(3)))
    sized = Unit("code", 4, tuple(Piece(f"/data/{k}.txt", "text", size=10, file_bytes=10) for k in range(3)))
    added = {"pieces": sized.describe()[:2], "size": 20, "file_bytes": [10, 10]}
    assert str(_changed_source("code", sized, added)) == (
        "stream code: unit 000004 (/data/0.txt and 2 more) is cut differently now than when "
        "this run wrote it, and the files it held have the sizes they had: a file was added to or removed from it, "
        "or the tokmix that started the run cut units another way (upgraded since?); restore the files or finish "
        "with that tokmix, or use --restart to start over")
    assert _changed_source("code", sized, {"pieces": sized.describe(), "size": 30, "file_bytes": [10] * 3}) is None
    record = {"pieces": sized.describe(), "size": 31, "file_bytes": [10, 10, 11]}  # since files' sizes are kept
    assert str(_changed_source("code", sized, record)).startswith("stream code: file /data/2.txt: changed since "
                                                                  "this run started (11 bytes when unit 000004 was "
                                                                  "written, now 10); ")
    moved = {"pieces": [["/data/0.txt", "text", 0, -1], ["/data/9.txt", "text", 0, -1]], "size": 30,
             "file_bytes": [0, 0]}
    assert str(_changed_source("code", unit, moved)).startswith("stream code: file /data/1.txt: changed since this "
                                                                 "run started (unit 000004 is cut differently now)")
