"""Stage 3: interleave the streams' documents in a seeded random order (one stream label per document,
shuffled with np.random.default_rng(seed); the i-th label s is stream s's i-th document) and cut the result
into train shards. Each shard needs one contiguous range of each stream, so shards are written
independently, in parallel, each committed atomically, and a resume rewrites only the missing ones."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokmix import __version__
from tokmix.errors import TokmixError
from tokmix.faults import fault_point
from tokmix.shards import (
    BlockFingerprinter,
    DamagedFile,
    TokenFileWriter,
    file_checksum,
    fingerprints_path,
    read_json,
    shard_blocks,
    write_bytes,
    write_json,
    write_record,
)
from tokmix.stages import Context, drop_cached
from tokmix.stages.passes import passes_used
from tokmix.stages.streams import UNITS_IN_FLIGHT_PER_WORKER, unit_lengths, units_dir

GATHER_TOKENS = 8 << 20  # tokens gathered in memory before each write: bounds a shard writer's memory
OPEN_UNITS = 16  # unit files a shard writer keeps open: a few per stream


@dataclass(frozen=True)
class ShardTask:
    """Everything one shard needs: its documents in interleave order as (stream, unit file, offset, length)."""

    path: str
    dtype: str
    seq_len: int
    blocks: int
    n_tokens: int
    skip: int  # tokens of the first document before the shard starts
    drop_first: bool  # the first token repeats the previous shard's last one and is counted there
    streams: tuple[str, ...]
    unit_files: tuple[tuple[str, ...], ...]  # per stream
    doc_stream: np.ndarray
    doc_unit: np.ndarray
    doc_offset: np.ndarray
    doc_length: np.ndarray


def write_shard(task: ShardTask) -> dict:
    """Gather the shard's documents from the unit files and commit the shard; returns its record. Unit files
    are read, never memory-mapped: mapped pages count in the process's RSS (what top and the memory guard
    see), and a 500M-token shard's units held ~1.9 GB of them. Reads go into one GATHER_TOKENS buffer."""
    drop_cached()  # a Ray worker that tokenized before: its encoder is not needed any more
    paths = [p for files in task.unit_files for p in files]
    writer = TokenFileWriter(Path(task.path), np.dtype(task.dtype), fault="assemble:mid-write")
    marks = BlockFingerprinter(task.seq_len, writer.dtype)
    gathered, pending = np.empty(min(GATHER_TOKENS, task.n_tokens), dtype=writer.dtype), 0
    files = _OpenUnits(paths, writer.dtype.itemsize)
    try:
        for f, start, stop in zip(*(a.tolist() for a in _copy_runs(task))):
            while start < stop:  # a run longer than what is left to gather before a write is cut there
                n = min(stop - start, len(gathered) - pending)
                files.read_into(f, start, gathered[pending : pending + n])
                start, pending = start + n, pending + n
                if pending == len(gathered):
                    _write_gathered(gathered, writer, marks)
                    pending = 0
        if pending:
            _write_gathered(gathered[:pending], writer, marks)
    except BaseException:
        writer.abort()
        raise
    finally:
        files.close()
    if writer.tokens != task.n_tokens:
        writer.abort()
        raise TokmixError(f"{Path(task.path).name}: gathered {writer.tokens:,} of {task.n_tokens:,} tokens")
    checksum = writer.close(before_commit=lambda: fault_point("assemble:before-rename"))
    path = Path(task.path)
    marks_path = fingerprints_path(path.parent, path.name)
    marks_path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(marks_path, marks.result().tobytes(), durable=False)  # a diagnosis aid, checked by its length
    return {
        "file": Path(task.path).name,
        "tokens": task.n_tokens,
        "blocks": task.blocks,
        "tokens_by_stream": _tokens_by_stream(task),
        "checksum": checksum,
    }


def _write_gathered(gathered: np.ndarray, writer: TokenFileWriter, marks: BlockFingerprinter) -> None:
    writer.write(gathered)
    marks.update(gathered)


