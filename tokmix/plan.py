"""The plan of a run, in seconds and without tokenizing everything: the files of every stream, budgets, shards,
holdouts, the disk space the run needs, and each stream's token supply estimated from a tokenized sample, so a
recipe that would run short fails here and not hours into a run. Nothing is written (not even the split file).

Supply = tokens per byte measured on a sample x the bytes the files hold, per kind of file: parquet bytes are the
text column's uncompressed size from the footers; JSONL and text bytes are file sizes, a compressed JSONL file's
measured in compressed bytes (so the sample's compression ratio is part of its rate). A file the sample read
whole counts with its real token count.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import fsspec
import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from tokmix import identity
from tokmix.backends import choose_backend, huge_doc_chars, make_encoder, saves_model_inputs
from tokmix.cache import KeyBase, UnitCache, default_cap
from tokmix.errors import TokmixError
from tokmix.ngrams import first_pass_note
from tokmix.process import default_unit_bytes
from tokmix.recipe import Recipe
from tokmix.shards import DamagedFile, Layout, tokens_in_shard
from tokmix.sources import Split, create_split, file_kind, jsonl, load_or_create_split, parse_mirrors, stream_files
from tokmix.sources.pieces import Sample
from tokmix.sources.units import FORMATS, plan_units
from tokmix.stages import key_base
from tokmix.stages.decontam import (
    BenchmarkSet,
    benchmark_checksums,
    build_set,
    changed_while_read,
    prepare_set,
    small_benchmarks,
)
from tokmix.stages.holdout import draw, holdout_cache_key, read_stream, stream_reads
from tokmix.stages.passes import passes_needed
from tokmix.store import is_url
from tokmix.text import clean_surrogates
from tokmix.tokenizer import document_delimiters, load_vocabulary, tokenizer_checksum, tokenizer_file
from tokmix.tokens import Delimiters, dtype_for_vocab
from tokmix.unit_files import token_and_length_files

SAMPLE_BYTES = 1 << 20  # text tokenized per stream and part (train, holdout); its cost: docs/benchmarks.md
SAMPLE_FILES = 8  # a sample is spread over this many files at least, so one odd first file does not decide it
MAX_SAMPLE_FILES = 64  # ... and opens at most this many (small text files: one document each)
GUESS_BYTES_PER_TOKEN = 4.0  # the run trains its tokenizer: nothing to sample with yet
LIST_THREADS = 16  # sizes and parquet footers fetched in parallel: remote files are latency-bound


# ---------------------------------------------------------------------------- what a plan holds
@dataclass
class Supply:
    """Tokens (delimiters included) that a list of files holds: measured on a sample, scaled to the files' size."""

    files: int = 0
    text_bytes: int = 0  # UTF-8 bytes of the documents
    docs: int = 0
    tokens: int = 0
    sample_text_bytes: int = 0
    sample_docs: int = 0
    sample_tokens: int = 0
    exact: bool = False  # the sample read every file whole: the numbers are counts, not estimates
    guessed: bool = False  # no tokenizer yet: tokens are the text's bytes at GUESS_BYTES_PER_TOKEN, not counted

    @property
    def bytes_per_token(self) -> float:
        """Text bytes per token, delimiters counted as tokens (as index.json's holdout bytes/targets)."""
        return self.sample_text_bytes / max(self.sample_tokens, 1)

    def guessed_at(self, guessed: bool) -> Supply:
        """This supply, marked as guessed (then never exact: a whole file read gives bytes, not tokens)."""
        self.guessed = guessed
        self.exact = self.exact and not guessed
        return self


@dataclass
class StreamPlan:
    name: str
    domain: str
    share: float
    budget: int
    train_files: list[str]
    holdout_files: list[str]
    train: Supply
    holdout: Supply
    holdout_need: int  # tokens of this stream the holdout stage reads: its share of its domain's holdout
    max_epochs: int = 1
    cached_units: int = 0  # of the units its budget needs (about), how many the token cache holds
    units: int = 0
    cached_tokens: int = 0
    # with a schedule: the stream's budget at each phase's end (its target so far times the slack), by phase
    phase_budgets: dict[str, int] = field(default_factory=dict)

    @property
    def short_phase(self) -> str | None:
        """The first phase whose end the stream's supply (its passes allowed) does not reach."""
        supply = self.train.tokens * self.max_epochs
        return next((p for p, need in self.phase_budgets.items() if need > supply), None)

    @property
    def passes(self) -> int:
        """Passes over the train documents the budget needs (more than max_epochs: the run would fail)."""
        return passes_needed(self.budget, self.train.tokens) if self.train.tokens else 1 << 62

    @property
    def short(self) -> bool:
        return self.passes > self.max_epochs

    @property
    def holdout_short(self) -> bool:
        return self.holdout.tokens < self.holdout_need


@dataclass
class HoldoutPlan:
    domain: str
    tokens: int  # tokens of val_<domain>.bin: [holdout] tokens + 1
    eval_targets: int
    streams: list[str]
    supply: int
    # tokens each stream gives: what the holdout stage's seeded draw takes from what they read (None when there
    # is no tokenizer to read them with yet)
    gives: dict[str, int] | None = None


