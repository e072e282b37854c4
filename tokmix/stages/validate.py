"""Stage 4: check an output directory from its files, index.json and the state the run kept: sizes, token ids,
the overlap tokens between shards, checksums, holdouts, the shares, and that each shard is what the committed
units and the seed produce (its bytes against the sha256 derived from them, tokmix.stages.expected). Reads
every file once, sequentially, in chunks, so it needs little memory whatever the shard size."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from tokmix.errors import TokmixError
from tokmix.format.records import Index, PhaseEntry, TokenFileEntry
from tokmix.provenance import DOC_DTYPE, read_ids
from tokmix.shards import (
    CHECKSUM,
    EOT_TOKEN,
    EXPECTED_NAME,
    READ_CHUNK_BYTES,
    STATE_DIR,
    DamagedFile,
    Layout,
    file_checksum,
    fingerprints_path,
    open_read,
    read_index,
    read_index_file,
    read_json,
    tokenizer_change,
    tokens_in_shard,
)
from tokmix.store import ObjectPath, as_path
from tokmix.tokens import Delimiters, block_fingerprints, read_array

SHARE_WARNING = 0.01  # realized share further than this (absolute) from the target is reported


def _scan(path: Path | ObjectPath, dtype: np.dtype, marker: int | None = None,
          no_token: list[list[int]] | None = None) -> dict:
    """One sequential pass: token count, largest id, first and last token, checksum; with `marker`, where that
    id is ("marks": the documents' delimiters, checked against the provenance index); with `no_token` (index.json's
    ranges of ids that are no token), the first such id found ("no_token", None without)."""
    h = hashlib.new(CHECKSUM)
    n, top, first, last, marks, found = 0, -1, None, None, [], None
    with open_read(path, fetch=READ_CHUNK_BYTES) as f:
        while data := f.read(READ_CHUNK_BYTES - READ_CHUNK_BYTES % dtype.itemsize):
            h.update(data)
            chunk = np.frombuffer(data, dtype=dtype)
            if len(chunk):
                top = max(top, int(chunk.max()))
                first = int(chunk[0]) if first is None else first
                last = int(chunk[-1])
                if marker is not None:
                    marks.append(np.flatnonzero(chunk == marker) + n)
                if no_token and found is None:
                    found = _no_token_in(chunk, no_token)
            n += len(chunk)
    return {"tokens": n, "max": top, "first": first, "last": last, "checksum": h.hexdigest(),
            "marks": np.concatenate(marks) if marks else np.empty(0, np.int64), "no_token": found}


def _no_token_in(chunk: np.ndarray, ranges: list[list[int]]) -> int | None:
    """The first id of `chunk` inside one of the [first, end) ranges, None when there is none."""
    hit = np.zeros(len(chunk), dtype=bool)
    for start, end in ranges:  # a few ranges (cl100k 2, o200k 2): two compares a token each
        hit |= (chunk >= start) & (chunk < end)
    at = np.flatnonzero(hit)
    return int(chunk[at[0]]) if len(at) else None


def _no_token_problem(name: str, got: dict) -> list[str]:
    if got["no_token"] is None:
        return []
    return [f"{name}: token id {got['no_token']:,} is no token of the run's tokenizer (index.json's no_token_ids)"]


def _starts_a_document(name: str, first: int | None, index: Index) -> list[str]:
    """A file that begins with a document begins with the doc_prefix's first token (nothing to check without one:
    a document's text comes first), named as the recipe names it."""
    delimiters = Delimiters.from_index(index)
    if delimiters.prefix and first != delimiters.prefix[0]:
        token = (index.delimiter_tokens or {"prefix": [EOT_TOKEN]})["prefix"][0]
        return [f"{name}: does not start with {token}"]
    return []


