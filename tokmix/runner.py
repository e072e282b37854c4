"""The supervisor: one run of a recipe into an output directory. `run()` takes the directory's lock, records
the recipe (refusing a changed one), and runs the stages in a child process that it starts again whenever
the child exits with RESTART_EXIT_CODE (the memory guard's backstop: a fresh process with a fresh heap,
resuming from the committed work). `python -m tokmix.runner OUT_DIR` is that child."""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from tokmix.backends import choose_backend, clean_surrogates
from tokmix.errors import TokmixError
from tokmix.faults import RESTART_EXIT_CODE, exit_for_restart, fault_point
from tokmix.recipe import Recipe, recipe_diff, recipe_from_dict
from tokmix.shards import STREAMS_DIR, Layout, remove_tmp_files, shard_blocks, shard_tokens, write_json
from tokmix.sources import UNIT_BYTES, iter_file_texts, load_or_create_split, parse_mirrors, stream_files
from tokmix.stages import Context
from tokmix.stages.assemble import build_index, run_assemble
from tokmix.stages.holdout import run_holdout
from tokmix.stages.streams import run_streams
from tokmix.stages.validate import share_warnings, validate_dir
from tokmix.tokenizer import load_tokenizer, token_dtype, train_tokenizer, vocab_size

ERROR_EXIT_CODE = 2
MAX_FRUITLESS_RESTARTS = 3
MEMORY_POLL_SECONDS = 0.25
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
MIN_AVAILABLE_BYTES = 256 << 20  # the machine itself running out: restart before the kernel's OOM killer acts
STAGES = ("tokenizer", "holdout", "streams", "assemble", "validate")
SAMPLE_DOCS_PER_STREAM = 64  # documents of each stream checked against HF when choosing a backend


@dataclass
class RunOptions:
    """How to run; none of it changes the output bytes."""

    workers: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    max_memory: int = 1 << 30
    keep_streams: bool = False
    mirrors: list[str] = field(default_factory=list)
    executor: str = "local"
    debug: bool = False
    # source bytes per work unit: the grain of parallelism and of resume (TOKMIX_UNIT_BYTES to tune)
    unit_bytes: int = field(default_factory=lambda: int(os.environ.get("TOKMIX_UNIT_BYTES", UNIT_BYTES)))


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


def _record_recipe(layout: Layout, recipe: Recipe, restart: bool) -> None:
    path = layout.state / "recipe.json"
    new = {"recipe": recipe.model_dump(mode="json"), "base_dir": str(recipe.base_dir),
           "output_fields": recipe.output_fields()}
    if path.exists() and not restart:
        old = json.loads(path.read_text())["output_fields"]
        changes = recipe_diff(old, new["output_fields"])
        if changes:
            raise TokmixError(f"{layout.root} was started with another recipe; resuming would mix two runs. "
                              f"Changed: {'; '.join(changes)}. Use --restart to start over")
    write_json(path, new)


def load_recorded_recipe(layout: Layout) -> Recipe:
    data = json.loads((layout.state / "recipe.json").read_text())
    return recipe_from_dict(data["recipe"], Path(data["base_dir"]))


def _wipe(layout: Layout) -> None:
    """--restart: remove everything a run wrote (the split file lives beside the recipe and is kept)."""
    for path in layout.root.glob("*"):
        if path.name.startswith(("train_", "val_")) or path.name in ("index.json", "tokenizer.json"):
            path.unlink()
    shutil.rmtree(layout.streams, ignore_errors=True)
    for path in layout.state.glob("*"):
        if path.name != "lock":
            shutil.rmtree(path) if path.is_dir() else path.unlink()


# ---------------------------------------------------------------------------- supervisor
def _progress_marker(layout: Layout) -> int:
    """Files committed so far: a restart that commits nothing more made no progress."""
    return sum(1 for _ in layout.streams.glob("*/units/*.json")) + sum(1 for _ in layout.root.glob("*.bin"))


