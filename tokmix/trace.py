"""`tokmix trace`: the documents of a training step (per rank), of a block or of a token, from the run's
provenance index (tokmix.provenance): each one's stream, source file and row or line, text checksum and tokens in
the block; with `text`, each document read again from its source and checked against its checksum."""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tokmix.data import TrainBlocks
from tokmix.errors import TokmixError
from tokmix.provenance import RunDocuments, Source, file_documents, read_ids, sources_of, text_crc32
from tokmix.shards import INDEX_NAME, DamagedFile, file_checksum, read_json

PREVIEW_CHARS = 60  # of a document's text shown by --text


@dataclass
class TracedDocument:
    index: int  # its position in its shard's index
    stream: str
    pass_no: int
    kind: str
    file: str
    place: int  # row (parquet) or line (JSONL), 0-based
    where: str  # file:row N / file:line N+1
    crc32: int
    start: int  # its first token in the block (0: it began at the block's start or before)
    tokens: int  # its tokens in the block
    offset: int  # its tokens before the block (in this shard or an earlier one)
    shard_tokens: int  # its tokens in the shard
    text: str | None = None  # with --text: its text read again from the source
    text_ok: bool | None = None  # ... and whether its CRC-32 is the recorded one
    id: str | int | None = None  # its own id, with [streams.X] id_field (the run's .ids files)


@dataclass
class TracedBlock:
    block: int  # of the run
    shard: int
    file: str
    block_in_shard: int
    first_token: int  # in the shard: the block is its tokens [first_token, first_token + seq_len + 1)
    documents: list[TracedDocument]
    token: int | None = None  # --token: the traced token's offset in the block

    def to_json(self) -> dict:
        return asdict(self)


def step_blocks(out_dir: str | os.PathLike, step: int, rank: int = 0, world_size: int = 1,
                skipped: int = 0) -> list[int]:
    """The global blocks TrainBlocks gives `rank` of `world_size` at logical `step` after `skipped` skips (with
    phases: skips made in the step's phase)."""
    loader = TrainBlocks(out_dir, rank, world_size)
    loader.step = step
    loader.skip(skipped)
    return list(loader.step_blocks(step))


def step_phase(out_dir: str | os.PathLike, step: int) -> str | None:
    """What names the phase of logical `step` in its summary (None for a run without a schedule): its name, steps,
    seq_len and requested shares."""
    loader = TrainBlocks(out_dir)
    if not loader.phases:
        return None
    phase = loader.phases[loader.phase_number(step)]
    first, end = phase.steps
    return (f"phase {phase.name} (steps {first:,}-{end:,}, seq_len {phase.seq_len:,}, "
            f"shares {', '.join(f'{n} {v:g}' for n, v in phase.requested_share_by_stream.items())})")


