"""What a run directory holds, from its files alone (no process is asked): the holdouts written, each stream's
committed units and tokens against its budget, the shards written against the plan, whether the run was
validated, and whether a live process holds the directory's lock. Safe to call while a run writes."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from tokmix.errors import TokmixError
from tokmix.format.records import Index
from tokmix.lock import flock_holders, read_holder
from tokmix.progress import read_stage
from tokmix.recipe import Recipe, recipe_from_dict
from tokmix.shards import (
    DamagedFile,
    Layout,
    NotAFile,
    read_index,
    read_json,
    read_regular,
    reader_layout,
    tokenizer_change,
)
from tokmix.store import storage
from tokmix.unit_files import recorded


@dataclass
class StreamStatus:
    name: str
    domain: str
    budget: int
    tokens: int  # committed: the stream's record when done, else the sum over committed unit records
    docs: int
    units: int
    done: bool


@dataclass
class Status:
    out: Path
    recipe: Recipe
    lock: tuple[str, int] | None  # (host, pid) the lock file names, if any
    running: bool  # a process holds the kernel's lock (or the file names another host)
    tokenizer: bool
    holdouts: dict[str, int | None]  # domain -> tokens written, None when not yet
    streams: dict[str, StreamStatus]
    shards_planned: list[int]  # blocks per shard
    shards_written: list[str]
    validated: bool
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    tokenizer_changed: str | None = None  # the line saying the tokenizer is not the one the shards were made with
    # the stage record (tokmix-state/stage.json): the stage the run is in or stopped in, since when, what it did
    stage: dict = field(default_factory=dict)
    backend: str | None = None  # the backend the run checked and chose, once it has
    now: float = field(default_factory=time.time)

    def in_stage(self, name: str) -> bool:
        """Whether the running run is in stage `name` now."""
        return self.running and self.stage.get("stage") == name

    def stage_seconds(self) -> float:
        return max(self.now - float(self.stage.get("started") or self.now), 0.0)

    @property
    def complete(self) -> bool:
        return self.validated and len(self.shards_written) == len(self.shards_planned)

    def remaining(self) -> list[str]:
        """What a resumed run still has to do, in stage order."""
        todo = []
        if not self.tokenizer:
            todo.append("train the tokenizer")
        todo += [f"holdout {d}" for d, n in self.holdouts.items() if n is None]
        todo += [
            f"stream {s.name} ({max(s.budget - s.tokens, 0):,} tokens)" for s in self.streams.values() if not s.done
        ]
        missing = len(self.shards_planned) - len(self.shards_written)
        if missing:
            todo.append(f"{missing} shard(s)")
        if not self.validated:
            todo.append("validate")
        return todo


def _recorded_recipe(layout: Layout) -> Recipe:
    path = layout.recorded_recipe
    if not path.exists():
        raise TokmixError(f"{layout.root}: no tokmix run here ({path} not found)")
    data = read_json(path)  # damaged: one line naming it, as `run` says
    if not isinstance(data, dict) or not isinstance(data.get("recipe"), dict) or "base_dir" not in data:
        raise DamagedFile(path, "not the recipe record tokmix writes")
    return recipe_from_dict(data["recipe"], Path(data["base_dir"]), str(path))


def _lock(layout: Layout) -> tuple[tuple[str, int] | None, bool]:
    """Who the lock file names, and whether a run holds the directory: judged by the kernel's lock itself (the
    flocks /proc/locks lists on the lock file, or on the writers file for a worker of a run whose stage process
    was killed), never by probing it with flock, which would make a run starting at that moment refuse. Where the
    kernel does not say, by the pids the file names; a lock of another host counts as held (it cannot be
    checked from here)."""
    if storage(layout.work).remote:  # read from a store, far from its working folder's kernel lock
        return None, False
    holder = read_holder(layout.lock)[0]
    host = holder[0] if holder else socket.gethostname()
    pids = [int(p) for p in holder[1:] if p.isdigit()]  # the supervisor's, then its stage process's
    if holder and host != socket.gethostname():
        return (host, pids[0] if pids else 0), True
    held = flock_holders(layout.lock)
    if held is None:
        pid = next((p for p in pids if _alive(p)), None)
        return ((host, pid if pid is not None else pids[0]) if pids else None), pid is not None
    held += flock_holders(layout.writers) or []
    if held:  # the taker's pid may be a supervisor that is gone while its stage process holds the lock
        return (host, next((p for p in pids if _alive(p)), held[0])), True
    return ((host, pids[0]) if pids else None), False


def _alive(pid: int) -> bool:
    """A process that runs (a killed one not reaped yet is a zombie, which holds no lock)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _json(path: Path, sealed: bool = False) -> dict | None:
    """A committed JSON file, or None: absent, or damaged (not whole JSON, a FIFO or a link in its place: what the
    next run remakes, as it would remake it); never opened unless it is a regular file."""
    try:
        value = read_json(path, sealed=sealed, remedy="")
    except DamagedFile:
        return None
    return value if isinstance(value, dict) else None


