"""index.json, the manifest a training loop and an evaluator read: its schema, filled from what the stages
returned (holdout entries, stream records, shard records). docs/format.md documents every key."""

from __future__ import annotations

from tokmix import __version__
from tokmix.backends import ORACLE_LIBRARY
from tokmix.format.records import (
    FORMAT_VERSION,
    HoldoutEntry,
    Index,
    Mix,
    PhaseEntry,
    Provenance,
    ShardRecord,
    StreamSummary,
    Total,
)
from tokmix.shards import EXPECTED_NAME, STATE_DIR, block_tokens
from tokmix.stages import Context
from tokmix.stages.holdout import holdout_cache
from tokmix.stages.passes import passes_used

# what a stream's record holds for the other stages, not for index.json's summary of it (the cache's has its key)
NOT_IN_SUMMARY = ("units", "last_unit_docs", "units_from_cache", "tokens_from_cache", "tokens_tokenized")


def build_index(ctx: Context, val: dict, metas: dict[str, dict], shards: list[dict], used: dict[str, int],
                provenance: dict | None = None, balance: dict | None = None,
                benchmarks: dict | None = None) -> Index:
    """index.json as the reference writes it, plus what tokmix adds (its format version, the tokenizer's checksum,
    tokmix's version, vocab size, shard checksums, decontamination, provenance): from the holdout stage's `val`
    entries, the streams stage's records (`metas`), the assemble stage's shard records and documents `used` of
    each stream."""
    recipe = ctx.recipe
    names = list(recipe.streams)
    # the oracle's library: the versions that made most units, and those of a resume under others, if any
    oracle_library = ORACLE_LIBRARY[ctx.oracle]
    now = {k: v for k, v in ctx.libraries.items() if k == oracle_library}
    start = {k: v for k, v in (ctx.libraries_at_start or ctx.libraries).items() if k == oracle_library}
    by_stream = {n: sum(s["tokens_by_stream"][n] for s in shards) for n in names}
    total = sum(by_stream.values())
    by_domain = {d: sum(by_stream[n] for n in recipe.streams_of(d)) for d in recipe.domains}
    summary = {n: {k: v for k, v in metas[n].items() if k not in NOT_IN_SUMMARY} for n in names}
    for n in names:  # what the benchmarks took from the stream; where, in contamination.json
        if "benchmark_contamination" in metas[n]:
            summary[n]["benchmark_contamination"] = {k: v for k, v in metas[n]["benchmark_contamination"].items()
                                                     if k != "places"}
    return Index(
        format_version=FORMAT_VERSION,
        tokenizer=ctx.tokenizer_path,
        tokenizer_sha256=ctx.tokenizer_sha256,
        tokenizer_oracle=ctx.oracle,
        tokenizer_libraries=start,
        tokenizer_libraries_resumed=now if now != start else None,
        tokenizer_ids_sha256=ctx.oracle_ids_sha256,
        tokmix_version=__version__,
        vocab_size=ctx.vocab_size,
        no_token_ids=ctx.no_token_ids,
        dtype=ctx.dtype.name,
        seq_len=recipe.layout.seq_len,
        block=block_tokens(recipe.layout.seq_len),
        stride=recipe.layout.seq_len,
        eot_id=ctx.delimiters.marker,  # the reference's key: the id that shows where documents meet
        delimiters=ctx.delimiters.to_index(),
        delimiter_tokens={"prefix": recipe.tokenizer.doc_prefix, "suffix": recipe.tokenizer.doc_suffix},
        seed=recipe.seed,
        recipe_fingerprint=recipe.fingerprint(),
        mix=Mix(
            method="each stream tokenized to its token budget, documents interleaved in a seeded random order "
            "(per-document sampling at fixed proportions)" if recipe.layout.interleave != "balanced" else
            "each stream tokenized to its token budget, documents interleaved so that every stream stays within "
            "one document of its target share at every document boundary (seeded ties)",
            target_share_by_stream={n: recipe.share(n) for n in recipe.streams},
            domain_by_stream={n: s.domain for n, s in recipe.streams.items()},
            streams={n: StreamSummary.from_json(summary[n]) for n in names},
            documents_used=used,
            # epochs of each stream's train documents in the shards: its tokens there over one pass's tokens
            passes_by_stream={n: round(passes_used(metas[n], by_stream[n]), 4) for n in names},
            interleave=recipe.layout.interleave,
            # the balanced order's realized deviation from each stream's target (docs/format.md)
            balance=balance_summary(balance) if balance is not None else None,
        ),
        blocks=recipe.blocks,
        train_steps=recipe.layout.steps,
        seqs_per_step=recipe.layout.seqs_per_step,
        margin_steps=recipe.layout.margin_steps if recipe.blocks == recipe.default_blocks else 0,
        shards=[ShardRecord.from_json(s) for s in with_phases(recipe, shards)],
        phases=phases_entry(recipe, balance) if recipe.schedule and balance is not None else None,
        total=Total(
            tokens=total,
            tokens_by_stream=by_stream,
            tokens_by_domain=by_domain,
            share_by_stream={n: by_stream[n] / total for n in names},
            share_by_domain={d: by_domain[d] / total for d in recipe.domains},
        ),
        decontamination={
            "enabled": recipe.holdout.decontaminate,
            "dropped_by_stream": {n: metas[n]["dropped_holdout_duplicates"] for n in names},
        },
        throughput={
            "tok_s_end_to_end_by_stream": {n: metas[n]["tok_s_end_to_end"] for n in names},
            "tok_s_tokenizer_capacity_by_stream": {n: metas[n]["tok_s_tokenizer_capacity"] for n in names},
            "num_proc": ctx.workers,
            "backend": ctx.backend,
            "backend_libraries": ctx.libraries,  # the oracle's and the backend's: it may change, the output not
        },
        val={d: e if isinstance(e, HoldoutEntry) else HoldoutEntry.from_json(e) for d, e in val.items()},
        cache=_cache_entry(ctx, metas) if ctx.cache is not None else None,
        provenance=Provenance.from_json(provenance) if provenance is not None else None,
        benchmark_decontamination=benchmarks,
        derived_digests=f"{STATE_DIR}/{EXPECTED_NAME}",  # what validate checks the shards against (on a store too)
    )


