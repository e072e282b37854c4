"""The tokenizer stage, in the stage process: the run's tokenizer trained on its sample (in fresh processes),
or found; its checksum pinned; and the backend that tokenizes chosen by checking the fast ones against the
format's own library (the oracle) on the first documents of every stream, recorded with the libraries'
versions and the oracle's ids, which a resume under other versions must give again."""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable, Iterator

from tokmix import identity
from tokmix.backends import (
    ORACLE,
    READING,
    choose_backend_with_digest,
    library_versions,
    reading_digest,
    tokenizer_format,
)
from tokmix.errors import TokmixError
from tokmix.executors import fresh_process
from tokmix.faults import fault_point
from tokmix.process import log
from tokmix.progress import count, read_stage, write_stage
from tokmix.recipe import Recipe, is_tiktoken_file
from tokmix.shards import Layout
from tokmix.sources import HugeText, iter_file_texts, stream_files
from tokmix.stages import ENCODER_THREADS, release_memory
from tokmix.text import HUGE_DOC_CHARS, document_pieces
from tokmix.tokenizer import (
    TRAINER_PIECE_CHARS,
    TRAINER_THREADS,
    DistinctWords,
    tokenizer_checksum,
    train_tokenizer,
)

STAGE_RECORD_SECONDS = 1.0  # how often the tokenizer trainer tells what it has read
SAMPLE_DOCS_PER_STREAM = 64  # documents of each stream checked against the oracle when choosing a backend
SAMPLE_CHARS_PER_STREAM = 128 << 10
# The backend check runs in the stage process for vocabularies up to this many ids: their encoders are small,
# and a fresh process's start and imports would be a large part of a small run's CPU. A larger vocabulary's
# encoders are checked in a fresh process, which takes their memory with it (the figures behind both:
# docs/benchmarks.md, "Choices measured in the code").
CHECK_IN_PROCESS_IDS = 1 << 16


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
                yield from document_pieces(part, TRAINER_PIECE_CHARS, letter=False)

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


def count_sample(recipe: Recipe, layout: Layout, split, mirrors) -> dict[str, int]:
    return sample_sizes(recipe, split, mirrors, _stage_teller(layout))


def train_run_tokenizer(recipe: Recipe, layout: Layout, split, mirrors, taken: dict[str, int]) -> str:
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
        # huge documents are skipped unread: reading one would take several times its size in this process
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



def run_backend(recipe: Recipe, layout: Layout, tokenizer_path: str, vocab_size: int, split, mirrors) -> str:
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
    libraries, extra = _libraries(tokenizer_path, backend), {}
    if first is not None and (changed := _changed(first["libraries"], libraries, both=True)):
        # a moved output directory (the key names the run's own files by path) or another requested backend,
        # under other versions: the ids were just re-checked against the first ones, above
        _say_rechecked(changed)
        extra["libraries_at_start"] = first.get("libraries_at_start", first["libraries"])
    identity.record(layout, "backend", key, backend=backend, notices=notices)
    identity.record(layout, "tokenizer libraries", libraries, oracle_ids_sha256=digest, **extra)
    return backend


def _changed(was: dict[str, str], now: dict[str, str], both: bool = False) -> str:
    """The libraries whose versions differ, as "lib 1.0 -> 1.1, ..."; `both`: only those in both (another
    backend's library is not a change of version)."""
    return ", ".join(f"{lib} {was.get(lib, 'absent')} -> {v}" for lib, v in now.items()
                     if was.get(lib) != v and (lib in was or not both))


def _say_rechecked(changed: str) -> None:
    log(f"tokenizer libraries changed since this run started ({changed}): ids re-checked on the check's texts "
        f"(adversarial texts and {SAMPLE_DOCS_PER_STREAM} documents a stream at most): identical, resuming")


def _libraries(tokenizer_path: str, backend: str) -> dict[str, str]:
    """The versions of the oracle's and the backend's libraries, and of tokmix's reading of the file for them."""
    return {**library_versions({ORACLE[tokenizer_format(tokenizer_path)], backend}), READING: reading_digest()}


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
    changed = _changed(was, libraries)
    try:
        _, _, digest = _checked(recipe, tokenizer_path, vocab_size, split, mirrors, backend)
    except TokmixError as e:
        raise TokmixError(f"tokenizer libraries changed since this run started ({changed}): {e}; restore the "
                          f"versions it started with, or {identity.RESTART}") from None
    if digest != first["oracle_ids_sha256"]:
        raise TokmixError(f"tokenizer libraries changed since this run started ({changed}) and the oracle's ids "
                          "on the check's texts changed with them: what is already written holds the first ids; "
                          f"restore the versions it started with, or {identity.RESTART}")
    _say_rechecked(changed)
    identity.record(layout, "tokenizer libraries", libraries, oracle_ids_sha256=digest,
                    libraries_at_start=first.get("libraries_at_start", was))


def same_tokenizer(layout: Layout, path: str) -> str:
    """The tokenizer file's checksum, recorded when the run first loads it. A resume finding other bytes is
    refused: the holdouts and units already written hold the first tokenizer's ids. (Another path is a changed
    recipe, refused before this; a trained tokenizer's path moves with the output directory.)"""
    # damaged: the one line naming it (what it recorded cannot be remade)
    return identity.pinned(layout, "tokenizer checksum", tokenizer_checksum(path), path, path=path)


def same_tokenizer_source(layout: Layout, recipe: Recipe) -> None:
    """The checksum of the local file a run's own copy of its tokenizer is made of (a .tiktoken file, a file://
    URL), recorded when the run starts: the run reads the copy, so a resume finding that file changed would go
    on with the first file's ids unsaid; it is refused as for a tokenizer file read where it is. A remote URL is
    not fetched again for this (its copy is the run's, docs/recipe.md)."""
    spec = recipe.tokenizer
    if spec.tiktoken is not None:
        source = recipe.resolve(spec.tiktoken) if is_tiktoken_file(spec.tiktoken) else None  # (a name: tiktoken's)
    else:
        source = recipe.tokenizer_path if spec.fetched else None  # (else read where it is: same_tokenizer)
    if source is not None and (source.startswith("file://") or "://" not in source):
        identity.pinned(layout, "tokenizer source", tokenizer_checksum(source), source, path=source)