def run(recipe: Recipe, out: str | Path, *, blocks: int | None = None, backend: str | None = None,
        restart: bool = False, options: RunOptions | None = None, **option_values) -> dict:
    """Run every stage of `recipe` that is not done yet into `out`; returns the index. Keyword arguments
    not named here are RunOptions fields (workers=, max_memory=, keep_streams=, mirrors=, executor=)."""
    options = options or RunOptions(**option_values)
    recipe = recipe.with_blocks(blocks).with_backend(backend)
    layout = Layout(out)
    try:
        layout.state.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TokmixError(f"output directory {layout.root}: cannot create it ({e.strerror})") from None
    if not os.access(layout.root, os.W_OK):
        raise TokmixError(f"output directory {layout.root}: not writable")
    with RunLock(layout):
        if restart:
            _wipe(layout)
        _record_recipe(layout, recipe, restart)
        write_json(layout.state / "options.json", asdict(options))
        (layout.state / "error.txt").unlink(missing_ok=True)
        fruitless = 0
        while True:
            before = _progress_marker(layout)
            code = _run_child(layout)
            if code == 0:
                break
            if code != RESTART_EXIT_CODE:
                error = layout.state / "error.txt"
                raise TokmixError(error.read_text().strip() if error.exists() else f"stage process exited with {code}")
            fruitless = fruitless + 1 if _progress_marker(layout) == before else 0
            if fruitless >= MAX_FRUITLESS_RESTARTS:
                raise TokmixError(f"the memory guard restarted the run {fruitless} times without progress: "
                                  f"raise --max-memory (now {options.max_memory / 2**20:,.0f} MiB) or lower --workers")
            fault_point("runner:before-restart")
            log("restarting the stage process (memory guard); resuming from committed work")
    return layout.read_index()


def _run_child(layout: Layout) -> int:
    """The stages in a child process. Ctrl-C reaches it too (same process group); SIGTERM to the supervisor
    is passed on. Either way the child stops its workers and exits, and the run can be resumed."""
    # workers stopped on an error leave their pool's semaphores behind; the tracker's warning about it is noise
    quiet = ["-W", "ignore:resource_tracker:UserWarning"]
    proc = subprocess.Popen([sys.executable, *quiet, "-m", "tokmix.runner", str(layout.root)])
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------------------- the child: stages
def _start_memory_guard(limit: int) -> None:
    """Exit for a restart when this process and its workers pass `limit` bytes, or the machine runs low.
    Units commit atomically, so exiting at any moment loses only the units in flight."""
    me = psutil.Process()

    def tree_rss() -> int:
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:  # a worker that just exited
                pass
        return total

    def watch() -> None:
        while True:
            rss, available = tree_rss(), psutil.virtual_memory().available
            if rss > limit or available < MIN_AVAILABLE_BYTES:
                log(f"memory guard: process tree {rss / 2**20:,.0f} MiB (limit {limit / 2**20:,.0f}), "
                    f"machine available {available / 2**20:,.0f} MiB -> restarting from committed work")
                exit_for_restart()
            time.sleep(MEMORY_POLL_SECONDS)

    threading.Thread(target=watch, daemon=True, name="memory-guard").start()


class Timings:
    """Seconds per stage, summed over the restarts of a run."""

    def __init__(self, layout: Layout):
        self.path = layout.state / "timings.json"
        self.seconds = json.loads(self.path.read_text()) if self.path.exists() else {}

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + seconds, 3)
        write_json(self.path, self.seconds)


def is_complete(layout: Layout, recipe: Recipe) -> bool:
    """The validated run of this recipe is on disk, every file at its size."""
    done = layout.state / "done.json"
    if not done.exists() or json.loads(done.read_text()).get("fingerprint") != recipe.fingerprint():
        return False
    index = layout.read_index()
    itemsize = 4 if index.get("dtype") == "uint32" else 2
    expected = {s["file"]: s["tokens"] for s in index.get("shards", [])}
    expected |= {v["file"]: v["tokens"] for v in index.get("val", {}).values()}
    plan = shard_blocks(recipe.blocks, recipe.blocks_per_shard)
    if len(index.get("shards", [])) != len(plan):
        return False
    return all((layout.root / f).exists() and (layout.root / f).stat().st_size == n * itemsize
               for f, n in expected.items()) and all(
        s["tokens"] == shard_tokens(b, recipe.layout.seq_len) for s, b in zip(index["shards"], plan))


def _train_tokenizer(recipe: Recipe, layout: Layout, split, mirrors) -> str:
    """[tokenizer.train]: learn a byte-level BPE from the train files only (each stream its share of
    max_bytes, in canonical order), once; later processes of the run load the saved file."""
    path = layout.root / "tokenizer.json"
    if path.exists():
        return str(path)
    spec = recipe.tokenizer.train

    def texts():
        for name, stream in recipe.streams.items():
            left = int(spec.max_bytes * stream.share)
            for text in iter_file_texts(stream_files(recipe, split, name, "train"), stream.text_field, name, mirrors):
                if left <= 0:
                    break
                if text:
                    left -= len(text)
                    yield clean_surrogates(text)

    train_tokenizer(texts(), spec.vocab_size, spec.min_frequency, path)
    fault_point("tokenizer:after-train")
    return str(path)