@dataclass
class Disk:
    path: Path  # the nearest existing folder of the output directory
    free: int
    intermediates: int  # streams/: every stream's budget of tokens, plus document lengths
    shards: int
    holdouts: int
    written: int  # of those, already in the output directory (a resumed run)
    cached: int = 0  # of the intermediates, what the token cache holds on this filesystem (linked: no new bytes)

    @property
    def needed(self) -> int:
        return max(0, self.intermediates - self.cached + self.shards + self.holdouts - self.written)


@dataclass
class CachePlan:
    root: str
    cap: int
    size: int  # bytes in the cache now
    entries: int
    holds: int = 0  # bytes of the run's intermediates the cache holds already
    grows: int = 0  # bytes the run adds to it (its other units)
    linked: bool = False  # on the output's filesystem: the run's units and the cache share their files
    free: int | None = None  # free bytes on the cache's filesystem, when it is another local one
    holdout_tokens: int = 0  # what the holdouts' reads take from their streams (their share of each domain's)
    holdout_cached: int = 0  # of those, the tokens the streams' holdout entries hold


@dataclass
class Plan:
    recipe: Recipe
    out: Path
    split_note: str
    tokenizer_note: str
    dtype: np.dtype
    streams: dict[str, StreamPlan]
    holdouts: dict[str, HoldoutPlan]
    shards: list[int]  # blocks of each shard
    disk: Disk
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # worth knowing, not a reason to refuse
    seconds: float = 0.0
    # [decontaminate]: per stream, the sampled train documents and text bytes, and those a benchmark item took
    contamination: dict[str, list[int]] = field(default_factory=dict)
    cache: CachePlan | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


# ---------------------------------------------------------------------------- sampling files
def _measure(path: str) -> str:
    """How a file's bytes are counted: its kind, and its codec for compressed JSONL."""
    kind = file_kind(path)
    codec = jsonl.codec(path)
    return f"{kind}.{codec}" if kind == "jsonl" and codec else kind


def _file_bytes(path: str, text_field: str, stream: str, mirrors) -> int:
    try:
        return FORMATS[file_kind(path)].byte_count(path, text_field, mirrors)
    except FileNotFoundError:
        raise TokmixError(f"stream {stream}: file {path}: not found") from None
    except OSError as e:
        raise TokmixError(f"stream {stream}: file {path}: cannot read: {e}") from None


def _sample_file(path: str, text_field: str, stream: str, mirrors, limit: int) -> Sample:
    return FORMATS[file_kind(path)].sample(path, text_field, stream, mirrors, limit)


def _spread(n: int) -> list[int]:
    """File indices in sampling order: the first file, then the others in a fixed random order."""
    rest = list(range(1, n))
    random.Random(0).shuffle(rest)
    return [0, *rest][:n]


# ---------------------------------------------------------------------------- estimating supply
@dataclass
class _Count:
    """Bytes in a file's measure, and what they hold."""

    used: int = 0
    text_bytes: int = 0
    docs: int = 0
    tokens: int = 0

    def __iadd__(self, other: _Count) -> _Count:
        self.used += other.used
        self.text_bytes += other.text_bytes
        self.docs += other.docs
        self.tokens += other.tokens
        return self

    def scaled(self, n_bytes: int) -> _Count:
        """What `n_bytes` more of the same hold, at this sample's rates."""
        rate = n_bytes / max(self.used, 1)
        return _Count(n_bytes, round(self.text_bytes * rate), round(self.docs * rate), round(self.tokens * rate))


def _counter(encoder, per_document: int):
    """texts -> (tokens of each non-empty document plus its `per_document` delimiters, documents, text bytes), by
    the encoder or, without a tokenizer, by GUESS_BYTES_PER_TOKEN."""

    def count(texts: list[str]) -> tuple[int, int, int]:
        texts = [clean_surrogates(t) for t in texts if t]
        n_bytes = sum(len(t.encode("utf-8")) for t in texts)
        if not texts:
            return 0, 0, 0
        if encoder is None:
            return round(n_bytes / GUESS_BYTES_PER_TOKEN) + per_document * len(texts), len(texts), n_bytes
        _, lengths = encoder.encode_batch(texts)
        return int(lengths.sum()) + per_document * len(texts), len(texts), n_bytes

    return count