def balance_summary(balance: dict) -> dict:
    """mix.balance: the proven bound (the longest document) and each stream's worst deviation from its target
    at a document boundary, above it (more tokens than its target) and below."""
    return {"bound_tokens": balance["bound_tokens"], "over_by_stream": balance["over_by_stream"],
            "under_by_stream": balance["under_by_stream"]}


def with_phases(recipe, shards: list[dict]) -> list[dict]:
    """The shard records, each with its phase and seq_len when the recipe has a schedule (a shard holds one
    phase's blocks)."""
    if not recipe.schedule:
        return shards
    out, first = [], 0
    phases = recipe.phases
    for shard in shards:
        phase = next(p for p in phases if p.first_block <= first < p.first_block + p.blocks)
        out.append({**shard, "phase": phase.name, "seq_len": phase.seq_len})
        first += shard["blocks"]
    return out


def phases_entry(recipe, balance: dict) -> list[PhaseEntry]:
    """index.json's `phases`: each phase's steps, blocks, tokens and shards (ranges [first, end)), its layout,
    the shares it asks for and every stream's target and realized tokens in it (a document cut by a phase's
    end counts its tokens on both sides; the run's last token is the last phase's)."""
    names, phases = list(recipe.streams), recipe.phases
    marks = [[0] * len(names), *balance["tokens_at_marks"]]
    out, shard = [], 0
    blocks = recipe.shard_blocks
    for i, phase in enumerate(phases):
        last = i == len(phases) - 1
        target = [t + (s if last else 0) for t, s in zip(phase.integral(), phase.shares)]
        realized = [b - a for a, b in zip(marks[i], marks[i + 1])]
        tokens = phase.tokens + last
        first_shard = shard
        while shard < len(blocks) and sum(blocks[: shard + 1]) <= phase.first_block + phase.blocks:
            shard += 1
        out.append(PhaseEntry(
            name=phase.name,
            steps=[phase.first_step, phase.first_step + phase.steps],
            margin_steps=phase.margin_steps,
            ramp_steps=phase.ramp_steps,
            seq_len=phase.seq_len,
            seqs_per_step=phase.seqs_per_step,
            blocks=[phase.first_block, phase.first_block + phase.blocks],
            tokens=[phase.first_token, phase.first_token + tokens],
            shards=[first_shard, shard],
            requested_share_by_stream=dict(zip(names, phase.shares)),
            target_tokens_by_stream={n: round(t, 1) for n, t in zip(names, target)},
            tokens_by_stream=dict(zip(names, realized)),
            share_by_stream={n: r / tokens for n, r in zip(names, realized)},
        ))
    return out


def _cache_entry(ctx: Context, metas: dict[str, dict]) -> dict:
    """What the streams took from the token cache (tokmix.cache): units and their tokens, per stream and in all;
    and what the holdouts' reads took from it (holdout_cache)."""
    keys = ("units_from_cache", "tokens_from_cache", "tokens_tokenized")
    by_stream = {n: {"units": len(m["units"]), **{k: m.get(k, 0) for k in keys}} for n, m in metas.items()}
    return {"location": ctx.cache, "units": sum(s["units"] for s in by_stream.values()),
            **{k: sum(s[k] for s in by_stream.values()) for k in keys}, "by_stream": by_stream,
            "holdouts": holdout_cache(ctx)}
