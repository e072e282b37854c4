"""Stage 2: each stream tokenized to its budget. A stream's content is its train documents in canonical
order (split-file order, rows in file order, empty texts and copies of holdout documents dropped), each
prefixed with EOT, up to and including the document that crosses the budget.

Work units (contiguous pieces of files) are tokenized independently by workers; each commits three files
in `streams/<name>/units/`: tokens (.tok), document lengths (.len) and, last, its record (.json), which is
the commit. The coordinator keeps a bounded window of units in flight and stops once the committed prefix
of units holds the budget; a resume skips committed units, so a kill loses only the units in flight.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokmix.backends import clean_surrogates, make_encoder
from tokmix.errors import TokmixError
from tokmix.executors import make_executor
from tokmix.faults import fault_point
from tokmix.shards import EOT_ID, TokenFileWriter, write_bytes, write_json, write_npy
from tokmix.sources import Unit, batches, plan_units, read_texts, stream_files
from tokmix.stages import Context
from tokmix.stages.holdout import holdout_hashes, text_hashes

LENGTH_DTYPE = np.dtype("<u4")  # tokens per document, EOT included
UNITS_IN_FLIGHT_PER_WORKER = 2


@dataclass(frozen=True)
class UnitTask:
    unit: Unit
    text_field: str
    tokenizer_path: str
    backend: str
    dtype: str
    unit_dir: str
    hashes_path: str | None
    mirrors: tuple[tuple[str, str], ...]
    threads: int


# ---------------------------------------------------------------------------- worker side
_cache: dict[tuple, object] = {}  # per worker process: the encoder and holdout hashes, built once


def _cached(key: tuple, build):
    if key not in _cache:
        _cache[key] = build()
    return _cache[key]


def with_eot(ids: np.ndarray, lengths: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Flat ids of several documents -> the same documents each prefixed with EOT, in `dtype`."""
    out = np.empty(len(ids) + len(lengths), dtype=dtype)
    starts = np.cumsum(lengths + 1) - (lengths + 1)
    is_text = np.ones(len(out), dtype=bool)
    is_text[starts] = False
    out[starts] = EOT_ID
    out[is_text] = ids
    return out


def tokenize_unit(task: UnitTask) -> dict:
    """Tokenize one unit and commit it; returns its record."""
    unit, unit_dir = task.unit, Path(task.unit_dir)
    encoder = _cached(("encoder", task.tokenizer_path, task.backend, task.threads),
                      lambda: make_encoder(task.tokenizer_path, task.backend, task.threads))
    hashes = _cached(("hashes", task.hashes_path), lambda: np.load(task.hashes_path)) if task.hashes_path else None
    writer = TokenFileWriter(unit_dir / f"{unit.name}.tok", np.dtype(task.dtype))
    lengths, dropped_at, kept, chars, encode_seconds = [], [], 0, 0, 0.0
    try:
        for batch in batches(read_texts(unit, task.text_field, unit.stream, task.mirrors)):
            batch = [clean_surrogates(t) for t in batch]
            if hashes is not None and len(hashes):
                is_copy = np.isin(text_hashes(batch), hashes)
                if is_copy.any():
                    dropped_at += (kept + np.cumsum(~is_copy)[is_copy]).tolist()
                    batch = [t for t, c in zip(batch, is_copy.tolist()) if not c]
            if not batch:
                continue
            t0 = time.perf_counter()
            ids, lens = encoder.encode_batch(batch)
            encode_seconds += time.perf_counter() - t0
            writer.write(with_eot(ids, lens, writer.dtype))
            lengths.append((lens + 1).astype(LENGTH_DTYPE))
            kept += len(batch)
            chars += sum(map(len, batch))
    except BaseException:
        writer.abort()
        raise
    checksum = writer.close(before_commit=lambda: fault_point("streams:unit-before-rename"))
    lengths = np.concatenate(lengths) if lengths else np.empty(0, LENGTH_DTYPE)
    write_bytes(unit_dir / f"{unit.name}.len", lengths.tobytes())
    fault_point("streams:unit-before-record")
    record = {
        "index": unit.index,
        "name": unit.name,
        "pieces": unit.describe(),
        "tokens": writer.tokens,
        "docs": kept,
        "chars": chars,
        "dropped_at": dropped_at,  # kept-document count when each holdout copy was dropped
        "encode_seconds": encode_seconds,
        "checksum": checksum,
    }
    write_json(unit_dir / f"{unit.name}.json", record)
    return record


# ---------------------------------------------------------------------------- coordinator side
def units_dir(ctx: Context, stream: str) -> Path:
    return ctx.layout.stream(stream) / "units"


def meta_path(ctx: Context, stream: str) -> Path:
    return ctx.layout.stream(stream) / "stream.json"


def unit_lengths(ctx: Context, stream: str, name: str) -> np.ndarray:
    return np.fromfile(units_dir(ctx, stream) / f"{name}.len", dtype=LENGTH_DTYPE)


def load_meta(ctx: Context, stream: str) -> dict | None:
    path = meta_path(ctx, stream)
    return json.loads(path.read_text()) if path.exists() else None


def _committed(directory: Path) -> dict[int, dict]:
    records = {}
    for path in directory.glob("*.json"):
        record = json.loads(path.read_text())
        if (directory / f"{record['name']}.tok").exists() and (directory / f"{record['name']}.len").exists():
            records[record["index"]] = record
    return records


def _out_of_source(stream: str, got: int, budget: int, records: list[dict]) -> TokmixError:
    chars = sum(r["chars"] for r in records)
    more = ""
    if got:
        missing_mb = (budget - got) * chars / got / 1e6
        more = f"; about {missing_mb:,.1f} MB more text ({100 * (budget - got) / got:.0f}% more) is needed"
    return TokmixError(
        f"stream {stream}: source files ran out at {got:,} tokens of a budget of {budget:,}{more}: "
        "add train files or lower the stream's share or the number of blocks"
    )


