"""A work unit's files, and the one module that knows them: their names in a stream's units folder (NNNNNN.tok:
the tokens, .len: tokens per document, .src: the documents' places, .json: the sealed record, written last,
which commits the unit), writing and committing them, the check that a committed unit is whole, its removal,
and reading them back. No numpy at import: the supervisor and `tokmix status` count units from their records."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokmix.shards import UNITS_DIR, Part, damage, read_json, sealed_record, unit_name, write_bytes, write_record
from tokmix.store import ObjectPath, as_path

if TYPE_CHECKING:
    import numpy as np

    from tokmix.tokens import TokenFileWriter

TOKENS, LENGTHS, PLACES, RECORD = "tok", "len", "src", "json"
CONTENT = (TOKENS, LENGTHS, PLACES)  # what the record's checksums cover (`{kind}_sha256`): the token cache's parts
KINDS = (*CONTENT, RECORD)
FILE_NAME = re.compile(rf"\d{{6}}\.({'|'.join(KINDS)})")  # what a units folder holds


def unit_path(stem: str, kind: str) -> str:
    """A unit's file of `kind` from its path without a suffix (UnitFiles.stem: how a shard task's units travel)."""
    return f"{stem}.{kind}"


def _stamp(path: Path) -> tuple:
    """What changes when a file is replaced or written in place: a changed stamp means a new check."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ()
    return st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class UnitFiles:
    """Unit `name`'s files in its stream's units folder (Layout.units: a local folder or a prefix on a store)."""

    directory: Path | ObjectPath
    name: str

    @classmethod
    def of(cls, directory: str | os.PathLike | ObjectPath, unit: int | str) -> UnitFiles:
        """By the unit's index or its name."""
        return cls(as_path(directory), unit_name(unit) if isinstance(unit, int) else unit)

    def path(self, kind: str) -> Path | ObjectPath:
        return self.directory / unit_path(self.name, kind)

    @property
    def record(self) -> Path | ObjectPath:
        return self.path(RECORD)

    @property
    def stem(self) -> str:
        return str(self.directory / self.name)

    # ------------------------------------------------------------------ written, then committed by the record
    def token_writer(self, dtype: np.dtype, fault: str) -> TokenFileWriter:
        """The token file, written as the tokens come (its sha256 taken as they are) and renamed whole."""
        from tokmix.tokens import TokenFileWriter  # numpy: not for the commands that only read records

        return TokenFileWriter(self.path(TOKENS), dtype, fault=fault)

    def write_lengths(self, data: bytes) -> str:
        return write_bytes(self.path(LENGTHS), data)

    def write_places(self, data: bytes) -> str:
        return write_bytes(self.path(PLACES), data)

    def commit(self, record: dict[str, Any]) -> None:
        """The sealed record, once the unit's other files are in place: the unit is committed."""
        write_record(self.record, record)

    # ------------------------------------------------------------------ checked, removed
    def stamps(self) -> tuple:
        """Of every local file of the unit: while they are unchanged, a check done stays true."""
        return tuple(_stamp(self.path(kind)) for kind in (RECORD, *CONTENT))

    def damage(self) -> tuple[dict | None, str | None]:
        """The committed unit's record, or why the unit cannot be used: its record is not the one written, or its
        token, lengths or (with provenance) places file is missing or not the bytes the record's checksums were
        taken of."""
        record, why = sealed_record(self.record)
        if record is None:
            return None, why
        # the places file only for a unit of a run with provenance
        parts = [Part(self.path(kind), record.get(f"{kind}_sha256")) for kind in (TOKENS, LENGTHS, PLACES)
                 if kind != PLACES or f"{PLACES}_sha256" in record]
        why = damage(parts)
        return (record, None) if why is None else (None, why)

    def discard(self, why: str, log: Callable[[str], None], damaged: bool = True) -> None:
        """Remove a damaged unit (or, not `damaged`, one the run cannot use: `why`), its record first (the record is
        the commit): its stream tokenizes it again."""
        log(f"unit {self.directory / self.name}: {f'damaged ({why})' if damaged else why}; remade from its source")
        for kind in (RECORD, *CONTENT):
            self.path(kind).unlink(missing_ok=True)

    # ------------------------------------------------------------------ read
    def read_record(self) -> dict | None:
        return read_json(self.record, sealed=True)

    def read_lengths(self) -> np.ndarray:
        from tokmix.tokens import LENGTH_DTYPE, read_array

        return read_array(self.path(LENGTHS), LENGTH_DTYPE)

    def read_places(self, dtype: np.dtype) -> np.ndarray:
        from tokmix.tokens import read_array

        return read_array(self.path(PLACES), dtype)

    def read_tokens(self, dtype: np.dtype | str) -> np.ndarray:
        from tokmix.tokens import read_tokens

        return read_tokens(self.path(TOKENS), dtype)

    def has_content(self) -> bool:
        """Its token and lengths files exist (not checked: what `tokmix status` counts while a run writes)."""
        return self.path(TOKENS).exists() and self.path(LENGTHS).exists()


def recorded(directory: Path | ObjectPath) -> list[UnitFiles]:
    """The units of a units folder that have a record, by name (not checked)."""
    return [UnitFiles(directory, path.stem) for path in sorted(directory.glob(f"*.{RECORD}"))]


def count_recorded(streams: Path) -> int:
    """Unit records in every stream's units folder under `streams` (Layout.streams)."""
    return sum(1 for _ in streams.glob(f"*/{UNITS_DIR}/*.{RECORD}"))


def token_and_length_files(streams: Path) -> list[Path]:
    """Every unit's token and lengths file under `streams` (Layout.streams): what a run has written of them."""
    return [p for kind in (TOKENS, LENGTHS) for p in streams.glob(f"*/{UNITS_DIR}/*.{kind}")]


def sample_files(directory: Path) -> list[Path]:
    """One unit's every file in a units folder, for asking whether a source pattern would match them
    (Layout.sample_paths)."""
    return [UnitFiles(directory, unit_name(0)).path(kind) for kind in (TOKENS, LENGTHS, PLACES, RECORD)]
