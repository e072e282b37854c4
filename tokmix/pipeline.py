"""The stage process: what `main()` runs for the supervisor (tokmix.runner).
It builds the run's context (split, tokenizer, backend) and runs holdout -> streams -> assemble -> validate,
each skipping what is committed, with the watchdogs of tokmix.guards (memory past the budget: exit for a
restart, losing only the work in flight; the supervisor gone: stop)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import psutil

from tokmix import identity
from tokmix.backends import (
    ORACLE_LIBRARY,
    cut_drops_space,
    huge_doc_chars,
)
from tokmix.cache import UnitCache, default_cap, gib
from tokmix.errors import TokmixError, os_error_message
from tokmix.executors import (
    encoder_process_bytes,
    holdout_threads,
    local_workers,
    make_executor,
    quiet_vanished_semaphores,
    started_worker_processes,
    worker_memory,
)
from tokmix.faults import end_descendants, fault_point, on_restart
from tokmix.format.records import Index
from tokmix.guards import start_memory_guard, watch_supervisor
from tokmix.identity import load_recorded_recipe
from tokmix.lock import RunWriter
from tokmix.manifest import build_index
from tokmix.ngrams import NORMALIZATION, first_pass_note
from tokmix.ownership import Ownership
from tokmix.process import ERROR_EXIT_CODE, RunOptions, interrupt, log
from tokmix.progress import RunProgress
from tokmix.provenance import sources_of
from tokmix.recipe import Recipe
from tokmix.shards import (
    OWN_TOKENIZER_NAMES,
    STATE_DIR,
    Layout,
    write_bytes,
    write_json,
)
from tokmix.sources import Split, load_or_create_split, parse_mirrors
from tokmix.stages import Context, drop_cached, release_memory
from tokmix.stages.assemble import balance_entry, provenance_entry, run_assemble
from tokmix.stages.decontam import (
    benchmark_checksums,
    build_set,
    prepare_set,
    remove_set,
    say_set,
    set_checksums,
    small_benchmarks,
    whole_set,
    write_contamination,
)
from tokmix.stages.expected import record_expected
from tokmix.stages.finished import remakable, verified_complete
from tokmix.stages.holdout import run_holdout
from tokmix.stages.ids import write_ids
from tokmix.stages.streams import run_streams
from tokmix.stages.validate import share_warnings, validate_dir
from tokmix.store import store_problem
from tokmix.tokenizer import (
    document_delimiters,
    id_ranges,
    load_vocabulary,
    token_dtype,
    tokenizer_file,
)
from tokmix.tokenizer_stage import (
    count_sample,
    in_fresh_process,
    run_backend,
    same_tokenizer,
    same_tokenizer_source,
    train_run_tokenizer,
)

REPORT_BYTES = 16 << 10  # of a failure message sent to the supervisor: well under a pipe's buffer

class Timings:
    """Seconds per stage, summed over the restarts of a run."""

    def __init__(self, layout: Layout):
        self.path = layout.timings
        self.seconds = remakable(self.path) or {}

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + seconds, 3)
        write_json(self.path, self.seconds)


def _same_split(layout: Layout, path: str, split: Split) -> None:
    """The split file's content, recorded when the run first reads it: it is part of the run's identity, like
    the recipe. A resume finding another split is refused: the holdouts and units already written follow the
    first one, and a file moved from holdout to train would put holdout documents in the train shards."""
    identity.pinned(layout, "split", split, path, path=path)


def build_context(recipe: Recipe, layout: Layout, options: RunOptions, timings: Timings,
                  progress: RunProgress) -> Context:
    t0 = time.perf_counter()
    progress.stage("split")
    mirrors = parse_mirrors(options.mirrors)
    split = load_or_create_split(recipe, mirrors)
    _same_split(layout, recipe.splits_path, split)
    tokenizer_path = tokenizer_file(recipe, layout.own_tokenizer(recipe.tokenizer.format))
    same_tokenizer_source(layout, recipe)
    if tokenizer_path is None:
        progress.stage("tokenizer", f"training a {recipe.tokenizer.train.vocab_size:,}-token BPE on the train files")
        taken = in_fresh_process(count_sample, recipe, layout, split, mirrors)
        tokenizer_path = in_fresh_process(train_run_tokenizer, recipe, layout, split, mirrors, taken)
    else:
        progress.stage("tokenizer", f"loading {tokenizer_path}")
    vocab = load_vocabulary(tokenizer_path, recipe.tokenizer.format)
    delimiters = document_delimiters(vocab, recipe.tokenizer.doc_prefix, recipe.tokenizer.doc_suffix,
                                     tokenizer_path)
    checksum = same_tokenizer(layout, tokenizer_path)
    dtype = token_dtype(vocab, recipe.tokenizer.dtype, tokenizer_path)
    vocab_size, oracle, token_bytes = vocab.size, vocab.oracle, vocab.token_bytes()
    no_token_ids = id_ranges(vocab.no_token_ids())
    # A large vocabulary's oracle tokenizer weighs as much as an encoder: it is not held beside the backend
    # check's process nor the stage's encoder (docs/benchmarks.md, "Pretrained vocabularies")
    del vocab
    release_memory()
    workers = max(1, options.workers)
    progress.stage("backend check", f"{recipe.tokenizer.backend}: the fast backends against "
                   f"the oracle ({ORACLE_LIBRARY[recipe.tokenizer.format]}) on the first documents of every stream")
    backend = run_backend(recipe, layout, tokenizer_path, vocab_size, split, mirrors)
    libraries = identity.recorded(layout, "tokenizer libraries")
    huge = huge_doc_chars(tokenizer_path)
    timings.add("tokenizer", time.perf_counter() - t0)
    return Context(recipe, layout, split, tokenizer_path, backend, dtype, vocab_size, workers, mirrors,
                   options.executor, progress.log, options.unit_bytes, progress, huge_doc_chars=huge,
                   cut_drops_space=cut_drops_space(tokenizer_path),
                   tokenizer_sha256=checksum, token_bytes=token_bytes, delimiters=delimiters,
                   no_token_ids=no_token_ids or None,
                   writer=RunWriter.of(layout), oracle=oracle, libraries=libraries["libraries"],
                   libraries_at_start=libraries.get("libraries_at_start"),
                   oracle_ids_sha256=libraries["oracle_ids_sha256"]["adversarial"], cache=options.cache,
                   worker_memory=worker_memory(workers, options.max_memory))


def _report_cache(ctx: Context, metas: dict[str, dict], cap: int | None) -> None:
    """What the streams took from the token cache, and the cache held to its cap (LRU; never an entry a running
    run holds). A cache that cannot be pruned (read-only, unreachable) is said, and the run goes on."""
    units = sum(m.get("units_from_cache", 0) for m in metas.values())
    tokens = sum(m.get("tokens_from_cache", 0) for m in metas.values())
    used = sum(len(m["units"]) for m in metas.values())
    log(f"token cache: {units:,} of {used:,} units ({tokens:,} tokens) taken from {ctx.cache}")
    cache = UnitCache(ctx.cache)
    try:
        removed, freed = cache.evict(cap if cap is not None else default_cap(ctx.cache))
        size, entries = cache.size()
    except OSError as e:
        log(f"token cache: {ctx.cache}: cannot prune it ({os_error_message(e)})")
        return
    evicted = f"; {removed:,} least recently used entries ({gib(freed)}) evicted to its cap" if removed else ""
    log(f"token cache: {gib(size)} in {entries:,} entries{evicted}")


def prepare_benchmarks(recipe: Recipe, directory: Path, mirrors, cache: str | None = None,
                       checksums: dict[str, dict[str, str]] | None = None, later=None,
                       data: dict[str, bytes | Path] | None = None) -> dict:
    """The run's benchmark n-grams (tokmix.stages.decontam.prepare_set): taken from the token cache `cache` when
    it holds them, else built (small local files in this process, others in a fresh one, whose arrays leave with
    it; `data`: the files read already, build_set's) and kept there (on a store: by `later`)."""
    def build(*args):
        if small_benchmarks(recipe, mirrors):
            return build_set(*args, data=data)
        return in_fresh_process(partial(build_set, data=data), *args)

    return prepare_set(recipe, directory, mirrors, log, build=build, cache=cache, checksums=checksums, later=later)


def early_benchmarks(ctx: Context, later) -> dict | None:
    """Before the holdout stage writes anything: the run's set of benchmark n-grams (prepare_benchmarks: its own,
    or the token cache's, or built: a large set in a fresh process, nothing beside it) and its benchmark files
    pinned (tokmix.identity, "benchmarks"), each file read once. A cold build without a token cache pins the
    bytes the build read (hashed as it reads them); otherwise they are read and hashed first (a resume checks
    them; a cache's key is made of them) and kept for the build (a small set's bytes, copies of remote files).
    A bad benchmark file (missing, unreadable, a row without its field) ends the run here, in one line, with
    nothing of the stages written; so does one changed since the run pinned it, and one changed between the two
    reads of a local file. `later`: what keeps a built set on a store, beside the stages."""
    recipe, directory = ctx.recipe, ctx.layout.benchmark_set
    if recipe.decontaminate is None:
        return None
    if (note := first_pass_note()) is not None:
        log(note)
    record = whole_set(directory, log, recipe)
    if record is None and ctx.cache is None:
        record = prepare_benchmarks(recipe, directory, ctx.mirrors)
        pin = (NORMALIZATION, set_checksums(record))
        try:
            identity.check(ctx.layout, "benchmarks", pin, "")  # a resume over a changed file: refused, naming it
        except TokmixError:
            remove_set(directory)  # (a set of the changed files: not one a resume over the first ones takes)
            raise
    else:
        data: dict[str, bytes | Path] = {}
        copies = None if small_benchmarks(recipe, ctx.mirrors) else directory
        if copies is not None:
            directory.mkdir(parents=True, exist_ok=True)
        try:
            checksums = benchmark_checksums(recipe, ctx.mirrors, data if record is None else None, copies)
            pin = (NORMALIZATION, checksums)
            identity.check(ctx.layout, "benchmarks", pin, "")
            if record is not None and set_checksums(record) != checksums:  # built, then killed before the pin
                log("benchmark n-grams: built from other bytes of the benchmark files than they hold now; built again")
                remove_set(directory)
                record = None
            if record is None:
                record = prepare_benchmarks(recipe, directory, ctx.mirrors, ctx.cache, checksums, later, data)
            else:
                say_set(record, log)
        finally:
            for held in data.values():
                if isinstance(held, Path):
                    held.unlink(missing_ok=True)
    identity.pinned(ctx.layout, "benchmarks", pin)  # recorded once the files read whole: a fixed file may follow
    return record


def run_pipeline(ctx: Context, timings: Timings, options_cap: int | None = None) -> Index:
    """holdout -> streams -> assemble -> index -> validate; each stage skips what is already committed.
    `options_cap`: the token cache's cap (RunOptions.cache_size)."""
    t0 = time.perf_counter()
    uploads = ThreadPoolExecutor(1, thread_name_prefix="benchmarks-upload")  # a built set kept on a store
    kept: list[Future] = []
    ctx.benchmarks = early_benchmarks(ctx, lambda keep: kept.append(uploads.submit(keep)))
    ctx.progress.stage("holdout", f"{len(ctx.recipe.domains)} domain(s)")
    with holdout_threads(ctx.workers) as threads:
        val = run_holdout(ctx, threads)
    if ctx.executor == "local":
        release_memory()
    else:  # the streams stage encodes in worker processes (or on Ray) with encoders of their own
        drop_cached()
    timings.add("holdout", time.perf_counter() - t0)
    t0 = time.perf_counter()
    ctx.progress.stage("streams", f"{len(ctx.recipe.streams)} stream(s)")
    metas = run_streams(ctx)
    for upload in kept:  # beside the stage (its memory: one part of 16 MiB and a read of 8); done before eviction
        upload.result()
    uploads.shutdown()
    drop_cached()
    if ctx.cache is not None:
        _report_cache(ctx, metas, options_cap)
    timings.add("streams", time.perf_counter() - t0)
    t0 = time.perf_counter()
    ctx.progress.stage("assemble", f"{len(ctx.recipe.shard_blocks)} shard(s)")
    shards, used = run_assemble(ctx, metas)
    provenance = provenance_entry(ctx) if ctx.recipe.layout.provenance else None
    balance = balance_entry(ctx, metas)
    benchmarks = write_contamination(ctx.layout, ctx.benchmarks, metas) if ctx.benchmarks is not None else None
    index = add_document_ids(ctx, build_index(ctx, val, metas, shards, used, provenance, balance, benchmarks))
    fault_point("assemble:before-index")
    ctx.layout.write_index(index)
    timings.add("assemble", time.perf_counter() - t0)
    ctx.progress.stage("validate")
    fault_point("validate:before")
    t0 = time.perf_counter()
    expected = record_expected(ctx, metas)  # while the units exist: what validate checks the shards against
    wrong = [s["file"] for s in shards if s["checksum"] != expected[s["file"]]]
    if wrong:  # committed with a record that matches them, yet not what the units make: made again
        for name in wrong:
            log(f"{name}: not what the committed units and the seed produce; rewritten")
            (ctx.layout.root / name).unlink()
            ctx.layout.shard_record(name).unlink(missing_ok=True)
        shards, used = run_assemble(ctx, metas)
        index = add_document_ids(ctx, build_index(ctx, val, metas, shards, used, provenance, balance, benchmarks))
        ctx.layout.write_index(index)
    problems = validate_dir(ctx.layout.root, index_path=ctx.layout.index, expected_path=ctx.layout.expected)
    timings.add("validate", time.perf_counter() - t0)
    if problems:
        raise TokmixError(f"validation failed: {problems[0]}" + (f" (and {len(problems) - 1} more)"
                                                                  if len(problems) > 1 else ""))
    for warning in share_warnings(index):
        log(f"warning: {warning}")
    log(f"validated {len(shards)} shard(s) and {len(val)} holdout(s)")
    return index


def add_document_ids(ctx: Context, index: Index) -> Index:
    """With an id_field: each train shard's and holdout's documents' ids beside its provenance index, and the
    index with their entries (tokmix.stages.ids)."""
    id_fields = ctx.recipe.id_fields
    if not id_fields:
        return index
    t0 = time.perf_counter()
    sources = sources_of(index.provenance.sources)
    shards = [write_ids(ctx.layout.root, entry, sources, id_fields, ctx.mirrors) for entry in index.shards]
    val = {domain: write_ids(ctx.layout.root, entry, sources_of(entry.provenance.sources), id_fields, ctx.mirrors)
           for domain, entry in index.val.items()}
    ctx.log(f"documents' ids ({', '.join(f'{s}: {f}' for s, f in id_fields.items())}) written beside "
            f"{len(shards)} shard(s) and {len(val)} holdout(s) in {time.perf_counter() - t0:.1f}s")
    return index.replace(shards=shards, val=val, provenance=index.provenance.replace(id_fields=id_fields))


def publish_index(layout: Layout) -> None:
    """On a store, the validated run's index.json is uploaded last (with the run's own tokenizer just before it):
    a reader that finds it finds every file it names, whole. Locally it is where the run wrote it."""
    if not layout.remote:
        return
    for fmt in OWN_TOKENIZER_NAMES:
        if (own := layout.own_tokenizer(fmt)).exists():
            write_bytes(layout.root / own.name, own.read_bytes())
    if layout.expected.exists():  # the kept digests beside the shards, for `tokmix validate s3://...`
        write_bytes(layout.root / STATE_DIR / layout.expected.name, layout.expected.read_bytes())
    fault_point("publish:before-index")
    write_bytes(layout.published_index, layout.index.read_bytes())
    log(f"index.json published to {layout.root}")


def run_stages(layout: Layout, options: RunOptions) -> None:
    recipe = load_recorded_recipe(layout)
    if (complete := verified_complete(layout, recipe)) is not None:
        if (path := tokenizer_file(recipe, layout.tokenizer)) is not None:
            same_tokenizer(layout, path)  # a finished run's tokenizer changed is named, not called complete
        same_tokenizer_source(layout, recipe)  # (and the local file its own copy was made of)
        log(f"{layout.root}: already complete: sha256 of {complete[0]} shard(s) and {complete[1]} holdout(s) "
            "verified; nothing to do")
        if layout.remote and not layout.published_index.exists():  # stopped between validation and publishing
            publish_index(layout)
    else:
        Ownership(layout).remove_tmp_files()
        timings = Timings(layout)
        progress = RunProgress(layout, options.log_seconds, budget=options.max_memory,
                               supervisor=psutil.Process().parent() if options.guard_counts_supervisor else None)
        try:
            ctx = build_context(recipe, layout, options, timings, progress)
            fit = local_workers(ctx.workers, options.max_memory, ctx.vocab_size)
            if ctx.executor == "processes" and options.worker_processes is not None:
                fit = min(fit, options.worker_processes)
                log(f"{fit} worker process{'es' if fit > 1 else ''}: what the memory guard left for this start")
            elif ctx.executor == "processes" and fit < ctx.workers:
                fits = f"{fit} worker process{'es fit' if fit > 1 else ' fits'}"
                log(f"{fits} in --max-memory {options.max_memory / 2**30:,.1f} GiB (each may "
                    f"hold ~{encoder_process_bytes(ctx.vocab_size) >> 20} MiB with its encoder of "
                    f"{ctx.vocab_size:,} ids), not {ctx.workers}: raise --max-memory to use more cores")
            with make_executor(ctx.executor, fit if ctx.executor == "processes" else ctx.workers,
                               options.ray_address, (ctx.tokenizer_path, ctx.backend)) as ctx.pool:
                run_pipeline(ctx, timings, options.cache_size)
            progress.stage("done")
        finally:
            progress.stop()
        write_json(layout.done, {"fingerprint": recipe.fingerprint()})
        publish_index(layout)
        fault_point("cleanup:before")
    if not options.keep_streams:
        owned = Ownership(layout)
        owned.remove_created([p for p in owned.recorded() if layout.streams in (p, *p.parents)])


def _failure_message(e: BaseException, layout: Layout) -> str:
    if isinstance(e, TokmixError):
        return str(e)
    if isinstance(e, KeyboardInterrupt):
        return f"interrupted; committed work is kept: run the same command again to resume ({layout.root})"
    if layout.remote and (problem := store_problem(e)) is not None:  # the store went away, or refused us
        return f"output {layout.root}: {problem}; committed work is kept: run the same command again once it is fixed"
    if isinstance(e, OSError):  # a full disk, a permission: the file and the reason
        return os_error_message(e, layout.root)
    # a bug, not bad input: say so, with the traceback on --debug
    return f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)"