def _finish(ctx: Context, stream: str, budget: int, used: list[dict], seconds: float, new_tokens: int) -> dict:
    """Cut the last unit at the document that crosses the budget and write the stream's record."""
    before = sum(r["tokens"] for r in used[:-1])
    last = used[-1]
    cum = np.cumsum(unit_lengths(ctx, stream, last["name"]), dtype=np.int64)
    last_docs = int(np.searchsorted(cum, budget - before)) + 1
    dropped = sum(len(r["dropped_at"]) for r in used[:-1]) + sum(1 for k in last["dropped_at"] if k <= last_docs)
    encode_seconds = sum(r["encode_seconds"] for r in used) or 1e-9
    meta = {
        "name": stream,
        "tokens": before + int(cum[last_docs - 1]),
        "docs": sum(r["docs"] for r in used[:-1]) + last_docs,
        "budget": budget,
        "seconds_last_run": round(seconds, 3),
        "tok_s_end_to_end": round(new_tokens / max(seconds, 1e-9)),
        "tok_s_tokenizer_capacity": round(sum(r["tokens"] for r in used) / encode_seconds * ctx.workers),
        "num_proc": ctx.workers,
        "backend": ctx.backend,
        "dropped_holdout_duplicates": dropped,
        "units": [{"name": r["name"], "tokens": r["tokens"], "docs": r["docs"]} for r in used],
        "last_unit_docs": last_docs,
    }
    fault_point("streams:before-meta")
    write_json(meta_path(ctx, stream), meta)
    fault_point("streams:after-meta")
    return meta


def tokenize_stream(ctx: Context, executor, stream: str) -> dict:
    recipe = ctx.recipe
    budget = recipe.budget(stream)
    directory = units_dir(ctx, stream)
    directory.mkdir(parents=True, exist_ok=True)
    records = _committed(directory)
    files = stream_files(recipe, ctx.split, stream, "train")
    hashes = str(ctx.layout.state / "holdout.hashes.npy") if recipe.holdout.decontaminate else None

    def task(unit: Unit) -> UnitTask:
        return UnitTask(unit, recipe.streams[stream].text_field, ctx.tokenizer_path, ctx.backend, ctx.dtype.str,
                        str(directory), hashes, tuple(ctx.mirrors), max(1, ctx.threads_per_worker))

    plan = plan_units(stream, files, ctx.mirrors, ctx.unit_bytes)
    in_flight: dict = {}
    prefix, prefix_tokens, exhausted, new_tokens = 0, 0, False, 0
    window = UNITS_IN_FLIGHT_PER_WORKER * ctx.workers
    t0 = last_log = time.perf_counter()
    resumed = sum(r["tokens"] for r in records.values())
    ctx.log(f"{stream}: budget {budget:,} tokens" + (f", {len(records)} units already committed" if records else ""))
    while True:
        while prefix in records and prefix_tokens < budget:
            prefix_tokens += records[prefix]["tokens"]
            prefix += 1
        if prefix_tokens >= budget:
            break
        while not exhausted and len(in_flight) < window:
            unit = next(plan, None)
            if unit is None:
                exhausted = True
            elif unit.index in records:
                if records[unit.index]["pieces"] != unit.describe():
                    raise TokmixError(f"stream {stream}: unit {unit.name} was cut from other files or sizes than "
                                      "now; the source files changed since this run started (use --restart)")
            else:
                in_flight[executor.submit(tokenize_unit, task(unit))] = unit
        if not in_flight:
            if exhausted and prefix not in records:
                raise _out_of_source(stream, prefix_tokens, budget, [records[i] for i in range(prefix)])
            continue
        for future in executor.wait_any(set(in_flight)):
            unit = in_flight.pop(future)
            records[unit.index] = record = executor.result(future)
            new_tokens += record["tokens"]
            fault_point("streams:after-unit")
        if time.perf_counter() - last_log > 10:
            last_log = time.perf_counter()
            done = resumed + new_tokens
            ctx.log(f"{stream}: {done:,} / {budget:,} tokens, {new_tokens / (last_log - t0):,.0f} tok/s")
    meta = _finish(ctx, stream, budget, [records[i] for i in range(prefix)], time.perf_counter() - t0, new_tokens)
    ctx.log(f"{stream}: done, {meta['tokens']:,} tokens, {meta['docs']:,} docs, {meta['tok_s_end_to_end']:,} tok/s"
            + (f", {meta['dropped_holdout_duplicates']:,} holdout copies dropped" if hashes else ""))
    return meta


def run_streams(ctx: Context) -> dict[str, dict]:
    """Every stream's record, tokenizing those not finished yet."""
    metas = {name: load_meta(ctx, name) for name in ctx.recipe.streams}
    todo = [name for name, meta in metas.items() if meta is None]
    if todo:
        # units are numbered by how files were cut: a resume keeps the cut the run started with
        cut = ctx.layout.state / "unit_bytes.json"
        if cut.exists():
            ctx.unit_bytes = json.loads(cut.read_text())
        else:
            write_json(cut, ctx.unit_bytes)
        if ctx.recipe.holdout.decontaminate:
            write_npy(ctx.layout.state / "holdout.hashes.npy", holdout_hashes(ctx))
        with make_executor(ctx.executor, ctx.workers) as executor:
            for name in todo:
                metas[name] = tokenize_stream(ctx, executor, name)
            executor.close(cancel=True)  # units past a budget that are still running are not needed
    return metas
