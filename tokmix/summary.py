"""Rich tables that show what a run produced, from index.json: requested vs realized share per stream and
domain, tokens, documents, shards, holdouts, and time per stage."""

from __future__ import annotations

from rich.table import Table

from tokmix.format.records import Index


def _tokens(n: float) -> str:
    return f"{n / 1e9:,.2f}B" if n >= 1e9 else f"{n / 1e6:,.2f}M" if n >= 1e6 else f"{n:,.0f}"


def passes(index: Index, name: str) -> str:
    """Passes the shards make over a stream's train documents: '1', or e.g. '2.25' for a repeated stream."""
    n = (index.mix.passes_by_stream or {}).get(name, 1)
    return f"{n:g}" if n == int(n) else f"{n:.2f}"


def mix_table(index: Index) -> Table:
    total = index.total
    mix = index.mix
    table = Table(title=f"mix: {index.blocks:,} blocks of {index.seq_len} tokens, "
                        f"{len(index.shards)} shard(s), {index.dtype}", title_justify="left")
    for col in ("stream", "domain", "requested", "realized", "tokens", "documents", "passes",
                "holdout copies dropped", "tok/s"):
        table.add_column(col, justify="left" if col in ("stream", "domain") else "right")
    domains = {}
    for name, meta in mix.streams.items():
        domain = mix.domain_by_stream[name]
        domains.setdefault(domain, []).append(name)
        table.add_row(
            name, domain, f"{mix.target_share_by_stream[name]:.2%}", f"{total.share_by_stream[name]:.2%}",
            _tokens(total.tokens_by_stream[name]), f"{mix.documents_used[name]:,}", passes(index, name),
            f"{meta.dropped_holdout_duplicates:,}", f"{meta.tok_s_end_to_end:,}",
        )
    table.add_section()
    for domain, names in domains.items():
        requested = sum(mix.target_share_by_stream[n] for n in names)
        table.add_row("", domain, f"{requested:.2%}", f"{total.share_by_domain.get(domain, 0):.2%}",
                      _tokens(total.tokens_by_domain.get(domain, 0)), "", "", "", "")
    table.add_section()
    table.add_row("total", "", "100.00%", "100.00%", _tokens(total.tokens), "", "", "", "")
    return table


def holdout_table(index: Index) -> Table:
    table = Table(title="holdouts", title_justify="left")
    for col in ("domain", "file", "tokens", "docs", "bytes/token", "eval windows", "eval bytes"):
        table.add_column(col, justify="left" if col in ("domain", "file") else "right")
    for domain, v in index.val.items():
        table.add_row(domain, v.file, f"{v.tokens:,}", f"{v.docs:,}", f"{v.bytes / v.targets:.3f}",
                      f"{v.eval_windows:,}", f"{v.eval_bytes:,}")
    return table


def timing_table(seconds: dict[str, float], tokens: int) -> Table:
    table = Table(title="time per stage", title_justify="left")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    for stage, s in seconds.items():
        table.add_row(stage, f"{s:,.1f}")
    wall = sum(seconds.values())
    table.add_section()
    table.add_row("total", f"{wall:,.1f}")
    table.add_row("train tokens/s", f"{tokens / max(wall, 1e-9):,.0f}")
    return table
