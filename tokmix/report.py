"""An HTML report of a finished run, in one self-contained file (plots embedded as PNG, no external resources):
requested vs realized shares, the share of each shard, document lengths, bytes per token, throughput, holdouts.

Per-stream document lengths come from the units' .len files when the run kept its intermediates
(--keep-streams); otherwise one streaming pass over the shards finds them at the delimiters (by default
<|endoftext|> starts every document) and gives each document its stream by replaying the seeded interleave from
index.json.
Plots with matplotlib, one of tokmix's dependencies.
"""

from __future__ import annotations

import base64
import html
import io
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokmix.errors import TokmixError
from tokmix.faults import fault_point
from tokmix.format.records import Index, PhaseEntry
from tokmix.interleave import interleave_labels
from tokmix.ownership import Ownership
from tokmix.provenance import RunDocuments
from tokmix.shards import (
    REMAKE_REMEDY,
    Layout,
    NotAFile,
    as_path,
    publish_new,
    read_index,
    read_json,
    read_regular,
    reader_layout,
)
from tokmix.store import storage
from tokmix.summary import passes
from tokmix.tokens import LENGTH_DTYPE, Delimiters, iter_token_chunks
from tokmix.trace import contamination_record
from tokmix.unit_files import LENGTHS, UnitFiles

REPORT_MARK = '<meta name="generator" content="tokmix report">'  # in its first bytes: a report tokmix wrote
SCAN_CHUNK_BYTES = 8 << 20  # shard bytes per step of the scan: bounds its temporaries to ~100 MB
HIST_BINS = 40


# ---------------------------------------------------------------------------- what the report shows
@dataclass
class StreamFacts:
    name: str
    domain: str
    doc_lengths: np.ndarray  # tokens per document, delimiters included
    lengths_from: str  # "units" or "shards"
    units: list[dict] = field(default_factory=list)  # unit records (intermediates kept), with their commit time
    chars: int | None = None  # characters of the units' documents, and their tokens
    unit_tokens: int = 0
    text_bytes: int | None = None  # UTF-8 bytes of the stream's tokens in the shards (the shard scan), and
    tokens_in_shards: int | None = None  # those tokens


def interleave_order(out_dir: Path, index: Index) -> np.ndarray:
    """The stream (its position in the recipe) of every document in the shards, in shard order: the
    assemble stage's seeded shuffle of one label per document of each stream, or for the balanced interleave
    (which depends on the documents' lengths) the streams the provenance index names."""
    kind = index.mix.interleave
    if kind == "balanced":
        return recorded_order(out_dir, index)
    docs = [meta.docs for meta in index.mix.streams.values()]
    return interleave_labels(docs, index.seed, kind)


def recorded_order(out_dir: Path, index: Index) -> np.ndarray:
    """The stream of every document in the shards, from their provenance index (a document cut by a shard's
    start, `skip` > 0, is the previous shard's last)."""
    if index.provenance is None:
        raise TokmixError(f"{out_dir}: a balanced run's streams per document come from its provenance index, and "
                          "this run has none ([layout] provenance = false)")
    run = RunDocuments(out_dir, index)
    names = index.stream_names
    stream_of = np.array([names.index(s.stream) for s in run.sources], dtype=np.uint8)
    pieces = []
    for k in range(len(index.shards)):
        docs = run.shard(k)
        pieces.append(stream_of[docs.records["source"][1 if docs.skip else 0 :]])
    return np.concatenate(pieces) if pieces else np.empty(0, np.uint8)


def scan_shards(out_dir: Path, index: Index, byte_len: np.ndarray | None) -> dict:
    """One sequential pass over the train shards: per stream, the lengths of its whole documents, its tokens,
    and (given each id's UTF-8 bytes) its text bytes. The last document, cut by the end of the run, is left out."""
    order = interleave_order(out_dir, index)
    n_streams = len(index.mix.streams)
    dtype = np.dtype(index.dtype)
    tokens = np.zeros(n_streams, dtype=np.int64)
    text_bytes = np.zeros(n_streams, dtype=np.float64)
    ends: list[np.ndarray] = []  # where documents start, across shards (overlap tokens counted once)
    doc, offset, previous = -1, 0, None
    delimiters = Delimiters.from_index(index)
    for k, shard in enumerate(index.shards):
        first = k > 0  # a shard's first token repeats the previous shard's last one
        for chunk in iter_token_chunks(out_dir / shard.file, dtype, SCAN_CHUNK_BYTES):
            if first:
                chunk, first = chunk[1:], False
            starts = delimiters.starts(chunk, previous)
            is_start = np.zeros(len(chunk), dtype=bool)
            is_start[starts] = True
            doc_of = doc + np.cumsum(is_start)  # the document each token belongs to
            if len(doc_of) and doc_of[0] < 0:
                raise TokmixError(f"{shard.file}: the run does not start with a document's first delimiter")
            labels = order[doc_of]
            tokens += np.bincount(labels, minlength=n_streams)
            if byte_len is not None:
                text_bytes += np.bincount(labels, weights=byte_len[chunk], minlength=n_streams)
            ends.append(offset + starts)
            doc = int(doc_of[-1]) if len(doc_of) else doc
            previous = int(chunk[-1]) if len(chunk) else previous
            offset += len(chunk)
    starts = np.concatenate(ends) if ends else np.empty(0, np.int64)
    lengths = np.diff(starts)  # whole documents only: the last one runs past the end of the run
    labels = order[: len(lengths)]
    names = list(index.mix.streams)
    return {
        "lengths": {n: lengths[labels == s] for s, n in enumerate(names)},
        "tokens": dict(zip(names, tokens.tolist())),
        "text_bytes": dict(zip(names, text_bytes.round().astype(np.int64).tolist())) if byte_len is not None else None,
    }


