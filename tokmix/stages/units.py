"""A committed unit as every reader checks it before using it: its record (sealed) and the sha256 of its token,
lengths and (with provenance) places files against that record. The streams coordinator checks each unit before
counting it (and remakes a damaged one); a repeat unit checks each pass-1 unit it copies from (and stops, naming
it)."""

from __future__ import annotations

import os
from pathlib import Path

from tokmix.shards import DamagedFile, file_checksum, read_json, unit_file
from tokmix.stages import cached
from tokmix.store import ObjectPath

REMAKE_UNIT = "run the same command again: a damaged unit is remade from its source as the streams stage starts"


def _stamp(path: Path) -> tuple:
    """What changes when a file is replaced or written in place: a changed stamp means a new check."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ()
    return st.st_ino, st.st_size, st.st_mtime_ns


def unit_damage(directory: Path | ObjectPath, name: str) -> tuple[dict | None, str | None]:
    """A committed unit's record, or why the unit cannot be used: its record is not the one written, or its
    token, lengths or places file is missing or not the bytes the record's checksums were taken of. One read of
    each local file per process while they are unchanged (a repeat unit's check after the coordinator's costs
    nothing); a unit on an object store is read each time."""
    if isinstance(directory, ObjectPath):
        return _check(directory, name)
    stamps = tuple(_stamp(unit_file(directory, name, part)) for part in ("json", "tok", "len", "src"))
    return cached(("unit check", str(directory), name, stamps), lambda: _check(directory, name))


def _check(directory: Path | ObjectPath, name: str) -> tuple[dict | None, str | None]:
    try:
        record = read_json(unit_file(directory, name, "json"), sealed=True)
    except DamagedFile as e:
        return None, e.why
    if record is None:
        return None, "its record is missing"
    for part in ("tok", "len", "src"):
        path = unit_file(directory, name, part)
        if part == "src" and "src_sha256" not in record:
            continue  # a unit of a run without provenance
        if not path.exists():
            return None, f"{path.name} is missing"
        if file_checksum(path) != record.get(f"{part}_sha256"):
            return None, f"sha256 of {path.name} differs from its record"
    return record, None


def checked_unit(directory: Path | ObjectPath, name: str) -> dict:
    """The unit's record when its files are whole; DamagedFile naming the unit otherwise (a worker cannot
    remake it: the next stage process does)."""
    record, why = unit_damage(directory, name)
    if why is not None:
        raise DamagedFile(directory / name, why, REMAKE_UNIT)
    return record
