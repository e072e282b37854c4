"""The run's identity: what a resume must find as the run started it. Each key (a `Pin`) is recorded in the state
folder when the run first sees it; a later run (a resume, a restart of the stage process) compares what it finds
with that record and describes a change one way, in lines (`Pin.changes`). A key that refuses a change stops the
run in its one line; one that keeps its first value gives that back (the unit size the streams were cut with);
one that is redone is decided again (the backend's check, made once per run). Adding a key (a tokenizer
library's version, a benchmark file's checksum) is one Pin in PINS, and one call where the run knows its value.
Imported by the supervisor and the stage process alike: it imports nothing of the pipeline."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokmix.errors import TokmixError
from tokmix.recipe import Recipe, recipe_diff, recipe_from_dict
from tokmix.shards import DamagedFile, Layout, read_json, write_json, write_record

RESTART = "use --restart to start over"


def differs(old: Any, new: Any) -> list[str]:
    """A value's change as one line, none when it is the same."""
    return [] if old == new else [f"{json.dumps(old)} -> {json.dumps(new)}"]


def split_changes(old: dict, new: dict) -> list[str]:
    """What an edit of the split file did, file by file: moved between holdout and train, added, removed, or
    train files put in another order (the order is each stream's canonical document order)."""
    changes = []
    for domain in sorted(set(old) | set(new)):
        was, now = old.get(domain, {}), new.get(domain, {})
        part_was = {f: part for part in ("holdout", "train") for f in was.get(part, [])}
        part_now = {f: part for part in ("holdout", "train") for f in now.get(part, [])}
        moved = [f"{domain}: {f} {'moved ' if 'absent' not in (a, b) else ''}{a} -> {b}"
                 for f in sorted(part_was.keys() | part_now.keys())
                 if (a := part_was.get(f, "absent")) != (b := part_now.get(f, "absent"))]
        if not moved and was != now:
            moved = [f"{domain}: files listed in another order"]
        changes += moved
    return changes


def _recipe_refusal(where: str, old: Any, new: Any, changes: list[str]) -> str:
    return (f"{where} was started with another recipe; resuming would mix two runs. Changed: {'; '.join(changes)}. "
            "Use --restart to start over")


def _split_refusal(where: str, old: Any, new: Any, changes: list[str]) -> str:
    more = f" (and {len(changes) - 3} more)" if len(changes) > 3 else ""
    return (f"split file {where}: changed since this run started ({'; '.join(changes[:3])}{more}); what is already "
            f"written follows the first split: restore it, or {RESTART}")


def _tokenizer_refusal(where: str, old: Any, new: Any, changes: list[str]) -> str:
    return (f"tokenizer {where}: changed since this run started (sha256 {old[:12]}..., now {new[:12]}...); what is "
            f"already written holds the first one's ids: restore it, or {RESTART}")


def _owner_refusal(where: str, old: Any, new: Any, changes: list[str]) -> str:
    host, work = old
    return (f"{where}: written by the tokmix run working in {work} on host {host}, whose lock this run cannot see: "
            "run it from there (--work), or, if no run is writing this prefix, run again with --break-lock")


def benchmark_changes(old: Any, new: Any) -> list[str]:
    """What changed in [decontaminate]'s inputs: the normalization's version, a benchmark's files or their bytes."""
    (rules_was, files_was), (rules_now, files_now) = old, new
    lines = [] if rules_was == rules_now else [f"n-gram normalization {rules_was} -> {rules_now}"]
    for name in sorted(set(files_was) | set(files_now)):
        was, now = files_was.get(name, {}), files_now.get(name, {})
        if list(was) != list(now):
            lines.append(f"benchmark {name}: its files are now {', '.join(now) or 'none'}, not "
                         f"{', '.join(was) or 'none'}")
            continue
        lines += [f"benchmark {name}: file {path}: changed since this run started (sha256 {was[path][:12]}..., now "
                  f"{now[path][:12]}...)" for path in was if was[path] != now[path]]
    return lines


def _benchmark_refusal(where: str, old: Any, new: Any, changes: list[str]) -> str:
    return (f"{changes[0]}; what is already written was decontaminated against the first: restore it, or "
            f"{RESTART}")


@dataclass(frozen=True)
class Pin:
    """One key of the run's identity: the state file that records it (`record`, a Layout path) and the key(s) of
    that file holding its value; what a resume that finds another value does (`on_change`: "refuse", "keep" the
    recorded value, "redo" the decision); how a change is described, and the line a refusal is."""

    name: str
    record: Callable[[Layout], Path]
    keys: tuple[str, ...]
    on_change: str = "refuse"
    sealed: bool = False  # a sealed record (shards.write_record): a torn or edited one shows
    remade: bool = False  # a damaged record is decided again (True) or the run's one line (False)
    changes: Callable[[Any, Any], list[str]] = differs
    refusal: Callable[[str, Any, Any, list[str]], str] | None = None
    value_first: bool = False  # in its record, the value's keys before what is kept beside it
    shape: Callable[[Any], bool] = lambda value: True  # what a value read back must be

    def value(self, record: dict) -> Any:
        return record[self.keys[0]] if len(self.keys) == 1 else tuple(record[k] for k in self.keys)


