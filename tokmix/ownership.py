"""What a run owns in its output directory, and the one way anything there is removed.

tokmix removes or overwrites nothing in an output directory but what it created there: before a run creates a
path, the path is in the directory's record (`tokmix-state/created`, sealed, written and fsynced first). The
top-level files and the intermediates' folders are recorded by name; inside a recorded folder, what is removed
is only what tokmix names there (a units folder's `NNNNNN.tok/.len/.json`, a stream's `stream.json`); the state
folder is tokmix's alone. `--restart`, the end-of-run cleanup and the sweep of temporary files all go through
`Ownership.remove_created`; anything else found there is left, and named. The record is input like any file a
run reads back: an edited one is named, never acted on.

Where the paths are is tokmix.shards' (Layout); this module decides which of them are the run's.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tokmix.format.commit import (
    PUBLISHED_DIR,
    STATE_DIR,
    TMP,
    NotAFile,
    mark_of,
    mark_published,
    read_regular,
    tmp_recorded,
)
from tokmix.shards import (
    CHECKSUM,
    INTERLEAVE_LABELS,
    OWN_FILES_REMEDY,
    RECORDABLE_PATH,
    STREAM_META,
    STREAMS_DIR,
    UNITS_DIR,
    DamagedFile,
    Layout,
    write_bytes,
)
from tokmix.unit_files import FILE_NAME as UNIT_FILE_NAME

RECORD_HEADER = "# tokmix: paths this run created in its output directory, recorded before creating them"
RECORD_SEAL_LINE = "# sha256 "  # the record's last line: the sha256 of every line before it (Ownership.recorded)
SEALED_RECORD_HEADER = RECORD_HEADER + " (sealed: the last line is their sha256)"


def _lines_digest(lines: list[str]) -> str:
    return hashlib.new(CHECKSUM, ("\n".join(lines) + "\n").encode()).hexdigest()


class Ownership:
    """The record of what the run in `layout` created, and every question and removal that goes through it."""

    def __init__(self, layout: Layout):
        self.layout, self.root, self.remote = layout, layout.root, layout.remote
        self.record, self.state, self.streams = layout.record, layout.state, layout.streams

    def owns(self, path: str | os.PathLike) -> bool:
        """Whether `path` is one of the run's own files or folders (however it is spelled, through links): its
        state and intermediates' folders and all they hold, a name tokmix gives at the top level, or one it
        recorded. Another command (report, export) never writes there."""
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(self.root))
        if rel == "." or rel.startswith(".."):
            return rel == "."
        return rel.split("/")[0] in (STATE_DIR, STREAMS_DIR) or bool(RECORDABLE_PATH.fullmatch(rel)) \
            or self.root / rel in self.recorded()

    def recorded(self) -> set[Path]:
        """The paths the record names. The record is input like any file a run reads back: it must be sealed (its
        last line the sha256 of the lines before it; a record of a tokmix before the seal has none) and each
        path must be one tokmix gives, inside the output directory: an edited record is named (DamagedFile),
        never acted on, so nothing outside the run is ever removed through it."""
        if self.remote:
            if not self.record.is_file():
                return set()
            text = self.record.read_text()
        else:
            try:
                text = read_regular(self.record, follow=False).decode("utf-8")
            except FileNotFoundError:
                return set()
            except NotAFile as e:
                raise DamagedFile(self.record, e.kind + ", not the record tokmix writes", OWN_FILES_REMEDY) from None
            except UnicodeDecodeError:
                raise DamagedFile(self.record, "not text: overwritten", OWN_FILES_REMEDY) from None
        lines = text.splitlines()
        if not lines or lines[0] not in (RECORD_HEADER, SEALED_RECORD_HEADER):
            raise DamagedFile(self.record, "not the record tokmix writes: truncated or overwritten", OWN_FILES_REMEDY)
        # each path first: one that leads out of the run is named, sealed or not (an unkeyed seal can be redone)
        paths = {self._recorded_path(line) for line in lines[1:] if line and not line.startswith("#")}
        if lines[0] == SEALED_RECORD_HEADER:
            if not lines[-1].startswith(RECORD_SEAL_LINE):
                raise DamagedFile(self.record, "its record has no checksum: truncated or edited", OWN_FILES_REMEDY)
            if lines[-1] != RECORD_SEAL_LINE + _lines_digest(lines[:-1]):
                raise DamagedFile(self.record, "its record was changed", OWN_FILES_REMEDY)
        return paths

    def _recorded_path(self, line: str) -> Path:
        """A line of the record as a path of this output directory; DamagedFile naming it when it is not one that
        tokmix creates here (absolute, with `..`, a name tokmix never gives)."""
        parts = line.split("/")
        if line.startswith("/") or any(p in ("", ".", "..") for p in parts) or not RECORDABLE_PATH.fullmatch(line):
            where = "outside the output directory" if line.startswith("/") or ".." in parts else \
                "not a path tokmix creates there"
            raise DamagedFile(self.record, f"it names {line!r}, {where}", OWN_FILES_REMEDY)
        return self.root / line

    def not_created(self, paths: list[Path]) -> list[Path]:
        """Those of `paths` that are there but not in the record: the user's, never to be written over."""
        known = self.recorded()
        return [p for p in paths if p not in known and (p.exists() or p.is_symlink())]

    def record_created(self, paths: list[Path]) -> None:
        """Add paths to the record, durably, before they are created."""
        known = self.recorded()
        new = [p for p in paths if p not in known]
        if new or not self.record.is_file():
            self._write_record(sorted(known | set(new)))

    def _write_record(self, paths: list[Path]) -> None:
        lines = [SEALED_RECORD_HEADER, *(str(p.relative_to(self.root)) for p in paths)]
        lines.append(RECORD_SEAL_LINE + _lines_digest(lines))
        write_bytes(self.record, ("\n".join(lines) + "\n").encode())
        if self.remote:  # an object is durable once its upload completes
            return
        fd = os.open(self.state, os.O_RDONLY)
        try:  # the rename itself on disk before anything it allows is created
            os.fsync(fd)
        finally:
            os.close(fd)

    def adopt_published(self) -> None:
        """Once per output directory: mark the recorded top-level files already there as published (a run begun
        before tokmix marked its names: they are its own), so that only names marked, or written by tokmix
        from now on, are ever replaced (publish)."""
        folder = self.state / PUBLISHED_DIR
        if self.remote or folder.is_dir():  # a store's objects are uploaded whole, never renamed over
            return
        folder.mkdir()
        for path in self.recorded():
            if path.parent == self.root and path.is_file() and not path.is_symlink():
                mark_published(mark_of(folder, path.name))

    def remove_created(self, paths: list[Path] | None = None, keep: tuple[Path, ...] = ()) -> list[Path]:
        """Remove the recorded paths among `paths` (default: all recorded, and the state folder's content but
        the lock, the record and `keep`), deepest first; returns what was left because tokmix did not make it:
        a folder that still holds something else, a symlink, a file where a folder was, or the reverse."""
        recorded = self.recorded()
        targets = recorded if paths is None else {p for p in paths if p in recorded}
        left: list[Path] = []
        for path in sorted(targets, key=lambda p: len(p.parts), reverse=True):
            left += self._remove_one(path)
        if paths is None:  # after the paths: their temporary files' records are in it
            left += self._empty_state(keep)
        gone = {p for p in targets if not (p.exists() or p.is_symlink())}
        if gone:  # forgotten: a file of the user's made later under such a name is not tokmix's
            self._write_record(sorted(recorded - gone))
        return left

    def confined(self, path: Path) -> bool:
        """Whether `path` is where its name says, in this output directory: no link on the way from the root to its
        folder (a stream's folder swapped for a link elsewhere would have its units removed there)."""
        if self.remote:
            return True
        real = os.path.normpath(os.path.join(os.path.realpath(self.root), os.path.relpath(path.parent, self.root)))
        return os.path.realpath(path.parent) == real

    def link_on_the_way(self, path: Path) -> Path | None:
        """The link at `path` or on the way to it from the root, if any: tokmix makes none, so one there leads
        out of the run (what is done through it would be done elsewhere)."""
        if self.remote:
            return None
        for step in [*reversed(path.relative_to(self.root).parents[:-1]), path.relative_to(self.root)]:
            if (self.root / step).is_symlink():
                return self.root / step
        return None

    def _remove_one(self, path: Path) -> list[Path]:
        if path.is_symlink() or not self.confined(path):  # tokmix makes no links: someone put this here
            return [path]
        if path.is_dir():
            left = [p for p in path.iterdir() if not self._removable_child(path, p)]
            for child in path.iterdir():
                if child not in left:
                    child.unlink()
            if left:
                return left
            path.rmdir()
            return []
        if path.exists() and not path.is_file():
            return [path]
        path.unlink(missing_ok=True)
        for tmp in path.parent.glob(f"{path.name}.tmp-*"):
            if self._own_tmp(path.parent, tmp, {path}) and tmp.is_file() and not tmp.is_symlink():
                tmp.unlink()
        return []

    def _own_tmp(self, folder: Path, tmp: Path, recorded: set[Path]) -> bool:
        """Whether a temporary file is tokmix's: at the top level, one tmp_name recorded (the user's own
        `index.json.tmp-77777` is not); in a recorded folder, one named as tokmix names files there."""
        name = TMP.fullmatch(tmp.name)
        if name is None:
            return False
        if folder == self.root:
            return folder / name.group(1) in recorded and tmp_recorded(tmp).is_file()
        return self._removable_child(folder, tmp)

    def _removable_child(self, folder: Path, child: Path) -> bool:
        """Whether `child` of a recorded folder is tokmix's to remove: a file named as tokmix names files there
        (its own recorded subfolders are removed on their own, before their parent)."""
        if child.is_symlink() or not child.is_file():
            return False
        name = m.group(1) if (m := TMP.fullmatch(child.name)) else child.name
        if folder.name == UNITS_DIR and folder.parent.parent == self.streams:
            return bool(UNIT_FILE_NAME.fullmatch(name))
        if folder.parent == self.streams:
            return name == STREAM_META
        if folder == self.streams:
            return name == INTERLEAVE_LABELS
        return False

    def _empty_state(self, keep: tuple[Path, ...]) -> list[Path]:
        """The state folder's content, but the locks, the record and `keep`: all of it is tokmix's."""
        left = []
        if self.remote:  # the store's share of the state: the shards' records and fingerprints
            for path in (self.root / STATE_DIR).glob("*/*"):
                path.unlink(missing_ok=True)
        for path in sorted(self.state.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path in (self.layout.lock, self.layout.writers, self.record, *keep) or path.parent in keep:
                continue
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                try:
                    path.rmdir()
                except OSError:
                    left.append(path)
        return left

    def remove_tmp_files(self) -> None:
        """Temporary files left by a killed writer are never visible under a final name; a resume sweeps those
        of recorded files and in recorded folders (never the user's files that happen to end in .tmp-N)."""
        recorded = self.recorded()
        # an object store has no temporary names: an upload cut short leaves no object
        folders = set() if self.remote else {self.root} | {p for p in recorded if p.is_dir() and not p.is_symlink()}
        for folder in folders:
            for tmp in folder.glob("*.tmp-*"):
                name = TMP.fullmatch(tmp.name)
                if name and self._own_tmp(folder, tmp, recorded) and tmp.is_file() and not tmp.is_symlink():
                    tmp.unlink()
        for tmp in self.state.rglob("*.tmp-*"):
            if tmp.is_file():
                tmp.unlink()
