"""The user's files and machine are the user's: tokmix runs only its installed code whatever the working
directory holds, touches only the paths it recorded creating, refuses an output directory that overlaps its
sources or belongs to something else, treats the split file as part of the run's identity, and lets one run
at a time write a directory. Every case is a real `tokmix` process on real files."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.corpus import make_inputs
from tokmix import TokmixError
from tokmix.lock import RunLock, RunWriter, writing
from tokmix.shards import Layout

TOKMIX = Path(sys.executable).with_name("tokmix")  # the console script: the supervisor never has cwd on its path
# tokmix as this session imports it: installed, or from the tree PYTHONPATH names (bench/mutate.py runs the tests
# on a mutated copy that way); never from the working directory, whatever it holds
ENV = dict(os.environ)


def tokmix(*args: str | Path, cwd: Path | None = None, env: dict | None = None, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([str(TOKMIX), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**ENV, **(env or {})}, start_new_session=True, **popen)


def run(recipe: Path, out: Path, *more: str, **kw) -> subprocess.CompletedProcess:
    return tokmix("run", recipe, "--out", out, "--workers", "2", *more, **kw)


def assert_refused(proc: subprocess.CompletedProcess, message: str) -> None:
    """The run was refused (exit 2) with exactly this one line."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == message


def outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root, by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trust")
    return make_inputs(root, doc_limit=300, rows_per_group=16)