PINS = {pin.name: pin for pin in (
    # what decides the output bytes (Recipe.output_fields); recorded with the recipe itself, for the stage process
    Pin("recipe", lambda layout: layout.recorded_recipe, ("output_fields",), changes=recipe_diff,
        refusal=_recipe_refusal, shape=lambda value: isinstance(value, dict)),
    # a store holds no lock: the working folder whose lock guards it, and the recipe it was started with
    Pin("store owner", lambda layout: layout.store_run, ("host", "work"), refusal=_owner_refusal, value_first=True),
    Pin("store recipe", lambda layout: layout.store_run, ("output_fields",), changes=recipe_diff,
        refusal=_recipe_refusal),
    Pin("split", lambda layout: layout.split_record, ("split",), changes=split_changes, refusal=_split_refusal),
    Pin("tokenizer checksum", lambda layout: layout.tokenizer_checksum, ("sha256",), refusal=_tokenizer_refusal),
    # the local file (a .tiktoken file) that the run's own copy of the tokenizer was made of: the run reads the copy
    Pin("tokenizer source", lambda layout: layout.tokenizer_source, ("sha256",), refusal=_tokenizer_refusal),
    # units are numbered by how files were cut: a resume keeps the cut the run started with (sealed: a
    # truncated number is still a number)
    Pin("unit size", lambda layout: layout.unit_bytes, ("unit_bytes",), on_change="keep", sealed=True),
    # the backend, checked once per run: restarts reuse the decision while what it was made for is the same
    Pin("backend", lambda layout: layout.backend_choice, ("key",), on_change="redo", remade=True, value_first=True),
    # [decontaminate]: the normalization's version and every benchmark file's sha256 (tokmix.stages.decontam)
    Pin("benchmarks", lambda layout: layout.benchmark_identity, ("normalization", "files"),
        changes=benchmark_changes, refusal=_benchmark_refusal),
    # the versions of the oracle's and the backend's libraries, with the digests of the oracle's ids on the
    # check's texts: a resume under others encodes those texts again (tokmix.tokenizer_stage._same_libraries)
    Pin("tokenizer libraries", lambda layout: layout.tokenizer_libraries, ("libraries",), on_change="redo",
        remade=True, value_first=True),
)}


def recorded(layout: Layout, name: str, log: Callable[[str], None] | None = None) -> dict | None:
    """The record of key `name`, None when there is none (or, for a key that is remade, when it is damaged: said
    in `log`)."""
    pin = PINS[name]
    path = pin.record(layout)
    try:
        found = read_json(path, sealed=pin.sealed)  # damaged: named, with --restart as the remedy
    except DamagedFile as e:
        if not pin.remade:
            raise
        if log is not None:
            log(f"{e.path}: damaged ({e.why}); remade")
        return None
    if found is not None and not (isinstance(found, dict) and all(k in found for k in pin.keys)
                                  and pin.shape(pin.value(found))):
        if pin.remade:
            return None
        raise DamagedFile(path, f"not the {'recipe' if 'recipe' in name else name} record tokmix writes")
    return found


def check(layout: Layout, name: str, value: Any, where: str, log: Callable[[str], None] | None = None) -> dict | None:
    """What the run goes on with for key `name`, given this run's `value`: the record when there is one that holds
    the same value (or, for a key that keeps its first value, any record); None when there is none (or, for a
    key that is redone, when it changed). A changed key that refuses raises its one line, naming `where`."""
    pin = PINS[name]
    found = recorded(layout, name, log)
    if found is None:
        return None
    changes = pin.changes(pin.value(found), value)
    if not changes or pin.on_change == "keep":
        return found
    if pin.on_change == "redo":
        return None
    raise TokmixError(pin.refusal(where, pin.value(found), value, changes))


def record(layout: Layout, name: str, value: Any, **beside: Any) -> None:
    """Record key `name`'s value, with what its record keeps `beside` it (the recipe beside its fingerprint)."""
    pin = PINS[name]
    own = dict(zip(pin.keys, value)) if len(pin.keys) > 1 else {pin.keys[0]: value}
    body = {**own, **beside} if pin.value_first else {**beside, **own}
    (write_record if pin.sealed else write_json)(pin.record(layout), body)


def pinned(layout: Layout, name: str, value: Any, where: str = "", **beside: Any) -> Any:
    """Key `name`'s value for this run: recorded the first time, then checked (refused, kept) on every resume."""
    found = check(layout, name, value, where)
    if found is None:
        record(layout, name, value, **beside)
        return value
    return PINS[name].value(found)


# ---------------------------------------------------------------------------- the recipe's record
def record_recipe(layout: Layout, recipe: Recipe) -> None:
    """The recipe as the run was started with it (for the stage process), and what decides its output."""
    record(layout, "recipe", recipe.output_fields(), recipe=recipe.model_dump(mode="json"),
           base_dir=str(recipe.base_dir))


def load_recorded_recipe(layout: Layout) -> Recipe:
    data = json.loads((layout.recorded_recipe).read_text())
    return recipe_from_dict(data["recipe"], Path(data["base_dir"]))
