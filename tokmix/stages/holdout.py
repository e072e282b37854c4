"""Stage 1: one holdout file per domain, `tokens + 1` tokens drawn from the domain's holdout files only,
each stream contributing in proportion to its share within the domain, documents in a seeded shuffle.
With decontamination on (the default) it also records a hash of every holdout document it read, so training
can drop exact copies."""

from __future__ import annotations

import hashlib
import itertools
import random
import time
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tokmix.cache import HOLDOUT, KeyBase, UnitCache, source_identity
from tokmix.errors import TokmixError
from tokmix.faults import fault_point
from tokmix.format.records import HoldoutEntry, Index
from tokmix.provenance import DOC_DTYPE, text_crc32
from tokmix.recipe import Recipe
from tokmix.shards import CHECKSUM, DamagedFile, Part, damage, read_json, write_bytes, write_record
from tokmix.sources import Places, file_kind, file_size, iter_file_texts, stream_files, text_hashes, text_keys
from tokmix.stages import UNITS_IN_FLIGHT_PER_WORKER, Context, Window, cache_key_base, shared_encoder
from tokmix.tokens import Delimiters, write_npy, write_tokens
from tokmix.unit_files import LENGTHS, TOKENS

UTF8 = "utf8"  # a holdout cache entry's file of each document's UTF-8 size (int64), beside its tokens and lengths

READ_BATCH = 256  # holdout documents encoded per call: large enough to be fast, small enough to stop early


def hashes_path(ctx: Context, domain: str) -> Path:
    return ctx.layout.holdout_state(domain, "hashes")


def keys_path(ctx: Context, domain: str) -> Path:
    return ctx.layout.holdout_state(domain, "keys")


# why holdout_damage refuses a holdout made before text keys (0e9dc87: its record names a lengths file)
EARLIER = "made by an earlier tokmix, without its documents' text keys"


def record_path(ctx: Context, domain: str) -> Path:
    """The checksums of the domain's hashes and keys files (its val file's is in index.json)."""
    return ctx.layout.holdout_state(domain, "record")


def holdout_damage(ctx: Context, domain: str, entry: HoldoutEntry) -> str | None:
    """Why a committed holdout cannot be used, or None: its val file, hashes and keys must be the bytes whose
    checksums were recorded (index.json, the domain's record)."""
    val = ctx.layout.val(domain)
    parts = [Part(val, entry.checksum, "index.json")]
    if ctx.recipe.layout.provenance:
        parts.append(Part(ctx.layout.docs(val), entry.provenance.checksum if entry.provenance else None, "index.json"))
    if (why := damage(parts)) is not None:
        return why
    try:
        record = read_json(record_path(ctx, domain), sealed=True)
    except DamagedFile as e:
        return f"its record {e.path.name}: {e.why}"
    if record is None:
        return f"{record_path(ctx, domain).name} is missing"
    if keys_path(ctx, domain).name not in record and ctx.layout.holdout_state(domain, "lengths").name in record:
        return EARLIER
    return damage([Part(path, record.get(path.name)) for path in (hashes_path(ctx, domain), keys_path(ctx, domain))])


def _union(paths: list) -> np.ndarray:
    parts = [np.load(p) for p in paths]
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.uint64)


def write_holdout_copies(ctx: Context) -> None:
    """The hashes and the keys (text_keys) of every holdout document of every domain, each merged into one sorted
    file (Layout.holdout_copies) that the streams stage drops exact copies of holdout documents by."""
    for kind, path_of in (("hashes", hashes_path), ("keys", keys_path)):
        write_npy(ctx.layout.holdout_copies(kind), _union([path_of(ctx, d) for d in ctx.recipe.domains]))


def _located_texts(files: list[str], field: str, stream: str, mirrors):
    """(text, (file's position in `files`, place)) of every document of the files, in order."""
    for i, path in enumerate(files):
        places = Places()
        for text in iter_file_texts([path], field, stream, mirrors, places=places):
            yield text, (i, places.take()[1])


