"""Two runs started at once on one output directory: the second is refused as "another tokmix run", never as a
directory that is "not empty and not a tokmix run". The second run's check of the directory (tokmix.outdir) is
made to stand still at its first listing of the directory, by an audit hook on os.listdir/os.scandir in its
own process (tokmix's code runs unchanged), while the first run takes the lock, commits its record and writes
beside it; the check then goes on. A check that looked for the record before listing saw no record, then a
folder full of the first run's files."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

from tests.pausing import resume, wait_for_pause
from tests.reference import GOLDEN

# the supervisor as the console script runs it, with a hook that holds it at its first listing of OUT or its
# state folder until the test writes "resume" into FIFO (the hook fires before the listing is made)
HELD = """
import os, sys
out, fifo = sys.argv.pop(1), sys.argv.pop(1)
watched, held = {out, os.path.join(out, "tokmix-state")}, []

def hook(event, args):
    if event in ("os.listdir", "os.scandir") and not held and args and args[0] is not None \\
            and os.path.abspath(os.fsdecode(os.fspath(args[0]))) in watched:
        held.append(True)
        with open(fifo, "w") as f:
            f.write("paused")
        said = ""
        while said != "resume":
            with open(fifo) as f:
                said = f.read()

sys.addaudithook(hook)
from tokmix.cli import main
sys.argv[0] = "tokmix"
main()
"""


def test_a_run_started_while_another_commits_its_record_is_told_another_run_writes(tmp_path):
    for part in ("corpus", "data", "tokenizer"):
        shutil.copytree(GOLDEN / part, tmp_path / part)
    shutil.copy(GOLDEN / "recipe.toml", tmp_path / "recipe.toml")
    out = tmp_path / "out"
    (out / "tokmix-state").mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()  # the lock of a run killed before its first record: all a starting run leaves
    (out / "tokmix-state" / "lock").write_text(f"{socket.gethostname()} {dead.pid}\n")
    held_fifo, paused_fifo = tmp_path / "held", tmp_path / "paused"
    os.mkfifo(held_fifo)
    os.mkfifo(paused_fifo)
    args = ["run", str(tmp_path / "recipe.toml"), "--out", str(out), "--workers", "1"]
    second = subprocess.Popen([sys.executable, "-c", HELD, str(out), str(held_fifo), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    first = None
    try:
        assert wait_for_pause(held_fifo, lambda: second.poll() is None, 120), second.communicate()
        env = {**os.environ, "TOKMIX_FAULT": "holdout:after-write:1:pause", "TOKMIX_PAUSE_FIFO": str(paused_fifo)}
        first = subprocess.Popen([sys.executable, "-m", "tokmix.cli", *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        # the first run holds the lock, its record committed and its first holdout file written beside it
        assert wait_for_pause(paused_fifo, lambda: first.poll() is None, 120), first.communicate()
        assert (out / "tokmix-state" / "created").is_file() and (out / "tokmix-state" / "recipe.json").is_file()
        holder = int((out / "tokmix-state" / "lock").read_text().split()[1])
        resume(held_fifo)
        _, stderr = second.communicate(timeout=120)
        assert second.returncode == 2, stderr
        assert stderr.strip() == f"error: {out}: another tokmix run (pid {holder}) is writing this directory"
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