def _check_shards(root: Path, index: Index, dtype: np.dtype, vocab: int | None,
                  expected: dict[str, str] | None) -> list[str]:
    problems, previous_last = [], None
    for k, shard in enumerate(index.shards):
        name, path = shard.file, root / shard.file
        seq_len = int(shard.seq_len or index.seq_len)  # a long-context phase's shards have their own
        if not path.exists():
            problems.append(f"{name}: missing")
            previous_last = None
            continue
        if path.stat().st_size % dtype.itemsize:
            problems.append(f"{name}: {path.stat().st_size} bytes is not a whole number of {dtype} tokens")
            previous_last = None  # unknown: the next shard's first token cannot be judged against it
            continue
        got = _scan(path, dtype, _marker(index, shard), index.no_token_ids)
        want = tokens_in_shard(shard.blocks, seq_len)
        if got["tokens"] != want or shard.tokens != want:
            problems.append(f"{name}: {got['tokens']:,} tokens, expected {want:,} ({shard.blocks:,} blocks)")
        if vocab is not None and got["max"] >= vocab:
            problems.append(f"{name}: token id {got['max']} out of range (vocabulary {vocab:,})")
        problems += _no_token_problem(name, got)
        if shard.checksum is not None and got["checksum"] != shard.checksum:
            problems.append(f"{name}: {CHECKSUM} checksum differs from index.json (file changed or corrupt)"
                            + _where(root, name, dtype, seq_len))
        # the bytes against index.json just above; index.json's checksum (the bytes' without one) against the
        # digest derived from the units: a shard edited together with its record and index.json shows here
        if expected is not None and (shard.checksum or got["checksum"]) != expected.get(name):
            problems.append(f"{name}: not what the committed units and the seed produce ({CHECKSUM} differs from "
                            f"the one derived from them, {STATE_DIR}/{EXPECTED_NAME})"
                            + _where(root, name, dtype, seq_len))
        if k == 0:
            problems += _starts_a_document(name, got["first"], index)
        if previous_last is not None and got["first"] != previous_last:
            problems.append(f"{name}: first token {got['first']} does not repeat the previous shard's last "
                            f"token {previous_last}")
        counted = sum(shard.tokens_by_stream.values())
        if counted != want - (k > 0):
            problems.append(f"{name}: tokens_by_stream sums to {counted:,}, expected {want - (k > 0):,}")
        if got["tokens"] == want:  # (a shard of the wrong size is named above: its index cannot be judged)
            problems += _check_documents(root, shard, got, index, len(index.provenance.sources)
                                         if shard.provenance is not None else 0)
        previous_last = got["last"]
    return problems


def _where(root: Path, name: str, dtype: np.dtype, seq_len: int) -> str:
    """Which blocks changed, from the fingerprints written with the shard (when this directory has them)."""
    marks = fingerprints_path(root, name)
    if not marks.exists():
        return ""
    want = read_array(marks, np.uint32)
    got = block_fingerprints(root / name, dtype, seq_len)
    if len(got) != len(want):
        return ""
    bad = np.flatnonzero(got != want)
    if not len(bad):
        return ""
    last = len(want) - 1
    blocks = [f"block {b} (tokens {b * seq_len:,}-{b * seq_len + seq_len:,})" if b < last else "its last token"
              for b in bad[:3]]
    return ": " + ", ".join(blocks) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")


def _check_holdouts(root: Path, index: Index, dtype: np.dtype, vocab: int | None) -> list[str]:
    problems = []
    for domain, entry in index.val.items():
        path = root / entry.file
        if not path.exists():
            problems.append(f"{entry.file}: missing (holdout {domain})")
            continue
        got = _scan(path, dtype, _marker(index, entry), index.no_token_ids)
        if got["tokens"] != entry.tokens:
            problems.append(f"{entry.file}: {got['tokens']:,} tokens, index.json says {entry.tokens:,}")
        if vocab is not None and got["max"] >= vocab:
            problems.append(f"{entry.file}: token id {got['max']} out of range (vocabulary {vocab:,})")
        problems += _no_token_problem(entry.file, got)
        if entry.checksum is not None and got["checksum"] != entry.checksum:
            problems.append(f"{entry.file}: {CHECKSUM} checksum differs from index.json (file changed or corrupt)")
        problems += _starts_a_document(entry.file, got["first"], index)
        if got["tokens"] == entry.tokens:
            problems += _check_documents(root, entry, got, index,
                                         len(entry.provenance.sources or []) if entry.provenance else 0)
    return problems