class Read(NamedTuple):
    """What one stream's holdout files gave: documents as (stream, ids, origin), the hashes and keys (text_keys)
    of their texts, whether the files ran out (`complete`), and each text's UTF-8 size (what the holdout's
    `bytes` count for a whole document: build_domain)."""

    docs: list
    hashes: np.ndarray
    keys: np.ndarray
    complete: bool
    utf8: np.ndarray


def read_stream(recipe: Recipe, encoder, stream: str, files: list[str], budget: float, mirrors,
                delimiters: Delimiters, dtype: np.dtype, decontaminate: bool,
                provenance: bool = False, held: Read | None = None) -> Read:
    """Documents of one stream's holdout files, in file order, empty ones included (each its delimiters alone),
    up to and including the one that crosses `budget` tokens, as (stream, ids, origin): with `provenance`
    origin is (file's position in `files`, place, CRC-32 of the text), else None; and the hashes and keys
    (text_keys) of their texts, or none without `decontaminate`. `held`: the first of those documents as an
    earlier read gave them (a token cache entry's, _held): as many as the budget needs are taken from it,
    and the files are read again past them (not encoded) only when it falls short. (`tokmix plan` reads them
    too, to show what each stream gives.)"""
    docs, hashes, keys, utf8, got = [], [], [], [], 0
    field = recipe.streams[stream].text_field
    reader = _located_texts(files, field, stream, mirrors)
    if held is not None:
        taken = _documents_for(held.docs, budget)
        docs = held.docs[:taken]
        got = sum(len(ids) for _, ids, _ in docs)
        utf8 += held.utf8[:taken].tolist()
        if decontaminate:
            hashes.append(held.hashes[:taken])
            keys.append(held.keys[:taken])
        if got >= budget or held.complete:
            return Read(docs, *_hashes_and_keys(hashes, keys), held.complete and taken == len(held.docs),
                        np.array(utf8, np.int64))
        reader = itertools.islice(reader, taken, None)  # read again, not encoded
    complete = False
    while got < budget:
        located = list(itertools.islice(reader, READ_BATCH))
        if not located:
            complete = True
            break
        batch = [text for text, _ in located]
        ids, lengths = encoder.encode_batch(batch)
        framed = delimiters.frame(ids, lengths, dtype)
        docs_ids = np.split(framed, np.cumsum(lengths + delimiters.per_document)[:-1])
        crcs = text_crc32(batch) if provenance or decontaminate else None
        checksums = crcs.tolist() if provenance else None
        for k, doc in enumerate(docs_ids):
            docs.append((stream, doc, (*located[k][1], checksums[k]) if provenance else None))
            got += len(doc)
            if got >= budget:
                batch = batch[: k + 1]
                break
        utf8 += [len(t) if t.isascii() else len(t.encode("utf-8", "surrogatepass")) for t in batch]
        if decontaminate:  # only decontamination reads them (hashing is a share of this stage worth sparing)
            hashes.append(text_hashes(batch))
            keys.append(text_keys(batch, crcs[:len(batch)]))
    return Read(docs, *_hashes_and_keys(hashes, keys), complete, np.array(utf8, np.int64))


def _hashes_and_keys(hashes: list, keys: list) -> tuple[np.ndarray, np.ndarray]:
    return tuple(np.concatenate(a) if a else np.empty(0, np.uint64) for a in (hashes, keys))


def _documents_for(docs: list, budget: float) -> int:
    """How many of `docs` a read to `budget` takes: up to and including the one whose end reaches it (all of
    them when none does; none for a budget of 0)."""
    if budget <= 0 or not docs:
        return 0
    ends = np.cumsum([len(ids) for _, ids, _ in docs])
    return min(int(np.searchsorted(ends, budget, side="left")) + 1, len(docs))


def holdout_cache_key(base: KeyBase, recipe: Recipe, stream: str, files: list[str], mirrors) -> str:
    """The token cache key of a stream's holdout documents read from `files` (KeyBase.holdout_key), as the
    holdout stage and `tokmix plan` both build it."""
    return base.holdout_key(recipe.streams[stream].text_field, files,
                            [source_identity(f, file_size(f, mirrors)) for f in files])


