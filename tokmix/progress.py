"""Progress of the stage process, and the record of the stage it is in. On a terminal: rich bars per stream
(tokens / budget, tokens/s, ETA) and the memory of the process tree, 80 columns wide. Without one (a log file,
a Slurm job, nohup): a line when each stage starts and ends, and every `every` seconds one line for the stage
running and one per stream being tokenized (tokens done / target, tok/s, ETA, tree RSS and the memory budget),
as text or as JSON lines (`--log-format json`, tokmix.process.log) for a cluster's log collector. The stage record
(tokmix-state/stage.json: which stage, since when, what it has done) is what `tokmix status` shows; a process of
the stage's own (the tokenizer trainer) updates it too. Bars start from the committed work, so they survive the
stage restarts."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from tokmix.process import log
from tokmix.shards import DamagedFile, Layout, read_json, write_bytes

if TYPE_CHECKING:
    from rich.progress import Progress


def tree_rss(extra: psutil.Process | None = None) -> int:
    """Bytes resident in this process and all its descendants (and in `extra`, the supervisor when counted)."""
    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True), *([extra] if extra else [])]:
        try:
            total += p.memory_info().rss
        except psutil.Error:  # a worker that just exited
            pass
    return total


def count(n: float) -> str:
    """A token count or rate in three significant digits: 987, 12.3k, 4.56M, 1.23G (never a bare 0.0M)."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.3g}{unit}" if value < 1000 else f"{value:,.0f}{unit}"
    return f"{n:.3g}" if n and abs(n) < 10 else f"{n:.0f}"


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def write_stage(layout: Layout, stage: str, doing: str = "", started: float | None = None) -> None:
    """The stage record `tokmix status` reads: the stage, since when (epoch seconds), what it has done."""
    record = {"stage": stage, "doing": doing, "started": started or time.time(), "pid": os.getpid(),
              "updated": time.time()}
    try:
        write_bytes(layout.stage, json.dumps(record).encode(), durable=False)  # a display's, not the run's, state
    except OSError:  # a full disk stops the run where its work is written, not here
        pass


def read_stage(layout: Layout) -> dict | None:
    """The stage record as write_stage wrote it, or None (missing, damaged, or not of its shape: it is input; a
    link, FIFO or device in its place is never opened)."""
    try:
        record = read_json(layout.stage, remedy="")
    except (DamagedFile, OSError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("stage"), str) or \
            not isinstance(record.get("doing", ""), str) or \
            not isinstance(record.get("started"), (int, float)) or isinstance(record.get("started"), bool):
        return None
    return record


@dataclass
class _Bar:
    total: int
    done: int
    started_at: float = field(default_factory=time.monotonic)
    started_done: int = 0
    line_at: float = field(default_factory=time.monotonic)
    line_done: int = 0
    ended_at: float | None = None  # when it reached its total: its rate stays what it was then

    def rate(self, now: float) -> float:
        """Tokens per second committed by this process (a resumed stream's earlier tokens are not counted)."""
        seconds = (self.ended_at or now) - self.started_at
        return (self.done - self.started_done) / seconds if seconds > 0 else 0.0


