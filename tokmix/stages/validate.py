"""Stage 4: check an output directory from its files and index.json alone: sizes, token ids, the overlap
tokens between shards, checksums, holdouts, and the shares. Reads every file once, sequentially, in
chunks, so it needs little memory whatever the shard size."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from tokmix.shards import (
    CHECKSUM,
    EOT_TOKEN,
    READ_CHUNK_BYTES,
    DamagedFile,
    Delimiters,
    Layout,
    block_fingerprints,
    fingerprints_path,
    read_json,
    tokens_in_shard,
)

SHARE_WARNING = 0.01  # realized share further than this (absolute) from the target is reported


def _scan(path: Path, dtype: np.dtype) -> dict:
    """One sequential pass: token count, largest id, first and last token, checksum."""
    h = hashlib.new(CHECKSUM)
    n, top, first, last = 0, -1, None, None
    with open(path, "rb") as f:
        while data := f.read(READ_CHUNK_BYTES - READ_CHUNK_BYTES % dtype.itemsize):
            h.update(data)
            chunk = np.frombuffer(data, dtype=dtype)
            if len(chunk):
                top = max(top, int(chunk.max()))
                first = int(chunk[0]) if first is None else first
                last = int(chunk[-1])
            n += len(chunk)
    return {"tokens": n, "max": top, "first": first, "last": last, "checksum": h.hexdigest()}


def _starts_a_document(name: str, first: int | None, index: dict) -> list[str]:
    """A file that begins with a document begins with the doc_prefix's first token (nothing to check without one:
    a document's text comes first), named as the recipe names it."""
    delimiters = Delimiters.from_index(index)
    if delimiters.prefix and first != delimiters.prefix[0]:
        token = (index.get("delimiter_tokens") or {"prefix": [EOT_TOKEN]})["prefix"][0]
        return [f"{name}: does not start with {token}"]
    return []


def _check_shards(root: Path, index: dict, dtype: np.dtype, vocab: int | None) -> list[str]:
    problems, previous_last = [], None
    seq_len = index["seq_len"]
    for k, shard in enumerate(index.get("shards", [])):
        name, path = shard["file"], root / shard["file"]
        if not path.exists():
            problems.append(f"{name}: missing")
            previous_last = None
            continue
        if path.stat().st_size % dtype.itemsize:
            problems.append(f"{name}: {path.stat().st_size} bytes is not a whole number of {dtype} tokens")
            previous_last = None  # unknown: the next shard's first token cannot be judged against it
            continue
        got = _scan(path, dtype)
        want = tokens_in_shard(shard["blocks"], seq_len)
        if got["tokens"] != want or shard["tokens"] != want:
            problems.append(f"{name}: {got['tokens']:,} tokens, expected {want:,} ({shard['blocks']:,} blocks)")
        if vocab is not None and got["max"] >= vocab:
            problems.append(f"{name}: token id {got['max']} out of range (vocabulary {vocab:,})")
        if "checksum" in shard and got["checksum"] != shard["checksum"]:
            problems.append(f"{name}: {CHECKSUM} checksum differs from index.json (file changed or corrupt)"
                            + _where(root, name, dtype, seq_len))
        if k == 0:
            problems += _starts_a_document(name, got["first"], index)
        if previous_last is not None and got["first"] != previous_last:
            problems.append(f"{name}: first token {got['first']} does not repeat the previous shard's last "
                            f"token {previous_last}")
        counted = sum(shard.get("tokens_by_stream", {}).values())
        if counted != want - (k > 0):
            problems.append(f"{name}: tokens_by_stream sums to {counted:,}, expected {want - (k > 0):,}")
        previous_last = got["last"]
    return problems


def _where(root: Path, name: str, dtype: np.dtype, seq_len: int) -> str:
    """Which blocks changed, from the fingerprints written with the shard (when this directory has them)."""
    marks = fingerprints_path(root, name)
    if not marks.exists():
        return ""
    want = np.fromfile(marks, dtype=np.uint32)
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


def _check_holdouts(root: Path, index: dict, dtype: np.dtype, vocab: int | None) -> list[str]:
    problems = []
    for domain, entry in index.get("val", {}).items():
        path = root / entry["file"]
        if not path.exists():
            problems.append(f"{entry['file']}: missing (holdout {domain})")
            continue
        got = _scan(path, dtype)
        if got["tokens"] != entry["tokens"]:
            problems.append(f"{entry['file']}: {got['tokens']:,} tokens, index.json says {entry['tokens']:,}")
        if vocab is not None and got["max"] >= vocab:
            problems.append(f"{entry['file']}: token id {got['max']} out of range (vocabulary {vocab:,})")
        if "checksum" in entry and got["checksum"] != entry["checksum"]:
            problems.append(f"{entry['file']}: {CHECKSUM} checksum differs from index.json (file changed or corrupt)")
        problems += _starts_a_document(entry["file"], got["first"], index)
    return problems


def _check_shares(index: dict) -> list[str]:
    total = index.get("total", {})
    problems = []
    by_stream = {}
    for shard in index.get("shards", []):
        for name, n in shard.get("tokens_by_stream", {}).items():
            by_stream[name] = by_stream.get(name, 0) + n
    if by_stream != total.get("tokens_by_stream", by_stream):
        problems.append("index.json: total.tokens_by_stream does not equal the sum over shards")
    if sum(by_stream.values()) != index["blocks"] * index["seq_len"] + 1:
        problems.append("index.json: shards hold a different number of tokens than blocks x seq_len + 1")
    return problems


def share_warnings(index: dict) -> list[str]:
    """Streams whose realized share is off its target by more than SHARE_WARNING (a warning, not an error)."""
    realized = index.get("total", {}).get("share_by_stream", {})
    targets = index.get("mix", {}).get("target_share_by_stream", {})
    return [f"stream {n}: realized share {realized[n]:.4f} vs target {t:.4f}"
            for n, t in targets.items() if n in realized and abs(realized[n] - t) > SHARE_WARNING]


def validate_dir(out_dir: str | Path, vocab_size: int | None = None) -> list[str]:
    """Every problem found, one line each; an empty list means valid."""
    root = Path(out_dir)
    try:
        index = read_json(Layout(root).index) or {}
    except DamagedFile as e:
        return [f"{e.path}: not valid JSON (truncated or overwritten: run the same command again to remake it)"]
    if not index.get("shards"):
        return [f"{root}: no index.json with shards (the run has not finished assembling)"]
    dtype = np.dtype(index["dtype"])
    vocab = vocab_size or index.get("vocab_size")
    return (_check_shards(root, index, dtype, vocab) + _check_holdouts(root, index, dtype, vocab)
            + _check_shares(index))
