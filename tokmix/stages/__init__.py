"""The pipeline's stages, in order: holdout, streams, assemble, validate. Each takes a `Context` (what one
run knows: the recipe, the output layout, the split, the tokenizer) and is safe to run again after a kill."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tokmix.backends import ORACLE_LIBRARY, Encoder, make_encoder, saves_model_inputs
from tokmix.cache import KeyBase, tokenizer_oracle
from tokmix.lock import RunWriter
from tokmix.recipe import Recipe
from tokmix.shards import UNIT_BYTES, Layout
from tokmix.sources import Split, Unit
from tokmix.text import HUGE_DOC_CHARS
from tokmix.tokens import REFERENCE_DELIMITERS, Delimiters


class Progress(Protocol):
    """What the stages tell of their progress: a bar per stream of tokens committed out of its budget."""

    def start(self, name: str, total: int, done: int = 0) -> None: ...

    def update(self, name: str, done: int, total: int) -> None: ...

    def stop(self) -> None: ...  # the stages are over (the pipeline calls it)


class NoProgress:
    """Progress told to no one: the default, so that a worker importing a stage loads no display (the pipeline
    gives the stage process tokmix.progress.RunProgress)."""

    def start(self, name: str, total: int, done: int = 0) -> None:
        pass

    def update(self, name: str, done: int, total: int) -> None:
        pass

    def stop(self) -> None:
        pass


@dataclass
class Context:
    recipe: Recipe
    layout: Layout
    split: Split
    tokenizer_path: str
    backend: str
    dtype: np.dtype
    vocab_size: int
    workers: int
    mirrors: list[tuple[str, str]] = field(default_factory=list)
    executor: str = "local"
    log: Callable[[str], None] = print
    unit_bytes: int = UNIT_BYTES
    progress: Progress = field(default_factory=NoProgress)
    pool: Any = None  # the executor the stages share, started once per stage process (tokmix.executors)
    # a document of more characters is read as bytes and encoded in pieces (1 << 62: never, for a tokenizer whose
    # ids would change where a piece is cut, see tokmix.backends.can_cut_documents)
    huge_doc_chars: int = HUGE_DOC_CHARS
    cut_drops_space: bool = False  # its pieces after the first are encoded without the space at the cut
    tokenizer_sha256: str = ""  # of the tokenizer file's bytes, recorded in index.json
    # UTF-8 bytes each token id stands for (tokmix.tokenizer.token_byte_lengths), for the holdouts' bits per byte;
    # taken from the tokenizer build_context loads anyway (not loaded again: docs/benchmarks.md)
    token_bytes: np.ndarray | None = None
    no_token_ids: list[list[int]] | None = None  # index.json's: the ids below vocab_size that are no token
    delimiters: Delimiters = REFERENCE_DELIMITERS  # the special tokens around each document, as ids
    writer: RunWriter | None = None  # what every task that writes checks and holds (tokmix.lock)
    benchmarks: dict | None = None  # the record of the run's benchmark n-grams ([decontaminate])
    cache: str | None = None  # the token cache's folder or URL (tokmix.cache), None without one
    oracle: str = "hf"  # the backend whose ids are the tokenizer's (tokmix.backends.ORACLE), recorded in index.json
    libraries: dict[str, str] = field(default_factory=dict)  # the oracle's and the backend's library versions
    # the versions the run started under, when it was resumed under others (the ids re-checked then: tokenizer_stage)
    libraries_at_start: dict[str, str] | None = None
    oracle_ids_sha256: str = ""  # of the oracle's ids on ADVERSARIAL_TEXTS (tokmix.backends.oracle_digests)
    worker_memory: int = 384 << 20  # a worker's share of the tree's budget (tokmix.executors.worker_memory): a unit
    # that may peak above it runs alone (alone_share)


# Backend threads per encoder call. Parallelism comes from the workers: locally the stage process's worker
# threads share one encoder, each call encoding on its caller's core, and the holdout stage reads its
# streams on as many threads (tokmix.executors.holdout_threads); a Ray task holds one CPU. (fastokens' own
# pool, shared by the workers, was slower: docs/benchmarks.md, "Choices measured in the code".)
ENCODER_THREADS = 1
# Units (shards, holdout reads) dispatched per worker and not yet committed: the window of the streams, assemble
# and holdout stages, which bounds their memory and what a kill loses.
UNITS_IN_FLIGHT_PER_WORKER = 2
# A unit's peak memory per byte of its source, at most: a heavy parquet row group holds its compressed page while it
# decompresses (~1.4x), a text file is held once (docs/benchmarks.md, "Memory on hard inputs"). (A JSONL piece is a
# byte range: a long line in it does not show; read from its file in chunks, it holds its decoded text once.)
UNIT_PEAK_PER_BYTE = 2


def alone_share(ctx: Context, unit: Unit) -> int | None:
    """A worker's share of the memory budget when `unit` may peak above it (the most text its reader holds at
    once, known before it is read: a text file's size, a heavy parquet row group's from the footer; Unit.held),
    times UNIT_PEAK_PER_BYTE, else None. Such a unit is tokenized with no other unit in flight
    (tokmix.stages.streams)."""
    share = ctx.worker_memory
    return share if ctx.workers > 1 and unit.held * UNIT_PEAK_PER_BYTE > share else None


class Window:
    """Tasks on an executor (tokmix.executors: threads, processes or Ray), at most `size` in flight: the one
    scheduler of the streams, assemble and holdout stages. `submit` while there is `room`; `finished` waits for
    at least one task and yields (key, result) of each that finished."""

    def __init__(self, executor: Any, size: int):
        self.executor, self.size = executor, size
        self.pending: dict[Any, Any] = {}

    @property
    def room(self) -> int:
        return self.size - len(self.pending)

    def __len__(self) -> int:
        return len(self.pending)

    def submit(self, fn: Callable, task: Any, key: Any) -> None:
        self.pending[self.executor.submit(fn, task)] = key

    def finished(self) -> Iterator[tuple[Any, Any]]:
        for future in self.executor.wait_any(set(self.pending)):
            key = self.pending.pop(future)
            yield key, self.executor.result(future)


_cache: dict[tuple, Any] = {}  # per process (the stage process, or a Ray worker): what tasks build once
_cache_lock = threading.RLock()  # reentrant: a build may use cached() itself (passes._pass_one)


def cached(key: tuple, build: Callable[[], Any]) -> Any:
    """`build()`'s result, built once per process and shared by its threads."""
    with _cache_lock:
        if key not in _cache:
            _cache[key] = build()
        return _cache[key]