def token_block(out_dir: str | os.PathLike, token: int) -> tuple[int, int]:
    """(block, offset in it) of token `token` of the run's train stream (each token once: a shard's overlap
    token is the previous shard's last)."""
    loader = TrainBlocks(out_dir)
    starts = np.concatenate([[0], np.cumsum(np.diff(loader.first_block) * np.array(loader.shard_seq_len))])
    total = int(starts[-1]) + 1
    if not 0 <= token < total:
        raise TokmixError(f"token {token:,} does not exist: the run's train stream has {total:,} tokens")
    k = min(int(np.searchsorted(starts, token, side="right")) - 1, len(loader.files) - 1)
    S = loader.shard_seq_len[k]
    block = min(int(loader.first_block[k]) + (token - int(starts[k])) // S, int(loader.first_block[k + 1]) - 1)
    return block, token - int(starts[k]) - (block - int(loader.first_block[k])) * S


def shard_block(out_dir: str | os.PathLike, shard: int, block: int) -> int:
    """The global block that is block `block` of train shard `shard`."""
    loader = TrainBlocks(out_dir)
    if not 0 <= shard < len(loader.files):
        raise TokmixError(f"shard {shard}: the run has shards 0..{len(loader.files) - 1}")
    blocks = int(loader.first_block[shard + 1] - loader.first_block[shard])
    if not 0 <= block < blocks:
        raise TokmixError(f"block {block}: {loader.files[shard].name} has blocks 0..{blocks - 1}")
    return int(loader.first_block[shard]) + block


def trace_blocks(out_dir: str | os.PathLike, blocks: list[int], text: bool = False,
                 mirrors: list[tuple[str, str]] | None = None) -> list[TracedBlock]:
    """Each block's documents, in the order of its tokens."""
    loader = TrainBlocks(out_dir)
    if loader.index.provenance is None:
        _needs_provenance(loader, "a block's documents")
    run = RunDocuments(loader.root, loader.index)
    traced = []
    for j in blocks:
        k, first = loader.locate(j)
        docs = run.shard(k)
        lo, hi = first, first + loader.shard_seq_len[k] + 1
        documents, ids = [], run.ids(k)
        for i in docs.overlapping(lo, hi).tolist():
            start, end = int(docs.ends[i]) - int(docs.records["tokens"][i]), int(docs.ends[i])
            record, source = docs.records[i], run.sources[int(docs.records[i]["source"])]
            documents.append(TracedDocument(
                i, source.stream, source.pass_no, source.kind, source.file, int(record["place"]),
                source.where(int(record["place"])), int(record["crc32"]), max(start - lo, 0),
                min(end, hi) - max(start, lo), max(lo - start, 0) + (docs.skip if i == 0 else 0),
                int(record["tokens"]), id=ids[i] if ids is not None else None))
        traced.append(TracedBlock(j, k, loader.files[k].name, j - int(loader.first_block[k]), first, documents))
    if text:
        fields = loader.index.provenance.text_fields
        for block in traced:
            for doc in block.documents:
                source = Source(doc.stream, doc.pass_no, doc.kind, doc.file)
                doc.text = read_document(source, doc.place, fields[doc.stream], mirrors or [])
                doc.text_ok = int(text_crc32([doc.text])[0]) == doc.crc32
    return traced


@dataclass
class FoundDocument:
    """A document found by its own id: where it is in a train shard (the blocks and steps it spans) or a holdout."""

    id: str | int
    file: str  # train_XXX.bin or val_<domain>.bin
    index: int  # its record in the file's provenance index
    stream: str
    where: str  # file:row N / file:line N+1
    first_token: int  # in the file
    tokens: int
    blocks: tuple[int, int] | None = None  # first and last global block holding its tokens (train shards)
    steps: tuple[int, int] | None = None  # ... and their steps

    def to_json(self) -> dict:
        return asdict(self)


def find_id(out_dir: str | os.PathLike, wanted: str) -> list[FoundDocument]:
    """Every document whose own id is `wanted` (a string id, or an integer id written in digits): a document
    repeated over passes is found once per copy, a holdout document in its holdout."""
    loader = TrainBlocks(out_dir)
    index = loader.index
    if index.provenance is None:
        _needs_provenance(loader, "where a document's id is")
    if not index.provenance.id_fields:
        raise TokmixError(f"{loader.root}: the run kept no documents' ids (give a stream id_field = \"...\" in "
                          "the recipe)")
    keys = {wanted} | ({int(wanted)} if wanted.lstrip("-").isdigit() else set())
    run, found = RunDocuments(loader.root, index), []
    entries = [(k, entry, run.sources) for k, entry in enumerate(index.shards)]
    entries += [(None, entry, sources_of(entry.provenance.sources)) for entry in index.val.values()]
    for k, entry, sources in entries:
        ids = read_ids(loader.root, entry) or []
        hits = [i for i, v in enumerate(ids) if v in keys and not isinstance(v, bool)]
        if not hits:
            continue
        docs = run.shard(k) if k is not None else file_documents(loader.root, entry, sources)
        found += [_found(loader, k, entry.file, docs, sources, i, ids[i]) for i in hits]
    if not found:
        entry = index.benchmark_decontamination
        dropped = entry["documents"] if entry is not None and entry["action"] == "drop" else 0
        why = (f" in the shards or holdouts; benchmark decontamination dropped {dropped:,} document(s), whose ids the "
               f"run does not keep: `tokmix inspect {loader.root} --contamination` lists them by file and row")
        raise TokmixError(f"{loader.root}: no document has the id {wanted!r}" + (why if dropped else ""))
    return found


@dataclass
class SourceDocument:
    """Where one document of a source file went: its copies in the train shards and holdouts (`found`) and the
    benchmark items that took it ([decontaminate]: `items`, each benchmark, index, id, stream, tokens)."""

    where: str  # file:row N / file:line N+1
    found: list[FoundDocument]
    items: list[dict]
    action: str | None = None  # the run's [decontaminate] action: "drop" (not in the shards) or "report"
    provenance: bool = True  # False: the run has no provenance index, `found` is empty whatever the shards hold

    def to_json(self) -> dict:
        return asdict(self)


def parse_where(where: str) -> tuple[str, int | None]:
    """`file:row N` (a parquet row, 0-based) or `file:line N` (a JSONL line, 1-based), as trace and inspect print
    them: (file, place 0-based); a bare file (a text file's one document): (file, None)."""
    head, _, tail = where.rpartition(":")
    kind, _, number = tail.partition(" ")
    if head and kind in ("row", "line") and number.isdigit() and (kind == "row" or int(number) > 0):
        return head, int(number) - (kind == "line")
    return where, None


def find_source(out_dir: str | os.PathLike, where: str) -> SourceDocument:
    """The document at `where` of a source file: each copy of it in a train shard or holdout, and the benchmark
    items that matched it (from contamination.json)."""
    wanted, place = parse_where(where)
    loader = TrainBlocks(out_dir)
    index = loader.index
    entry = index.benchmark_decontamination
    if index.provenance is None and entry is None:
        _needs_provenance(loader, "where a source document is")
    run, found, entries = None, [], []
    if index.provenance is not None:  # without it: only what contamination.json says of the document
        run = RunDocuments(loader.root, index)
        entries = [(k, entry, run.sources) for k, entry in enumerate(index.shards)]
        entries += [(None, entry, sources_of(entry.provenance.sources)) for entry in index.val.values()]
    record = contamination_record(loader.root, entry) if entry is not None else None
    files = {source.file for *_, sources in entries for source in sources}
    files |= {p["file"] for item in (record or {"items": []})["items"] for p in item["places"]}
    if wanted not in files and "://" not in wanted and os.path.abspath(wanted) in files:
        where = os.path.abspath(wanted) + where[len(wanted):]  # relative to the working directory, as trace prints it
        wanted = os.path.abspath(wanted)
    kinds = {source.kind for *_, sources in entries for source in sources if source.file == wanted}
    kinds |= {p["kind"] for item in (record or {"items": []})["items"] for p in item["places"] if p["file"] == wanted}
    said = where.rpartition(":")[2].partition(" ")[0] if place is not None else None
    for kind, word in (("parquet", "row"), ("jsonl", "line")):  # a document of it is `file:row N` / `file:line N`
        if kind in kinds and said != word:
            raise TokmixError(f"{where}: a {kind} file holds many documents, one a {word}: name one as "
                              f"{wanted}:{word} N")
    for k, entry, sources in entries:
        mine = [i for i, source in enumerate(sources) if source.file == wanted]
        if not mine:
            continue
        docs = run.shard(k) if k is not None else file_documents(loader.root, entry, sources)
        hits = np.isin(docs.records["source"], mine)
        if place is not None:
            hits &= docs.records["place"] == place
        found += [_found(loader, k, entry.file, docs, sources, int(i), None) for i in np.flatnonzero(hits)]
    items, action = [], None
    if record is not None:
        action = index.benchmark_decontamination["action"]
        items = [{"benchmark": item["benchmark"], "index": item["index"], "id": item["id"], "stream": p["stream"],
                  "tokens": p["tokens"]} for item in record["items"] for p in item["places"]
                 if p["file"] == wanted and (place is None or p["place"] == place)]
    shown = found[0].where if found else where
    if run is None and not items:
        raise TokmixError(f"{where}: no benchmark item took it (contamination.json); where it is in the shards, if "
                          f"it is, trace cannot show: {loader.root / INDEX_NAME} has no provenance index ([layout] "
                          "provenance = false)")
    if not found and not items:
        raise TokmixError(f"{where}: in no train shard or holdout of {loader.root}, and no benchmark item took it "
                          "(a file or row the run did not read, an empty text, a copy of a holdout document, or "
                          "past its stream's budget)")
    return SourceDocument(shown, found, items, action, run is not None)


# what a reader tells the user of a damaged contamination.json: the run remakes it (tokmix.stages.finished), from
# its units' records, when it finds it missing or not the file index.json names; --restart would redo the whole run
CONTAMINATION_REMEDY = "the run's `tokmix run` command, run again, remakes it"


def contamination_record(root, entry: dict) -> dict:
    """contamination.json as index.json's benchmark_decontamination names it (`entry`): whole, sealed and the file
    of its sha256; missing or not that file, one line naming it, with how to get it back."""
    path = root / entry["file"]
    try:
        record = read_json(path, sealed=True, remedy=CONTAMINATION_REMEDY)
    except DamagedFile as e:
        if isinstance(path, Path) and not stat.S_ISREG(os.lstat(path).st_mode):  # a FIFO, a folder: the run stops
            raise DamagedFile(path, e.why, f"remove it: {CONTAMINATION_REMEDY}") from None
        raise
    if record is None:
        raise TokmixError(f"{path}: missing (index.json names it in benchmark_decontamination); "
                          f"{CONTAMINATION_REMEDY}")
    if file_checksum(path) != entry["sha256"]:
        raise DamagedFile(path, "sha256 differs from index.json's benchmark_decontamination",
                          CONTAMINATION_REMEDY)
    return record


def _needs_provenance(loader: TrainBlocks, what: str):
    """Refuse, in one line, what only a provenance index shows, saying what trace shows of the run without one."""
    left = ("only why a document benchmark decontamination took is not in the shards (--source FILE:row N, from "
            "contamination.json)" if loader.index.benchmark_decontamination is not None else "nothing")
    raise TokmixError(f"{loader.root / INDEX_NAME}: no provenance index (the run was made with [layout] provenance "
                      f"= false, or by a tokmix before it): trace cannot show {what}; without it, it shows {left}")


def _found(loader: TrainBlocks, k: int | None, file: str, docs, sources: list[Source], i: int,
           doc_id: str | int | None) -> FoundDocument:
    """Record i of a token file's provenance index as a FoundDocument; in train shard k, with its blocks and
    steps."""
    record, source = docs.records[i], sources[int(docs.records[i]["source"])]
    end = int(docs.ends[i])
    start = end - int(record["tokens"])
    doc = FoundDocument(doc_id, file, i, source.stream, source.where(int(record["place"])), start,
                        int(record["tokens"]))
    if k is not None:
        first = int(loader.first_block[k])
        blocks = int(loader.first_block[k + 1]) - first
        S = loader.shard_seq_len[k]
        lo, hi = first + min(start // S, blocks - 1), first + min((end - 1) // S, blocks - 1)
        doc.blocks, doc.steps = (lo, hi), (lo // loader.seqs_per_step, hi // loader.seqs_per_step)
    return doc


def render_source(doc: SourceDocument) -> list:
    from rich.table import Table

    shown = []
    if doc.items:
        taken = ("dropped by benchmark decontamination: not in the shards" if doc.action == "drop" else
                 "counted by benchmark decontamination (action \"report\"): kept")
        shown.append(f"{_shown_where(doc.where)}: {taken}")
        table = Table(title="the benchmark items it shares n-grams with", title_justify="left")
        for col in ("benchmark", "item", "id", "stream", "tokens"):
            table.add_column(col, justify="right" if col in ("item", "tokens") else "left")
        for item in doc.items:
            table.add_row(item["benchmark"], str(item["index"]), str(item["id"]), item["stream"],
                          f"{item['tokens']:,}")
        shown.append(table)
        if not doc.provenance and doc.action != "drop":
            shown.append("where it is in the shards: not shown (the run has no provenance index: [layout] "
                         "provenance = false)")
    if doc.found:
        shown.append(render_found(doc.found, f"{_shown_where(doc.where)}: in the run"))
    return shown


def render_found(found: list[FoundDocument], title: str | None = None):
    from rich.table import Table

    table = Table(title=title or f"documents with the id {found[0].id!r}", title_justify="left")
    for col in ("file", "#", "stream", "source", "tokens", "blocks", "steps"):
        table.add_column(col, justify="right" if col in ("#", "tokens", "blocks", "steps") else "left",
                         overflow="fold" if col == "source" else "ellipsis")
    for d in found:
        table.add_row(d.file, str(d.index), d.stream, _shown_where(d.where), f"{d.first_token:,}-"
                      f"{d.first_token + d.tokens:,}", _span_of(d.blocks), _span_of(d.steps))
    return table


def _span_of(pair: tuple[int, int] | None) -> str:
    if pair is None:
        return ""
    return f"{pair[0]:,}" if pair[0] == pair[1] else f"{pair[0]:,}-{pair[1]:,}"


def _shown_where(where: str) -> str:
    path, sep, rest = where.partition(":")
    return _shown(path) + sep + rest


@dataclass
class StepSummary:
    documents: int
    tokens: int
    streams: dict[str, list[int]]  # stream -> [documents, tokens] in the step
    sources: int  # distinct source files


def step_summary(blocks: list[TracedBlock]) -> StepSummary:
    """What a step's blocks hold: its distinct documents (a document spanning blocks counted once), tokens and
    files, per stream."""
    seen, streams, files, tokens = set(), {}, set(), 0
    for b in blocks:
        for d in b.documents:
            key = (b.shard, d.index)
            entry = streams.setdefault(d.stream, [0, 0])
            if key not in seen:
                seen.add(key)
                entry[0] += 1
            entry[1] += d.tokens
            tokens += d.tokens
            files.add(d.file)
    return StepSummary(len(seen), tokens, streams, len(files))


def render_summary(summary: StepSummary, title: str, phase: str | None = None):
    """The step's head line (with a schedule, ending with its phase: step_phase) and its table per stream."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text(f"{title}: {summary.documents:,} document(s), {summary.tokens:,} tokens, from "
                f"{len(summary.streams)} stream(s) and {summary.sources:,} source file(s)"
                + (f"; {phase}" if phase is not None else ""))
    table = Table()
    for col in ("stream", "documents", "tokens", "share"):
        table.add_column(col, justify="left" if col == "stream" else "right")
    for name, (documents, tokens) in sorted(summary.streams.items(), key=lambda kv: -kv[1][1]):
        table.add_row(name, f"{documents:,}", f"{tokens:,}", f"{tokens / max(summary.tokens, 1):.1%}")
    return Group(head, table)


def read_document(source: Source, place: int, field: str, mirrors: list[tuple[str, str]]) -> str:
    """A document read again from its source file by tokmix's own readers: a parquet row from its row group
    alone, a JSONL line by reading the file up to it, a text file whole."""
    from tokmix.sources import Places, read_texts
    from tokmix.sources.units import file_pieces

    unit_bytes = 1 if source.kind == "parquet" else 1 << 62  # a parquet piece per row group
    pieces = list(file_pieces(source.file, mirrors, unit_bytes, source.stream))
    if source.kind == "parquet":
        pieces = [p for p in pieces if p.first_row <= place][-1:]
    places = Places()
    for piece in pieces:
        for text in read_texts(piece, field, source.stream, mirrors, places=places):
            if places.take()[1] == place:
                return text.utf8().decode("utf-8") if hasattr(text, "utf8") else text
    raise TokmixError(f"{source.where(place)}: not in the file any more (it holds fewer documents)")


def render_trace(blocks: list[TracedBlock]) -> list:
    """A rich table per block: its documents in order."""
    from rich.table import Table
    from rich.text import Text

    tables = []
    for b in blocks:
        title = (f"block {b.block:,} of the run: {b.file} block {b.block_in_shard:,} "
                 f"(tokens {b.first_token:,} to {b.first_token + _span(b):,})")
        if b.token is not None:
            title += f"; token {b.token} of the block"
        table = Table(title=title, title_justify="left")
        with_ids = any(d.id is not None for d in b.documents)
        columns = ["#", "stream", "source", *(["id"] if with_ids else []), "pass", "crc32", "block tokens",
                   "document tokens"]
        with_text = any(d.text is not None for d in b.documents)
        for col in columns + (["text"] if with_text else []):
            right = col in ("#", "pass", "block tokens", "document tokens")
            table.add_column(col, justify="right" if right else "left",
                             overflow="fold" if col in ("source", "text", "id") else "ellipsis")
        for d in b.documents:
            here = f"{d.start}-{d.start + d.tokens}"  # half-open ranges, as Python slices
            if b.token is not None and d.start <= b.token < d.start + d.tokens:
                here = f"▶ {here}"
            where = Source(d.stream, d.pass_no, d.kind, _shown(d.file)).where(d.place)
            row = [str(d.index), d.stream, where, *([_id(d.id)] if with_ids else []), str(d.pass_no),
                   f"{d.crc32:08x}", here, f"{d.offset:,}-{d.offset + d.tokens:,}"]
            if with_text:
                mark = Text("ok " if d.text_ok else "CHANGED ", style="green" if d.text_ok else "bold red")
                row.append(mark + Text(repr(d.text[:PREVIEW_CHARS])[1:-1]))
            table.add_row(*row)
        tables.append(table)
    return tables


def _id(value: str | int | None) -> str:
    return "" if value is None else str(value)


def _shown(path: str) -> str:
    """A path under the working directory relative to it (the table's widest column), others as recorded."""
    if "://" in path or not os.path.isabs(path):
        return path
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _span(block: TracedBlock) -> int:
    return max((d.start + d.tokens for d in block.documents), default=1) - 1