def _sample_texts(recipe: Recipe, split, mirrors) -> list[str]:
    """The first documents of every stream, for the backend's exactness check."""
    sample = []
    for name, stream in recipe.streams.items():
        reader = iter_file_texts(stream_files(recipe, split, name, "train"), stream.text_field, name, mirrors)
        sample += [clean_surrogates(t) for t in itertools.islice(reader, SAMPLE_DOCS_PER_STREAM)]
    return sample


def build_context(recipe: Recipe, layout: Layout, options: RunOptions, timings: Timings) -> Context:
    t0 = time.perf_counter()
    mirrors = parse_mirrors(options.mirrors)
    split = load_or_create_split(recipe, mirrors)
    tokenizer_path = recipe.tokenizer_path or _train_tokenizer(recipe, layout, split, mirrors)
    tok = load_tokenizer(tokenizer_path)
    dtype = token_dtype(tok, recipe.tokenizer.dtype, tokenizer_path)
    workers = max(1, options.workers)
    backend, notices = choose_backend(tokenizer_path, recipe.tokenizer.backend, _sample_texts(recipe, split, mirrors))
    for notice in notices:
        log(notice)
    timings.add("tokenizer", time.perf_counter() - t0)
    return Context(recipe, layout, split, tokenizer_path, backend, dtype, vocab_size(tok), workers, mirrors,
                   options.executor, log, options.unit_bytes)


def run_pipeline(ctx: Context, timings: Timings) -> dict:
    """holdout -> streams -> assemble -> index -> validate; each stage skips what is already committed."""
    t0 = time.perf_counter()
    val = run_holdout(ctx)
    timings.add("holdout", time.perf_counter() - t0)
    t0 = time.perf_counter()
    metas = run_streams(ctx)
    timings.add("streams", time.perf_counter() - t0)
    t0 = time.perf_counter()
    shards, used = run_assemble(ctx, metas)
    index = build_index(ctx, val, metas, shards, used)
    fault_point("assemble:before-index")
    ctx.layout.write_index(index)
    timings.add("assemble", time.perf_counter() - t0)
    fault_point("validate:before")
    t0 = time.perf_counter()
    problems = validate_dir(ctx.layout.root)
    timings.add("validate", time.perf_counter() - t0)
    if problems:
        raise TokmixError(f"validation failed: {problems[0]}" + (f" (and {len(problems) - 1} more)"
                                                                  if len(problems) > 1 else ""))
    for warning in share_warnings(index):
        log(f"warning: {warning}")
    log(f"validated {len(shards)} shard(s) and {len(val)} holdout(s)")
    return index


def run_stages(layout: Layout, options: RunOptions) -> None:
    recipe = load_recorded_recipe(layout)
    if is_complete(layout, recipe):
        log(f"{layout.root}: already complete and validated; nothing to do")
    else:
        remove_tmp_files(layout.root)
        timings = Timings(layout)
        run_pipeline(build_context(recipe, layout, options, timings), timings)
        write_json(layout.state / "done.json", {"fingerprint": recipe.fingerprint()})
        fault_point("cleanup:before")
    if not options.keep_streams:
        shutil.rmtree(layout.root / STREAMS_DIR, ignore_errors=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def child_main(out_dir: str) -> int:
    layout = Layout(out_dir)
    options = RunOptions(**json.loads((layout.state / "options.json").read_text()))
    signal.signal(signal.SIGTERM, _interrupt)
    _start_memory_guard(options.max_memory)
    try:
        run_stages(layout, options)
        return 0
    except TokmixError as e:
        message = str(e)
    except KeyboardInterrupt:
        message = f"interrupted; committed work is kept: run the same command again to resume ({layout.root})"
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        message = (f"no space left writing {e.filename or layout.root} ({e.strerror}); committed work is kept: "
                   "free some space and run the same command again to resume")
    except Exception as e:  # a bug, not bad input: say so, with the traceback on --debug
        message = f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)"
    if options.debug:
        traceback.print_exc()
    (layout.state / "error.txt").write_text(message + "\n")
    return ERROR_EXIT_CODE


if __name__ == "__main__":
    code = child_main(sys.argv[1])
    sys.stdout.flush()
    os._exit(code)  # worker pools' threads must not stall the exit