def report_failure(message: str, layout: Layout, report_fd: int | None) -> None:
    """Hand the one-line message to the supervisor through its pipe, which needs no disk space, and keep it in
    tokmix-state/error.txt for `tokmix status` when the disk lets it be written."""
    if report_fd is not None:
        try:
            os.write(report_fd, message.encode()[:REPORT_BYTES])
        except OSError:  # the supervisor is gone (EPIPE): error.txt keeps the message
            pass
    try:
        (layout.error).write_text(message + "\n")
    except OSError:  # the full disk that stopped the run, most likely: the pipe carried the message
        pass


def fewer_worker_processes(layout: Layout, options: RunOptions) -> None:
    """Before a restart for memory: the next stage process starts one worker process fewer than this one did
    (local_workers only estimates what a process holds; this machine's may hold more). Recorded in the run's
    options, which the next start reads; the supervisor does not count such a restart as fruitless
    (tokmix.runner), so a run goes down to one worker process before it gives up."""
    started = started_worker_processes()
    if started <= 1:
        return
    try:
        write_json(layout.options, asdict(replace(options, worker_processes=started - 1)))
    except OSError:  # a full disk: the next start tries as many again
        return
    log(f"the next start runs {started - 1} worker process{'es' if started > 2 else ''} instead of {started}")


