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
from dataclasses import asdict, replace
from pathlib import Path

from tokmix import identity
from tokmix.cache import default_cap, gib
from tokmix.cache import resolve as resolve_cache
from tokmix.errors import TokmixError
from tokmix.executors import check_executor
from tokmix.faults import RESTART_EXIT_CODE, fault_point
from tokmix.lock import RunLock
from tokmix.mirrors import absolute_mirror
from tokmix.outdir import check_output_dir
from tokmix.ownership import Ownership
from tokmix.process import RunOptions, interrupt, log
from tokmix.recipe import Recipe, recipe_diff
from tokmix.shards import (
    OWN_TOKENIZER_NAMES,
    STATE_DIR,
    DamagedFile,
    Layout,
    read_json,
    write_bytes,
    write_json,
)
from tokmix.store import check_store_url, claim_object, is_url, local_path, work_dir
from tokmix.unit_files import count_recorded

WORK_OUTPUT_NAME = "output.json"  # in a working folder's tokmix-state/: the one store output it works for

MAX_FRUITLESS_RESTARTS = 3
LOG_FORMATS = ("text", "json")


# ---------------------------------------------------------------------------- the run's identity
def _same_run(layout: Layout, recipe: Recipe, restart: bool, break_lock: bool) -> bool:
    """Refuse to resume a run of another recipe (--restart starts over) and, on a store, one that another working
    folder writes (a store holds no lock: the run's lock is the kernel's, in its local working folder, so the
    store names the folder whose lock guards it; --break-lock takes the prefix over once that run is known to
    have stopped). A run of another recipe that wrote nothing yet (it stopped on bad input, a typo in a path,
    before its first stage wrote) is started over with this one, said: returns whether the run starts over."""
    where = str(layout.root)
    if not restart:
        try:
            identity.check(layout, "recipe", recipe.output_fields(), where)
        except DamagedFile:
            raise
        except TokmixError:
            if not _nothing_written(layout):
                raise
            was = identity.recorded(layout, "recipe")["output_fields"]
            log(f"{where}: started with another recipe, which wrote nothing yet "
                f"({'; '.join(recipe_diff(was, recipe.output_fields()))}): started over with this one")
            restart = True
    if layout.remote:
        _own_work_folder(layout)
        if identity.recorded(layout, "store owner") is None:  # a fresh prefix: claimed by a create-if-absent
            claim_object(layout.store_run, json.dumps(_store_owner(layout, recipe), indent=2).encode())
        if not break_lock:
            identity.check(layout, "store owner", (socket.gethostname(), str(layout.work)), where)
        if not restart:
            identity.check(layout, "store recipe", recipe.output_fields(), where)
    return restart


def _nothing_written(layout: Layout) -> bool:
    """Whether a local run's folder holds none of the work of its stages: no output file, holdout, unit, built
    benchmark set nor tokenizer of its own (a trained one is work), only the records of what it was started
    with; so starting it over loses nothing."""
    if layout.remote:
        return False
    state = layout.state
    return (not any(layout.root.glob("*.bin")) and not any(layout.root.glob("*.docs"))
            and count_recorded(layout.streams) == 0 and not any(state.glob("holdout*"))
            and not (layout.benchmark_set / "set.json").exists()
            and not any(layout.own_tokenizer(fmt).exists() for fmt in OWN_TOKENIZER_NAMES))


def _store_owner(layout: Layout, recipe: Recipe) -> dict:
    """The store's record of the working folder that writes it (identity's "store owner" and "store recipe")."""
    return {"host": socket.gethostname(), "work": str(layout.work), "output_fields": recipe.output_fields()}


def _own_work_folder(layout: Layout) -> None:
    """A working folder belongs to one store output: it records the URL, and one that works for another, or that
    is a local run's output directory (its bookkeeping would be rewritten), is refused. Of working folders
    started on one fresh prefix at once, the store's create-if-absent of its record (tokmix-state/run.json)
    lets one claim it; the others find it, and are refused by the "store owner" check, before either writes."""
    record = layout.state / WORK_OUTPUT_NAME
    if Layout(layout.work).is_run():
        raise TokmixError(f"--work {layout.work}: the output directory of a local tokmix run (its {STATE_DIR} is that "
                          "run's bookkeeping): choose a folder of its own for the store's run")
    found = read_json(record)
    if found is None:
        write_json(record, {"out": str(layout.root)})
    elif not isinstance(found, dict) or found.get("out") != str(layout.root):
        other = found.get("out") if isinstance(found, dict) else None
        raise TokmixError(f"--work {layout.work}: the working folder of the run writing {other}; each output needs "
                          "its own: choose another --work")