def _estimate_measure(
    paths: list[str], sizes: list[int], text_field: str, stream: str, mirrors, count, limit: int
) -> tuple[_Count, _Count, bool]:
    """Files of one measure: (the estimate, the sample, whether the sample read them all whole)."""
    # an empty file holds nothing and is not read: the sample is spread over the files that hold bytes (a stream of
    # 50,000 empty files beside 3 real ones is the 3 real ones, not a sample of empty files scaled up to them)
    read_whole = {i for i, n in enumerate(sizes) if n == 0 and file_kind(paths[i]) != "parquet"}  # (a parquet
    # file's measure is its text column's bytes: 0 also when the column is missing, which its sample says)
    full = [i for i in _spread(len(paths)) if i not in read_whole]
    per_file = max(1, limit // max(1, min(len(full), SAMPLE_FILES)))
    sample, whole = _Count(), _Count()
    for i in full[:MAX_SAMPLE_FILES]:
        if sample.used >= limit:
            break
        got = _sample_file(paths[i], text_field, stream, mirrors, per_file)
        tokens, docs, text_bytes = count(got.texts)
        part = _Count(got.used, text_bytes, docs, tokens)
        sample += part
        if got.whole:
            whole += part
            read_whole.add(i)
    rest = sum(n for i, n in enumerate(sizes) if i not in read_whole)
    whole += sample.scaled(rest)
    return whole, sample, len(read_whole) == len(paths)


def estimate_supply(
    files: Sequence[str], text_field: str, stream: str, mirrors, count, sample_bytes: int = SAMPLE_BYTES
) -> Supply:
    """The token supply of `files`, from a sample of about `sample_bytes` per part (split among the kinds of
    file), spread over several files."""
    with ThreadPoolExecutor(LIST_THREADS) as pool:
        sizes = list(pool.map(lambda p: _file_bytes(p, text_field, stream, mirrors), files))
    by_measure: dict[str, list[int]] = {}
    for i, path in enumerate(files):
        by_measure.setdefault(_measure(path), []).append(i)
    supply = Supply(files=len(files), exact=True)
    for members in by_measure.values():
        estimate, sample, exact = _estimate_measure(
            [files[i] for i in members],
            [sizes[i] for i in members],
            text_field,
            stream,
            mirrors,
            count,
            max(1, sample_bytes // len(by_measure)),
        )
        supply.text_bytes += estimate.text_bytes
        supply.docs += estimate.docs
        supply.tokens += estimate.tokens
        supply.sample_text_bytes += sample.text_bytes
        supply.sample_docs += sample.docs
        supply.sample_tokens += sample.tokens
        supply.exact = supply.exact and exact
    return supply


# ---------------------------------------------------------------------------- the plan
def _split(recipe: Recipe, mirrors) -> tuple[Split, str]:
    """The persisted split when there is one, else the one the run would write (computed, not written)."""
    path = recipe.splits_path
    fs, fpath = fsspec.core.url_to_fs(path)
    if fs.exists(fpath):
        split = load_or_create_split(recipe, mirrors)
        return split, f"{path} (exists; used as is)" + "".join(f"; {d}" for d in _split_differences(recipe, split,
                                                                                                    mirrors))
    return create_split(recipe, mirrors), f"{path} (not there yet: computed here, the run writes it)"


def _split_differences(recipe: Recipe, split: Split, mirrors) -> list[str]:
    """Streams whose own holdout keys would hold out other files than the existing split file does: the split
    file wins (it is written once), which a user who just edited the keys should hear."""
    keyed = [n for n, s in recipe.streams.items() if s.holdout_files is not None or s.holdout_fraction is not None]
    if not keyed:
        return []
    fresh = create_split(recipe, mirrors)
    differences = []
    for name in keyed:
        would, does = stream_files(recipe, fresh, name, "holdout"), stream_files(recipe, split, name, "holdout")
        if would != does:
            differences.append(f"stream {name}: the recipe would hold out {', '.join(Path(f).name for f in would)}, "
                               f"the split file holds out {', '.join(Path(f).name for f in does)}")
    return differences


def _tokenizer(recipe: Recipe, out: Path) -> tuple[str | None, int, str]:
    """The tokenizer to sample with (None: guess), its vocabulary size, and how the estimate is made."""
    spec = recipe.tokenizer
    earlier = Layout(out).tokenizer
    if spec.train is not None:
        vocab = spec.train.vocab_size
        if earlier.exists():
            return str(earlier), vocab, f"trained by an earlier run of this directory ({earlier})"
        note = f"trained by the run (vocab {vocab:,}); supply estimated at {GUESS_BYTES_PER_TOKEN:g} bytes/token"
        return None, vocab, note
    own = Layout(out).own_tokenizer(spec.format)
    if spec.fetched and not own.exists():  # the run would write it; plan writes nothing of the run's
        scratch = tempfile.mkdtemp(prefix="tokmix-plan-")
        atexit.register(shutil.rmtree, scratch, True)
        own = Layout(scratch).own_tokenizer(spec.format)
    path = tokenizer_file(recipe, own)
    vocab = load_vocabulary(path, spec.format)
    document_delimiters(vocab, spec.doc_prefix, spec.doc_suffix, path)  # refused now, not mid-run
    given = (spec.path or spec.sentencepiece) and not spec.fetched
    return path, vocab.size, path if given else f"{_source(spec)} ({path})"


def _source(spec) -> str:
    if spec.hf is not None:
        return f"hf = {spec.hf!r}"
    return f"tiktoken = {spec.tiktoken!r}" if spec.tiktoken is not None else \
        f"{spec.path or spec.sentencepiece} (copied)"


def _encoder(path: str | None, backend: str):
    if path is None:
        return None, "no tokenizer yet"
    name, _ = choose_backend(path, backend)
    return make_encoder(path, name), name


def _free_space(out: Path) -> tuple[Path, int]:
    place = out.absolute()
    while not place.exists() and place != place.parent:
        place = place.parent
    return place, shutil.disk_usage(place).free


def _already_written(layout: Layout) -> int:
    files = [*layout.root.glob("*.bin"), *token_and_length_files(layout.streams)]
    return sum(p.stat().st_size for p in files if p.is_file())


def _disk(recipe: Recipe, out: Path, itemsize: int, streams: dict[str, StreamPlan], shards: list[int],
          cache: CachePlan | None = None) -> Disk:
    """The disk the run needs in its output's filesystem and, with a token cache, what the cache holds of its
    intermediates and how much it grows (set in `cache`)."""
    intermediates = cached = 0
    for s in streams.values():
        docs = s.budget * s.train.sample_docs / max(s.train.sample_tokens, 1)
        stream = s.budget * itemsize + round(docs) * 4  # .tok and .len (uint32 per document)
        intermediates += stream
        cached += round(stream * min(s.cached_tokens, s.budget) / max(s.budget, 1))
    place, free = _free_space(out)
    if cache is not None:
        cache.holds, cache.grows = cached, intermediates - cached
        if not is_url(cache.root):
            cache_place, cache_free = _free_space(Path(cache.root))
            cache.linked = os.stat(cache_place).st_dev == os.stat(place).st_dev
            cache.free = None if cache.linked else cache_free
    return Disk(
        path=place,
        free=free,
        intermediates=intermediates,
        shards=sum(recipe.shard_tokens_list) * itemsize,
        holdouts=len(recipe.domains) * (recipe.holdout.tokens + 1) * itemsize,
        written=_already_written(Layout(out)) if out.exists() else 0,
        cached=cached if cache is not None and cache.linked else 0,
    )


def _holdout_gives(recipe: Recipe, encoder, split: Split, mirrors, delimiters: Delimiters, dtype: np.dtype,
                   h: HoldoutPlan) -> dict[str, int]:
    """Tokens each stream gives the domain's holdout: the documents the holdout stage reads, drawn as it draws
    them (tokmix.stages.holdout), so plan and run agree; at most the holdout's tokens plus a document per
    stream are tokenized."""
    docs = []
    for name, reads in stream_reads(recipe, h.domain).items():
        files = stream_files(recipe, split, name, "holdout")
        docs += read_stream(recipe, encoder, name, files, reads, mirrors, delimiters, dtype, decontaminate=False)[0]
    return draw(docs, h.streams, h.tokens, recipe.seed)[1]


def _holdout_notes(plan: Plan) -> list[str]:
    """A stream of a several-stream domain that gives its holdout nothing: the documents read were drawn in
    a seeded order and a long one filled the holdout first (the reference's semantics, kept for conformance)."""
    notes = []
    for h in plan.holdouts.values():
        if h.gives is None or len(h.streams) < 2:
            continue
        for name in h.streams:
            if h.gives[name] == 0 and plan.streams[name].holdout.tokens:
                others = ", ".join(f"{n} {g:,}" for n, g in h.gives.items() if g)
                share = plan.streams[name].holdout_need
                notes.append(f"holdout {h.domain}: stream {name} gives none of its {share:,}-token share: the seeded "
                             f"draw of the documents read (the reference's) filled the {h.tokens:,} tokens before "
                             f"reaching one of {name}'s ({others}); a document longer than a share is taken whole: "
                             "hold out files with smaller documents or raise [holdout] tokens")
    return notes


def phase_budgets(recipe: Recipe, name: str) -> dict[str, int]:
    """The stream's target tokens up to each phase's end, times the slack (none without a schedule)."""
    if not recipe.schedule:
        return {}
    s, out, total = list(recipe.streams).index(name), {}, 0.0
    for phase in recipe.phases:
        total += phase.integral()[s]
        out[phase.name] = int(total * recipe.layout.stream_slack) + 1
    return out


def _problems(plan: Plan) -> list[str]:
    problems = []
    for s in plan.streams.values():
        if s.short and s.short_phase:
            problems.append(f"stream {s.name} runs short in phase {s.short_phase}: its train files hold about "
                            f"{s.train.tokens:,} tokens ({s.max_epochs} pass(es) allowed), the phases up to the end of "
                            f"{s.short_phase} need {s.phase_budgets[s.short_phase]:,}")
        if s.short:
            missing = s.budget / max(s.train.tokens, 1) - 1
            dropped = plan.contamination.get(s.name, [0, 0, 0])[2] and plan.recipe.decontaminate.action == "drop"
            hold = (f"its {len(s.train_files)} train file(s) hold {'' if s.train.exact else 'about '}"
                    f"{s.train.tokens:,} tokens{' once [decontaminate] drops what it takes' if dropped else ''}, "
                    f"its budget is {s.budget:,}")
            if s.max_epochs > 1 and s.train.tokens:
                problems.append(f"stream {s.name} needs max_epochs = {s.passes} (it is {s.max_epochs}): {hold}, "
                                f"{s.passes} passes over them: raise max_epochs, add train files or lower its "
                                "share or the number of blocks")
                continue
            repeat = f", or let its documents repeat: max_epochs = {s.passes}" if s.train.tokens else ""
            problems.append(
                f"stream {s.name} is likely to run short: {hold} (about "
                f"{missing:.0%} more text needed): add "
                f"train files or lower its share or the number of blocks{repeat}"
            )
    for h in plan.holdouts.values():
        for name in h.streams:
            s = plan.streams[name]
            if s.holdout_short:
                problems.append(
                    f"holdout {h.domain} cannot be filled: stream {name}'s {len(s.holdout_files)} holdout file(s) "
                    f"hold {'' if s.holdout.exact else 'about '}{s.holdout.tokens:,} tokens, it must give "
                    f"{s.holdout_need:,} of the holdout's "
                    f"{h.tokens:,}: hold out more files (holdout_files) or lower [holdout] tokens"
                )
        if h.eval_targets > h.tokens - 1:
            problems.append(
                f"holdout {h.domain}: eval_windows x seq_len = {h.eval_targets:,} targets but the holdout has "
                f"{h.tokens - 1:,}: lower eval_windows or raise [holdout] tokens"
            )
    d = plan.disk
    if d.needed > d.free:
        problems.append(
            f"not enough disk space: the run writes about {_bytes(d.needed)} into {plan.out}, {d.path} has "
            f"{_bytes(d.free)} free"
        )
    return problems


@contextmanager
def _benchmarks(recipe: Recipe, mirrors, cache: str | None, notes: list[str]):
    """The recipe's benchmark set ([decontaminate]) in a temporary folder: the token cache's (`cache`), linked and
    checked as a run takes it, else built as the run builds it (not kept: plan writes nothing); None without one.
    What the cache said goes to `notes`."""
    if recipe.decontaminate is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="tokmix-plan-") as folder:
        said: list[str] = []
        record = (build_set(recipe, Path(folder), mirrors) if cache is None else
                  plan_set(recipe, Path(folder), mirrors, cache, said.append))
        notes += [line for line in said if line.startswith("benchmark n-grams:")]
        notes += [f"decontaminate: benchmark {name}: {bench['items']:,} item(s) and not one word among them: it "
                  f"takes nothing (its files: {', '.join(bench['files']) or 'none'})"
                  for name, bench in record["benchmarks"].items() if not bench["ngrams"]]
        notes += [note for note in [first_pass_note()] if note is not None]
        yield BenchmarkSet(folder)


def plan_set(recipe: Recipe, directory: Path, mirrors, cache: str, log,
             checksums: dict[str, dict[str, str]] | None = None) -> dict:
    """The benchmark set in `directory` with a token cache, each file read as a run's early_benchmarks reads it:
    hashed for the key, and on a miss built from what that read kept (a small local set's bytes, a copy in
    `directory` of a file not on this machine), not read again; a large local set's files are read again by the
    build, and one whose bytes changed between the two reads is refused, naming it. Nothing is kept in the
    cache (plan writes nothing). `checksums`: the files' sha256 taken already (then nothing is kept: the build
    reads every file)."""
    data: dict[str, bytes | Path] = {}
    if checksums is None:
        checksums = benchmark_checksums(recipe, mirrors, data, None if small_benchmarks(recipe, mirrors) else directory)
    record = prepare_set(recipe, directory, mirrors, log, build=None, cache=cache, checksums=checksums)
    if record is None:
        record = build_set(recipe, directory, mirrors, data=data)
        if (changed := changed_while_read(record, checksums)) is not None:
            raise TokmixError(changed)
    return record


def _contamination_counter(count, bench, tally: list[int], drop: bool):
    """`count`, also tallying the sampled documents and text bytes and those a benchmark item contaminates; with
    action "drop" (`drop`) it counts only the others: the run drops those before tokenizing them, so they are
    none of the stream's supply (a plan counting them said "ok" of a stream the run then found short)."""

    def counting(texts: list[str]) -> tuple[int, int, int]:
        texts = [t for t in texts if t]
        found = bench.contaminating(texts)
        tally[0] += len(texts)
        tally[1] += sum(len(t) for t in texts)
        tally[2] += sum(1 for f in found if f)
        tally[3] += sum(len(t) for t, f in zip(texts, found) if f)
        return count([t for t, f in zip(texts, found) if not f] if drop else texts)

    return counting


def _stream_plans(recipe: Recipe, split: Split, mirrors, count, sample_bytes: int, encoder,
                  bench) -> tuple[dict[str, StreamPlan], dict[str, list[int]]]:
    streams, contamination = {}, {}
    for name, spec in recipe.streams.items():
        train = stream_files(recipe, split, name, "train")
        counting = count
        if bench is not None:
            contamination[name] = [0, 0, 0, 0]
            counting = _contamination_counter(count, bench, contamination[name],
                                              recipe.decontaminate.action == "drop")
        hold = stream_files(recipe, split, name, "holdout")
        in_domain = sum(recipe.share(n) for n in recipe.streams_of(spec.domain))
        streams[name] = StreamPlan(
            name=name,
            domain=spec.domain,
            share=recipe.share(name),
            budget=recipe.budget(name),
            train_files=train,
            holdout_files=hold,
            train=estimate_supply(train, spec.text_field, name, mirrors, counting, sample_bytes).guessed_at(
                encoder is None),
            holdout=estimate_supply(hold, spec.text_field, name, mirrors, count, sample_bytes).guessed_at(
                encoder is None),
            holdout_need=int(np.ceil((recipe.holdout.tokens + 1) * recipe.share(name) / in_domain)),
            max_epochs=spec.max_epochs,
            phase_budgets=phase_budgets(recipe, name),
        )
    return streams, contamination


def _contamination_notes(plan: Plan) -> list[str]:
    """What [decontaminate] would take from each stream, as the sample shows it."""
    if plan.recipe.decontaminate is None:
        return []
    spec = plan.recipe.decontaminate
    verb = "drop" if spec.action == "drop" else "count"
    share = f"a {spec.ngram}-gram" if spec.min_matches == 1 else f"{spec.min_matches} distinct {spec.ngram}-grams"
    notes = []
    for name, (docs, chars, found, found_chars) in plan.contamination.items():
        notes.append(f"decontaminate: stream {name}: {found:,} of {docs:,} sampled documents share {share} with "
                     f"a benchmark item: the run would {verb} ~"
                     f"{100 * found / max(docs, 1):.2f}% of its documents, {100 * found_chars / max(chars, 1):.2f}% "
                     "of its text")
    return notes


def run_unit_bytes(out: Path) -> int:
    """The unit size a run into `out` cuts its streams with, as the run decides it: the one an earlier run there
    recorded (a resume keeps its cut), else a new run's (TOKMIX_UNIT_BYTES or the default)."""
    try:
        found = identity.recorded(Layout(out), "unit size")
    except (DamagedFile, OSError):
        found = None  # the run itself names a damaged record
    return identity.PINS["unit size"].value(found) if found is not None else default_unit_bytes()


def _cached(recipe: Recipe, split: Split, mirrors, base: KeyBase, streams: dict[str, StreamPlan],
            cache: UnitCache, unit_bytes: int) -> None:
    """How much of each stream's budget the token cache holds: its units in order (as a run cuts them) until the
    budget, the cached ones counted at their tokens and the others at the sample's tokens per byte. `base`: the
    key parts the run's units share (the benchmark n-gram set's fingerprint included)."""
    for name, s in streams.items():
        per_byte = s.train.tokens / max(s.train.text_bytes, 1)
        got = 0
        for unit in plan_units(name, s.train_files, mirrors, unit_bytes):
            if got >= s.budget:
                break
            tokens = cache.holds(base.key(unit, recipe.streams[name].text_field), s.budget - got)
            s.units += 1
            s.cached_units += tokens > 0
            s.cached_tokens += tokens
            got += tokens or unit.size * per_byte


def _cached_holdouts(recipe: Recipe, split: Split, mirrors, base: KeyBase, cache: UnitCache, plan: CachePlan) -> None:
    """How much of what the holdouts read the token cache holds: each stream's holdout entry (keyed as the
    holdout stage keys it) against the tokens the stream's holdout read needs."""
    for domain in recipe.domains:
        for name, need in stream_reads(recipe, domain).items():
            key = holdout_cache_key(base, recipe, name, stream_files(recipe, split, name, "holdout"), mirrors)
            plan.holdout_tokens += round(need)
            plan.holdout_cached += min(cache.holds(key, 0), round(need))  # an entry short of it: read on past it


def make_plan(
    recipe: Recipe,
    mirrors: Iterable = (),
    *,
    out: str | os.PathLike | None = None,
    sample_bytes: int = SAMPLE_BYTES,
    cache: str | None = None,
) -> Plan:
    """What a run of `recipe` into `out` would do and whether it is likely to succeed; reads samples of the
    source files, writes nothing. `out` decides the free space checked and lets a recipe that trains its
    tokenizer be estimated with the tokenizer an earlier run there trained. `cache`: the token cache whose
    entries are counted (None: none)."""
    t0 = time.perf_counter()
    mirrors = list(mirrors)
    if mirrors and isinstance(mirrors[0], str):
        mirrors = parse_mirrors(mirrors)
    out = Path(out) if out is not None else Path(".")
    split, split_note = _split(recipe, mirrors)
    tokenizer_path, vocab, tokenizer_note = _tokenizer(recipe, out)
    try:
        dtype = dtype_for_vocab(vocab, recipe.tokenizer.dtype)
    except ValueError as e:
        raise TokmixError(f'tokenizer: {e}; use dtype = "auto" or "uint32"') from None
    encoder, backend = _encoder(tokenizer_path, recipe.tokenizer.backend)
    if encoder is not None:
        tokenizer_note += f"; sample tokenized with {backend}"
    count = _counter(encoder, len(recipe.tokenizer.doc_prefix) + len(recipe.tokenizer.doc_suffix))

    set_notes: list[str] = []
    with _benchmarks(recipe, mirrors, cache, set_notes) as bench:
        streams, contamination = _stream_plans(recipe, split, mirrors, count, sample_bytes, encoder, bench)
        benchmark_fingerprint = bench.fingerprint if bench is not None else None
    holdouts = {
        d: HoldoutPlan(
            domain=d,
            tokens=recipe.holdout.tokens + 1,
            eval_targets=recipe.holdout.eval_windows * recipe.layout.seq_len,
            streams=recipe.streams_of(d),
            supply=sum(streams[n].holdout.tokens for n in recipe.streams_of(d)),
        )
        for d in recipe.domains
    }
    if encoder is not None:
        spec = recipe.tokenizer
        delimiters = document_delimiters(load_vocabulary(tokenizer_path), spec.doc_prefix, spec.doc_suffix,
                                         tokenizer_path)
        for h in holdouts.values():
            h.gives = _holdout_gives(recipe, encoder, split, mirrors, delimiters, dtype, h)
    cache_plan = None
    if cache is not None:
        unit_cache = UnitCache(cache)
        size, entries = unit_cache.size()
        cache_plan = CachePlan(cache, default_cap(cache), size, entries)
        if encoder is not None:
            base = key_base(recipe, tokenizer_checksum(tokenizer_path), delimiters, dtype,
                            huge_doc_chars(tokenizer_path), benchmark_fingerprint, saves_model_inputs(tokenizer_path))
            _cached(recipe, split, mirrors, base, streams, unit_cache, run_unit_bytes(out))
            _cached_holdouts(recipe, split, mirrors, base, unit_cache, cache_plan)
    shards = recipe.shard_blocks
    disk = _disk(recipe, out, dtype.itemsize, streams, shards, cache_plan)
    plan = Plan(recipe, out, split_note, tokenizer_note, dtype, streams, holdouts, shards, disk,
                contamination=contamination, cache=cache_plan)
    plan.problems = _problems(plan)
    plan.notes = set_notes + _holdout_notes(plan) + _contamination_notes(plan)
    plan.seconds = time.perf_counter() - t0
    return plan


# ---------------------------------------------------------------------------- rendering
def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"  # pragma: no cover


def _shards_line(shards: list[int], seq_len: int) -> str:
    groups: dict[int, int] = {}
    for b in shards:
        groups[b] = groups.get(b, 0) + 1
    return " + ".join(f"{n} x {b:,} blocks ({tokens_in_shard(b, seq_len):,} tokens)" for b, n in groups.items())


def _status(short: bool, exact: bool, ratio: float) -> Text:
    if short:
        return Text("SHORT", style="bold red")
    if ratio > 0.9 and not exact:
        return Text("tight", style="yellow")
    return Text("ok", style="green")


def _passes(s: StreamPlan) -> str:
    """Passes the budget needs over the stream's train documents, with the recipe's max_epochs when it allows
    more than one."""
    need = "-" if s.passes == 1 << 62 else f"{s.passes:,}"
    return need if s.max_epochs == 1 else f"{need} of max {s.max_epochs}"


def streams_table(plan: Plan) -> Table:
    table = Table(title="streams (train files)", title_justify="left")
    for col in (
        "stream",
        "domain",
        "share",
        "budget",
        "files",
        "text",
        "sampled",
        "bytes/token",
        "est. supply",
        "budget/supply",
        "passes",
        "",
    ):
        table.add_column(col, justify="left" if col in ("stream", "domain", "") else "right")
    for s in plan.streams.values():
        t = s.train
        ratio = s.budget / max(t.tokens, 1)
        table.add_row(
            s.name,
            s.domain,
            f"{s.share:.2%}",
            f"{s.budget:,}",
            f"{t.files:,}",
            _bytes(t.text_bytes),
            "all" if t.exact else _bytes(t.sample_text_bytes),
            f"{GUESS_BYTES_PER_TOKEN:g} (guess)" if t.guessed else f"{t.bytes_per_token:.3f}",
            ("" if t.exact else "~") + f"{t.tokens:,}",
            f"{ratio:.0%}",
            _passes(s),
            _status(s.short, t.exact, ratio / s.max_epochs),  # tight: near what max_epochs allows
        )
    total_budget = sum(s.budget for s in plan.streams.values())
    total_supply = sum(s.train.tokens for s in plan.streams.values())
    table.add_section()
    table.add_row(
        "total",
        "",
        "",
        f"{total_budget:,}",
        f"{sum(s.train.files for s in plan.streams.values()):,}",
        _bytes(sum(s.train.text_bytes for s in plan.streams.values())),
        "",
        "",
        f"{total_supply:,}",
        f"{total_budget / max(total_supply, 1):.0%}",
        "",
        "",
    )
    return table


def holdouts_table(plan: Plan) -> Table:
    table = Table(title="holdouts (holdout files)", title_justify="left")
    for col in ("domain", "stream", "files", "text", "reads", "gives", "est. supply", "eval targets", ""):
        table.add_column(col, justify="left" if col in ("domain", "stream", "") else "right")
    for h in plan.holdouts.values():
        for k, name in enumerate(h.streams):
            s = plan.streams[name]
            table.add_row(
                h.domain if k == 0 else "",
                name,
                f"{len(s.holdout_files):,}",
                _bytes(s.holdout.text_bytes),
                f"{s.holdout_need:,}",
                f"{h.gives[name]:,}" if h.gives is not None else f"~{s.holdout_need:,}",
                ("" if s.holdout.exact else "~") + f"{s.holdout.tokens:,}",
                f"{h.eval_targets:,}" if k == 0 else "",
                _status(s.holdout_short, s.holdout.exact, s.holdout_need / max(s.holdout.tokens, 1)),
            )
        table.add_row("", "total", "", "", "", f"{h.tokens:,}", f"{h.supply:,}", "", "", end_section=True)
    return table


def disk_table(plan: Plan) -> Table:
    d = plan.disk
    table = Table(title=f"disk ({plan.dtype.name} tokens)", title_justify="left")
    table.add_column("what")
    table.add_column("bytes", justify="right")
    table.add_row("intermediates (streams/: each stream's budget)", _bytes(d.intermediates))
    table.add_row(f"train shards ({len(plan.shards)})", _bytes(d.shards))
    table.add_row(f"holdouts ({len(plan.holdouts)})", _bytes(d.holdouts))
    if d.written:
        table.add_row("already written in the output directory", "-" + _bytes(d.written))
    if d.cached:
        table.add_row("of the intermediates, in the token cache already (linked from it: no second copy)",
                      "-" + _bytes(d.cached))
    table.add_section()
    table.add_row("needed", _bytes(d.needed))
    style = "red" if d.needed > d.free else "green"
    table.add_row(f"free on {d.path}", Text(_bytes(d.free), style=style))
    c = plan.cache
    if c is not None:
        table.add_section()
        if not c.linked:
            table.add_row("of the intermediates, in the token cache already (copied into streams/)", _bytes(c.holds))
        where = "its units, linked: counted above" if c.linked else "on its own filesystem"
        table.add_row(f"the token cache grows by ({where}; now {_bytes(c.size)}, cap {_bytes(c.cap)})",
                      _bytes(c.grows))
        if c.free is not None:
            style = "red" if c.grows > c.free else "green"
            table.add_row(f"free where the token cache is ({c.root})", Text(_bytes(c.free), style=style))
        if c.size + c.grows > c.cap:
            table.add_row("evicted at the run's end, least recently used first, down to the cap",
                          "-" + _bytes(c.size + c.grows - c.cap))
    return table


def cache_line(plan: Plan) -> Text | None:
    """How much of the recipe the token cache holds, by stream."""
    c = plan.cache
    if c is None:
        return None
    line = Text()
    line.append("cache      ", style="bold").append(f"{c.root}: {c.entries:,} entries, {_bytes(c.size)}")
    units = sum(s.units for s in plan.streams.values())
    if units:
        tokens = sum(s.cached_tokens for s in plan.streams.values())
        budget = sum(s.budget for s in plan.streams.values())
        line.append(f"; holds {sum(s.cached_units for s in plan.streams.values()):,} of the ~{units:,} units the "
                    f"budgets need (~{min(tokens, budget) / max(budget, 1):.0%} of their tokens: "
                    + ", ".join(f"{s.name} {min(s.cached_tokens, s.budget) / max(s.budget, 1):.0%}"
                                for s in plan.streams.values()) + ")")
    if c.holdout_tokens:
        line.append(f"; and ~{c.holdout_cached / c.holdout_tokens:.0%} of the tokens the holdouts read")
    return line


def render_plan(plan: Plan) -> Group:
    r = plan.recipe
    head = Text()
    head.append("split      ", style="bold").append(f"{plan.split_note}\n")
    head.append("tokenizer  ", style="bold").append(f"{plan.tokenizer_note}\n")
    head.append("train      ", style="bold").append(
        f"{r.blocks:,} blocks x {r.layout.seq_len} tokens = {r.train_tokens:,} tokens ({plan.dtype.name}); "
        f"stream budgets include stream_slack {r.layout.stream_slack}\n"
    )
    head.append("shards     ", style="bold").append(f"{_shards_line(plan.shards, r.layout.seq_len)}\n")
    head.append("holdouts   ", style="bold").append(
        f"{len(plan.holdouts)} x {r.holdout.tokens + 1:,} tokens, {r.holdout.eval_windows:,} eval windows each\n"
    )
    head.append("output     ", style="bold").append(f"{plan.out}")
    parts: list = [head, *filter(None, [cache_line(plan)]), streams_table(plan), holdouts_table(plan),
                   disk_table(plan)]
    for note in plan.notes:
        parts.append(Text.assemble(("note: ", "bold yellow"), note))
    for problem in plan.problems:
        parts.append(Text.assemble(("problem: ", "bold red"), problem))
    verdict = (
        Text(f"plan ok ({plan.seconds:.1f}s)", style="bold green")
        if plan.ok
        else Text(f"plan: {len(plan.problems)} problem(s) ({plan.seconds:.1f}s)", style="bold red")
    )
    parts.append(verdict)
    return Group(*parts)