class _OpenUnits:
    """Unit files opened as a shard reads them, one at a time per stream in effect (a stream's documents come
    from its units in order), so at most the last few stay open."""

    def __init__(self, paths: list[str], itemsize: int):
        self.paths, self.itemsize, self.open = paths, itemsize, {}

    def read_into(self, f: int, start: int, out: np.ndarray) -> None:
        if f not in self.open:
            if len(self.open) >= OPEN_UNITS:
                self.open.pop(next(iter(self.open))).close()  # the oldest opened
            self.open[f] = open(self.paths[f], "rb", buffering=0)
        handle = self.open[f]
        handle.seek(start * self.itemsize)
        view = memoryview(out).cast("B")
        got = handle.readinto(view)
        while got < len(view):  # a regular file returns short reads only at its end
            more = handle.readinto(view[got:])
            if not more:
                raise TokmixError(f"{self.paths[f]}: ends before token {start + len(out):,} (truncated unit file)")
            got += more

    def close(self) -> None:
        for handle in self.open.values():
            handle.close()
        self.open.clear()


def _copy_runs(task: ShardTask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the shard copies, in order, as runs (unit file, first token, end token): the tokens it takes of
    each document, consecutive documents of one unit file merged (a document's Python cost is most of a
    shard's otherwise). Unit files are numbered across the streams in task.unit_files order."""
    take, start = task.doc_length.copy(), task.doc_offset.copy()
    take[0] -= task.skip
    start[0] += task.skip
    ends = np.cumsum(take)
    last = min(int(np.searchsorted(ends, task.n_tokens)), len(ends) - 1)  # too few tokens: the caller says so
    take, start = take[: last + 1], start[: last + 1]
    take[-1] -= max(int(ends[last]) - task.n_tokens, 0)
    first_file = np.cumsum([0] + [len(files) for files in task.unit_files])
    file = first_file[task.doc_stream[: last + 1]] + task.doc_unit[: last + 1]
    stop = start + take
    new_run = np.ones(len(file), dtype=bool)
    new_run[1:] = (file[1:] != file[:-1]) | (start[1:] != stop[:-1])
    at = np.flatnonzero(new_run)
    return file[at], start[at], np.append(stop[at[1:] - 1], stop[-1])


def _tokens_by_stream(task: ShardTask) -> dict[str, int]:
    """Tokens of each stream in the shard, without the leading overlap token (counted in the previous shard)."""
    ends = np.cumsum(task.doc_length) - task.skip
    starts = ends - task.doc_length
    lo = 1 if task.drop_first else 0
    inside = np.clip(np.minimum(ends, task.n_tokens) - np.maximum(starts, lo), 0, None)
    counts = np.bincount(task.doc_stream, weights=inside, minlength=len(task.streams))
    return {name: int(c) for name, c in zip(task.streams, counts)}


def interleave_order(docs_per_stream: list[int], seed: int) -> np.ndarray:
    """The stream (its position in the recipe) of every document in train order: one label per document,
    shuffled with np.random.default_rng(seed), as the reference does."""
    order = np.concatenate([np.full(n, s, dtype=np.uint8) for s, n in enumerate(docs_per_stream)])
    np.random.default_rng(seed).shuffle(order)
    return order


class Interleave:
    """The seeded document order over all streams, with where each document's tokens lie."""

    def __init__(self, ctx: Context, metas: dict[str, dict]):
        self.streams = tuple(ctx.recipe.streams)
        lengths, units, offsets, self.unit_files = [], [], [], []
        for name in self.streams:
            meta = metas[name]
            per_unit = [unit_lengths(ctx, name, u["name"]).astype(np.int64) for u in meta["units"]]
            docs = meta["docs"]
            lengths.append(np.concatenate(per_unit)[:docs])
            units.append(np.repeat(np.arange(len(per_unit), dtype=np.int32), [len(x) for x in per_unit])[:docs])
            offsets.append(np.concatenate([np.cumsum(x) - x for x in per_unit])[:docs])
            self.unit_files.append(tuple(str(units_dir(ctx, name) / f"{u['name']}.tok") for u in meta["units"]))
        self.order = order = interleave_order([len(x) for x in lengths], ctx.recipe.seed)
        self.length = np.empty(len(order), dtype=np.int64)
        self.unit = np.empty(len(order), dtype=np.int32)
        self.offset = np.empty(len(order), dtype=np.int64)
        for s in range(len(self.streams)):
            at = np.flatnonzero(order == s)
            self.length[at], self.unit[at], self.offset[at] = lengths[s], units[s], offsets[s]
        self.ends = np.cumsum(self.length)

    @property
    def total_tokens(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def documents_used(self, n_tokens: int) -> dict[str, int]:
        """Documents of each stream with at least one token among the first `n_tokens`."""
        last = int(np.searchsorted(self.ends, n_tokens - 1, side="right"))
        counts = np.bincount(self.order[: last + 1], minlength=len(self.streams))
        return {name: int(c) for name, c in zip(self.streams, counts)}

    def shard_task(self, path: Path, dtype: np.dtype, start: int, blocks: int, seq_len: int, first: bool) -> ShardTask:
        n_tokens = blocks * seq_len + 1
        d0 = int(np.searchsorted(self.ends, start, side="right"))
        d1 = int(np.searchsorted(self.ends, start + n_tokens - 1, side="right")) + 1
        return ShardTask(
            str(path), dtype.str, seq_len, blocks, n_tokens,
            skip=start - int(self.ends[d0] - self.length[d0]),
            drop_first=not first,
            streams=self.streams,
            unit_files=tuple(self.unit_files),
            doc_stream=self.order[d0:d1],
            doc_unit=self.unit[d0:d1],
            doc_offset=self.offset[d0:d1],
            doc_length=self.length[d0:d1],
        )


def _record_path(ctx: Context, k: int) -> Path:
    return ctx.layout.shard_record(ctx.layout.train(k).name)


def _done(ctx: Context, k: int, n_tokens: int) -> dict | None:
    """A shard's record when the shard is on disk, whole, from this recipe: the bytes its record's checksum was
    taken of (one read of the shard). A damaged shard or record is None: the shard is written again."""
    path, shard = _record_path(ctx, k), ctx.layout.train(k)
    if not (shard.exists() and shard.stat().st_size == n_tokens * ctx.dtype.itemsize):
        return None
    try:
        record = read_json(path, sealed=True)
    except DamagedFile as e:
        ctx.log(f"{shard.name}: its record is damaged ({e.why}); rewritten")
        return None
    if record is not None and file_checksum(shard) != record["checksum"]:
        ctx.log(f"{shard.name}: damaged (sha256 differs from its record); rewritten")
        return None
    return record


def run_assemble(ctx: Context, metas: dict[str, dict]) -> tuple[list[dict], dict[str, int]]:
    """Write every train shard not on disk yet; returns the shard records in order and the documents of each
    stream that the shards use."""
    recipe, layout = ctx.recipe, ctx.layout
    seq_len = recipe.layout.seq_len
    plan = shard_blocks(recipe.blocks, recipe.blocks_per_shard)
    starts = np.concatenate([[0], np.cumsum(plan)[:-1]]) * seq_len
    records: list[dict | None] = [_done(ctx, k, b * seq_len + 1) for k, b in enumerate(plan)]
    todo = [k for k, r in enumerate(records) if r is None]
    # a run with fewer blocks than an earlier one in this directory: what it made beyond this plan goes
    layout.remove_created(sorted(layout.root.glob("train_*.bin"))[len(plan):])
    used_path = layout.state / "documents_used.json"
    try:
        used = read_json(used_path)
    except DamagedFile:
        used = None  # computed again below, from the units
    if not todo and used is not None:
        return records, used
    t0 = time.perf_counter()
    (layout.state / "shards").mkdir(parents=True, exist_ok=True)
    interleave = Interleave(ctx, metas)
    if interleave.total_tokens < recipe.train_tokens:
        raise TokmixError(f"streams hold {interleave.total_tokens:,} tokens, fewer than the {recipe.train_tokens:,} "
                          "the blocks need (stream_slack too small?)")
    used = interleave.documents_used(recipe.train_tokens)
    write_json(used_path, used)
    tasks = {k: interleave.shard_task(layout.train(k), ctx.dtype, int(starts[k]), plan[k], seq_len, k == 0)
             for k in todo}
    executor, queue, pending = ctx.pool, iter(tasks.items()), {}
    window = UNITS_IN_FLIGHT_PER_WORKER * ctx.workers  # bounded: each task carries its documents' arrays
    while True:
        for k, task in itertools.islice(queue, window - len(pending)):
            pending[executor.submit(write_shard, task)] = k
        if not pending:
            break
        for future in executor.wait_any(set(pending)):
            k = pending.pop(future)
            records[k] = executor.result(future)
            fault_point("assemble:after-rename")
            write_record(_record_path(ctx, k), records[k])
            fault_point("assemble:after-record")
            ctx.log(f"shard {records[k]['file']}: {plan[k]:,} blocks, {records[k]['tokens']:,} tokens")
    ctx.log(f"assembled {len(todo)} shard(s) in {time.perf_counter() - t0:.1f}s")
    return records, used


def build_index(ctx: Context, val: dict, metas: dict[str, dict], shards: list[dict], used: dict[str, int]) -> dict:
    """index.json as the reference writes it, plus what tokmix adds (the tokenizer's checksum, tokmix's version,
    vocab size, shard checksums, decontamination)."""
    recipe = ctx.recipe
    names = list(recipe.streams)
    by_stream = {n: sum(s["tokens_by_stream"][n] for s in shards) for n in names}
    total = sum(by_stream.values())
    by_domain = {d: sum(by_stream[n] for n in recipe.streams_of(d)) for d in recipe.domains}
    summary = {n: {k: v for k, v in metas[n].items() if k not in ("units", "last_unit_docs")} for n in names}
    return {
        "tokenizer": ctx.tokenizer_path,
        "tokenizer_sha256": ctx.tokenizer_sha256,
        "tokmix_version": __version__,
        "vocab_size": ctx.vocab_size,
        "dtype": ctx.dtype.name,
        "seq_len": recipe.layout.seq_len,
        "block": recipe.layout.seq_len + 1,
        "stride": recipe.layout.seq_len,
        "eot_id": ctx.delimiters.marker,  # the reference's key: the id that shows where documents meet
        "delimiters": ctx.delimiters.to_index(),
        "delimiter_tokens": {"prefix": recipe.tokenizer.doc_prefix, "suffix": recipe.tokenizer.doc_suffix},
        "seed": recipe.seed,
        "recipe_fingerprint": recipe.fingerprint(),
        "mix": {
            "method": "each stream tokenized to its token budget, documents interleaved in a seeded random order "
            "(per-document sampling at fixed proportions)",
            "target_share_by_stream": {n: s.share for n, s in recipe.streams.items()},
            "domain_by_stream": {n: s.domain for n, s in recipe.streams.items()},
            "streams": summary,
            "documents_used": used,
            # epochs of each stream's train documents in the shards: its tokens there over one pass's tokens
            "passes_by_stream": {n: round(passes_used(metas[n], by_stream[n]), 4) for n in names},
        },
        "blocks": recipe.blocks,
        "train_steps": recipe.layout.steps,
        "seqs_per_step": recipe.layout.seqs_per_step,
        "margin_steps": recipe.layout.margin_steps if recipe.blocks == recipe.default_blocks else 0,
        "shards": shards,
        "total": {
            "tokens": total,
            "tokens_by_stream": by_stream,
            "tokens_by_domain": by_domain,
            "share_by_stream": {n: by_stream[n] / total for n in names},
            "share_by_domain": {d: by_domain[d] / total for d in recipe.domains},
        },
        "decontamination": {
            "enabled": recipe.holdout.decontaminate,
            "dropped_by_stream": {n: metas[n]["dropped_holdout_duplicates"] for n in names},
        },
        "throughput": {
            "tok_s_end_to_end_by_stream": {n: metas[n]["tok_s_end_to_end"] for n in names},
            "tok_s_tokenizer_capacity_by_stream": {n: metas[n]["tok_s_tokenizer_capacity"] for n in names},
            "num_proc": ctx.workers,
            "backend": ctx.backend,
        },
        "val": val,
    }