def _terminal_bars(bars: dict[str, _Bar], rss) -> Progress:
    """rich's bars, one per stream, with its tokens, rate and the tree's memory; rich is imported only on a
    terminal (a stage process writing a log does not pay its import)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
    from rich.text import Text

    class Tokens(ProgressColumn):
        def render(self, task) -> Text:
            bar = bars.get(task.description)
            rate = bar.rate(time.monotonic()) if bar else 0.0
            return Text(f"{count(task.completed):>5}/{count(task.total):<5} {count(rate):>5} tok/s")

    class Memory(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{rss() / 2**20:,.0f} MiB") if task.id == 0 else Text("")

    # 80 columns: name 12, bar 16, "12.3k/45.6k  1.23M tok/s" 26, ETA 7, memory 9, and the gaps
    return Progress(TextColumn("{task.description:<12.12}"), BarColumn(bar_width=16), Tokens(),
                    TimeRemainingColumn(), Memory(), console=Console(), transient=False)


class RunProgress:
    """Bars on a terminal, lines in a log; `stage()` names the stage the run is in (and records it)."""

    def __init__(self, layout: Layout, every: float = 30.0, live: bool | None = None, budget: int = 1 << 30,
                 supervisor: psutil.Process | None = None):
        self.layout, self.every, self.budget, self.supervisor = layout, every, budget, supervisor
        # JSON lines are for a log collector, even when stdout is a terminal: no bars between them
        self.live = (sys.stdout.isatty() and log.format != "json") if live is None else live
        self.bars_by_name: dict[str, _Bar] = {}
        self.tasks: dict[str, int] = {}
        self.current: tuple[str, float] | None = None  # the stage and when it started (monotonic)
        self.stopped = threading.Event()
        self.bars = None
        if self.live:
            self.bars = _terminal_bars(self.bars_by_name, self.rss)
        else:
            threading.Thread(target=self._heartbeat, daemon=True, name="tokmix-progress-lines").start()

    def rss(self) -> int:
        return tree_rss(self.supervisor)

    # ---------------------------------------------------------------- lines
    def emit(self, event: str, message: str, **fields) -> None:
        line = log.line(message, event, **fields)
        if self.bars is not None and self.bars.live.is_started:
            self.bars.console.print(line, highlight=False, markup=False, soft_wrap=True)
        else:
            log.write(line)

    def log(self, msg: str) -> None:
        self.emit("log", msg)

    def _memory(self) -> tuple[str, dict]:
        rss = self.rss()
        return (f"tree RSS {rss / 2**20:,.0f} MiB of {self.budget / 2**20:,.0f} MiB",
                {"tree_rss": rss, "memory_budget": self.budget})

    def stage(self, name: str, doing: str = "") -> None:
        """The run enters stage `name`: a line, and the stage record; the previous stage's end is logged."""
        now = time.monotonic()
        if self.current is not None:
            was, since = self.current
            self.emit("stage", f"stage {was}: done in {now - since:,.1f}s", stage=was, state="done",
                      seconds=round(now - since, 3))
        self.current = (name, now)
        write_stage(self.layout, name, doing)
        if name != "done":
            self.emit("stage", f"stage {name}: started" + (f" ({doing})" if doing else ""), stage=name,
                      state="started")

    def _heartbeat(self) -> None:
        while not self.stopped.wait(max(self.every, 0.05)):
            self.lines()

    def lines(self) -> None:
        """One line for the stage running, one per stream being tokenized that has not had one for `every`."""
        if self.current is None:
            return
        name, since = self.current
        now = time.monotonic()
        memory, fields = self._memory()
        record = read_stage(self.layout) or {}
        doing = record.get("doing", "") if record.get("stage") == name else ""
        self.emit("progress", f"{name}: {doing + ', ' if doing else ''}running {clock(now - since)}; {memory}",
                  stage=name, doing=doing, seconds=round(now - since, 3), **fields)
        for stream, bar in list(self.bars_by_name.items()) if name == "streams" else []:
            if bar.line_done < bar.total and now - bar.line_at >= self.every:  # not finished and said so already
                self._stream_line(stream, bar, now)

    def _stream_line(self, stream: str, bar: _Bar, now: float) -> None:
        memory, fields = self._memory()
        rate = bar.rate(now)
        eta = max(bar.total - bar.done, 0) / rate if rate > 0 else None
        bar.line_at, bar.line_done = now, bar.done
        self.emit("progress", f"streams {stream}: {bar.done:,} / {bar.total:,} tokens "
                  f"({100 * bar.done / max(bar.total, 1):.1f}%), {count(rate)} tok/s, ETA {clock(eta)}; {memory}",
                  stage="streams", stream=stream, tokens=bar.done, target=bar.total, tok_per_s=round(rate, 1),
                  eta_s=None if eta is None else round(eta, 1), **fields)

    # ---------------------------------------------------------------- the stages' Progress protocol
    def start(self, name: str, total: int, done: int = 0) -> None:
        self.bars_by_name[name] = _Bar(total, done, started_done=done, line_done=done)
        if self.bars is None:
            return
        if not self.bars.live.is_started:
            self.bars.start()
        self.tasks[name] = self.bars.add_task(name, total=total, completed=done)

    def update(self, name: str, done: int, total: int) -> None:
        """A stream's committed tokens: its bar, or without a terminal a line when `every` has passed since its
        last (the heartbeat says it too when no unit commits for that long)."""
        bar = self.bars_by_name.get(name)
        if bar is not None:
            bar.done, bar.total = done, total
            if done >= total and bar.ended_at is None:
                bar.ended_at = time.monotonic()
        if self.bars is not None:
            self.bars.update(self.tasks[name], completed=min(done, total))
        elif bar is not None and time.monotonic() - bar.line_at >= self.every:
            self._stream_line(name, bar, time.monotonic())

    def stop(self) -> None:
        self.stopped.set()
        if self.bars is not None and self.bars.live.is_started:
            self.bars.stop()
