"""Look inside a finished run: the summary tables of index.json (mix, holdouts, shards with checksums) and one
block of a train shard (or one eval window of a holdout) decoded back to text, with every document delimiter (the
recipe's doc_prefix and doc_suffix tokens; the reference's <|endoftext|>) shown as a visible marker."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tokmix.errors import TokmixError
from tokmix.format.records import Index
from tokmix.provenance import Source
from tokmix.shards import as_path, block_tokens, read_index
from tokmix.summary import holdout_table, mix_table
from tokmix.tokens import Delimiters, read_array
from tokmix.trace import contamination_record

DOC_MARKER = "⟦doc⟧"  # stands for the token that marks where documents meet (the reference's <|endoftext|>)


def _index(out_dir: str | os.PathLike) -> Index:
    index = read_index(out_dir)
    if not index or not index.shards:
        raise TokmixError(f"{out_dir}: no index.json with shards (not a finished tokmix run)")
    return index


def shards_table(index: Index) -> Table:
    table = Table(title="shards", title_justify="left")
    for col in ("file", "blocks", "first block", "tokens", "sha256"):
        table.add_column(col, justify="left" if col in ("file", "sha256") else "right")
    first = 0
    for shard in index.shards:
        table.add_row(
            shard.file, f"{shard.blocks:,}", f"{first:,}", f"{shard.tokens:,}", shard.checksum or ""
        )
        first += shard.blocks
    return table


def summary(out_dir: str | os.PathLike) -> Group:
    """The run's tables: the mix (requested vs realized shares), the holdouts, the shards with checksums, and
    what benchmark decontamination took, per benchmark and stream."""
    index = _index(out_dir)
    tables = [mix_table(index), holdout_table(index), shards_table(index)]
    if index.benchmark_decontamination is not None:
        tables.append(benchmarks_table(index))
    return Group(*tables)


def benchmarks_table(index: Index) -> Table:
    entry = index.benchmark_decontamination
    taken = "dropped" if entry["action"] == "drop" else "counted"
    table = Table(title=f"benchmark decontamination ({entry['ngram']}-grams, {entry['normalization']}; "
                  f"tokmix inspect --contamination lists the places)", title_justify="left")
    for col in ("benchmark", "stream", "items", "items found", f"documents {taken}", f"tokens {taken}"):
        table.add_column(col, justify="left" if col in ("benchmark", "stream") else "right")
    for name, bench in entry["benchmarks"].items():
        table.add_row(name, "", f"{bench['items']:,}", f"{bench['items_found']:,}", "", "")
        for stream, v in bench["by_stream"].items():
            table.add_row("", stream, "", f"{v['items']:,}", f"{v['documents']:,}", f"{v['tokens']:,}")
    return table


def contamination(out_dir: str | os.PathLike) -> Table:
    """Every benchmark item found in the training documents, and each place that matched it: why a document
    of the sources is not in the shards (action "drop") or was counted ("report")."""
    index = _index(out_dir)
    entry = index.benchmark_decontamination
    if entry is None:
        raise TokmixError(f"{out_dir}: the run has no [decontaminate] (index.json has no benchmark_decontamination)")
    record = contamination_record(as_path(out_dir), entry)  # whole, and the file index.json names
    what = "dropped: not in the shards" if entry["action"] == "drop" else "kept, counted"
    table = Table(title=f"contaminated items ({what})", title_justify="left")
    for col in ("benchmark", "item", "id", "stream", "document", "tokens"):
        table.add_column(col, justify="right" if col in ("item", "tokens") else "left")
    for item in record["items"]:
        for place in item["places"]:
            where = Source(place["stream"], 1, place["kind"], place["file"]).where(place["place"])
            table.add_row(item["benchmark"], str(item["index"]), item["id"], place["stream"], where,
                          f"{place['tokens']:,}")
    return table


# ---------------------------------------------------------------------------- decoding
@dataclass(frozen=True)
class Special:
    """A delimiter other than the marker (a doc_prefix after the first, a doc_suffix before the last), by its name:
    shown as ⟦name⟧, so that it cannot be taken for the same name written in a document's text."""

    name: str

    def __str__(self) -> str:
        return f"⟦{self.name}⟧"


@dataclass
class BlockView:
    """One block (or eval window) of seq_len + 1 tokens, decoded: `pieces` alternate document text and delimiters
    (None stands for the marker, the delimiter where documents meet; a Special for each other delimiter, e.g.
    ⟦</s>⟧), `text` is their concatenation with DOC_MARKER for each marker."""

    file: str
    title: str
    start: int  # token offset in the file
    tokens: np.ndarray
    pieces: list[str | None]
    delimiters: Delimiters
    documents: list | None = None  # a train block's documents from the provenance index (tokmix.trace)

    @property
    def text(self) -> str:
        return "".join(DOC_MARKER if p is None else str(p) for p in self.pieces)

    @property
    def documents_started(self) -> int:
        return int(np.count_nonzero(self.tokens == self.delimiters.marker))


