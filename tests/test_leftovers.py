"""No process outlives a run, whatever the stage when Ctrl-C, SIGTERM or a SIGKILL of the supervisor comes.

One output directory is taken through every stage by a chain of `tokmix run` commands, each started in a
session of its own, stopped at a fault point of a stage (tokmix.faults, action `pause`: the process standing
there says so through a FIFO) and then interrupted; each command resumes what the one before committed. After
each, no process of its session is left: at once once the command has returned (Ctrl-C, SIGTERM), or once the
stage process notices its supervisor is gone (SIGKILL of the supervisor)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from tests.pausing import wait_for_pause
from tests.reference import GOLDEN
from tokmix.cli import app

PAUSE_SECONDS = 120  # how long a run may take to reach its pause point on a loaded machine
NOTICE_SECONDS = 30  # a stage process notices a lost supervisor in 0.25 s; its cleanup on a loaded machine
TRAIN = "[tokenizer.train]\nvocab_size = 600\n"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The golden JSONL corpus with a recipe that trains its tokenizer (a run's first stage)."""
    root = tmp_path_factory.mktemp("leftovers")
    for part in ("corpus", "data"):
        shutil.copytree(GOLDEN / part, root / part)
    recipe = (GOLDEN / "recipe.toml").read_text()
    given = next(line for line in recipe.splitlines() if line.startswith("path = "))
    (root / "recipe.toml").write_text(recipe.replace(f"[tokenizer]\n{given}\n", TRAIN))
    return root