# ---------------------------------------------------------------------------- the provenance index
def _marker(index: Index, entry: TokenFileEntry) -> int | None:
    """The id whose places validate compares with the token file's provenance index, when it has one."""
    return Delimiters.from_index(index).marker if entry.provenance is not None else None


def _check_documents(root: Path, entry: TokenFileEntry, scanned: dict, index: Index, sources: int) -> list[str]:
    """A token file's provenance index against its record (checksum, size), its sources table and the file:
    its documents hold the file's tokens, and they start where the delimiters say documents start (a
    doc_prefix's first token at a start, a doc_suffix's last just before one)."""
    docs = entry.provenance
    if docs is None:
        return []
    name, path = docs.file, root / docs.file
    if not path.exists():
        return [f"{name}: missing (the provenance index of {entry.file})"]
    data = path.read_bytes()
    problems = []
    if hashlib.new(CHECKSUM, data).hexdigest() != docs.checksum:
        problems.append(f"{name}: {CHECKSUM} checksum differs from index.json (file changed or corrupt)")
    if len(data) % DOC_DTYPE.itemsize or len(data) // DOC_DTYPE.itemsize != docs.documents:
        return problems + [f"{name}: {len(data):,} bytes, index.json records {docs.documents:,} documents "
                           f"of {DOC_DTYPE.itemsize} bytes"]
    records = np.frombuffer(data, dtype=DOC_DTYPE)
    if docs.ids is not None:
        problems += _check_ids(root, entry, len(records))
    ends = np.cumsum(records["tokens"], dtype=np.int64)
    if not len(ends) or int(ends[-1]) != scanned["tokens"]:
        return problems + [f"{name}: its documents hold {int(ends[-1]) if len(ends) else 0:,} tokens, "
                           f"{entry.file} {scanned['tokens']:,}"]
    if len(records) and int(records["source"].max()) >= sources:
        bad = int(np.argmax(records["source"] >= sources))
        problems.append(f"{name}: document {bad} names source {int(records['source'][bad])}, the table has {sources}")
    delimiters = Delimiters.from_index(index)
    found = scanned["marks"] if delimiters.prefix else scanned["marks"] + 1
    found = found[(found > 0) & (found < scanned["tokens"])]
    starts = ends[:-1]
    if not np.array_equal(found, starts):
        n = min(len(found), len(starts))
        differ = np.flatnonzero(found[:n] != starts[:n])
        at = int(min(found[differ[0]], starts[differ[0]]) if len(differ) else
                 found[n] if len(found) > n else starts[n])
        problems.append(f"{name}: its documents do not start where {entry.file}'s delimiters do "
                        f"(first at token {at:,})")
    return problems


def _check_ids(root: Path, entry: TokenFileEntry, documents: int) -> list[str]:
    """The documents' own ids beside the provenance index (an id_field): whole, and one for each document."""
    try:
        ids = read_ids(root, entry)
    except (TokmixError, ValueError) as e:  # ValueError: not UTF-8 or not JSON, with a matching checksum
        return [str(e)]
    if len(ids) != documents:
        return [f"{entry.provenance.ids.file}: {len(ids):,} ids, {entry.provenance.file} has {documents:,} documents"]
    return []