def run_tokenizer(out_dir: Path, index: Index):
    """The run's tokenizer as its oracle reads it (tokmix.tokenizer.run_vocabulary)."""
    from tokmix.tokenizer import run_vocabulary

    return run_vocabulary(out_dir, index)  # read through run_tokenizer_path, refused if it changed


def decode_pieces(vocab, tokens: np.ndarray, delimiters: Delimiters,
                  names: dict[int, str] | None = None) -> list[str | Special | None]:
    """Texts between the delimiters, each decoded on its own (a document boundary never splits a character): None
    for the marker, a Special for every other delimiter (named by `names`, else by the tokenizer's decoding)."""
    pieces: list[str | Special | None] = []
    others = sorted(set(delimiters.prefix + delimiters.suffix) - {delimiters.marker})
    cuts = np.flatnonzero(np.isin(tokens, [delimiters.marker, *others]))
    start = 0
    for cut in [*cuts.tolist(), len(tokens)]:
        if cut > start:
            pieces.append(vocab.decode(tokens[start:cut].tolist()))
        if cut < len(tokens):
            token = int(tokens[cut])
            pieces.append(None if token == delimiters.marker else
                          Special((names or {}).get(token) or vocab.decode([token])))
        start = cut + 1
    return pieces


def delimiter_names(index: Index, delimiters: Delimiters) -> dict[int, str]:
    """Each delimiter id's name as the recipe gave it (index.json's delimiter_tokens; none in an index before it)."""
    given = index.delimiter_tokens or {}
    return {token: name for side in ("prefix", "suffix")
            for token, name in zip(getattr(delimiters, side), given.get(side) or []) if isinstance(name, str)}


def read_block(out_dir: str | os.PathLike, shard: int, block: int) -> BlockView:
    """Block `block` of train shard `shard`: tokens[block * seq_len : block * seq_len + seq_len + 1]."""
    out_dir, index = as_path(out_dir), _index(out_dir)
    shards = index.shards
    if not 0 <= shard < len(shards):
        raise TokmixError(f"shard {shard}: the run has shards 0..{len(shards) - 1}")
    entry = shards[shard]
    if not 0 <= block < entry.blocks:
        raise TokmixError(f"block {block}: {entry.file} has blocks 0..{entry.blocks - 1}")
    seq_len = int(entry.seq_len or index.seq_len)  # a long-context phase's shard: its own
    start = block * seq_len
    tokens = read_array(out_dir / entry.file, index.dtype, start, block_tokens(seq_len))  # the block only
    first = sum(s.blocks for s in shards[:shard]) + block
    title = f"{entry.file} block {block} (block {first:,} of the run): tokens {start:,} to {start + seq_len:,}"
    view = _view(out_dir, index, entry.file, title, start, tokens)
    if index.provenance is not None:
        from tokmix.trace import trace_blocks

        view.documents = trace_blocks(out_dir, [first])
    return view


def read_window(out_dir: str | os.PathLike, domain: str, window: int) -> BlockView:
    """Eval window `window` of holdout `domain`, laid out as the train blocks are."""
    out_dir, index = as_path(out_dir), _index(out_dir)
    val = index.val
    if domain not in val:
        raise TokmixError(f"holdout {domain!r}: the run has {', '.join(val) or 'none'}")
    entry, seq_len = val[domain], index.seq_len
    windows = (entry.tokens - 1) // seq_len
    if not 0 <= window < windows:
        raise TokmixError(f"window {window}: {entry.file} has windows 0..{windows - 1}")
    start = window * seq_len
    tokens = read_array(out_dir / entry.file, index.dtype, start, block_tokens(seq_len))
    title = f"{entry.file} window {window}: tokens {start:,} to {start + seq_len:,}"
    return _view(out_dir, index, entry.file, title, start, tokens)


def _view(out_dir: Path, index: Index, file: str, title: str, start: int, tokens: np.ndarray) -> BlockView:
    delimiters = Delimiters.from_index(index)
    pieces = decode_pieces(run_tokenizer(out_dir, index), tokens, delimiters, delimiter_names(index, delimiters))
    return BlockView(file, title, start, tokens, pieces, delimiters)


def render_block(view: BlockView) -> Panel:
    body = Text()
    for piece in view.pieces:
        if piece is None:
            body.append(DOC_MARKER, style="bold black on yellow")
        elif isinstance(piece, Special):
            body.append(str(piece), style="bold black on cyan")
        else:
            body.append(piece)
    meet = "start(s)" if view.delimiters.prefix else "end(s)"
    subtitle = f"{len(view.tokens):,} tokens, {view.documents_started} document {meet} marked {DOC_MARKER}"
    panel = Panel(body, title=view.title, title_align="left", subtitle=subtitle, subtitle_align="left")
    if not view.documents:
        return panel
    from tokmix.trace import render_trace

    table = render_trace(view.documents)[0]
    table.title = "its documents, in order (tokmix trace)"
    return Group(panel, table)