def _error_line(path: Path) -> str | None:
    if storage(path).remote:
        return None
    try:
        return read_regular(path, follow=False).decode(errors="replace").strip()
    except (FileNotFoundError, NotAFile):
        return None


def _stream_status(layout: Layout, recipe: Recipe, name: str, index: Index | None, validated: bool) -> StreamStatus:
    spec, budget = recipe.streams[name], recipe.budget(name)
    folder = layout.stream(name)
    meta = _json(layout.stream_meta(name), sealed=True)
    if meta is not None:
        return StreamStatus(name, spec.domain, budget, meta["tokens"], meta["docs"], len(meta["units"]), True)
    if validated and not folder.exists():  # intermediates removed after validation
        meta = index.mix.streams.get(name) if index is not None and index.mix is not None else None
        tokens, docs = (meta.tokens, meta.docs) if meta is not None else (budget, 0)
        return StreamStatus(name, spec.domain, budget, tokens, docs, 0, True)
    tokens = docs = units = 0
    for files in recorded(layout.units(name)):
        record = _json(files.record, sealed=True)
        if record and files.has_content():
            tokens, docs, units = tokens + record["tokens"], docs + record["docs"], units + 1
    return StreamStatus(name, spec.domain, budget, tokens, docs, units, False)


def _shards_written(layout: Layout, tokens: list[int], itemsize: int) -> list[str]:
    written = []
    for k, n in enumerate(tokens):
        shard = layout.train(k)
        record = layout.shard_record(shard.name)
        if record.exists() and shard.exists() and shard.stat().st_size == n * itemsize:
            written.append(shard.name)
    return written


def status(out_dir: str | os.PathLike) -> Status:
    """The state of the run in `out_dir`, read from its files."""
    layout = reader_layout(out_dir)  # a store's run: its local working folder, or what the store holds
    recipe = _recorded_recipe(layout)
    index = (read_index(layout.work) if layout.index.exists() else
             read_index(layout.root) if layout.published_index.exists() else None)
    done = _json(layout.done) or {}
    validated = done.get("fingerprint") == recipe.fingerprint()
    if storage(layout.work).remote:  # read from the store alone: its index.json is published once it is valid
        validated = index is not None and layout.published_index.exists() \
            and index.recipe_fingerprint == recipe.fingerprint()
    lock, running = _lock(layout)
    val = index.val if index is not None else {}
    holdouts = {d: (val[d].tokens if d in val and layout.val(d).exists() else None) for d in recipe.domains}
    forced = recipe.tokenizer.dtype if recipe.tokenizer.dtype != "auto" else None
    recorded = index.dtype if index is not None and index.has("dtype") else None
    import numpy as np  # here only: `tokmix status` starts without it

    itemsize = np.dtype(recorded or forced or Index.DEFAULTS["dtype"]).itemsize
    plan = recipe.shard_blocks
    error = layout.error
    return Status(
        out=layout.root,
        recipe=recipe,
        lock=lock,
        running=running,
        tokenizer=bool(recipe.tokenizer_path) or layout.own_tokenizer(recipe.tokenizer.format).exists(),
        holdouts=holdouts,
        streams={n: _stream_status(layout, recipe, n, index, validated) for n in recipe.streams},
        shards_planned=plan,
        shards_written=_shards_written(layout, recipe.shard_tokens_list, itemsize),
        validated=validated,
        error=_error_line(error) if not running else None,
        timings=_json(layout.timings) or {},
        tokenizer_changed=tokenizer_change(layout.root, index) if index is not None and index.shards else None,
        stage=read_stage(layout) or {},
        backend=(_json(layout.backend_choice) or {}).get("backend"),
    )