class StreamRead(NamedTuple):
    """The holdout stage's task: `budget` tokens of one stream's holdout documents, for its domain's holdout."""

    domain: str
    stream: str
    budget: float


def _read_stream(ctx: Context, encoder, task: StreamRead) -> tuple[Read, dict | None]:
    """One stream's read (read_stream) and, with a token cache, what came from it: the documents an earlier run
    read are taken from the stream's entry (checked), only those past it encoded, and a read that went past the
    entry becomes its new entry, before the holdout that uses it is written (so no committed holdout lacks it)."""
    recipe, stream, budget = ctx.recipe, task.stream, task.budget
    files = stream_files(recipe, ctx.split, stream, "holdout")
    args = (recipe, encoder, stream, files, budget, ctx.mirrors, ctx.delimiters, ctx.dtype,
            recipe.holdout.decontaminate, recipe.layout.provenance)
    if ctx.cache is None:
        return read_stream(*args), None
    cache = UnitCache(ctx.cache)
    try:
        key = holdout_cache_key(cache_key_base(ctx), recipe, stream, files, ctx.mirrors)
        found = cache.take_files(key)
        held = _held(found, stream, ctx.dtype, recipe.holdout.decontaminate, recipe.layout.provenance)
        if found is not None and held is None:  # whole files that do not fit together: not this entry's
            cache.problem = "its files do not fit together"
            cache.remove(key)
    except OSError:  # a file the read names in its own words, or an unreadable cache: read as without one
        read = read_stream(*args)
        return read, {"tokens_from_cache": 0, "tokens_tokenized": _tokens(read)}
    if cache.problem is not None:
        ctx.log(f"token cache: {cache.entry_dir(key)}: damaged ({cache.problem}); removed, holdout {stream}'s "
                "documents encoded again")
    read = read_stream(*args, held=held)
    reused = len(held.docs) if held is not None else 0
    from_cache, tokens = sum(len(ids) for _, ids, _ in read.docs[:reused]), _tokens(read)
    if len(read.docs) > reused:
        try:
            cache.fill(key, None, stream, {"tokens": tokens,
                                           "documents": len(read.docs)}, read.complete,
                       {"tokenizer": ctx.tokenizer_sha256, "tokenizer_path": ctx.tokenizer_path, "stream": stream,
                        "holdout": True, "sources": files}, _entry_files(read, ctx.dtype), kind=HOLDOUT)
        except (OSError, DamagedFile):  # a full or read-only cache: the run goes on without adding to it
            pass
    tokenized = tokens - from_cache
    ctx.log(f"holdout {stream}: its documents' {from_cache:,} tokens from the token cache, {tokenized:,} encoded")
    return read, {"tokens_from_cache": from_cache, "tokens_tokenized": tokenized}


def _read_or_error(ctx: Context, encoder, task: StreamRead) -> tuple[Read, dict | None] | Exception:
    """_read_stream's result, or the error it raised: build_domain raises the first in the domain's stream order,
    whichever read failed first."""
    try:
        return _read_stream(ctx, encoder, task)
    except Exception as e:  # noqa: BLE001 - raised by build_domain, as the read's own
        return e


def _tokens(read: Read) -> int:
    return sum(len(ids) for _, ids, _ in read.docs)


def _entry_files(read: Read, dtype: np.dtype) -> dict[str, bytes]:
    """A stream's holdout documents as the files of its cache entry: their tokens and lengths (named as a unit's
    are) and, as the read has them, their texts' hashes and keys (decontamination) and origins (provenance)."""
    files = {TOKENS: np.concatenate([ids for _, ids, _ in read.docs]).astype(dtype, copy=False).tobytes(),
             LENGTHS: np.array([len(ids) for _, ids, _ in read.docs], np.int64).tobytes(),
             UTF8: read.utf8.astype(np.int64).tobytes()}
    if len(read.hashes) == len(read.docs):
        files["hash"], files["keys"] = read.hashes.astype(np.uint64).tobytes(), read.keys.tobytes()
    if read.docs[0][2] is not None:
        files["origin"] = np.array([origin for _, _, origin in read.docs], np.int64).tobytes()
    return files