def session(sid: int) -> list[psutil.Process]:
    """Every process of session `sid`: whatever the run started, however it was reparented."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, ProcessLookupError):
            pass
    return found


def described(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    return out


STARTED: list[int] = []  # the sessions the tests started, killed at the end whatever happened


@pytest.fixture
def no_session_left():
    """A test that fails while a run stands paused must not leave that run behind."""
    yield
    while STARTED:
        sid = STARTED.pop()
        for proc in session(sid):
            try:
                proc.kill()
            except psutil.Error:
                pass


def interruptible() -> None:
    """In the child, before it runs tokmix: Ctrl-C's SIGINT handled as a terminal user's process has it, whatever
    this test process inherited (a shell starts a background job, `cmd &`, with SIGINT ignored, and Python then
    never installs its KeyboardInterrupt handler: every Ctrl-C test would hang)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Paused:
    """`tokmix ARGS` in a session of its own, standing at `point` (its `hit`-th passage). Its output goes to
    pipes, or with `tty` to a pseudo-terminal of 80 columns that is the session's controlling terminal, where a
    Ctrl-C is the character a user types."""

    def __init__(self, root: Path, args: list[str], point: str | None, hit: int = 1, tty: bool = False):
        self.fifo, self.tty, self.shown = root / "paused", None, b""
        self.fifo.unlink(missing_ok=True)
        os.mkfifo(self.fifo)
        env = {**os.environ, "TOKMIX_PAUSE_FIFO": str(self.fifo), "TOKMIX_UNIT_BYTES": str(UNIT_BYTES)}
        env.pop("TOKMIX_FAULT", None)
        if point:
            env["TOKMIX_FAULT"] = f"{point}:{hit}:pause"
        command = [sys.executable, "-m", "tokmix", *args]
        if tty:
            self.tty, terminal = pty.openpty()
            fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))

            def controlling_terminal() -> None:  # a session of its own whose terminal is the pty
                os.setsid()
                fcntl.ioctl(terminal, termios.TIOCSCTTY, 0)
                interruptible()

            env.pop("COLUMNS", None)
            self.proc = subprocess.Popen(command, cwd=root, env={**env, "TERM": "xterm"}, stdin=terminal,
                                         stdout=terminal, stderr=terminal, preexec_fn=controlling_terminal)
            os.close(terminal)
        else:
            self.proc = subprocess.Popen(command, cwd=root, env=env, start_new_session=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                         preexec_fn=interruptible)
        self.read = b""  # of its stdout, by line_matching
        self.sid = self.proc.pid
        STARTED.append(self.sid)
        self.lines: list[str] = []
        if point:
            paused = wait_for_pause(self.fifo, lambda: self.proc.poll() is None, PAUSE_SECONDS)
            if not paused:
                self.stop("sigkill")
                pytest.fail(f"{args} never reached {point}: {self.shown[-2000:]!r}")

    def line_matching(self, pattern: str) -> str:
        """The first line of its stdout (read as it comes, while it stands paused) that matches `pattern`.
        select() wakes on the output; its timeout only bounds how long a missing line is waited for."""
        deadline, fd = time.monotonic() + PAUSE_SECONDS, self.proc.stdout.fileno()
        while time.monotonic() < deadline:
            *lines, rest = self.read.decode(errors="replace").split("\n")
            for k, line in enumerate(lines):
                if re.search(pattern, line):
                    self.read = "\n".join(lines[k + 1:] + [rest]).encode()
                    self.lines += lines[: k + 1]
                    return line
            if select.select([fd], [], [], 1.0)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                self.read += chunk
        pytest.fail(f"no line matching {pattern!r} in {self.read[-3000:]!r}")

    def screen_until(self, pattern: bytes) -> str:
        """What the terminal showed, read until `pattern` has been shown."""
        deadline = time.monotonic() + PAUSE_SECONDS
        while not re.search(pattern, self.shown):
            if time.monotonic() > deadline:
                pytest.fail(f"the terminal never showed {pattern!r}: {self.shown[-3000:]!r}")
            if not select.select([self.tty], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(self.tty, 1 << 16)
            except OSError:  # EIO: the terminal's other side is closed
                chunk = b""
            if not chunk:
                pytest.fail(f"the terminal never showed {pattern!r}: {self.shown[-3000:]!r}")
            self.shown += chunk
        return self.shown.decode(errors="replace")

    def stop(self, how: str) -> tuple[int, str, str]:
        """Interrupt as a user or a scheduler would; returns the exit code, stdout and stderr once the command
        has returned, after checking that nothing of its session is left."""
        if how == "ctrl-c" and self.tty is not None:
            os.write(self.tty, b"\x03")  # typed: the terminal sends SIGINT to its foreground process group
        elif how == "ctrl-c":
            os.killpg(self.sid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        elif how == "sigterm":
            self.proc.send_signal(signal.SIGTERM)
        elif how == "sigkill":
            self.proc.kill()
        if self.tty is not None:
            self.screen_until(b"committed work is kept")
            self.proc.wait(timeout=120)
            out, err = self.shown.decode(errors="replace"), ""
        else:
            out, err = self.proc.communicate(timeout=120)
            out, err = "".join(f"{line}\n" for line in self.lines) + (self.read + out).decode(), err.decode()
        left = session(self.sid)
        if how == "sigkill":  # the stage process notices, stops its children, and goes
            _, left = psutil.wait_procs(left, timeout=NOTICE_SECONDS)
        try:
            assert not left, f"{how}: left behind {described(left)}; {err[-1500:]}"
        finally:
            for proc in left:
                proc.kill()
            if self.tty is not None:
                os.close(self.tty)
        return self.proc.returncode, out, err


def status_of(root: Path) -> str:
    """`tokmix status out`, as the command prints it without a terminal (140 columns)."""
    result = CliRunner().invoke(app, ["status", str(root / "out")])
    assert result.exit_code == 0, result.output
    return result.output


def flat(shown: str) -> str:
    """Status's text with its lines joined (a long line wraps at 140 columns)."""
    return " ".join(shown.split())


def row(shown: str, stage: str) -> str:
    return next(line for line in shown.splitlines() if line.startswith(f"│ {stage} "))


UNIT_BYTES = 1000  # a few units per stream: a run stands in the streams stage with some committed
RUN = ["run", "recipe.toml", "--out", "out", "--workers", "2", "--log-every", "0.2"]
TRAINING = r"training: [\d.]+k? of at most 268M characters read \(1 document\(s\), stream dclm\)"


# One test per stage, in the order a run goes through them, on the module's one output directory: each resumes
# what the tests before it committed (a test that fails leaves less done, and the next runs that part again).
def test_tokenizer_training_ctrl_c_sigterm_and_a_killed_supervisor_leave_no_process(workspace, no_session_left):
    """The trainer's process (the one that was left behind, holding the pipe): stopped by Ctrl-C, by SIGTERM
    and by a SIGKILL of the supervisor. While it trains, `tokmix status` and the piped log say what it has read."""
    run = Paused(workspace, RUN, "tokenizer:training")
    shown = status_of(workspace)
    head = rf"running: pid {run.proc.pid} .*; stage tokenizer for 0:00:\d\d: {TRAINING}"
    assert re.search(head, flat(shown)), shown
    assert re.search(r"│ in progress │ .*│ +0:00:\d\d │ training: [\d.]+k? of at most", row(shown, "tokenizer"))
    assert "not started" in row(shown, "backend check") and "not started" in row(shown, "stream dclm")
    run.line_matching(rf"^\[[\d:]+\] tokenizer: {TRAINING}, running 0:00:\d\d; tree RSS [\d,]+ MiB of 1,024 MiB$")
    code, out, err = run.stop("ctrl-c")
    assert code == 130 and "committed work is kept" in err and "Resume with the same command" in err, err
    assert "] stage split: done in " in out and "] stage tokenizer: started (training a 600-token BPE" in out
    shown = status_of(workspace)
    assert "not running" in shown and "stopped in stage tokenizer" in shown and "last error: interrupted" in shown
    assert "remaining: train the tokenizer; holdout dclm;" in flat(shown)

    assert Paused(workspace, RUN, "tokenizer:training").stop("sigterm")[0] == 130
    assert Paused(workspace, RUN, "tokenizer:training").stop("sigkill")[0] == -signal.SIGKILL
    assert "stopped in stage tokenizer" in status_of(workspace)


def test_the_backend_check_sigterm_leaves_no_process(workspace, no_session_left):
    """The backend check (in the stage process for a vocabulary this small), SIGTERM; status names the check and
    how long it has run."""
    run = Paused(workspace, RUN, "backend:checking")
    shown = status_of(workspace)
    assert "; stage backend check for 0:00:" in flat(shown)
    assert "done" in row(shown, "tokenizer")
    checking = row(shown, "backend check")
    assert re.search(r"│ in progress │ .*│ +0:00:\d\d │ auto: the fast backends against the oracle", checking), shown
    assert run.stop("sigterm")[0] == 130


def test_holdout_a_killed_supervisor_leaves_no_process(workspace, no_session_left):
    """SIGKILL of the supervisor: the stage process notices and stops."""
    run = Paused(workspace, RUN, "holdout:after-write")
    shown = status_of(workspace)
    assert "; stage holdout for " in flat(shown) and "in progress" in row(shown, "holdout dclm")
    assert re.search(r"│ done +│ +│ +│ +│ (fastokens|tiktoken|hf) ", row(shown, "backend check")), shown
    assert run.stop("sigkill")[0] == -signal.SIGKILL
    assert "stopped in stage holdout" in status_of(workspace)


def test_streams_on_a_terminal_ctrl_c_typed_leaves_no_process_and_the_view_fits_80_columns(workspace, no_session_left):
    run = Paused(workspace, RUN, "streams:after-unit", hit=3, tty=True)
    run.screen_until(rb"code_other .* tok/s")
    assert "; stage streams for " in flat(status_of(workspace))
    code, screen, _ = run.stop("ctrl-c")
    assert code == 130
    rows = [line for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen).replace("\r", "\n").splitlines()
            if re.match(r"(dclm|edu|code_py|code_other) ", line)]
    assert rows and all(len(line.rstrip()) <= 80 and "tok/s" in line and " MiB" in rows[0] for line in rows), rows
    assert not re.search(r"\b0\.0M\b", screen) and re.search(r"\d(\.\d+)?[kM]? tok/s", screen)


def test_streams_json_lines_sigterm_leaves_no_process(workspace, no_session_left):
    """JSON lines for a log collector, then SIGTERM."""
    run = Paused(workspace, [*RUN, "--log-format", "json"], "streams:after-unit", hit=2)
    line = json.loads(run.line_matching(r'"stream": '))
    # (a stream's last line may pass its target: it ends with the document that crosses it)
    assert line["event"] == "progress" and line["stage"] == "streams" and line["tokens"] > 0 < line["target"]
    assert line["memory_budget"] == 1 << 30 and 0 < line["tree_rss"] < 1 << 30 and "tok_per_s" in line
    assert "eta_s" in line and line["message"].startswith(f"streams {line['stream']}: ")
    code, out, err = run.stop("sigterm")
    assert code == 130 and all(json.loads(x)["event"] for x in out.splitlines()), out


def test_assemble_a_killed_supervisor_leaves_no_process(workspace, no_session_left):
    run = Paused(workspace, RUN, "assemble:mid-write")
    shown = status_of(workspace)
    assert "; stage assemble for " in flat(shown) and "in progress" in row(shown, "shards")
    assert all("done" in row(shown, f"stream {s}") for s in ("dclm", "edu", "code_py", "code_other"))
    run.line_matching(r"^\[[\d:]+\] assemble: 4 shard\(s\), running 0:00:\d\d; tree RSS [\d,]+ MiB of 1,024 MiB$")
    assert run.stop("sigkill")[0] == -signal.SIGKILL


def test_validate_ctrl_c_leaves_no_process(workspace, no_session_left):
    """Then the stage record is input to `tokmix status`: one of another shape, or a FIFO in its place (which
    would hang a reader that opens it), is ignored, never a traceback or a hang."""
    run = Paused(workspace, RUN, "validate:before")
    assert "in progress" in row(status_of(workspace), "validate")
    assert run.stop("ctrl-c")[0] == 130
    record = workspace / "out" / "tokmix-state" / "stage.json"
    assert "stopped in stage validate" in status_of(workspace)
    record.write_text(json.dumps({"stage": "streams", "started": "soon", "doing": 5}))
    assert "stopped in stage" not in status_of(workspace)
    record.unlink()
    os.mkfifo(record)
    assert "stopped in stage" not in status_of(workspace)
    record.unlink()


def test_report_ctrl_c_leaves_no_process(workspace, no_session_left):
    """The run finished (the whole session gone once the command returns), then its report interrupted."""
    code, out, err = Paused(workspace, RUN, None).stop("wait")
    assert code == 0 and "done in" in out, err[-2000:]
    assert "complete and validated" in status_of(workspace)
    code, _, err = Paused(workspace, ["report", "out"], "report:before-write").stop("ctrl-c")
    assert code == 130, err