# ---------------------------------------------------------------------------- rendering
def _state(done: bool, started: bool) -> Text:
    if done:
        return Text("done", style="green")
    return Text("in progress", style="yellow") if started else Text("not started", style="dim")


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _time(st: Status, stage: str, timing: str | None = None) -> str:
    """How long a stage has run: its running time when it is the run's stage now, else its recorded seconds."""
    if st.in_stage(stage):
        return _clock(st.stage_seconds())
    seconds = st.timings.get(timing or stage)
    return f"{seconds:,.1f}s" if seconds is not None else ""


def render_status(st: Status) -> Group:
    if st.running:
        head = Text.assemble(("running", "bold yellow"), f": pid {st.lock[1]} on {st.lock[0]} holds the lock")
        if st.stage:
            doing = f": {st.stage['doing']}" if st.stage.get("doing") else ""
            head.append(f"; stage {st.stage['stage']} for {_clock(st.stage_seconds())}{doing}")
    elif st.lock:
        head = Text.assemble(
            ("not running", "bold"),
            f" (stale lock of pid {st.lock[1]} on {st.lock[0]}: no process holds it; the next run takes it over)",
        )
    else:
        head = Text.assemble(("not running", "bold"))
    table = Table(title=f"{st.out}: recipe {st.recipe.fingerprint()}", title_justify="left")
    for col in ("stage", "state", "progress", "", "time", "detail"):
        table.add_column(col, justify="right" if col in ("progress", "time") else "left")
    training = st.in_stage("tokenizer")
    tokenizer = st.recipe.tokenizer_path or ("trained (tokenizer.json)" if st.tokenizer else "trained by the run")
    table.add_row("tokenizer", _state(st.tokenizer and not training, training), "", "", _time(st, "tokenizer"),
                  st.stage.get("doing", "") if training else tokenizer)
    checking = st.in_stage("backend check")
    table.add_row("backend check", _state(st.backend is not None and not checking, checking), "", "",
                  _clock(st.stage_seconds()) if checking else "",
                  st.stage.get("doing", "") if checking else (st.backend or ""))
    first_todo = next((d for d, n in st.holdouts.items() if n is None), None)
    for k, (domain, tokens) in enumerate(st.holdouts.items()):
        table.add_row(f"holdout {domain}", _state(tokens is not None, st.in_stage("holdout") and domain == first_todo),
                      f"{tokens:,}" if tokens is not None else "", "", _time(st, "holdout") if k == 0 else "", "")
    table.add_section()
    for k, s in enumerate(st.streams.values()):
        bar = ProgressBar(total=s.budget, completed=min(s.tokens, s.budget), width=20)
        table.add_row(
            f"stream {s.name}",
            _state(s.done, s.units > 0),
            f"{s.tokens:,} / {s.budget:,}",
            bar,
            _time(st, "streams") if k == 0 else "",
            ", ".join(
                x for x in (f"{s.units:,} unit(s)" if s.units else "", f"{s.docs:,} docs" if s.docs else "") if x
            ),
        )
    table.add_section()
    n, planned = len(st.shards_written), len(st.shards_planned)
    table.add_row("shards", _state(n == planned, n > 0 or st.in_stage("assemble")), f"{n} / {planned}",
                  ProgressBar(total=planned, completed=n, width=20), _time(st, "assemble"), "")
    table.add_row("validate", _state(st.validated, st.in_stage("validate")), "", "", _time(st, "validate"), "")
    parts: list = [head, table]
    if not st.running and st.stage.get("stage") not in (None, "done") and not st.complete:
        parts.append(Text(f"stopped in stage {st.stage['stage']}"))
    if st.error:
        parts.append(Text.assemble(("last error: ", "bold red"), st.error))
    if st.tokenizer_changed:
        parts.append(Text.assemble(("warning: ", "bold red"), st.tokenizer_changed))
    if st.complete:
        parts.append(Text("complete and validated", style="bold green"))
    else:
        parts.append(Text.assemble(("remaining: ", "bold"), "; ".join(st.remaining())))
    return Group(*parts)