def _held(found: tuple[dict, dict[str, bytes]] | None, stream: str, dtype: np.dtype, decontaminate: bool,
          provenance: bool) -> Read | None:
    """The documents a stream's cache entry holds, as read_stream gave them; None without an entry, or for one
    whose files (each checked against its sha256 by the cache) do not fit together."""
    if found is None:
        return None
    record, files = found
    if TOKENS not in files or LENGTHS not in files or UTF8 not in files or ("hash" in files) != decontaminate \
            or ("origin" in files) != provenance:
        return None
    try:
        ids, lengths = np.frombuffer(files[TOKENS], dtype), np.frombuffer(files[LENGTHS], np.int64)
        utf8 = np.frombuffer(files[UTF8], np.int64)
        hashes = np.frombuffer(files.get("hash", b""), np.uint64)
        keys = np.frombuffer(files.get("keys", b""), np.uint64)
        origins = np.frombuffer(files["origin"], np.int64).reshape(-1, 3).tolist() if provenance else None
    except ValueError:  # a size that is no whole number of its items
        return None
    count = len(lengths)
    if (not int(lengths.sum()) == len(ids) == record["unit"]["tokens"] or count != record["unit"]["documents"]
            or len(utf8) != count or (count and int(utf8.min()) < 0)
            or (decontaminate and not len(hashes) == len(keys) == count)
            or (origins is not None and len(origins) != count)):
        return None
    ends = np.cumsum(lengths).tolist()
    docs = [(stream, ids[end - n:end], tuple(origins[i]) if origins is not None else None)
            for i, (n, end) in enumerate(zip(lengths.tolist(), ends))]
    return Read(docs, hashes, keys, record["complete"], utf8)


def stream_reads(recipe: Recipe, domain: str) -> dict[str, float]:
    """Tokens read from each of the domain's streams: its share of the holdout within the domain (the last
    document read crosses it). The shuffle in `draw` decides what each then gives."""
    need, names = recipe.holdout.tokens + 1, recipe.streams_of(domain)
    total_share = sum(recipe.share(n) for n in names)
    return {name: need * recipe.share(name) / total_share for name in names}


def draw(docs: list[tuple[str, np.ndarray]], names: list[str], need: int,
         seed: int) -> tuple[list[np.ndarray], dict[str, int], int]:
    """The holdout from the documents its streams read: shuffled with random.Random(seed), then taken in that
    order until `need` tokens (the last one cut), as the reference does. Each stream reads its share, but a
    document longer than a share can take the place of several streams' documents. Returns the pieces taken,
    the tokens each stream gave and their total (less than `need` when the documents run out). `docs` is
    shuffled in place: the pieces are its first documents."""
    random.Random(seed).shuffle(docs)
    chunks, by_stream, n = [], dict.fromkeys(names, 0), 0
    for name, ids, _ in docs:
        take = min(len(ids), need - n)
        chunks.append(ids[:take])
        by_stream[name] += take
        n += take
        if n == need:
            break
    return chunks, by_stream, n