def _check_shares(index: Index) -> list[str]:
    total = index.total
    problems = []
    by_stream = {}
    for shard in index.shards:
        for name, n in shard.tokens_by_stream.items():
            by_stream[name] = by_stream.get(name, 0) + n
    if total is not None and total.has("tokens_by_stream") and by_stream != total.tokens_by_stream:
        problems.append("index.json: total.tokens_by_stream does not equal the sum over shards")
    phases = index.phases or [PhaseEntry(blocks=[0, index.blocks], seq_len=index.seq_len)]
    run_tokens = sum(p.block_count * p.seq_len for p in phases) + 1  # each phase's blocks of its own seq_len
    if sum(by_stream.values()) != run_tokens:
        problems.append("index.json: shards hold a different number of tokens than blocks x seq_len + 1")
    return problems


def share_warnings(index: Index) -> list[str]:
    """Streams whose realized share is off its target by more than SHARE_WARNING (a warning, not an error)."""
    realized = index.total.share_by_stream if index.total is not None else {}
    targets = index.mix.target_share_by_stream if index.mix is not None else {}
    return [f"stream {n}: realized share {realized[n]:.4f} vs target {t:.4f}"
            for n, t in targets.items() if n in realized and abs(realized[n] - t) > SHARE_WARNING]


def validate_dir(out_dir: str | Path | ObjectPath, vocab_size: int | None = None,
                 index_path: Path | None = None, expected_path: Path | None = None) -> list[str]:
    """Every problem found, one line each; an empty list means valid. `out_dir` may be a store's URL;
    `index_path`: the index to check the files against, when not yet in `out_dir` (a store's run, which
    publishes it once they are valid); `expected_path` likewise for the digests derived from the units (a
    store's run keeps them in its local state folder)."""
    root = as_path(out_dir)
    try:
        index = read_index_file(index_path or Layout(root).index)
    except DamagedFile as e:
        return [f"{e.path}: not valid JSON (truncated or overwritten: run the same command again to remake it)"]
    if index is None or not index.shards:
        return [f"{root}: no index.json with shards (the run has not finished assembling)"]
    dtype = np.dtype(index.dtype)
    vocab = vocab_size or index.vocab_size
    expected, problems = _expected(expected_path or Layout(root).expected, index)
    if (changed := tokenizer_change(root, index)) is not None:
        problems.append(changed)
    return (problems + _check_shards(root, index, dtype, vocab, expected) + _check_holdouts(root, index, dtype, vocab)
            + _check_shares(index) + _check_balance(index) + _check_phases(index) + _check_contamination(root, index))


def _check_contamination(root: Path | ObjectPath, index: Index) -> list[str]:
    """With [decontaminate]: contamination.json, which index.json names with its sha256, there, whole and that
    one (what inspect, trace and report say was dropped)."""
    entry = index.benchmark_decontamination
    if entry is None:
        return []
    path = root / entry["file"]
    try:
        if read_json(path, sealed=True) is None:
            return [f"{path}: missing (index.json names it in benchmark_decontamination)"]
    except DamagedFile as e:
        return [f"{path}: damaged ({e.why})"]
    if file_checksum(path) != entry["sha256"]:
        return [f"{path}: sha256 differs from index.json's (benchmark_decontamination)"]
    return []


def _check_balance(index: Index) -> list[str]:
    """A balanced run's recorded deviations are within its bound (docs/format.md, the balanced interleave)."""
    balance = index.mix.balance if index.mix is not None else None
    if balance is None:
        return []
    bound = balance["bound_tokens"]
    return [f"index.json: stream {n} was {v:,} tokens {side} its target, past the bound of {bound:,} (the longest "
            "document)" for side, key in (("above", "over_by_stream"), ("below", "under_by_stream"))
            for n, v in balance[key].items() if v > bound]


