"""A finished run found again: whether its validated output is on disk, whole (every file at its size and its
sha256 in index.json, and the shards' sha256 what the committed units and the seed derive), before a run of the
same recipe does anything; a damaged file is removed so that the run remakes it."""

from __future__ import annotations

import numpy as np

from tokmix.format.records import Index, TokenFileEntry
from tokmix.process import log
from tokmix.recipe import Recipe
from tokmix.shards import DamagedFile, Layout, Part, first_damage, read_json


def remakable(path, sealed: bool = False):
    """A state file that the run remakes when it is damaged: its content, or None (missing or damaged)."""
    try:
        return read_json(path, sealed)
    except DamagedFile as e:
        log(f"{e.path}: damaged ({e.why}); remade")
        return None


def verified_complete(layout: Layout, recipe: Recipe) -> tuple[int, int] | None:
    """(shards, holdouts) when the validated run of this recipe is on disk, every file at its size and its
    checksum in index.json (one read of each); None otherwise. A damaged file is removed, with its record and
    done.json, so that the run remakes it."""
    done = remakable(layout.done)
    if done is None or done.get("fingerprint") != recipe.fingerprint():
        return None
    try:
        index = layout.read_index()
    except DamagedFile as e:
        log(f"{e.path}: damaged ({e.why}); remade")
        return None
    plan = recipe.shard_blocks
    if not index or len(index.shards) != len(plan):
        return None
    itemsize = np.dtype(index.dtype).itemsize
    files = index.shards + list(index.val.values())
    # layout.root: the output directory or the store; one stat or request per file
    if not all((layout.root / f.file).exists() and (layout.root / f.file).stat().st_size == f.tokens * itemsize
               for f in files) or any(s.tokens != n for s, n in zip(index.shards, recipe.shard_tokens_list)):
        return None
    damaged = []
    for entry in files:
        if (why := _damage(layout, entry)) is not None:
            log(f"{why}; remaking it")
            damaged.append(entry.file)
    damaged += _not_derived(layout, index, damaged)
    for name in damaged:
        (layout.root / name).unlink()
        layout.shard_record(name).unlink(missing_ok=True)
    if (why := _contamination_damage(layout, index)) is not None:  # remade with the streams' unit records
        log(f"{why}; remaking it")
        layout.contamination.unlink(missing_ok=True)
        damaged.append(layout.contamination.name)
    if damaged:
        (layout.done).unlink()
        return None
    return len(index.shards), len(index.val)


def _damage(layout: Layout, entry: TokenFileEntry) -> str | None:
    """Why a finished run's token file must be made again: it, or its provenance index or documents' ids (made
    with it), is not what index.json's checksum says."""
    if first_damage([Part(layout.root / entry.file, entry.checksum)]) is not None:
        return f"{entry.file}: damaged (sha256 differs from index.json)"
    docs = entry.provenance
    if docs is not None and first_damage([Part(layout.root / docs.file, docs.checksum)]) is not None:
        return f"{docs.file}: missing or damaged (sha256 differs from index.json)"
    ids = docs.ids if docs is not None else None
    if ids is not None and first_damage([Part(layout.root / ids.file, ids.checksum)]) is not None:
        return f"{ids.file}: missing or damaged (sha256 differs from index.json)"
    return None


def _contamination_damage(layout: Layout, index: Index) -> str | None:
    """Why a finished run's contamination.json (with [decontaminate]) must be made again: it is not the file
    index.json names with its sha256."""
    entry = index.benchmark_decontamination
    if entry is None or first_damage([Part(layout.root / entry["file"], entry["sha256"])]) is None:
        return None
    return f"{entry['file']}: missing or damaged (sha256 differs from index.json)"


def _not_derived(layout: Layout, index: Index, damaged: list[str]) -> list[str]:
    """The shards whose sha256 in index.json is not the one derived from the committed units and the seed before
    they were removed (tokmix.stages.expected): a shard edited together with its record and index.json. A run
    that kept no such record is verified against index.json alone, and the log says so."""
    try:
        expected = read_json(layout.expected, sealed=True)
    except DamagedFile as e:
        log(f"{e.path}: damaged ({e.why}); the shards are verified against index.json only")
        return []
    if expected is None:
        log(f"no {layout.expected}: the shards are verified against index.json only")
        return []
    wrong = [s.file for s in index.shards if s.file not in damaged and s.checksum != expected["shards"].get(s.file)]
    for name in wrong:
        log(f"{name}: not what the committed units and the seed produce ({layout.expected.name}); remaking it")
    return wrong