def build_domain(ctx: Context, domain: str, reads: dict[str, tuple[Read, dict | None] | Exception],
                 byte_len: np.ndarray) -> dict:
    recipe = ctx.recipe
    need = recipe.holdout.tokens + 1
    names = recipe.streams_of(domain)
    docs, hashes, keys, utf8, from_cache = [], [], [], [], {}
    for name in names:
        if isinstance(reads[name], Exception):
            raise reads[name]
        read, from_cache[name] = reads[name]
        docs += read.docs
        hashes.append(read.hashes)
        keys.append(read.keys)
        utf8.append(read.utf8)
    numbered = [(name, ids, k) for k, (name, ids, _) in enumerate(docs)]  # shuffled as the documents would be
    chunks, by_stream, n = draw(numbered, names, need, recipe.seed)
    order = [k for _, _, k in numbered[: len(chunks)]]
    taken = [docs[k] for k in order]
    if n < need:
        raise TokmixError(
            f"holdout {domain}: its holdout files give only {n:,} of the {need:,} tokens asked for "
            f"(streams {', '.join(names)}); hold out more files or lower [holdout] tokens"
        )
    tokens = np.concatenate(chunks)
    targets = tokens[1:]
    eval_targets = recipe.holdout.eval_windows * recipe.layout.seq_len
    if eval_targets > len(targets):
        raise TokmixError(
            f"holdout {domain}: eval_windows x seq_len = {eval_targets:,} targets but the holdout has {len(targets):,}"
        )
    sizes = [len(c) for c in chunks]
    if recipe.layout.provenance:
        docs_entry = write_holdout_documents(ctx, domain, taken, sizes)
    spelled = SpelledBytes(tokens, sizes, [len(ids) for _, ids, _ in taken], np.concatenate(utf8)[order], byte_len,
                           ctx.delimiters)
    digests = {keys_path(ctx, domain).name: write_npy(keys_path(ctx, domain), np.unique(np.concatenate(keys))),
               hashes_path(ctx, domain).name: write_npy(hashes_path(ctx, domain), np.unique(np.concatenate(hashes)))}
    # with a token cache, what the reads took from it: index.json's cache entry gathers it (holdout_cache)
    write_record(record_path(ctx, domain), {**digests, **({"cache": from_cache} if ctx.cache is not None else {})})
    write_tokens(ctx.layout.val(domain), tokens)
    return {
        "file": ctx.layout.val(domain).name,
        "tokens": int(len(tokens)),
        "targets": int(len(targets)),
        "docs": len(chunks),
        "bytes": spelled.of_targets(len(targets)),
        "eval_windows": recipe.holdout.eval_windows,
        "eval_targets": eval_targets,
        "eval_bytes": spelled.of_targets(eval_targets),
        "tokens_by_stream": by_stream,
        "source_files": ctx.split[domain]["holdout"],
        "checksum": hashlib.new(CHECKSUM, tokens.tobytes()).hexdigest(),
        **({"provenance": docs_entry} if recipe.layout.provenance else {}),
    }


class SpelledBytes:
    """The UTF-8 size of the text a holdout's first targets spell: each document whose text's tokens are all among
    them counts its text's own UTF-8 size; a document cut by either end of them (the first one's first token is no
    target; the last one may be cut) counts the bytes of its tokens there (Vocabulary.token_bytes); delimiters count
    none. For byte-level BPE and tiktoken's encodings, whose tokens spell the text byte for byte, that is the sum of
    the targets' token bytes (the reference's count); a SentencePiece model's pieces do not (the "▁" it puts before
    a document, whitespace and text its normalizer rewrites, <unk>), and its whole documents count their text."""

    def __init__(self, tokens: np.ndarray, sizes: list[int], full: list[int], utf8: np.ndarray,
                 byte_len: np.ndarray, delimiters: Delimiters):
        """`tokens`: the holdout, its documents' pieces end to end (`sizes` tokens each, of `full` when whole)."""
        self.tokens = tokens
        self.byte_len = byte_len
        self.starts = np.cumsum([0, *sizes])[:-1]  # each piece's first token
        self.text = self.starts + len(delimiters.prefix)  # each document's text: [text, text_end) when whole
        self.text_end = self.starts + np.array(full, np.int64) - len(delimiters.suffix)
        self.utf8 = utf8

    def of_targets(self, count: int) -> int:
        """Of targets [0, count): tokens [1, count + 1)."""
        lo, hi = 1, count + 1
        whole = (self.text >= lo) & (self.text_end <= hi)
        total = int(self.utf8[whole].sum())
        for i in np.flatnonzero(~whole & (self.text < hi) & (self.text_end > lo)).tolist():  # cut by an end
            a, b = max(int(self.text[i]), lo), min(int(self.text_end[i]), hi)
            total += int(self.byte_len[self.tokens[a:b]].sum())
        return total