def _record_run(layout: Layout, recipe: Recipe) -> None:
    identity.record_recipe(layout, recipe)
    if layout.remote:
        identity.record(layout, "store owner", (socket.gethostname(), str(layout.work)),
                        output_fields=recipe.output_fields())
        # a copy of the recorded recipe on the store, for the commands that read the run from elsewhere (status)
        write_bytes(layout.root / STATE_DIR / layout.recorded_recipe.name, layout.recorded_recipe.read_bytes())


def _claim(layout: Layout, recipe: Recipe, restart: bool) -> None:
    """Record every path this run will create before any is created, refusing one that is there already and
    that tokmix did not create (the user's). --restart first removes what earlier runs created, only that (the
    split file lives beside the recipe and is kept)."""
    shards = len(recipe.shard_blocks)
    own = recipe.tokenizer.format if recipe.tokenizer.fetched else None
    paths = layout.run_paths(recipe.domains, list(recipe.streams), shards, own, recipe.layout.provenance,
                             recipe.decontaminate is not None, bool(recipe.id_fields))
    owned = Ownership(layout)
    for path in paths:  # a recorded folder swapped for a link: the run would write (and --restart remove) there
        if (link := owned.link_on_the_way(path)) is not None:
            raise TokmixError(f"{link}: is a link (to {os.path.realpath(link)}); tokmix writes only inside its "
                              "output directory: remove the link, or choose another --out")
    taken = owned.not_created(paths)
    if taken:
        how = "write there" if taken[0].is_dir() else "overwrite it"
        raise TokmixError(f"{taken[0]}: exists but tokmix did not create it (the run would {how}); move it away "
                          "or choose another --out")
    if restart:
        left = owned.remove_created()
        if left:
            log(f"--restart left {len(left)} path(s) that tokmix did not make: {', '.join(map(str, left[:5]))}")
    owned.record_created(paths)
    owned.adopt_published()  # after the record: a folder killed before it holds only the locks


# ---------------------------------------------------------------------------- supervisor
def _progress_marker(layout: Layout) -> int:
    """Files committed so far: a restart that commits nothing more made no progress."""
    return count_recorded(layout.streams) + sum(1 for _ in layout.root.glob("*.bin"))


def run(recipe: Recipe, out: str | Path, *, blocks: int | None = None, backend: str | None = None,
        restart: bool = False, work: str | Path | None = None, options: RunOptions | None = None,
        break_lock: bool = False, **option_values) -> dict:
    """Run every stage of `recipe` that is not done yet into `out`; returns the index. `out` may be an
    fsspec URL (s3://, gs://, ...): workers then write units and shards straight to the store, and the run keeps
    its lock and bookkeeping in `work` (default: a folder under ~/.cache named after the URL). `break_lock`
    takes over a lock that a run on another host left (see RunLock). Keyword arguments not named here are
    RunOptions fields (workers=, max_memory=, keep_streams=, mirrors=, executor=)."""
    options = options or RunOptions(**option_values)
    if options.log_format not in LOG_FORMATS:
        raise TokmixError(f"--log-format {options.log_format!r}: choose one of {', '.join(LOG_FORMATS)}")
    log.format = options.log_format
    check_executor(options.executor, options.ray_address)  # before hours of holdout and streams, not after
    recipe = recipe.with_blocks(blocks).with_backend(backend)
    # the stage process runs elsewhere (see STAGE_BOOT): every local path it is given is absolute
    recipe = recipe.model_copy(update={"base_dir": Path(os.path.abspath(recipe.base_dir))})
    options = replace(options, mirrors=[absolute_mirror(spec) for spec in options.mirrors],
                      cache=resolve_cache(options.cache) if options.cache is not None else None)
    if is_url(out):
        url = str(out).rstrip("/")
        check_store_url(url)
        check_store_options(recipe)
        layout = Layout(url, work=work_dir(url, work))
        options = replace(options, store=url)
    else:
        if work is not None:  # a local run keeps its lock and bookkeeping in its own directory
            raise TokmixError(f"--work {work}: only for an output on an object store (s3://, gs://); a local --out "
                              f"keeps its lock and bookkeeping in {os.path.join(local_path(out), STATE_DIR)}: drop "
                              "--work")
        layout = Layout(os.path.abspath(local_path(out)))
    check_output_dir(recipe, str(layout.root), options.mirrors)  # before anything is written
    if options.cache is not None:
        _check_cache_apart(options.cache, str(layout.root))
    try:
        layout.state.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TokmixError(f"output directory {layout.work}: cannot create it ({e.strerror})") from None
    if not os.access(layout.work, os.W_OK):
        raise TokmixError(f"output directory {layout.work}: not writable")
    with RunLock(layout, break_lock) as lock:
        if lock.took_over:
            log(f"took over the lock of {lock.took_over} that ended without releasing it")
        restart = _same_run(layout, recipe, restart, break_lock)
        _claim(layout, recipe, restart)
        _record_run(layout, recipe)
        write_json(layout.options, asdict(options))
        (layout.error).unlink(missing_ok=True)
        if options.cache is not None:
            cap = options.cache_size if options.cache_size is not None else default_cap(options.cache)
            log(f"token cache: {options.cache} (cap {gib(cap)}; --cache DIR or TOKMIX_CACHE to move it, "
                "--no-cache to turn it off)")
        fruitless = 0
        while True:
            before, processes = _progress_marker(layout), _worker_process_cap(layout)
            code, message = _run_child(layout, lock)
            if code == 0:
                break
            if code != RESTART_EXIT_CODE:
                raise TokmixError(message or f"stage process exited with {code}")
            # a restart with fewer worker processes (the memory guard's way down) is not fruitless: there are as
            # many such as worker processes, and the last start, with one, is counted as any other
            leaner = _worker_process_cap(layout) < processes
            fruitless = 0 if leaner or _progress_marker(layout) != before else fruitless + 1
            if fruitless >= MAX_FRUITLESS_RESTARTS:
                raise TokmixError(f"the memory guard restarted the run {fruitless} times without progress: "
                                  f"raise --max-memory (now {options.max_memory / 2**20:,.0f} MiB) or lower --workers")
            fault_point("runner:before-restart")
            log("restarting the stage process (memory guard); resuming from committed work")
    index = layout.read_index()
    return index.to_json() if index is not None else {}