def documents_in_order(out_dir: Path, index: Index) -> tuple[np.ndarray, np.ndarray]:
    """Every document of the train run in order, from the provenance index: its stream (position in the recipe)
    and its tokens in the run (a document cut by a shard's end counted once, the overlap token once)."""
    run = RunDocuments(out_dir, index)
    names = index.stream_names
    stream_of = np.array([names.index(s.stream) for s in run.sources], dtype=np.int64)
    labels, tokens = [], []
    for k in range(len(index.shards)):
        docs = run.shard(k)
        records, t = docs.records, docs.records["tokens"].astype(np.int64)
        if k:
            t[0] -= 1  # the shard's first token is the previous shard's last
        if docs.skip:  # the first document began in an earlier shard: the last one with a document starting in it
            next(counted for counted in reversed(tokens) if len(counted))[-1] += t[0]
            records, t = records[1:], t[1:]
        labels.append(stream_of[records["source"]])
        tokens.append(t)
    return np.concatenate(labels), np.concatenate(tokens)


def step_targets(index: Index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The token position of every step boundary of the run's blocks (margins included), its step number, and
    every stream's target tokens there: a schedule's phases (a ramp step at the ramp's middle) or fixed shares."""
    names = index.stream_names
    phases = index.phases or [PhaseEntry(
        steps=[0, index.blocks // index.seqs_per_step], seqs_per_step=index.seqs_per_step, seq_len=index.seq_len,
        requested_share_by_stream=index.mix.target_share_by_stream)]
    positions, targets, at, total, previous = [0], [np.zeros(len(names))], 0, np.zeros(len(names)), None
    for phase in phases:
        shares = np.array([phase.requested_share_by_stream[n] for n in names])
        step_tokens = phase.seqs_per_step * phase.seq_len
        for t in range(phase.step_count + phase.margin_steps):
            f = (t + 0.5) / phase.ramp_steps if t < phase.ramp_steps else 1.0
            share = shares if f >= 1 else previous + (shares - previous) * f
            at, total = at + step_tokens, total + share * step_tokens
            positions.append(at)
            targets.append(total)
        previous = shares
    return np.array(positions, dtype=np.float64), np.arange(len(positions)), np.array(targets)


def step_shares(out_dir: Path, index: Index, buckets: int | None = None) -> dict:
    """Realized against target share of every stream along the run, in `buckets` equal pieces of its tokens
    (default: ~40 documents a piece, 8 to 200 pieces; x: the physical step, margins included, at each piece's
    middle)."""
    labels, tokens = documents_in_order(out_dir, index)
    buckets = buckets or int(np.clip(len(labels) // 40, 8, 200))
    ends = np.cumsum(tokens)
    n = len(index.mix.streams)
    cum = np.zeros((len(labels) + 1, n), dtype=np.float64)
    np.add.at(cum[1:], (np.arange(len(labels)), labels), tokens)
    cum = np.cumsum(cum, axis=0)
    positions, steps, targets = step_targets(index)
    edges = np.linspace(0, float(ends[-1]), buckets + 1)

    def realized_at(x: np.ndarray) -> np.ndarray:
        d = np.minimum(np.searchsorted(ends, x, side="right"), len(labels) - 1)
        out = cum[d].copy()
        out[np.arange(len(x)), labels[d]] += np.minimum(x - (ends[d] - tokens[d]), tokens[d])
        return out

    def target_at(x: np.ndarray) -> np.ndarray:
        return np.stack([np.interp(x, positions, targets[:, s]) for s in range(n)], axis=1)

    width = np.diff(edges)[:, None]
    return {"step": np.interp((edges[:-1] + edges[1:]) / 2, positions, steps),
            "realized": np.diff(realized_at(edges), axis=0) / width,
            "target": np.diff(target_at(edges), axis=0) / width}


def plot_step_shares(plt, out_dir: Path, index: Index) -> str:
    names = index.stream_names
    colors = _colors(names)
    got = step_shares(out_dir, index)
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for s, n in enumerate(names):
        ax.plot(got["step"], got["realized"][:, s], color=colors[n], lw=1.2, label=n)
        ax.plot(got["step"], got["target"][:, s], color=colors[n], lw=0.8, ls="--")
    at = 0
    for phase in index.phases or []:
        if at:
            ax.axvline(at, color="black", lw=0.6)
        ax.text(at, ax.get_ylim()[1], f" {phase.name}", va="top", fontsize=8)
        at += phase.step_count + phase.margin_steps
    ax.set_xlabel("step (blocks / seqs_per_step, margins included)")
    ax.set_ylabel("share of the tokens")
    ax.set_title(f"share per step, {len(got['step'])} equal pieces of the run (solid: realized, dashed: target)")
    _stack_legend(ax)
    return _png(fig)


def shard_composition(out_dir: Path, index: Index) -> list[dict] | None:
    """Each shard's documents and tokens by stream and its sources (files, by pass) from its provenance index,
    None for a run without one. A shard's first token (the previous shard's last) is counted there, as in
    tokens_by_stream; a document cut by a shard's end is a document of both shards."""
    if index.provenance is None:
        return None
    run = RunDocuments(out_dir, index)
    names = list(index.mix.streams)
    stream_of = np.array([names.index(s.stream) for s in run.sources], dtype=np.int64)
    out = []
    for k, shard in enumerate(index.shards):
        records = run.shard(k).records
        streams = stream_of[records["source"]]
        tokens = np.zeros(len(names), dtype=np.int64)
        np.add.at(tokens, streams, records["tokens"].astype(np.int64))
        tokens[streams[0]] -= k > 0
        if tokens.tolist() != [shard.tokens_by_stream[n] for n in names]:
            raise TokmixError(f"{shard.file}: its provenance index gives its streams {tokens.tolist()} tokens, "
                              f"index.json {list(shard.tokens_by_stream.values())}")
        out.append({"tokens": dict(zip(names, tokens.tolist())),
                    "documents": dict(zip(names, np.bincount(streams, minlength=len(names)).tolist())),
                    "sources": len(np.unique(records["source"]))})
    return out


def _unit_records(layout: Layout, name: str) -> tuple[list[dict], np.ndarray] | None:
    """The stream's committed unit records (with their commit time) and the lengths of the documents it
    gave the run, when the intermediates were kept."""
    meta_path = layout.stream_meta(name)
    meta = read_json(meta_path, sealed=True)  # the run's records are checked like any state a command reads
    if meta is None:
        return None
    folder = layout.units(name)
    records = []
    for unit in meta["units"]:
        path = UnitFiles(folder, unit["name"]).record
        record = read_json(path, sealed=True)
        if record is None:
            raise TokmixError(f"{path}: missing, but {meta_path} lists it; run the same command again to remake it")
        record["committed_at"] = path.stat().st_mtime
        records.append(record)
    per_unit = [UnitFiles(folder, u["name"]).read_lengths() for u in meta["units"]]
    lengths = np.concatenate(per_unit or [np.empty(0, LENGTH_DTYPE)])
    return records, lengths[: meta["docs"]].astype(np.int64)


def gather(out_dir: str | os.PathLike, scan: bool | None = None) -> tuple[Index, dict[str, StreamFacts]]:
    """index.json and per-stream facts; `scan` forces (True) or skips (False) the pass over the shards,
    which by default runs only when the intermediates are gone."""
    layout = reader_layout(out_dir)
    index = read_index(layout.root)
    if not index or not index.shards:
        raise TokmixError(f"{layout.root}: no index.json with shards (not a finished tokmix run)")
    names = list(index.mix.streams)
    kept = {n: _unit_records(layout, n) for n in names}
    scanned = None
    if scan or (scan is None and any(v is None for v in kept.values())):
        scanned = scan_shards(layout.root, index, _byte_lengths(layout.root, index))
    facts = {}
    for n in names:
        domain = index.mix.domain_by_stream[n]
        if kept[n] is not None:
            records, lengths = kept[n]
            chars = sum(r["chars"] for r in records)
            facts[n] = StreamFacts(
                n, domain, lengths, "units", units=records, chars=chars, unit_tokens=sum(r["tokens"] for r in records)
            )
        elif scanned is not None:
            facts[n] = StreamFacts(n, domain, scanned["lengths"][n], "shards")
        else:  # --no-scan without intermediates: no document lengths
            facts[n] = StreamFacts(n, domain, np.empty(0, np.int64), "none")
        if scanned is not None:
            facts[n].text_bytes = scanned["text_bytes"][n] if scanned["text_bytes"] else None
            facts[n].tokens_in_shards = scanned["tokens"][n]
            if facts[n].tokens_in_shards != index.total.tokens_by_stream[n]:
                raise TokmixError(
                    f"stream {n}: the shards hold {facts[n].tokens_in_shards:,} of its tokens by the replayed "
                    f"interleave, index.json says {index.total.tokens_by_stream[n]:,}"
                )
    return index, facts


def _byte_lengths(out_dir: Path, index: Index) -> np.ndarray | None:
    from tokmix.inspect import run_tokenizer

    try:
        return run_tokenizer(out_dir, index).token_bytes()
    except TokmixError:
        return None  # no tokenizer: lengths and shares still, bytes per token from the holdouts only


# ---------------------------------------------------------------------------- plots
def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise TokmixError("the report needs matplotlib, a tokmix dependency: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    # zlib level 1: the default (6) costs more of the report's time than the few percent of bytes it saves
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", pil_kwargs={"compress_level": 1})
    fig.clf()
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _colors(names: list[str]) -> dict[str, tuple]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def _stack_legend(ax) -> None:
    """A stacked chart's legend, top entry first as in the bars."""
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")


def plot_shares(plt, index: Index) -> str:
    mix, total = index.mix, index.total
    names = list(mix.streams)
    domains = list(total.share_by_domain)
    fig, axes = plt.subplots(
        1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [max(len(names), 2), max(len(domains), 2)]}
    )
    for ax, labels, requested, realized, title in (
        (
            axes[0],
            names,
            [mix.target_share_by_stream[n] for n in names],
            [total.share_by_stream[n] for n in names],
            "per stream",
        ),
        (
            axes[1],
            domains,
            [sum(mix.target_share_by_stream[n] for n in names if mix.domain_by_stream[n] == d) for d in domains],
            [total.share_by_domain[d] for d in domains],
            "per domain",
        ),
    ):
        x = np.arange(len(labels))
        ax.bar(x - 0.2, requested, 0.4, label="requested", color="#bbbbbb")
        bars = ax.bar(x + 0.2, realized, 0.4, label="realized", color="#3b6ea5")
        for bar, r in zip(bars, realized):
            ax.annotate(
                f"{r:.2%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8
            )
        ax.set_xticks(x, labels, rotation=20 if len(labels) > 4 else 0)
        ax.set_ylabel("share of train tokens")
        ax.set_title(title)
        ax.legend(fontsize=8)
    return _png(fig)


def plot_shard_shares(plt, index: Index) -> str:
    names = list(index.mix.streams)
    colors = _colors(names)
    shards = index.shards
    fig, ax = plt.subplots(figsize=(min(2 + 0.5 * len(shards), 14), 3.6))
    x = np.arange(len(shards))
    bottom = np.zeros(len(shards))
    for n in names:
        share = np.array([s.tokens_by_stream[n] / max(sum(s.tokens_by_stream.values()), 1) for s in shards])
        ax.bar(x, share, 0.8, bottom=bottom, label=n, color=colors[n])
        bottom += share
    cum = 0.0
    for n in names[:-1]:  # the targets, as the stacked bars' ideal boundaries
        cum += index.mix.target_share_by_stream[n]
        ax.axhline(cum, color="black", lw=0.6, ls="--")
    ax.set_xticks(
        x, [s.file.removesuffix(".bin") for s in shards], rotation=45 if len(shards) > 6 else 0, fontsize=8
    )
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of the shard's tokens")
    ax.set_title("share per shard (dashed: requested)")
    _stack_legend(ax)
    return _png(fig)


def plot_doc_lengths(plt, facts: dict[str, StreamFacts]) -> str:
    colors = _colors(list(facts))
    all_lengths = np.concatenate([f.doc_lengths for f in facts.values()] or [np.ones(1)])
    top = max(int(all_lengths.max()) if len(all_lengths) else 2, 2)
    bins = np.logspace(0, np.log10(top) + 0.01, HIST_BINS)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for f in facts.values():
        if len(f.doc_lengths):
            ax.hist(
                f.doc_lengths,
                bins=bins,
                histtype="step",
                lw=1.6,
                color=colors[f.name],
                label=f"{f.name} (median {int(np.median(f.doc_lengths)):,})",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens per document (delimiters included)")
    ax.set_ylabel("documents")
    ax.set_title("document length per stream")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.text(
            0.5,
            0.5,
            "no document lengths (intermediates gone, shards not scanned)",
            ha="center",
            transform=ax.transAxes,
        )
    return _png(fig)


def bytes_per_token(index: Index, facts: dict[str, StreamFacts]) -> list[tuple[str, str, float]]:
    """(what, label, value) rows: text bytes (or characters) per token per stream, bytes per target per holdout."""
    rows = []
    for f in facts.values():
        if f.text_bytes is not None:
            rows.append(("stream", f.name, f.text_bytes / max(f.tokens_in_shards, 1)))
        elif f.chars is not None:
            rows.append(("stream (chars)", f.name, f.chars / max(f.unit_tokens, 1)))
    for domain, v in index.val.items():
        rows.append(("holdout", domain, v.bytes / max(v.targets, 1)))
    return rows


def plot_bytes_per_token(plt, rows: list[tuple[str, str, float]]) -> str:
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(rows) + 2), 3.4))
    palette = {"stream": "#3b6ea5", "stream (chars)": "#7a9cc6", "holdout": "#c46a2f"}
    x = np.arange(len(rows))
    bars = ax.bar(x, [r[2] for r in rows], 0.6, color=[palette[r[0]] for r in rows])
    for bar, r in zip(bars, rows):
        ax.annotate(
            f"{r[2]:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8
        )
    ax.set_xticks(x, [r[1] for r in rows], fontsize=8)
    ax.set_ylabel("bytes per token")
    ax.set_title("bytes per token (delimiters counted as tokens)")
    kinds = list(dict.fromkeys(r[0] for r in rows))
    names = {"stream": "stream: UTF-8 bytes", "stream (chars)": "stream: characters", "holdout": "holdout: bytes"}
    ax.legend(
        handles=[Patch(color=palette[k], label=names[k]) for k in kinds],
        fontsize=8,
        bbox_to_anchor=(1.01, 1),
        loc="upper left",
    )
    return _png(fig)


def plot_throughput(plt, index: Index, facts: dict[str, StreamFacts]) -> str:
    names = list(index.mix.streams)
    thr = index.throughput or {}
    with_units = [f for f in facts.values() if f.units]
    fig, axes = plt.subplots(1, 2 if with_units else 1, figsize=(12 if with_units else 6, 3.6), squeeze=False)
    ax = axes[0][0]
    x = np.arange(len(names))
    end_to_end = [thr.get("tok_s_end_to_end_by_stream", {}).get(n, 0) for n in names]
    capacity = [thr.get("tok_s_tokenizer_capacity_by_stream", {}).get(n, 0) for n in names]
    ax.bar(x - 0.2, end_to_end, 0.4, label="end to end", color="#3b6ea5")
    ax.bar(x + 0.2, capacity, 0.4, label="tokenizer capacity", color="#bbbbbb")
    ax.set_xticks(x, names, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("tokens / s")
    ax.set_title(f"throughput per stream ({thr.get('backend', '?')}, {thr.get('num_proc', '?')} workers)")
    ax.legend(fontsize=8)
    if with_units:
        ax = axes[0][1]
        colors = _colors(names)
        t0 = min(r["committed_at"] for f in with_units for r in f.units)
        for f in with_units:
            at = np.array([r["committed_at"] - t0 for r in f.units])
            rate = np.array([r["tokens"] / max(r["encode_seconds"], 1e-9) for r in f.units])
            ax.plot(at, rate, "o-", ms=4, color=colors[f.name], label=f.name)
        ax.set_yscale("log")
        ax.set_xlabel("seconds since the first unit was committed")
        ax.set_ylabel("tokens / encode second")
        ax.set_title("per unit: tokenizer throughput over the run")
        ax.legend(fontsize=8)
    return _png(fig)


def plot_holdouts(plt, index: Index) -> str:
    val = index.val
    names = list(index.mix.streams)
    colors = _colors(names)
    domains = list(val)
    fig, ax = plt.subplots(figsize=(max(4, 1.3 * len(domains) + 3), 3.4))
    x = np.arange(len(domains))
    bottom = np.zeros(len(domains))
    for n in names:
        counts = np.array([val[d].tokens_by_stream.get(n, 0) for d in domains], dtype=float)
        if counts.any():
            ax.bar(x, counts, 0.6, bottom=bottom, color=colors[n], label=n)
            bottom += counts
    for i, d in enumerate(domains):
        ax.plot([i - 0.3, i + 0.3], [val[d].eval_targets] * 2, color="black", lw=1.2)
    ax.set_xticks(x, domains)
    ax.set_ylabel("tokens")
    ax.set_title("holdout tokens per stream (black line: eval windows x seq_len)")
    _stack_legend(ax)
    return _png(fig)


# ---------------------------------------------------------------------------- HTML
CSS = """
body { font: 15px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222; max-width: 1180px;
       margin: 2em auto; padding: 0 1.5em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { padding: 0.25em 0.8em; border-bottom: 1px solid #e4e4e4; text-align: right; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
tr.total td { font-weight: bold; border-top: 1px solid #999; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
code { background: #f4f4f4; padding: 0 0.3em; border-radius: 3px; }
.ok { color: #2a7a2a; } .warn { color: #b36b00; } .note { color: #666; font-size: 0.9em; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _table(
    head: list[str], rows: list[list], left: int = 1, total: list | None = None, left_cols: tuple[int, ...] = ()
) -> str:
    """An HTML table; the first `left` columns (and any in `left_cols`) are left-aligned, the rest numbers."""

    def cells(row: list, tag: str) -> str:
        return "".join(
            f'<{tag} class="l">{_e(v)}</{tag}>' if i < left or i in left_cols else f"<{tag}>{_e(v)}</{tag}>"
            for i, v in enumerate(row)
        )

    body = "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows)
    if total:
        body += f'<tr class="total">{cells(total, "td")}</tr>'
    return f"<table><thead><tr>{cells(head, 'th')}</tr></thead><tbody>{body}</tbody></table>"


def _facts_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f'<tr><th class="l">{_e(k)}</th><td class="l">{_e(v)}</td></tr>' for k, v in rows)
    return f"<table><tbody>{body}</tbody></table>"


def _img(png: str, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{png}">'


def _blocks_line(index: Index) -> str:
    """The run's blocks and their length: a schedule's phases each with their own (a long-context phase)."""
    if not index.phases:
        return f"{index.blocks:,} blocks of {index.seq_len} tokens"
    each = ", ".join(f"{p.name} {p.block_count:,} of {p.seq_len}" for p in index.phases)
    return f"{index.blocks:,} blocks ({each} tokens)"


def _steps_line(index: Index) -> str:
    """Steps, sequences per step and margin: a schedule's phases each with their own (the table below)."""
    if not index.phases:
        return f"{index.train_steps:,} x {index.seqs_per_step} sequences, margin {index.margin_steps} steps"
    each = ", ".join(f"{p.name} {p.step_count:,} x {p.seqs_per_step}" for p in index.phases)
    return f"{index.train_steps:,} in {len(index.phases)} phases ({each} sequences), each with its own margin"


def _schedule_table(index: Index) -> str:
    """The schedule's phases: steps, sequences per step, seq_len, margin, and requested against realized share of
    every stream."""
    if not index.phases:
        return ""
    names = index.stream_names
    rows = [[p.name, f"{p.steps[0]:,}-{p.steps[1]:,}", str(p.ramp_steps), str(p.seqs_per_step), str(p.seq_len),
             str(p.margin_steps),
             *(f"{p.requested_share_by_stream[n]:.2%} / {p.share_by_stream[n]:.2%}" for n in names)]
            for p in index.phases]
    head = ["phase", "steps", "ramp", "sequences", "seq_len", "margin", *(f"{n} requested / realized" for n in names)]
    return _table(head, rows, left=1)


def _mix_rows(index: Index) -> list[list]:
    mix, total = index.mix, index.total
    rows = []
    for n, meta in mix.streams.items():
        target, real = mix.target_share_by_stream[n], total.share_by_stream[n]
        rows.append(
            [
                n,
                mix.domain_by_stream[n],
                f"{target:.2%}",
                f"{real:.2%}",
                f"{real - target:+.2%}",
                f"{total.tokens_by_stream[n]:,}",
                f"{mix.documents_used[n]:,}",
                passes(index, n),
                f"{meta.dropped_holdout_duplicates:,}",
            ]
        )
    return rows


def _length_rows(facts: dict[str, StreamFacts]) -> list[list]:
    rows = []
    for f in facts.values():
        x = f.doc_lengths
        if len(x):
            q = np.percentile(x, [10, 50, 90, 99])
            rows.append(
                [f.name, f.lengths_from, f"{len(x):,}", f"{x.mean():,.0f}", *(f"{v:,.0f}" for v in q), f"{x.max():,}"]
            )
        else:
            rows.append([f.name, f.lengths_from, "0", "", "", "", "", "", ""])
    return rows


def render_html(out_dir: Path, index: Index, facts: dict[str, StreamFacts], plt) -> str:
    layout = reader_layout(out_dir)
    where = out_dir if storage(out_dir).remote else out_dir.resolve()
    done = layout.done
    timings = layout.timings
    validated = (read_json(done, remedy=REMAKE_REMEDY) or {}).get("fingerprint") == index.recipe_fingerprint
    bpt = bytes_per_token(index, facts)
    sources = {f.lengths_from for f in facts.values()}
    lengths_note = (
        f"from the units' .{LENGTHS} files (intermediates kept)"
        if sources == {"units"}
        else "from the shards (delimiter positions; streams by replaying the seeded interleave); the run's last, cut "
        "document is left out"
        if sources == {"shards"}
        else "not available: the intermediates are gone and the shards were not scanned (--no-scan)"
    )
    parts = [
        "<!doctype html>",
        f'<html lang="en"><head><meta charset="utf-8">{REPORT_MARK}',
        f"<title>tokmix report: {_e(out_dir)}</title><style>{CSS}</style></head><body>",
        f"<h1>tokmix report: {_e(out_dir.name or out_dir)}</h1>",
        f'<p class="sub">{_e(where)} &middot; written {_e(time.strftime("%Y-%m-%d %H:%M:%S"))}</p>',
        _facts_table(
            [
                ("recipe fingerprint", index.recipe_fingerprint or ""),
                ("validated", "yes" if validated else "no (done.json missing or from another recipe)"),
                ("tokenizer", f"{index.tokenizer} ({index.vocab_size:,} ids, {index.dtype})"),
                ("train", f"{_blocks_line(index)} = {index.total.tokens:,} tokens in {len(index.shards)} shard(s)"),
                ("steps", _steps_line(index)),
                ("seed", index.seed),
                ("holdouts", ", ".join(f"{d} {v.tokens:,} tokens" for d, v in index.val.items())),
            ]
        ),
        "<h2>Mixture: requested vs realized</h2>",
        _img(plot_shares(plt, index), "requested vs realized share per stream and per domain"),
        _table(
            [
                "stream",
                "domain",
                "requested",
                "realized",
                "difference",
                "tokens",
                "documents",
                "passes",
                "holdout copies dropped",
            ],
            _mix_rows(index),
            left=2,
            total=["total", "", "100.00%", "100.00%", "", f"{index.total.tokens:,}", "", "", ""],
        ),
        "<h2>Share per shard</h2>",
        _img(plot_shard_shares(plt, index), "share of each stream in each shard"),
        *(["<h2>Share per step</h2>", _schedule_table(index),
           _img(plot_step_shares(plt, out_dir, index), "realized vs target share of each stream per step")]
          if index.provenance is not None else []),
        *_shard_tables(out_dir, index, list(facts)),
        "<h2>Document lengths</h2>",
        f'<p class="note">Tokens per document, {_e(lengths_note)}.</p>',
        _img(plot_doc_lengths(plt, facts), "document length distribution per stream"),
        _table(
            ["stream", "from", "documents", "mean", "p10", "median", "p90", "p99", "max"], _length_rows(facts), left=2
        ),
        "<h2>Bytes per token</h2>",
        '<p class="note">Streams: UTF-8 text bytes over tokens in the train shards (or characters over tokens in '
        "the unit records when the shards were not scanned); holdouts: bytes over targets, as index.json records "
        "them for bits per byte.</p>",
        _img(plot_bytes_per_token(plt, bpt), "bytes per token per stream and holdout"),
        _table(["what", "name", "bytes per token"], [[w, n, f"{v:.3f}"] for w, n, v in bpt], left=2),
        "<h2>Throughput</h2>",
        _img(plot_throughput(plt, index, facts), "throughput per stream"),
        _throughput_table(index, timings),
        "<h2>Holdouts</h2>",
        _img(plot_holdouts(plt, index), "holdout sizes and eval windows"),
        _table(
            [
                "domain",
                "file",
                "tokens",
                "documents",
                "bytes",
                "bytes/token",
                "eval windows",
                "eval targets",
                "eval bytes",
                "source files",
            ],
            [
                [
                    d,
                    v.file,
                    f"{v.tokens:,}",
                    f"{v.docs:,}",
                    f"{v.bytes:,}",
                    f"{v.bytes / max(v.targets, 1):.3f}",
                    f"{v.eval_windows:,}",
                    f"{v.eval_targets:,}",
                    f"{v.eval_bytes:,}",
                    ", ".join(v.source_files),
                ]
                for d, v in index.val.items()
            ],
            left=2,
            left_cols=(9,),
        ),
        *_contamination_tables(out_dir, index),
        "</body></html>",
    ]
    return "\n".join(parts)


TOP_SOURCES = 10  # training files listed in the contamination section, by documents taken


def _contamination_tables(out_dir: Path, index: Index) -> list[str]:
    """Decontamination: the holdout stage's exact copies per stream and, with [decontaminate], the benchmark
    items found per benchmark and stream and the training files most of them came from (contamination.json)."""
    holdout = index.decontamination or {}
    parts = ["<h2>Decontamination</h2>",
             f'<p class="note">Holdout copies (exact text): {"on" if holdout.get("enabled") else "off"}.</p>',
             _table(["stream", "holdout copies dropped"],
                    [[n, f"{v:,}"] for n, v in holdout.get("dropped_by_stream", {}).items()])]
    entry = index.benchmark_decontamination
    if entry is None:
        return parts
    taken = "dropped" if entry["action"] == "drop" else "counted (kept)"
    parts.append(f'<p class="note">Benchmarks: documents sharing at least {entry["min_matches"]} '
                 f'{entry["ngram"]}-gram(s) with an item ({entry["normalization"]}), {taken}: '
                 f'{entry["documents"]:,} documents, {entry["tokens"]:,} tokens.</p>')
    rows = []
    for name, bench in entry["benchmarks"].items():
        rows.append([name, "all", f"{bench['items']:,}", f"{bench['ngrams']:,}", f"{bench['items_found']:,}",
                     f"{sum(v['documents'] for v in bench['by_stream'].values()):,}",
                     f"{sum(v['tokens'] for v in bench['by_stream'].values()):,}"])
        rows += [[name, stream, "", "", f"{v['items']:,}", f"{v['documents']:,}", f"{v['tokens']:,}"]
                 for stream, v in bench["by_stream"].items()]
    parts.append(_table(["benchmark", "stream", "items", "n-grams", "items found", "documents", "tokens"], rows,
                        left=2))
    try:
        record = contamination_record(out_dir, entry)  # whole, and the file index.json names
    except TokmixError as e:  # damaged, missing, or not the file index.json names
        return [*parts, f'<p class="note">{_e(e)}</p>']
    sources: dict[tuple[str, str], set] = {}
    for item in record["items"]:
        for place in item["places"]:
            sources.setdefault((place["stream"], place["file"]), set()).add((item["benchmark"], item["index"]))
    top = sorted(sources.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:TOP_SOURCES]
    parts.append(_table(["stream", "file", "items found in it"], [[s, f, f"{len(v):,}"] for (s, f), v in top],
                        left=2))
    return parts


def _shard_tables(out_dir: Path, index: dict, names: list[str]) -> list[str]:
    """The shards' table: each stream's share of its tokens and, from the provenance index, its documents and
    the source files (by pass) they came from."""
    composition = shard_composition(out_dir, index)
    rows = []
    for k, s in enumerate(index.shards):
        total = max(sum(s.tokens_by_stream.values()), 1)
        shares = [f"{s.tokens_by_stream[n] / total:.2%}" for n in names]
        if composition is not None:
            docs = composition[k]["documents"]
            shares = [f"{share} ({docs[n]:,} docs)" for share, n in zip(shares, names)]
            extra = [f"{sum(docs.values()):,}", f"{composition[k]['sources']:,}"]
        else:
            extra = []
        rows.append([s.file, f"{s.blocks:,}", f"{s.tokens:,}", *extra, *shares,
                     (s.checksum or "")[:16] + "…"])
    head = ["shard", "blocks", "tokens", *(["documents", "sources"] if composition is not None else []), *names,
            "sha256"]
    note = ('<p class="note">Documents and sources (files, by pass) from the provenance index; a document cut by a '
            "shard's end counts in both shards.</p>" if composition is not None else "")
    return [_table(head, rows), note]


def _throughput_table(index: Index, timings: Path) -> str:
    thr = index.throughput or {}
    rows = [
        [
            n,
            f"{thr['tok_s_end_to_end_by_stream'][n]:,}",
            f"{thr['tok_s_tokenizer_capacity_by_stream'][n]:,}",
            f"{meta.seconds_last_run:,.1f}",
        ]
        for n, meta in index.mix.streams.items()
        if n in thr.get("tok_s_end_to_end_by_stream", {})
    ]
    html_ = _table(["stream", "tokens/s end to end", "tokenizer capacity (tokens/s)", "seconds (last run)"], rows)
    if (seconds := read_json(timings, remedy=REMAKE_REMEDY)):
        html_ += _table(
            ["stage", "seconds"],
            [[k, f"{v:,.1f}"] for k, v in seconds.items()],
            total=["total", f"{sum(seconds.values()):,.1f}"],
        )
    return html_


def write_report(out_dir: str | os.PathLike, path: str | os.PathLike, *, scan: bool | None = None) -> Path:
    """Write the HTML report of the run in `out_dir` to `path`; returns the path."""
    plt = _pyplot()
    out_dir, path = as_path(out_dir), Path(path)
    replace = _report_target(out_dir, path)  # before the work: a target refused costs nothing
    index, facts = gather(out_dir, scan)
    page = render_html(out_dir, index, facts, plt)
    fault_point("report:before-write")
    path.parent.mkdir(parents=True, exist_ok=True)
    publish_new(path, page.encode("utf-8"), replace)
    return path


def _report_target(out_dir: Path, path: Path) -> bool:
    """Where a report may go: never one of the run's own files (index.json, a shard, its state), never over a
    file that is not an earlier report of tokmix's (its first bytes say so). Returns whether it replaces one."""
    if not storage(out_dir).remote and Ownership(Layout(out_dir)).owns(path):
        raise TokmixError(f"{path}: one of the run's own files or folders; write the report elsewhere (default: "
                          f"{out_dir / 'report.html'})")
    if not (path.exists() or path.is_symlink()):
        return False
    try:
        head = read_regular(path, follow=False)[:4096]
    except NotAFile as e:
        raise TokmixError(f"{path}: exists and is {e.kind}; the report is never written over it") from None
    if REPORT_MARK.encode() not in head:
        raise TokmixError(f"{path}: exists and is not a report tokmix wrote; the report is never written over it: "
                          "choose another --html")
    return True
