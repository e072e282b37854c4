"""The stage process: what `main()` runs for the supervisor (tokmix.runner).
It builds the run's context (split, tokenizer, backend) and runs holdout -> streams -> assemble -> validate,
each skipping what is committed, with the watchdogs of tokmix.guards (memory past the budget: exit for a
restart, losing only the work in flight; the supervisor gone: stop)."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from tokmix import identity
from tokmix.backends import (
    ORACLE,
    ORACLE_LIBRARY,
    choose_backend_with_digest,
    huge_doc_chars,
    library_versions,
    tokenizer_format,
)
from tokmix.cache import UnitCache, default_cap, gib
from tokmix.errors import TokmixError, os_error_message
from tokmix.executors import WORKER_PROCESS_BYTES, fresh_process, local_workers, make_executor
from tokmix.faults import end_descendants, fault_point
from tokmix.format.records import Index
from tokmix.guards import start_memory_guard, watch_supervisor
from tokmix.identity import load_recorded_recipe
from tokmix.lock import RunWriter
from tokmix.manifest import build_index
from tokmix.ngrams import NORMALIZATION
from tokmix.ownership import Ownership
from tokmix.process import ERROR_EXIT_CODE, RunOptions, interrupt, log
from tokmix.progress import RunProgress, count, read_stage, write_stage
from tokmix.provenance import sources_of
from tokmix.recipe import Recipe
from tokmix.shards import (
    OWN_TOKENIZER_NAMES,
    STATE_DIR,
    Layout,
    write_bytes,
    write_json,
)
from tokmix.sources import HugeText, Split, iter_file_texts, load_or_create_split, parse_mirrors, stream_files
from tokmix.stages import ENCODER_THREADS, Context, drop_cached, release_memory
from tokmix.stages.assemble import balance_entry, provenance_entry, run_assemble
from tokmix.stages.decontam import (
    benchmark_checksums,
    build_set,
    prepare_set,
    small_benchmarks,
    write_contamination,
)
from tokmix.stages.expected import record_expected
from tokmix.stages.finished import remakable, verified_complete
from tokmix.stages.holdout import run_holdout
from tokmix.stages.ids import write_ids
from tokmix.stages.streams import run_streams
from tokmix.stages.validate import share_warnings, validate_dir
from tokmix.store import store_problem
from tokmix.text import HUGE_DOC_CHARS, document_pieces
from tokmix.tokenizer import (
    TRAINER_PIECE_CHARS,
    TRAINER_THREADS,
    DistinctWords,
    document_delimiters,
    load_vocabulary,
    token_dtype,
    tokenizer_checksum,
    tokenizer_file,
    train_tokenizer,
)

STAGE_RECORD_SECONDS = 1.0  # how often the tokenizer trainer tells what it has read
REPORT_BYTES = 16 << 10  # of a failure message sent to the supervisor: well under a pipe's buffer
SAMPLE_DOCS_PER_STREAM = 64  # documents of each stream checked against the oracle when choosing a backend
SAMPLE_CHARS_PER_STREAM = 128 << 10
# The backend check runs in the stage process for vocabularies up to this many ids (a 32k BPE's encoders are a
# few MiB, and a fresh process would cost an interpreter's start and every import, about 40% of the CPU of a
# small run). A larger vocabulary's encoders are checked in a fresh process, which takes their memory with it
# (o200k_base: ~270 MiB each, a tree of 912 MiB at the run's peak otherwise).
CHECK_IN_PROCESS_IDS = 1 << 16

class Timings:
    """Seconds per stage, summed over the restarts of a run."""

    def __init__(self, layout: Layout):
        self.path = layout.timings
        self.seconds = remakable(self.path) or {}

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + seconds, 3)
        write_json(self.path, self.seconds)


def training_pieces(recipe: Recipe, split, mirrors, tell: Callable[[str], None] | None = None,
                    taken: dict[str, int] | None = None) -> Iterator[tuple[str, str]]:
    """(stream, text) of what a [tokenizer.train] learns from: each stream's train documents in canonical order,
    up to its share of max_bytes characters, the streams read side by side (the next text always from the stream
    with the fewest characters read for its share), until the next one would take the distinct words past
    max_word_bytes (DistinctWords: what the trainer's tables grow with), where the whole sample ends. Documents
    come in pieces of at most TRAINER_PIECE_CHARS where a word ends (the trainer counts the same words: each of
    its threads holds several copies of the text it splits). With `taken` (what sample_sizes counted), the first
    taken[stream] pieces of each stream, and nothing counted. `tell(what)` is told what has been read, every
    STAGE_RECORD_SECONDS."""
    spec = recipe.tokenizer.train
    words = DistinctWords() if taken is None else None
    said, docs, full = time.monotonic() - STAGE_RECORD_SECONDS, 0, False
    chars, given = dict.fromkeys(recipe.streams, 0), dict.fromkeys(recipe.streams, 0)
    shares = {name: recipe.share(name) for name in recipe.streams}  # a schedule's: integrated once, not per piece
    left = {name: int(spec.max_bytes * shares[name]) for name in recipe.streams}

    def pieces(name: str) -> Iterator[str]:
        nonlocal docs
        stream = recipe.streams[name]
        for text in iter_file_texts(stream_files(recipe, split, name, "train"), stream.text_field, name, mirrors,
                                    HUGE_DOC_CHARS):
            if chars[name] >= left[name]:  # checked at each document: its pieces come whole
                return
            docs += 1
            # a huge document's pieces already end where a word does
            for part in text.pieces() if isinstance(text, HugeText) else [text] if text else []:
                yield from document_pieces(part, TRAINER_PIECE_CHARS)

    readers = {name: pieces(name) for name in recipe.streams}
    while readers:
        # ties: the recipe's order; a stream of share 0 (a schedule may give one none) last, and it gives nothing
        name = min(readers, key=lambda n: chars[n] / shares[n] if shares[n] > 0 else math.inf)
        piece = None if taken is not None and given[name] >= taken[name] else next(readers[name], None)
        if piece is None:
            readers.pop(name).close()
            continue
        if words is not None:
            new, mass = words.new_mass(piece)
            if words.mass + mass > spec.max_word_bytes:
                full = True
                break
            words.take(new, mass)
        chars[name] += len(piece)
        given[name] += 1
        yield name, piece
        if tell is not None and time.monotonic() - said >= STAGE_RECORD_SECONDS:
            tell(f"training: {count(sum(chars.values()))} of at most {count(spec.max_bytes)} characters read "
                 f"({docs:,} document(s), stream {name})")
            said = time.monotonic()
        fault_point("tokenizer:training")
    for reader in readers.values():
        reader.close()
    if tell is None:
        return
    if words is not None:
        tell(f"training: the sample is {count(sum(chars.values()))} characters ({docs:,} document(s)), "
             f"{count(words.mass)} bytes of distinct words (at most {count(spec.max_word_bytes)}"
             f"{': reached' if full else ''})")
    else:
        tell(f"training: merging, all {count(sum(chars.values()))} characters read ({docs:,} document(s))")


def sample_sizes(recipe: Recipe, split, mirrors, tell: Callable[[str], None] | None = None) -> dict[str, int]:
    """The pieces of each stream that training_pieces gives [tokenizer.train], counted (in a process of its own:
    its sets of words are gone before the trainer starts)."""
    taken = dict.fromkeys(recipe.streams, 0)
    for name, _ in training_pieces(recipe, split, mirrors, tell):
        taken[name] += 1
    return taken


def _stage_teller(layout: Layout) -> Callable[[str], None]:
    started = (read_stage(layout) or {}).get("started")
    return lambda doing: write_stage(layout, "tokenizer", doing, started)  # for `tokmix status`, progress lines


def _count_sample(recipe: Recipe, layout: Layout, split, mirrors) -> dict[str, int]:
    return sample_sizes(recipe, split, mirrors, _stage_teller(layout))


def _train_tokenizer(recipe: Recipe, layout: Layout, split, mirrors, taken: dict[str, int]) -> str:
    """[tokenizer.train]: learn a byte-level BPE from the sample training_pieces gives (train files only; `taken`:
    sample_sizes), once, on TRAINER_THREADS threads; later processes of the run load the saved file."""
    os.environ["RAYON_NUM_THREADS"] = str(TRAINER_THREADS)  # this fresh process's pool is not built yet
    path, spec = layout.tokenizer, recipe.tokenizer.train
    texts = (piece for _, piece in training_pieces(recipe, split, mirrors, _stage_teller(layout), taken))
    train_tokenizer(texts, spec.vocab_size, spec.min_frequency, path,
                    recipe.tokenizer.doc_prefix + recipe.tokenizer.doc_suffix)
    fault_point("tokenizer:after-train")
    return str(path)


def _sample_texts(recipe: Recipe, split, mirrors) -> list[str]:
    """The first documents of every stream, SAMPLE_CHARS_PER_STREAM in all, for the exactness check: HF, the
    oracle, encodes ~0.3M tokens/s, so the sample is what makes the check take a second or ten."""
    sample = []
    for name, stream in recipe.streams.items():
        files = stream_files(recipe, split, name, "train")
        # huge documents are skipped unread: reading a 200 MB one would need ~1 GB in this process
        reader = iter_file_texts(files, stream.text_field, name, mirrors, HUGE_DOC_CHARS, skip_huge=True)
        left = SAMPLE_CHARS_PER_STREAM
        for text in itertools.islice(reader, SAMPLE_DOCS_PER_STREAM):
            text = (next(text.pieces()) if isinstance(text, HugeText) else text)[:left]
            sample.append(text)
            left -= len(text)
            if left <= 0:
                break
    return sample


def _check_backend(recipe: Recipe, tokenizer_path: str, split, mirrors, requested: str | None = None,
                   threads: int | None = None) -> tuple[str, list[str], dict[str, str]]:
    """The backend, its notices, and the digests of the oracle's ids on the check's texts."""
    fault_point("backend:checking")
    sample = _sample_texts(recipe, split, mirrors)
    return choose_backend_with_digest(tokenizer_path, requested or recipe.tokenizer.backend, sample, threads)


def _checked(recipe: Recipe, tokenizer_path: str, vocab_size: int, split, mirrors, requested: str | None = None
             ) -> tuple[str, list[str], dict[str, str]]:
    """_check_backend where it costs least (CHECK_IN_PROCESS_IDS). In this process its encoders get the
    stages' thread count, the first a process builds fixing the Rust pools' sizes (_size_thread_pools)."""
    if vocab_size > CHECK_IN_PROCESS_IDS:
        return in_fresh_process(_check_backend, recipe, tokenizer_path, split, mirrors, requested)
    try:
        return _check_backend(recipe, tokenizer_path, split, mirrors, requested, ENCODER_THREADS)
    finally:
        release_memory()


def in_fresh_process(fn, *args):
    with fresh_process() as pool:
        return pool.submit(fn, *args).result()



def _backend(recipe: Recipe, layout: Layout, tokenizer_path: str, vocab_size: int, split, mirrors) -> str:
    """The backend, checked once per run and recorded (restarts reuse the decision), with the versions of the
    libraries that give the ids and the digests of the oracle's ids on the check's texts (_same_libraries)."""
    key = {"requested": recipe.tokenizer.backend, "tokenizer": tokenizer_path}
    if (recorded := identity.check(layout, "backend", key, "", log)) is not None:
        backend = recorded["backend"]
        _same_libraries(recipe, layout, tokenizer_path, vocab_size, split, mirrors, backend)
        return backend
    backend, notices, digest = _checked(recipe, tokenizer_path, vocab_size, split, mirrors)
    for notice in notices:
        log(notice)
    first = identity.recorded(layout, "tokenizer libraries", log)
    if first is not None and first["oracle_ids_sha256"] != digest:  # a backend checked again (another requested)
        raise TokmixError("the tokenizer's oracle gives other ids on the check's texts than when this run started "
                          f"(its libraries then: {first['libraries']}): what is already written holds the first "
                          f"ids; restore those versions, or {identity.RESTART}")
    identity.record(layout, "backend", key, backend=backend, notices=notices)
    identity.record(layout, "tokenizer libraries", _libraries(tokenizer_path, backend), oracle_ids_sha256=digest)
    return backend


def _libraries(tokenizer_path: str, backend: str) -> dict[str, str]:
    return library_versions({ORACLE[tokenizer_format(tokenizer_path)], backend})


def _same_libraries(recipe: Recipe, layout: Layout, tokenizer_path: str, vocab_size: int, split, mirrors,
                    backend: str) -> None:
    """A resume under other versions of the oracle's or the backend's library: the oracle's ids on the first
    check's texts must be the ones recorded then, and the backend must still give them; said in one line."""
    libraries = _libraries(tokenizer_path, backend)
    first = identity.recorded(layout, "tokenizer libraries", log)
    if first is not None and identity.check(layout, "tokenizer libraries", libraries, "") is not None:
        return
    if first is None:  # a run started before tokmix recorded them, or its record damaged: recorded now
        _, _, digest = _checked(recipe, tokenizer_path, vocab_size, split, mirrors, backend)
        identity.record(layout, "tokenizer libraries", libraries, oracle_ids_sha256=digest)
        return
    was = first["libraries"]
    changed = ", ".join(f"{lib} {was.get(lib, 'absent')} -> {v}" for lib, v in libraries.items() if was.get(lib) != v)
    try:
        _, _, digest = _checked(recipe, tokenizer_path, vocab_size, split, mirrors, backend)
    except TokmixError as e:
        raise TokmixError(f"tokenizer libraries changed since this run started ({changed}): {e}; restore the "
                          f"versions it started with, or {identity.RESTART}") from None
    if digest != first["oracle_ids_sha256"]:
        raise TokmixError(f"tokenizer libraries changed since this run started ({changed}) and the oracle's ids "
                          "on the check's texts changed with them: what is already written holds the first ids; "
                          f"restore the versions it started with, or {identity.RESTART}")
    log(f"tokenizer libraries changed since this run started ({changed}): ids re-checked on the check's texts "
        f"(adversarial texts and {SAMPLE_DOCS_PER_STREAM} documents a stream at most): identical, resuming")
    identity.record(layout, "tokenizer libraries", libraries, oracle_ids_sha256=digest,
                    libraries_at_start=first.get("libraries_at_start", was))


def _same_tokenizer(layout: Layout, path: str) -> str:
    """The tokenizer file's checksum, recorded when the run first loads it. A resume finding other bytes is
    refused: the holdouts and units already written hold the first tokenizer's ids. (Another path is a changed
    recipe, refused before this; a trained tokenizer's path moves with the output directory.)"""
    # damaged: the one line naming it (what it recorded cannot be remade)
    return identity.pinned(layout, "tokenizer checksum", tokenizer_checksum(path), path, path=path)


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
    if tokenizer_path is None:
        progress.stage("tokenizer", f"training a {recipe.tokenizer.train.vocab_size:,}-token BPE on the train files")
        taken = in_fresh_process(_count_sample, recipe, layout, split, mirrors)
        tokenizer_path = in_fresh_process(_train_tokenizer, recipe, layout, split, mirrors, taken)
    else:
        progress.stage("tokenizer", f"loading {tokenizer_path}")
    vocab = load_vocabulary(tokenizer_path, recipe.tokenizer.format)
    delimiters = document_delimiters(vocab, recipe.tokenizer.doc_prefix, recipe.tokenizer.doc_suffix,
                                     tokenizer_path)
    checksum = _same_tokenizer(layout, tokenizer_path)
    dtype = token_dtype(vocab, recipe.tokenizer.dtype, tokenizer_path)
    workers = max(1, options.workers)
    progress.stage("backend check", f"{recipe.tokenizer.backend}: the fast backends against "
                   f"the oracle ({ORACLE_LIBRARY[recipe.tokenizer.format]}) on the first documents of every stream")
    backend = _backend(recipe, layout, tokenizer_path, vocab.size, split, mirrors)
    libraries = identity.recorded(layout, "tokenizer libraries")
    huge = huge_doc_chars(tokenizer_path)
    timings.add("tokenizer", time.perf_counter() - t0)
    return Context(recipe, layout, split, tokenizer_path, backend, dtype, vocab.size, workers, mirrors,
                   options.executor, progress.log, options.unit_bytes, progress, huge_doc_chars=huge,
                   tokenizer_sha256=checksum, token_bytes=vocab.token_bytes(), delimiters=delimiters,
                   writer=RunWriter.of(layout), oracle=vocab.oracle, libraries=libraries["libraries"],
                   oracle_ids_sha256=libraries["oracle_ids_sha256"]["adversarial"], cache=options.cache)


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


def prepare_benchmarks(recipe: Recipe, directory: Path, mirrors) -> dict:
    """The run's benchmark n-grams (tokmix.stages.decontam.prepare_set): small local files built in this
    process, others in a fresh one, whose arrays leave with it."""
    build = build_set if small_benchmarks(recipe, mirrors) else lambda *args: in_fresh_process(build_set, *args)
    return prepare_set(recipe, directory, mirrors, log, build=build)


def run_pipeline(ctx: Context, timings: Timings, options_cap: int | None = None) -> Index:
    """holdout -> streams -> assemble -> index -> validate; each stage skips what is already committed.
    `options_cap`: the token cache's cap (RunOptions.cache_size)."""
    t0 = time.perf_counter()
    ctx.progress.stage("holdout", f"{len(ctx.recipe.domains)} domain(s)")
    val = run_holdout(ctx)
    if ctx.executor == "local":
        release_memory()
    else:  # the streams stage encodes in worker processes (or on Ray) with encoders of their own
        drop_cached()
    timings.add("holdout", time.perf_counter() - t0)
    t0 = time.perf_counter()
    ctx.progress.stage("streams", f"{len(ctx.recipe.streams)} stream(s)")
    if ctx.recipe.decontaminate is not None:  # a large set built in a process of its own: its arrays leave with it
        identity.pinned(ctx.layout, "benchmarks", (NORMALIZATION, benchmark_checksums(ctx.recipe, ctx.mirrors)))
        ctx.benchmarks = prepare_benchmarks(ctx.recipe, ctx.layout.benchmark_set, ctx.mirrors)
    metas = run_streams(ctx)
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
            _same_tokenizer(layout, path)  # a finished run's tokenizer changed is named, not called complete
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
            if ctx.executor == "processes" and local_workers(ctx.workers, options.max_memory) < ctx.workers:
                log(f"{local_workers(ctx.workers, options.max_memory)} worker processes fit in --max-memory "
                    f"{options.max_memory / 2**30:,.1f} GiB (each may hold ~{WORKER_PROCESS_BYTES >> 20} MiB), "
                    f"not {ctx.workers}: raise --max-memory to use more cores")
            with make_executor(ctx.executor, ctx.workers, options.ray_address, options.max_memory,
                               (ctx.tokenizer_path, ctx.backend)) as ctx.pool:
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


def child_main(work: str, report_fd: int | None = None) -> int:
    """`work`: the run's state folder's parent (the output directory, or a store's local working folder)."""
    options = RunOptions(**json.loads(Layout(work).options.read_text()))
    layout = Layout(options.store, work=work) if options.store else Layout(work)
    log.format = options.log_format
    signal.signal(signal.SIGTERM, interrupt)
    watch_supervisor()
    start_memory_guard(options.max_memory, with_workers=options.executor != "ray",
                        with_supervisor=options.guard_counts_supervisor)
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