def holdout_cache(ctx: Context) -> dict:
    """The tokens the holdouts' reads took from the token cache and encoded, in all and by stream, as each
    domain's record kept them when its holdout was made (by this stage process or an earlier one of the run; a
    holdout made without the cache counts none)."""
    by_stream = {}
    for domain in ctx.recipe.domains:
        try:
            record = read_json(record_path(ctx, domain), sealed=True) or {}
        except DamagedFile:  # checked before the holdout was used (holdout_damage): only its counts are lost
            record = {}
        by_stream |= record.get("cache", {})
    keys = ("tokens_from_cache", "tokens_tokenized")
    return {**{k: sum(c.get(k, 0) for c in by_stream.values()) for k in keys}, "by_stream": by_stream}


def write_holdout_documents(ctx: Context, domain: str, taken: list[tuple], tokens: list[int]) -> dict:
    """The holdout's provenance index (its documents in the holdout's order) and its entry in index.json, which
    holds the holdout's own table of sources: its streams' holdout files, stream by stream."""
    sources, first = [], {}
    for name in ctx.recipe.streams_of(domain):
        first[name] = len(sources)
        sources += [[name, 1, file_kind(f), f] for f in stream_files(ctx.recipe, ctx.split, name, "holdout")]
    records = np.zeros(len(taken), DOC_DTYPE)
    for i, ((name, _, (file, place, crc)), n) in enumerate(zip(taken, tokens)):
        records[i] = (first[name] + file, place, n, crc)
    path = ctx.layout.docs(ctx.layout.val(domain))
    return {"file": path.name, "documents": len(records), "skip": 0,
            "checksum": write_bytes(path, records.tobytes()), "sources": sources}


def run_holdout(ctx: Context, threads: Any) -> dict[str, HoldoutEntry]:
    """Build every domain's holdout that is not on disk yet; returns the index's `val` entry. `threads`: this
    process's threads (tokmix.executors.LocalExecutor), on which the streams' reads run through a Window (the
    process's encoder encodes a call on its caller's thread)."""
    layout = ctx.layout
    try:
        index = layout.read_index() or Index.from_json({})
    except DamagedFile as e:  # what it holds of the holdouts is remade; the rest is written at the end of the run
        ctx.log(f"{e.path}: damaged ({e.why}); remade")
        index = Index.from_json({})
    val = dict(index.val)
    todo = []
    for d in ctx.recipe.domains:
        why = holdout_damage(ctx, d, val[d]) if d in val else "not made yet"
        if why is not None:
            todo.append(d)
            if d in val:
                ctx.log(f"holdout {d}: {why}; remade" if why == EARLIER else f"holdout {d}: damaged ({why}); remade")
    if not todo:
        if ctx.recipe.holdout.decontaminate:
            write_holdout_copies(ctx)
        return val
    read = partial(_read_or_error, ctx, shared_encoder(ctx.tokenizer_path, ctx.backend))  # the streams stage's too
    queue = iter([StreamRead(d, name, budget) for d in todo for name, budget in stream_reads(ctx.recipe, d).items()])
    upcoming = next(queue, None)
    done: dict[str, dict[str, tuple[Read, dict | None] | Exception]] = {d: {} for d in todo}
    window = Window(threads, UNITS_IN_FLIGHT_PER_WORKER * threads.workers)
    for k, domain in enumerate(todo):
        ahead, t0 = todo[k : k + 2], time.perf_counter()  # this domain's streams and the next one's read at once
        while len(done[domain]) < len(ctx.recipe.streams_of(domain)):
            while window.room > 0 and upcoming is not None and upcoming.domain in ahead:
                window.submit(read, upcoming, upcoming)
                upcoming = next(queue, None)
            for task, result in window.finished():
                done[task.domain][task.stream] = result
        val[domain] = entry = HoldoutEntry.from_json(build_domain(ctx, domain, done.pop(domain), ctx.token_bytes))
        fault_point("holdout:after-write")
        index = index.replace(val=val)
        layout.write_index(index)
        fault_point("holdout:after-index")
        ctx.log(
            f"holdout {domain}: {entry.tokens:,} tokens, {entry.docs:,} docs, {entry.bytes:,} bytes "
            f"({entry.bytes / entry.targets:.3f} bytes/token) in {time.perf_counter() - t0:.1f}s"
        )
    if ctx.recipe.holdout.decontaminate:
        write_holdout_copies(ctx)
    return val