@pytest.fixture(scope="module")
def clean(corpus, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("clean")
    proc = run(corpus, out)
    assert proc.returncode == 0, proc.stderr
    return outputs(out)


# ---------------------------------------------------------------------------- only the installed code runs
@pytest.mark.parametrize("shadow", ["a clone's folder", "a package with code"])
def test_the_stage_process_never_imports_tokmix_from_the_working_directory(corpus, clean, tmp_path, shadow):
    """A `tokmix` folder in the working directory: the folder that holds a clone (no __init__, so a namespace
    package, which an editable install's finder loses to), or a package whose code would leave a marker."""
    cwd, marker = tmp_path / "cwd", tmp_path / "executed"
    (cwd / "tokmix").mkdir(parents=True)
    if shadow == "a clone's folder":
        (cwd / "tokmix" / "README.md").write_text("the clone of tokmix\n")
    else:
        code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
        for name in ("__init__.py", "pipeline.py", "runner.py", "stages.py"):
            (cwd / "tokmix" / name).write_text(code)
    proc = run(corpus, tmp_path / "out", cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists(), f"code from the working directory ran: {marker.read_text()}"
    assert outputs(tmp_path / "out") == clean


# ---------------------------------------------------------------------------- the split file is the run's
def test_an_edited_split_file_is_refused_naming_the_files_it_moved(corpus, clean, tmp_path):
    """decontaminate = false, the run killed once the holdout stage is done, a holdout file moved to train: the
    resume used to exit 0 with that file's holdout documents in the train shards."""
    root = tmp_path / "c"
    shutil.copytree(corpus.parent, root)
    recipe, split_path = root / "recipe.toml", root / "data" / "file_splits.json"
    assert "decontaminate = false" in recipe.read_text()
    out = tmp_path / "out"
    killed = run(recipe, out, env={"TOKMIX_FAULT": "holdout:after-index:3"})  # the third and last domain
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert sorted(p.name for p in out.glob("val_*.bin")) == ["val_code.bin", "val_dclm.bin", "val_edu.bin"]
    first = split_path.read_text()
    split = json.loads(first)
    moved = split["code"]["holdout"].pop(0)
    split["code"]["train"].append(moved)
    split_path.write_text(json.dumps(split, indent=2))
    refused = run(recipe, out)
    assert_refused(refused, (
        f"error: split file {split_path}: changed since this run started (code: {moved} moved holdout -> train); "
        "what is already written follows the first split: restore it, or use --restart to start over"))
    assert not list(out.glob("train_*.bin"))
    split_path.write_text(first)  # restored: the run resumes to the clean run's bytes
    assert run(recipe, out).returncode == 0
    assert outputs(out) == clean


# ---------------------------------------------------------------------------- only what tokmix made is removed
def _copy(corpus: Path, tmp_path: Path) -> Path:
    root = tmp_path / "c"
    shutil.copytree(corpus.parent, root)
    return root


def _move_stream(root: Path, stream: str, folder: str) -> None:
    """Move a stream's source files into `folder` (relative to root), and the recipe and split file with them."""
    (root / folder).mkdir(parents=True, exist_ok=True)
    for path in (root / "corpus" / stream).glob("*.parquet"):
        path.rename(root / folder / path.name)
    for name in ("recipe.toml", "data/file_splits.json"):
        (root / name).write_text((root / name).read_text().replace(f"corpus/{stream}/", f"{folder}/"))


def test_sources_under_the_output_directory_are_refused_and_kept(corpus, tmp_path):
    """The issue's first case: a user keeps a streams/ folder of sources where the run is written; the run used
    to exit 0 and then remove OUT/streams with every source file in it."""
    root = _copy(corpus, tmp_path)
    _move_stream(root, "dclm", "out/streams/dclm")
    before = tree(root)
    proc = run(root / "recipe.toml", root / "out")
    assert_refused(proc, (f"error: output directory {root / 'out'}: it holds stream dclm's source "
                          f"{root / 'out/streams/dclm/part-0.parquet'}; tokmix writes and removes files "
                          "there: choose another --out"))
    assert tree(root) == before


def test_a_run_of_a_tokmix_without_the_created_record_is_named_as_such_and_left_as_it_is(corpus, tmp_path):
    """A run directory left by an earlier tokmix (its state folder has done.json and recipe.json, but no record
    of what it created, which tokmix now removes by): refused with --restart too, saying what it is, untouched."""
    out = tmp_path / "old"
    (out / "tokmix-state").mkdir(parents=True)
    for name in ("tokmix-state/done.json", "tokmix-state/recipe.json", "index.json"):
        (out / name).write_text("{}")
    (out / "train_000.bin").write_bytes(bytes(64))
    before = tree(out)
    for more in ((), ("--restart",)):
        proc = run(corpus, out, *more)
        assert_refused(proc, (
            f"error: output directory {out}: a run of an earlier tokmix version, which kept no record of what it "
            "created, so tokmix cannot tell its files from others: remove it yourself or choose a new or empty "
            "directory"))
        assert tree(out) == before


def test_restart_over_a_folder_of_the_users_own_files_is_refused_and_deletes_nothing(corpus, tmp_path):
    """The issue's second case: an output directory holding the user's train_*.jsonl and tokenizer.json, then
    `--restart`: both used to be deleted before the run failed."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train_a.jsonl").write_text('{"text": "mine"}\n')
    (out / "train_b.jsonl").write_text('{"text": "also mine"}\n')
    shutil.copy(corpus.parent / "tokenizer/tokenizer.json", out / "tokenizer.json")
    before = tree(out)
    proc = run(corpus, out, "--restart")
    assert_refused(proc, (f"error: output directory {out}: not empty and not a tokmix run (it holds "
                          "tokenizer.json); choose a new or empty directory"))
    assert tree(out) == before
    # the same folder named by the recipe as its sources and tokenizer: refused for that, first
    root = _copy(corpus, tmp_path)
    recipe = root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('path = "tokenizer/tokenizer.json"', f'path = "{out}/tokenizer.json"'))
    proc = run(recipe, out, "--restart")
    assert_refused(proc, (f"error: output directory {out}: it holds the tokenizer {out}/tokenizer.json; "
                          "tokmix writes and removes files there: choose another --out"))
    assert tree(out) == before


OVERLAPS = {  # how the recipe or --out overlaps a source -> what the one line says
    "out is a source folder": ("corpus/edu", r"it holds stream edu's source .*/corpus/edu/part-0\.parquet"),
    "out holds a source folder": ("corpus", r"it holds stream \w+'s source .*/corpus/\w+/part-0\.parquet"),
    "out inside a recursive glob": ("corpus/edu/run",
                                    r"stream edu's source pattern .*/corpus/edu/\*\* would match files tokmix writes"),
    "out holds the split file": ("data", r"it holds the split file .*/data/file_splits\.json"),
    "out holds the tokenizer": ("tokenizer", r"it holds the tokenizer .*/tokenizer/tokenizer\.json"),
    "out is a link to a source folder": ("link", r"it holds stream edu's source .*/corpus/edu/part-0\.parquet"),
    "a source is a link into out": ("out", r"it holds stream edu's source .*/corpus/edu/part-9\.parquet \(through a"),
    "out given relative to the working directory": ("./corpus/../corpus/edu", r"it holds stream edu's source"),
    "out is a file": ("corpus/edu/part-0.parquet", r"is a file, not a directory"),
}


@pytest.mark.parametrize("case", OVERLAPS)
def test_an_output_directory_that_overlaps_an_input_is_refused_before_anything_is_written(corpus, tmp_path, case):
    root = _copy(corpus, tmp_path)
    out, message = OVERLAPS[case]
    recipe = root / "recipe.toml"
    if case == "out inside a recursive glob":
        recipe.write_text(recipe.read_text().replace('"corpus/edu/*.parquet"', '"corpus/edu/**"'))
    if case == "out is a link to a source folder":
        (root / "link").symlink_to(root / "corpus" / "edu")
    if case == "a source is a link into out":
        (root / "out").mkdir()
        (root / "out" / "kept.parquet").write_bytes((root / "corpus/edu/part-3.parquet").read_bytes())
        (root / "corpus/edu/part-9.parquet").symlink_to(root / "out" / "kept.parquet")
    before = tree(root)
    proc = run(recipe, out, cwd=root)
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(rf"error: output directory \S+: {message}.*\n", proc.stderr), proc.stderr
    assert tree(root) == before


def test_a_mirror_copy_inside_the_output_directory_is_refused(corpus, tmp_path):
    root = _copy(corpus, tmp_path)
    _move_stream(root, "edu", "out/mirror/edu")
    recipe = root / "recipe.toml"
    split = root / "data/file_splits.json"
    split.write_text(split.read_text().replace("out/mirror/edu/", "hf://datasets/org/edu/"))
    recipe.write_text(recipe.read_text().replace('"out/mirror/edu/', '"hf://datasets/org/edu/'))
    before = tree(root)
    proc = run(recipe, root / "out", "--mirror", f"hf://datasets/org/edu={root}/out/mirror/edu")
    assert proc.returncode == 2
    assert f"output directory {root / 'out'}: it holds stream edu's source" in proc.stderr, proc.stderr
    assert tree(root) == before


@pytest.mark.parametrize("state", ["another tool's folder", "a link to a tokmix run's state"])
def test_a_tokmix_state_folder_of_another_tool_is_not_a_tokmix_run(corpus, tmp_path, state):
    out = tmp_path / "out"
    if state == "another tool's folder":
        (out / "tokmix-state").mkdir(parents=True)
        (out / "tokmix-state" / "recipe.json").write_text("{}")
    else:  # a --restart through it would empty the other run's bookkeeping
        (tmp_path / "other" / "tokmix-state").mkdir(parents=True)
        (tmp_path / "other" / "tokmix-state" / "created").write_text("# tokmix\n")
        out.mkdir()
        (out / "tokmix-state").symlink_to(tmp_path / "other" / "tokmix-state")
    before = tree(tmp_path)
    proc = run(corpus, out, "--restart")
    assert_refused(proc, (f"error: output directory {out}: not empty and not a tokmix run (it holds "
                          "tokmix-state without tokmix's record of what it created); choose a new or "
                          "empty directory"))
    assert tree(tmp_path) == before


def test_restart_and_cleanup_remove_only_what_tokmix_made(corpus, clean, tmp_path):
    """A finished run that kept its intermediates, then the user's own files beside and inside what tokmix
    made: a restart and its end-of-run cleanup remove the run's files and intermediates, and leave every one of
    the user's (the restart used to remove every train_* and val_* name, and the cleanup all of streams/)."""
    out = tmp_path / "out"
    assert run(corpus, out, "--keep-streams").returncode == 0
    mine = {"train_notes.txt": b"mine", "val_plan.md": b"mine", "tokmix-run.log": b"mine",
            "streams/notes.txt": b"mine", "streams/dclm/units/notes.txt": b"mine", "streams/edu/units/1.tok": b"m"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    proc = run(corpus, out, "--restart")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {name: (out / name).read_bytes() for name in mine} == mine
    assert outputs(out) == clean
    assert not list(out.glob("streams/*/units/0*")) and not list(out.glob("streams/*/stream.json"))


def test_a_folder_of_the_users_where_the_run_writes_is_refused(corpus, clean, tmp_path):
    """A finished run (its intermediates removed), then a folder of the user's named as tokmix names one: a
    restart does not write into it or remove it."""
    out = tmp_path / "out"
    assert run(corpus, out).returncode == 0
    (out / "streams").mkdir()
    (out / "streams" / "notes.txt").write_text("mine")
    before = tree(out)
    proc = run(corpus, out, "--restart")
    assert_refused(proc, (f"error: {out / 'streams'}: exists but tokmix did not create it (the run would "
                          "write there); move it away or choose another --out"))
    assert tree(out) == before


def test_a_tokenizer_the_recipe_names_is_never_written_or_trained_in_its_place(corpus, tmp_path):
    root = _copy(corpus, tmp_path)
    (root / "tokenizer/tokenizer.json").unlink()
    proc = run(root / "recipe.toml", root / "out")
    assert proc.returncode == 2
    assert f"tokenizer {root / 'tokenizer/tokenizer.json'}: file not found" in proc.stderr, proc.stderr
    assert not (root / "tokenizer/tokenizer.json").exists()
    assert not (root / "out/tokenizer.json").exists()


# ---------------------------------------------------------------------------- one writer per directory
def _pause_env(fifo: Path, point: str = "streams:after-unit:2") -> dict:
    return {"TOKMIX_FAULT": f"{point}:pause", "TOKMIX_PAUSE_FIFO": str(fifo), "TOKMIX_UNIT_BYTES": "20000"}


def _start(recipe: Path, out: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([str(TOKMIX), "run", str(recipe), "--out", str(out), "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**ENV, **env},
                            start_new_session=True)


def test_of_many_runs_started_together_over_a_stale_lock_one_writes(corpus, clean, tmp_path):
    """Eight runs started at once on a directory whose lock names a killed run: one takes the lock (and stands
    paused inside its streams stage), every other one is refused while it holds it; the run then resumes to
    the clean run's bytes."""
    out, fifo = tmp_path / "out", tmp_path / "paused"
    (out / "tokmix-state").mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / "tokmix-state" / "lock").write_text(f"{socket.gethostname()} {dead.pid}\n")
    os.mkfifo(fifo)
    procs = [_start(corpus, out, _pause_env(fifo)) for _ in range(8)]
    try:
        with open(fifo) as f:  # blocks until a run stands at the pause point, holding the lock
            assert f.read() == "paused"
        holder = int((out / "tokmix-state" / "lock").read_text().split()[1])
        others = [p for p in procs if p.pid != holder]
        assert len(others) == 7
        for proc in others:  # a second holder would stand paused too, and never exit
            _, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 2, stderr
            assert stderr.strip() == f"error: {out}: another tokmix run (pid {holder}) is writing this directory"
    finally:  # every run started, whatever failed: none is left paused
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert run(corpus, out).returncode == 0
    assert outputs(out) == clean


def test_killing_the_supervisor_alone_leaves_the_directory_locked_while_its_stage_process_writes(corpus, clean,
                                                                                                tmp_path):
    out, fifo = tmp_path / "out", tmp_path / "paused"
    os.mkfifo(fifo)
    first = _start(corpus, out, _pause_env(fifo))
    with open(fifo) as f:
        assert f.read() == "paused"
    stage = [p for p in psutil.process_iter(["cmdline"]) if "tokmix.pipeline" in " ".join(p.info["cmdline"] or [])
             and str(out) in p.info["cmdline"]]
    assert len(stage) == 1
    # stopped, so that it cannot notice its supervisor's end (it then stops too, as tests/test_leftovers.py
    # shows): it stands for a stage process still writing, which holds the lock however long that takes
    stage[0].suspend()
    os.kill(first.pid, signal.SIGKILL)  # the supervisor alone; its stage process stays, paused mid-stream
    first.wait()
    committed = {name: data for name, data in tree(out).items() if ".tmp-" not in name}
    for more in ([], ["--restart"]):  # a restart too: it removes nothing while another run holds the lock
        second = run(corpus, out, *more)
        assert_refused(second, f"error: {out}: another tokmix run (pid {stage[0].pid}) is writing this "
                               "directory")
    assert tree(out).items() >= committed.items()  # its workers may have committed more units meanwhile
    stage[0].resume()  # it notices its supervisor is gone and stops, its workers with it
    _, alive = psutil.wait_procs(stage, timeout=60)
    assert not alive, "the stage process stops once its supervisor is gone"
    assert run(corpus, out).returncode == 0
    assert outputs(out) == clean


def test_a_lock_taken_on_another_host_is_broken_only_when_the_user_says_so(corpus, clean, tmp_path):
    out = tmp_path / "out"
    (out / "tokmix-state").mkdir(parents=True)
    (out / "tokmix-state" / "lock").write_text("node-b.cluster 4242\n")
    refused = run(corpus, out)
    assert_refused(refused, (
        f"error: {out}: locked by a tokmix run on host node-b.cluster (pid 4242), which cannot be checked from "
        "here: if no run is writing this directory there, run again with --break-lock"))
    assert sorted(p.name for p in out.rglob("*")) == ["lock", "tokmix-state"], "nothing written"
    taken = run(corpus, out, "--break-lock")
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert outputs(out) == clean
    assert (out / "tokmix-state" / "lock").read_text() == "", "a finished run leaves the lock naming no holder"


def test_a_worker_process_left_writing_by_a_killed_stage_process_keeps_a_new_run_out(corpus, clean, tmp_path):
    """`--executor processes`: the workers are spawned, so they do not inherit the run's lock. Every task that
    writes holds a shared lock on tokmix-state/writers, which a new run must get exclusively: the stage process
    killed alone while its worker stands paused in the middle of a unit, a run started at once is refused,
    naming the worker (it used to take the directory while the worker wrote); once the worker is gone, the run
    resumes and ends identical."""
    out, fifo, workers = tmp_path / "out", tmp_path / "paused", []
    os.mkfifo(fifo)
    first = subprocess.Popen([str(TOKMIX), "run", str(corpus), "--out", str(out), "--workers", "1", "--executor",
                              "processes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**ENV, **_pause_env(fifo, "streams:unit-mid-write:1")}, start_new_session=True)
    try:
        with open(fifo) as f:
            assert f.read() == "paused"
        stage = psutil.Process(int((out / "tokmix-state/lock").read_text().split()[2]))
        workers += [p.pid for p in stage.children()]
        stage.kill()  # the stage process alone: its worker stays, paused with half a unit written
        assert first.wait() == 2
        second = run(corpus, out)
        assert second.returncode == 2
        refused = re.fullmatch(rf"error: {re.escape(str(out))}: a process of an earlier run \(pid (\d+)\) is still "
                               r"writing this directory \(a worker whose stage process was stopped\): wait for it to "
                               r"end, or stop it, then run again", second.stderr.strip())
        assert refused and int(refused[1]) in workers, second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the first run's group: its worker
        psutil.wait_procs([p for p in map(_process, workers) if p], timeout=60)
    assert run(corpus, out).returncode == 0
    assert outputs(out) == clean


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def test_a_task_whose_run_lost_the_directory_writes_nothing(tmp_path):
    """A worker that had not begun its task when a new run took the directory (the new run's token is in the lock
    file) writes nothing: the window the writers lock alone would leave."""
    layout = Layout(tmp_path / "out")
    layout.state.mkdir(parents=True)
    with RunLock(layout):
        writer = RunWriter.of(layout)
        with writing(writer):
            pass  # its own run holds the directory
    with RunLock(layout), pytest.raises(TokmixError, match="this run no longer holds the directory"):
        with writing(writer):
            pass


def test_a_file_put_under_a_name_the_run_recorded_but_had_not_written_is_never_overwritten(corpus, clean, tmp_path):
    """The record names every path before the run creates it; a file the user puts under such a name before the
    run writes it (a shard the run has not reached) is kept: the run stops with one line naming it (it used to
    be overwritten by the rename). Moved away, the run ends identical."""
    out, name = tmp_path / "out", "train_001.bin"
    killed = run(corpus, out, env={"TOKMIX_FAULT": "streams:after-unit:2", "TOKMIX_UNIT_BYTES": "20000"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / name).exists() and f"\n{name}\n" in (out / "tokmix-state/created").read_text()
    (out / name).write_text("the user's own file\n")
    refused = run(corpus, out, env={"TOKMIX_UNIT_BYTES": "20000"})
    assert_refused(refused, f"error: {out / name}: exists but tokmix did not create it (put there after the "
                            "run named it, before it wrote it); move it away and run the same command again")
    assert (out / name).read_text() == "the user's own file\n"
    (out / name).unlink()
    assert run(corpus, out, env={"TOKMIX_UNIT_BYTES": "20000"}).returncode == 0
    assert outputs(out) == clean


def test_a_link_in_place_of_the_lock_file_is_never_written_through(corpus, tmp_path):
    """The run writes its name into tokmix-state/lock and truncates it when done: a link there (a copied run, a
    hostile folder) would have it truncate the file the link names. Refused in one line, the file kept."""
    out, theirs = tmp_path / "out", tmp_path / "notes.txt"
    theirs.write_text("the user's notes\n")
    assert run(corpus, out, env={"TOKMIX_FAULT": "streams:after-unit:1"}).returncode == -signal.SIGKILL
    lock = out / "tokmix-state/lock"
    lock.unlink()
    lock.symlink_to(theirs)
    refused = run(corpus, out)
    assert_refused(refused, f"error: {lock}: is a link, not tokmix's lock file; remove the link (tokmix "
                            "makes the file itself)")
    assert theirs.read_text() == "the user's notes\n"


def test_a_lock_file_that_names_no_run_is_taken_over(corpus, clean, tmp_path):
    """A lock file whose content is not tokmix's (edited, garbage) and that no process holds names no run on
    another host: taken over (it used to be read as a run on host "garbage" and refused without --break-lock)."""
    out = tmp_path / "out"
    assert run(corpus, out, env={"TOKMIX_FAULT": "streams:after-unit:1"}).returncode == -signal.SIGKILL
    (out / "tokmix-state/lock").write_text("garbage here\n")
    resumed = run(corpus, out)
    assert resumed.returncode == 0, resumed.stderr
    assert outputs(out) == clean
