"""Live progress of the stage process: rich bars per stream (tokens / budget, tokens/s, ETA) and the memory
of the process tree when stdout is a terminal; plain timestamped lines every `every` seconds otherwise
(CI, nohup, log files). Bars start from the committed work, so they survive the stage restarts."""

from __future__ import annotations

import sys
import time

import psutil
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text


def tree_rss() -> int:
    """Bytes resident in this process and all its descendants."""
    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:  # a worker that just exited
            pass
    return total


class _Tokens(ProgressColumn):
    def render(self, task) -> Text:
        rate = task.finished_speed or task.speed or 0
        return Text(f"{task.completed / 1e6:,.1f}M / {task.total / 1e6:,.1f}M tok  {rate / 1e6:,.1f}M tok/s")


class _Memory(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{tree_rss() / 2**20:,.0f} MiB") if task.id == 0 else Text("")


class RunProgress:
    def __init__(self, every: float = 10.0, live: bool | None = None):
        self.live = sys.stdout.isatty() if live is None else live
        self.every, self.last = every, {}
        self.tasks: dict[str, int] = {}
        self.bars = None
        if self.live:
            self.bars = Progress(TextColumn("{task.description:<14}"), BarColumn(), _Tokens(), TimeRemainingColumn(),
                                 _Memory(), console=Console(), transient=False)

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        if self.bars is not None and self.bars.live.is_started:
            self.bars.console.print(line, highlight=False)
        else:
            print(line, flush=True)

    def start(self, name: str, total: int, done: int = 0) -> None:
        if self.bars is None:
            return
        if not self.bars.live.is_started:
            self.bars.start()
        self.tasks[name] = self.bars.add_task(name, total=total, completed=done)

    def update(self, name: str, done: int, total: int) -> None:
        """Progress of one bar; without a terminal, a line per bar every `every` seconds."""
        if self.bars is not None:
            self.bars.update(self.tasks[name], completed=min(done, total))
            return
        now = time.monotonic()
        if now - self.last.setdefault(name, now) >= self.every:
            self.last[name] = now
            self.log(f"{name}: {done:,} / {total:,} tokens committed ({100 * done / max(total, 1):.0f}%), "
                     f"process tree {tree_rss() / 2**20:,.0f} MiB")

    def stop(self) -> None:
        if self.bars is not None and self.bars.live.is_started:
            self.bars.stop()