def child_main(work: str, report_fd: int | None = None) -> int:
    """`work`: the run's state folder's parent (the output directory, or a store's local working folder)."""
    options = RunOptions(**json.loads(Layout(work).options.read_text()))
    layout = Layout(options.store, work=work) if options.store else Layout(work)
    log.format = options.log_format
    quiet_vanished_semaphores()
    signal.signal(signal.SIGTERM, interrupt)
    watch_supervisor()
    start_memory_guard(options.max_memory, with_workers=options.executor != "ray",
                       with_supervisor=options.guard_counts_supervisor)
    on_restart(partial(fewer_worker_processes, layout, options))
    try:
        run_stages(layout, options)
        return 0
    except (Exception, KeyboardInterrupt) as e:
        if options.debug:  # here, while the exception is being handled: the stage process's own traceback
            traceback.print_exc()
        message = _failure_message(e, layout)
    report_failure(message, layout, report_fd)
    return ERROR_EXIT_CODE


def main() -> None:
    """The stage process's entry point (tokmix.runner.STAGE_BOOT): `python -c ... OUT_DIR`."""
    code = child_main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
    end_descendants()  # whatever stopped the stages: nothing this process started outlives it
    sys.stdout.flush()
    os._exit(code)  # worker pools' threads must not stall the exit