def shared_encoder(tokenizer_path: str, backend: str) -> Encoder:
    """The process's encoder: the holdout stage and every unit of the streams stage use one instance."""
    return cached(("encoder", tokenizer_path, backend),
                  lambda: make_encoder(tokenizer_path, backend, ENCODER_THREADS))


def drop_cached() -> None:
    """Free the encoder and its caches (hundreds of MiB once it has tokenized: docs/benchmarks.md) when tokenizing
    is over. Nothing cached is in a reference cycle, so clearing frees it: no gc.collect."""
    with _cache_lock:
        if not _cache:
            return
        _cache.clear()
    release_memory()


def release_memory() -> None:
    """Hand freed heap back to the OS (glibc keeps it otherwise), so the memory guard sees what is in use."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


# ---------------------------------------------------------------------------- the token cache's key
def cache_key_base(ctx: Context) -> KeyBase:
    """What every unit of this run has in its token cache key (tokmix.cache.KeyBase)."""
    return key_base(ctx.recipe, ctx.tokenizer_sha256, ctx.delimiters, ctx.dtype, ctx.huge_doc_chars,
                    ctx.benchmarks["fingerprint"] if ctx.benchmarks is not None else None,
                    saves_model_inputs(ctx.tokenizer_path))


# the token cache key's part for runs that drop their holdout documents' copies: how they are found, and how a
# cached unit records its kept documents for that check ("2": by their keys, tokmix.sources.text_keys, not every
# document's hash). Another value makes those runs' older entries, units and holdout reads, a miss.
HOLDOUT_COPIES = "holdout-exact 2"


# the key's tokenizer part for a tokenizer.json that saves truncation or padding (backends.saves_model_inputs):
# entries that an earlier tokmix, which applied them, made of its documents are not this one's
NOT_TRUNCATED = " (its truncation and padding not applied)"


def key_base(recipe: Recipe, tokenizer_sha256: str, delimiters: Delimiters, dtype: np.dtype, huge_doc_chars: int,
             benchmark_fingerprint: str | None, saves_inputs: bool = False) -> KeyBase:
    """The key parts a recipe's units share, as a run (cache_key_base) and `tokmix plan` both build them."""
    return KeyBase(tokenizer=tokenizer_sha256 + (NOT_TRUNCATED if saves_inputs else ""),
                   oracle=tokenizer_oracle(ORACLE_LIBRARY[recipe.tokenizer.format]),
                   delimiters=delimiters.to_index(), dtype=dtype.str, huge_doc_chars=huge_doc_chars,
                   provenance=recipe.layout.provenance,
                   decontamination=HOLDOUT_COPIES if recipe.holdout.decontaminate else None,
                   benchmarks=(f"{benchmark_fingerprint} {recipe.decontaminate.action}"
                               if benchmark_fingerprint is not None else None))
