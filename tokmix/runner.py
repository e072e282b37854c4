"""The supervisor: one run of a recipe into an output directory. `run()` takes the directory's lock, records
the recipe (refusing a changed one), and runs the stages in a child process (tokmix.pipeline) that it
starts again whenever the child exits with RESTART_EXIT_CODE (the memory guard's backstop: a fresh process
with a fresh heap, resuming from the committed work). It imports none of the pipeline, so it stays small
while the stage process works."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil

from tokmix.errors import TokmixError
from tokmix.executors import check_executor
from tokmix.faults import RESTART_EXIT_CODE, fault_point
from tokmix.outdir import check_output_dir
from tokmix.publish import is_remote, local_path, publish, staging_dir
from tokmix.recipe import Recipe, recipe_diff, recipe_from_dict
from tokmix.shards import UNIT_BYTES, Layout, shard_blocks, write_json

ERROR_EXIT_CODE = 2
MAX_FRUITLESS_RESTARTS = 3


@dataclass
class RunOptions:
    """How to run; none of it changes the output bytes."""

    workers: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    max_memory: int = 1 << 30
    keep_streams: bool = False
    mirrors: list[str] = field(default_factory=list)
    executor: str = "local"  # local | ray
    ray_address: str | None = None  # a running Ray cluster; without it --executor ray starts a local instance
    debug: bool = False
    # source bytes per work unit: the grain of parallelism and of resume (TOKMIX_UNIT_BYTES to tune)
    unit_bytes: int = field(default_factory=lambda: int(os.environ.get("TOKMIX_UNIT_BYTES", UNIT_BYTES)))
    log_seconds: float = 10.0  # without a terminal: a progress line per stream this often


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------- lock and recorded recipe
class RunLock:
    """One writer per output directory: a lock file holding the owner's host and pid. A lock whose process
    is gone (a killed run) is stale and taken over."""

    def __init__(self, layout: Layout):
        self.path = layout.state / "lock"

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = f"{socket.gethostname()} {os.getpid()}"
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                owner = self.path.read_text().split()
                if len(owner) == 2 and owner[0] == socket.gethostname() and psutil.pid_exists(int(owner[1])):
                    raise TokmixError(f"{self.path.parent.parent}: another tokmix run (pid {owner[1]}) is writing "
                                      "this directory") from None
                self.path.unlink(missing_ok=True)  # stale: its owner was killed
                continue
            with os.fdopen(fd, "w") as f:
                f.write(me)
            return self
        raise TokmixError(f"{self.path}: could not take the lock")

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)


def _same_recipe(layout: Layout, recipe: Recipe) -> None:
    path = layout.state / "recipe.json"
    if path.exists():
        changes = recipe_diff(json.loads(path.read_text())["output_fields"], recipe.output_fields())
        if changes:
            raise TokmixError(f"{layout.root} was started with another recipe; resuming would mix two runs. "
                              f"Changed: {'; '.join(changes)}. Use --restart to start over")


def _record_recipe(layout: Layout, recipe: Recipe) -> None:
    write_json(layout.state / "recipe.json", {"recipe": recipe.model_dump(mode="json"),
                                             "base_dir": str(recipe.base_dir), "output_fields": recipe.output_fields()})


def load_recorded_recipe(layout: Layout) -> Recipe:
    data = json.loads((layout.state / "recipe.json").read_text())
    return recipe_from_dict(data["recipe"], Path(data["base_dir"]))


def _claim(layout: Layout, recipe: Recipe, restart: bool) -> None:
    """Record every path this run will create before any is created, refusing one that is there already and
    that tokmix did not create (the user's). --restart first removes what earlier runs created, only that (the
    split file lives beside the recipe and is kept)."""
    shards = len(shard_blocks(recipe.blocks, recipe.blocks_per_shard))
    paths = layout.run_paths(recipe.domains, list(recipe.streams), shards, recipe.tokenizer.fetched)
    taken = layout.not_created(paths)
    if taken:
        how = "write there" if taken[0].is_dir() else "overwrite it"
        raise TokmixError(f"{taken[0]}: exists but tokmix did not create it (the run would {how}); move it away "
                          "or choose another --out")
    if restart:
        left = layout.remove_created()
        if left:
            log(f"--restart left {len(left)} path(s) that tokmix did not make: {', '.join(map(str, left[:5]))}")
    layout.record_created(paths)


# ---------------------------------------------------------------------------- supervisor
def _progress_marker(layout: Layout) -> int:
    """Files committed so far: a restart that commits nothing more made no progress."""
    return sum(1 for _ in layout.streams.glob("*/units/*.json")) + sum(1 for _ in layout.root.glob("*.bin"))


def run(recipe: Recipe, out: str | Path, *, blocks: int | None = None, backend: str | None = None,
        restart: bool = False, work: str | Path | None = None, options: RunOptions | None = None,
        **option_values) -> dict:
    """Run every stage of `recipe` that is not done yet into `out`; returns the index. `out` may be an
    fsspec URL (s3://, gs://, ...): the run then works in `work` (default: a folder under ~/.cache) and
    publishes the validated files there. Keyword arguments not named here are RunOptions fields (workers=,
    max_memory=, keep_streams=, mirrors=, executor=)."""
    options = options or RunOptions(**option_values)
    check_executor(options.executor, options.ray_address)  # before hours of holdout and streams, not after
    recipe = recipe.with_blocks(blocks).with_backend(backend)
    # the stage process runs elsewhere (see STAGE_BOOT): every local path it is given is absolute
    recipe = recipe.model_copy(update={"base_dir": Path(os.path.abspath(recipe.base_dir))})
    options = replace(options, mirrors=[_absolute_mirror(spec) for spec in options.mirrors])
    if is_remote(out):
        check_output_dir(recipe, str(out), options.mirrors)
        index = run(recipe, staging_dir(str(out), work), restart=restart, options=options)
        uploaded = publish(staging_dir(str(out), work), str(out))
        log(f"published {len(uploaded)} file(s) to {out}")
        return index
    layout = Layout(os.path.abspath(local_path(out)))
    check_output_dir(recipe, str(layout.root), options.mirrors)  # before anything is written
    try:
        layout.state.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TokmixError(f"output directory {layout.root}: cannot create it ({e.strerror})") from None
    if not os.access(layout.root, os.W_OK):
        raise TokmixError(f"output directory {layout.root}: not writable")
    with RunLock(layout):
        if not restart:
            _same_recipe(layout, recipe)
        _claim(layout, recipe, restart)
        _record_recipe(layout, recipe)
        write_json(layout.state / "options.json", asdict(options))
        (layout.state / "error.txt").unlink(missing_ok=True)
        fruitless = 0
        while True:
            before = _progress_marker(layout)
            code, message = _run_child(layout)
            if code == 0:
                break
            if code != RESTART_EXIT_CODE:
                raise TokmixError(message or f"stage process exited with {code}")
            fruitless = fruitless + 1 if _progress_marker(layout) == before else 0
            if fruitless >= MAX_FRUITLESS_RESTARTS:
                raise TokmixError(f"the memory guard restarted the run {fruitless} times without progress: "
                                  f"raise --max-memory (now {options.max_memory / 2**20:,.0f} MiB) or lower --workers")
            fault_point("runner:before-restart")
            log("restarting the stage process (memory guard); resuming from committed work")
    return layout.read_index()


# The stage process imports tokmix from where this supervisor did, never from the working directory: `-m` and
# `-c` put the working directory first on sys.path (and Python 3.10 has no -P), so the bootstrap drops that
# entry before importing anything. The process also runs in the run's state directory, a folder tokmix made
# that holds no code: it is the directory Ray adds to its workers' sys.path (the driver's working directory).
STAGE_BOOT = "import sys\nif sys.path[0] == '':\n    del sys.path[0]\nfrom tokmix.pipeline import main\nmain()"


def _absolute_mirror(spec: str) -> str:
    """`PREFIX=LOCAL_DIR` with LOCAL_DIR made absolute (a URL is left as it is)."""
    prefix, sep, local = spec.partition("=")
    return f"{prefix}={os.path.abspath(local)}" if sep and local and "://" not in local else spec


def _run_child(layout: Layout) -> tuple[int, str]:
    """The stages in a child process; returns its exit code and the one-line message it failed with, which
    comes through a pipe: a full disk cannot stop it from reaching the terminal. Ctrl-C reaches the child too
    (same process group); SIGTERM to the supervisor is passed on. Either way the child stops its workers and
    exits, and the run can be resumed."""
    # the short-lived processes it starts leave their pools' semaphores behind; the tracker's warning is noise
    quiet = ["-W", "ignore:resource_tracker:UserWarning"]
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, *quiet, "-c", STAGE_BOOT, str(layout.root), str(write_end)],
                                cwd=layout.state, pass_fds=(write_end,))
    finally:
        os.close(write_end)
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        os.set_blocking(read_end, False)  # the child is gone; a worker it left behind may still hold the pipe
        try:
            message = os.read(read_end, 1 << 16).decode(errors="replace").strip()
        except BlockingIOError:
            message = ""
        os.close(read_end)
    return code, message


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