def _check_phases(index: Index) -> list[str]:
    """A schedule's phases: they follow each other over the run's steps, blocks and shards, every shard is
    one phase's (its phase and seq_len recorded), and each phase's realized tokens per stream are within its
    two ends' bound of its target."""
    phases = index.phases
    if not phases:
        return []
    problems, shards = [], index.shards
    ends = {"steps": 0, "blocks": 0, "shards": 0}
    bound = ((index.mix.balance if index.mix is not None else None) or {}).get("bound_tokens", 0)
    for phase in phases:
        name = phase.name
        for key in ends:
            first, end = getattr(phase, key)
            if first != ends[key] or end < first:
                problems.append(f"index.json: phase {name}'s {key} start at {first:,}, not where the "
                                f"previous phase's end ({ends[key]:,})")
            ends[key] = end
        first, end = phase.shards
        held = sum(int(s.blocks) for s in shards[first:end])
        if held != phase.block_count:
            problems.append(f"index.json: phase {name}'s shards hold {held:,} blocks, the phase {phase.block_count:,}")
        for shard in shards[first:end]:
            if shard.phase != name or shard.seq_len != phase.seq_len:
                problems.append(f"{shard.file}: recorded in phase {shard.phase} with seq_len "
                                f"{shard.seq_len}, index.json's phases put it in {name} ({phase.seq_len})")
        for n, target in phase.target_tokens_by_stream.items():
            if abs(phase.tokens_by_stream[n] - target) > 2 * bound:
                problems.append(f"index.json: phase {name}: stream {n} has {phase.tokens_by_stream[n]:,} tokens, "
                                f"its target {target:,.0f} (more than twice the longest document apart)")
    if ends["steps"] != index.train_steps or ends["blocks"] != index.blocks or ends["shards"] != len(shards):
        problems.append("index.json: the phases do not cover the run's steps, blocks and shards")
    realized = {n: sum(p.tokens_by_stream[n] for p in phases) for n in index.total.tokens_by_stream}
    if realized != index.total.tokens_by_stream:
        problems.append("index.json: the phases' tokens by stream do not sum to the run's")
    return problems


def _expected(path: Path | ObjectPath, index: Index) -> tuple[dict[str, str] | None, list[str]]:
    """The shards' sha256 as the run's validate stage derived them from the units and the seed (None for a run
    that kept none: one before tokmix kept them), and what is wrong with that record itself."""
    try:
        kept = read_json(path, sealed=True)
    except DamagedFile as e:
        return None, [f"{path}: damaged ({e.why}): the shards cannot be checked against the units they were made of"]
    if kept is None:
        if index.derived_digests:  # the run kept them: lost since, not a run made before tokmix kept them
            return None, [f"{path}: missing, but index.json says this run kept it (the shards' sha256 derived from "
                          "the units and the seed): the shards cannot be checked against the units they were made of"]
        return None, []
    if not isinstance(kept.get("seed"), int) or not isinstance(kept.get("shards"), dict):
        field = "seed" if not isinstance(kept.get("seed"), int) else "shards"
        return None, [f"{path}: damaged (not the record tokmix writes: no {field!r}): the shards cannot be checked "
                      "against the units they were made of"]
    if kept["seed"] != index.seed or len(kept["shards"]) != len(index.shards):
        return kept["shards"], [f"index.json: seed {index.seed} and {len(index.shards)} shard(s), but the "
                                f"shards were derived with seed {kept['seed']} and {len(kept['shards'])} shard(s) "
                                f"({STATE_DIR}/{EXPECTED_NAME})"]
    return kept["shards"], []


def derivation_note(out_dir: str | Path) -> str | None:
    """What `tokmix validate` says when the run kept no derived digests: that it could not check the shards
    against the units and the seed."""
    path = Layout(out_dir).expected
    if path.exists() or path.is_symlink() or (read_index(out_dir) or Index()).derived_digests:
        return None  # there, or lost (a problem validate_dir names)
    return (f"note: no {STATE_DIR}/{EXPECTED_NAME}: the shards were checked against index.json, not against what "
            "the committed units and the seed produce (a run made before tokmix kept that record)")