def _worker_process_cap(layout: Layout) -> float:
    """The worker processes the next stage process may start (the memory guard lowers them for its restart;
    unbounded until it does)."""
    cap = json.loads(layout.options.read_text()).get("worker_processes")
    return float("inf") if cap is None else cap


def _check_cache_apart(cache: str, out: str) -> None:
    """The token cache and the output directory must not hold one another: each deletes only what is its own,
    and a cache inside a run's directory would be a file the run did not make there."""
    a, b = cache.rstrip("/") + "/", out.rstrip("/") + "/"
    if a.startswith(b) or b.startswith(a):
        raise TokmixError(f"token cache {cache}: inside the output directory {out} or holding it; put it elsewhere "
                          "(--cache DIR) or run with --no-cache")


def check_store_options(recipe: Recipe) -> None:
    """What a run to a store cannot do yet, refused before any work."""
    repeating = [name for name, stream in recipe.streams.items() if stream.max_epochs > 1]
    if repeating:
        raise TokmixError(f"stream {repeating[0]}: max_epochs > 1 needs a local or shared-filesystem --out (a "
                          "repeat unit reads its documents from every unit of the first pass, which on a store "
                          "would mean holding them in memory)")


# The stage process imports tokmix from where this supervisor did, never from the working directory: `-m` and
# `-c` put the working directory first on sys.path (and Python 3.10 has no -P), so the bootstrap drops that
# entry before importing anything. The process also runs in the run's state directory, a folder tokmix made
# that holds no code: it is the directory Ray adds to its workers' sys.path (the driver's working directory).
STAGE_BOOT = "import sys\nif sys.path[0] == '':\n    del sys.path[0]\nfrom tokmix.pipeline import main\nmain()"


def _run_child(layout: Layout, lock: RunLock) -> tuple[int, str]:
    """The stages in a child process; returns its exit code and the one-line message it failed with, which
    comes through a pipe: a full disk cannot stop it from reaching the terminal. Ctrl-C reaches the child too
    (same process group); SIGTERM to the supervisor is passed on. Either way the child stops its workers and
    exits, and the run can be resumed."""
    # the short-lived processes it starts leave their pools' semaphores behind; the tracker's warning is noise
    quiet = ["-W", "ignore:resource_tracker:UserWarning"]
    read_end, write_end = os.pipe()
    try:  # the lock's descriptor is inherited too: the stage process holds the lock as long as it runs
        proc = subprocess.Popen([sys.executable, *quiet, "-c", STAGE_BOOT, str(layout.work), str(write_end)],
                                cwd=layout.state, pass_fds=(write_end, lock.fd))
    finally:
        os.close(write_end)
    lock.name_stage_process(proc.pid)
    previous = signal.signal(signal.SIGTERM, interrupt) if threading.current_thread() is threading.main_thread() \
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
