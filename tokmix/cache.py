"""The token cache: committed work units kept under a key of everything that decides their bytes, shared by
runs, so that a new mix (other shares, blocks, seed, interleave, schedule) tokenizes only the units it has not
seen. A cached unit is input like the run's own state: every entry carries its files' sha256, checked when it
is used; a damaged or partial entry is removed and the unit tokenized again (DESIGN.md guarantee 12).

Layout of a cache (a local folder or a prefix on an object store):

    entries/<k[:2]>/<key>/entry.json       sealed record: the unit's record, its files, the key's parts
    entries/<k[:2]>/<key>/<sha[:16]>.tok   tokens, lengths, places: named by their content (never overwritten)
                                           (other kinds: a stream's holdout documents, a built benchmark set's
                                           arrays, tokmix.stages.decontam: the entry's "extra" files)
    tmp/                                   entries being filled (a local folder renamed into entries/ whole)
    used/<key>                             on a store: the time an entry was last used (LRU), as the object's
    lock                                   local: shared while an entry is linked or filled, exclusive to evict
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tokmix.errors import TokmixError
from tokmix.faults import fault_point
from tokmix.shards import CHECKSUM, DamagedFile, file_checksum, open_read, read_json, write_bytes, write_record
from tokmix.store import ObjectPath, abort_upload, as_path, is_url, storage
from tokmix.text import size_bytes
from tokmix.unit_files import CONTENT, LENGTHS, TOKENS, UnitFiles

CACHE_FORMAT = 1  # the unit-format version: what a unit's files hold; a new one makes every older entry a miss
# what a holdout entry's files hold (2: each document's UTF-8 size too); a new one makes older holdout entries a miss
HOLDOUT_FORMAT = 2
ENV = "TOKMIX_CACHE"  # a folder or URL; "off" turns the cache off
SIZE_ENV = "TOKMIX_CACHE_SIZE"
DEFAULT_CAP = 50 << 30  # or a quarter of the cache's filesystem, whichever is smaller (default_cap)
ENTRY = "entry.json"
COPY_BYTES = 8 << 20
HOLDOUT = "holdout"  # an entry's kind (record["kind"]): a stream's holdout documents; absent: a work unit
STORE_HOLD_SECONDS = 3600  # on a store, an entry used this recently may be being copied by a run: not evicted
TMP_STALE_SECONDS = 3600  # a local fill left this long by a killed run is swept


# ---------------------------------------------------------------------------- the key
def unit_key(*, tokenizer: str, oracle: str, delimiters: dict, dtype: str, huge_doc_chars: int, provenance: bool,
             text_field: str, unit_index: int, pieces: list, sources: list, decontamination: str | None,
             benchmarks: str | None = None) -> str:
    """The cache key of one work unit: everything that decides its files' bytes, and nothing else (shares,
    blocks, seed, interleave, schedule and the output directory do not). `tokenizer`: the tokenizer file's
    sha256; `oracle`: the library whose ids are the tokenizer's and its version; `pieces`: the unit's cut
    (Unit.describe()); `sources`: each piece's file identity (source_identity); `unit_index`: the unit's place in
    its stream (its places file names it); `decontamination`: how the holdout documents' copies are dropped
    (tokmix.stages.HOLDOUT_COPIES; None: they are not); `benchmarks`: the benchmark n-gram set's fingerprint
    (None: none)."""
    parts = {"format": CACHE_FORMAT, "tokenizer": tokenizer, "oracle": oracle, "delimiters": delimiters,
             "dtype": dtype, "huge_doc_chars": huge_doc_chars, "provenance": provenance, "text_field": text_field,
             "unit_index": unit_index, "pieces": pieces, "sources": sources, "decontamination": decontamination,
             "benchmarks": benchmarks}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class KeyBase:
    """What a run's units share of their key (the tokenizer's and the recipe's parts); `key(unit, text_field)`
    adds the unit's own. Built by the streams stage, and by `tokmix plan` to see what is cached already."""

    tokenizer: str
    oracle: str
    delimiters: dict
    dtype: str
    huge_doc_chars: int
    provenance: bool
    decontamination: str | None
    benchmarks: str | None = None

    def key(self, unit, text_field: str) -> str:
        """`unit`: a tokmix.sources.Unit (its index, its pieces and their files)."""
        return unit_key(tokenizer=self.tokenizer, oracle=self.oracle, delimiters=self.delimiters, dtype=self.dtype,
                        huge_doc_chars=self.huge_doc_chars, provenance=self.provenance, text_field=text_field,
                        unit_index=unit.index, pieces=unit.describe(),
                        sources=[source_identity(p.path, p.file_bytes) for p in unit.pieces],
                        decontamination=self.decontamination, benchmarks=self.benchmarks)

    def holdout_key(self, text_field: str, files: list[str], sources: list) -> str:
        """The key of a stream's holdout documents (HOLDOUT entries): its holdout files in the split's order, each
        one's identity (source_identity), the text field, and of the run's parts those that decide the documents'
        ids and what is kept of them (tokenizer, oracle, delimiters, dtype, provenance: their places and text
        checksums, decontamination: their texts' hashes and keys). Not the shares, which decide only how many
        of the documents a run reads (the entry is the prefix an earlier run read), nor the seed, which shuffles
        them into the holdout; not where a huge document is cut, nor the benchmarks: the holdout stage does
        neither."""
        parts = {"format": CACHE_FORMAT, "holdout_format": HOLDOUT_FORMAT, "kind": HOLDOUT,
                 "tokenizer": self.tokenizer, "oracle": self.oracle, "delimiters": self.delimiters,
                 "dtype": self.dtype, "provenance": self.provenance, "decontamination": self.decontamination,
                 "text_field": text_field, "files": files, "sources": sources}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def tokenizer_oracle(library: str = "tokenizers") -> str:
    """The key's oracle part: the library whose ids the tokenizer file's format's are (tokmix.backends.ORACLE_LIBRARY:
    HF tokenizers for a tokenizer.json, tiktoken for ranks, sentencepiece for a .model) and its version: another
    library or version may give other ids, so its units are not this one's."""
    return f"{library} {importlib.metadata.version(library)}"


def source_identity(path: str, file_bytes: int) -> list:
    """What tells one version of a source file from another: its size as the resume check records it and, for a
    local file, its modification time (a file rewritten in place at the same size is another file)."""
    if is_url(path):
        return [file_bytes]
    try:
        return [file_bytes, os.stat(path).st_mtime_ns]
    except OSError:
        return [file_bytes]


# ---------------------------------------------------------------------------- where and how large
def default_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tokmix" / "units"


def resolve(cache: str | None = None, no_cache: bool = False) -> str | None:
    """The cache a run uses: --cache, else TOKMIX_CACHE, else the default folder; None when turned off."""
    if no_cache:
        return None
    value = cache or os.environ.get(ENV) or str(default_root())
    if value.strip().lower() in ("off", "none", "0", "false", "no"):
        return None
    return value.rstrip("/") if is_url(value) else os.path.abspath(os.path.expanduser(value))


def default_cap(root: str) -> int:
    """TOKMIX_CACHE_SIZE, else 50 GiB or a quarter of the local cache's filesystem, whichever is smaller."""
    if os.environ.get(SIZE_ENV):
        try:
            return size_bytes(os.environ[SIZE_ENV])
        except ValueError:
            raise TokmixError(f"{SIZE_ENV} {os.environ[SIZE_ENV]!r}: not a size such as 50GiB or 512MiB") from None
    if is_url(root):
        return DEFAULT_CAP
    path = Path(root)
    while not path.exists() and path.parent != path:
        path = path.parent
    try:
        return min(DEFAULT_CAP, shutil.disk_usage(path).total // 4)
    except OSError:
        return DEFAULT_CAP


def gib(n: int) -> str:
    """A size as people read it: GiB, MiB or KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if n >= 1 << (shift - 2):
            return f"{n / 2**shift:,.1f} {unit}"
    return f"{n / 1024:,.1f} KiB"


# ---------------------------------------------------------------------------- entries
@dataclass
class Entry:
    key: str
    record: dict  # the sealed entry.json: "unit" (the unit's record), "files", "parts" (what the key was made of)
    size: int
    used: float  # last use (LRU)
    held: bool  # a run's units folder links its files, or (store) it was used within STORE_HOLD_SECONDS


class UnitCache:
    """One cache, local or on a store. Workers call `take` and `fill`; `tokmix cache` the rest."""

    def __init__(self, root: str):
        self.root = as_path(root)
        self.remote = storage(self.root).remote
        self.problem: str | None = None  # why the last entry taken or read could not be used (it was removed)

    def __str__(self) -> str:
        return str(self.root)

    def entry_dir(self, key: str) -> Path | ObjectPath:
        return self.root / "entries" / key[:2] / key

    # ------------------------------------------------------------------ the lock (local)
    @contextmanager
    def _locked(self, exclusive: bool = False) -> Iterator[None]:
        """Shared while an entry is linked into a run or filled; exclusive while entries are removed, so that
        no entry goes while a run is taking it. A store has no lock (see STORE_HOLD_SECONDS)."""
        if self.remote:
            yield
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the flock

    # ------------------------------------------------------------------ use
    def _read_entry(self, key: str) -> dict | None:
        """The entry's record; None when there is none, and a damaged one is removed (then None)."""
        try:
            record = read_json(self.entry_dir(key) / ENTRY, sealed=True)
        except DamagedFile as e:
            record, self.problem = None, e.why
        else:
            if record is None or (record.get("key") == key and record.get("format") == CACHE_FORMAT):
                return record
            self.problem = "its record is another entry's"
        self.remove(key)
        return None

    def take(self, key: str, unit_dir: Path | ObjectPath, name: str, limit: int | None,
             accept: Callable[[dict, Callable[[str], bytes]], bool] | None = None) -> dict | None:
        """Put the entry's files in `unit_dir` as unit `name`'s (a hard link where it can, a copy otherwise), each
        checked against the entry's sha256; returns the unit's record as the entry holds it, or None when there
        is no usable entry: none, damaged (removed), partial with fewer tokens than `limit` needs, or not one
        `accept(entry record, read)` takes (`read(part)`: the bytes of one of its extra files, checked)."""
        record = self._read_entry(key)
        if record is None:
            return None
        unit = record["unit"]
        if not record["complete"] and (limit is None or unit["tokens"] < limit):
            return None
        if accept is not None:
            try:
                if not accept(record, lambda part: self._read_extra(key, record, part)):
                    return None
            except (DamagedFile, FileNotFoundError) as e:
                self.problem = getattr(e, "why", "a file of it is missing")
                self._discard(key, record)
                return None
        placing = [(file, UnitFiles(unit_dir, name).path(part), unit[f"{part}_sha256"])
                   for part, file in record["files"].items()]
        if not self._place_checked(key, record, placing, "cache:after-take-file"):
            return None
        return {**unit, "complete": record["complete"]}

    def place(self, key: str, paths: dict[str, Path], fault: str | None = None) -> dict | None:
        """Put an entry's extra files at `paths` (part: where), as `take` does a unit's (a hard link where it
        can, a copy otherwise, each checked against its sha256; the fault point `fault` after each); returns the
        entry's record, None when there is none or it is damaged (removed, and what was placed of it too:
        `problem` says why)."""
        record = self._read_entry(key)
        if record is None:
            return None
        if set(record["extra"]) != set(paths):
            self.problem = f"it holds {', '.join(sorted(record['extra']))}, not {', '.join(sorted(paths))}"
            self._discard(key, record)
            return None
        placing = [(record["extra"][part]["file"], path, record["extra"][part]["sha256"])
                   for part, path in paths.items()]
        return record if self._place_checked(key, record, placing, fault) else None

    def _place_checked(self, key: str, record: dict, placing: list[tuple[str, Path | ObjectPath, str]],
                       fault: str | None = None) -> bool:
        """Place each (entry's file, destination, its sha256), checked, while no eviction can remove the entry;
        a damaged one (or one removed meanwhile) is discarded with what was placed of it: False."""
        if self.remote:
            self._touch(key)  # first: an entry used within STORE_HOLD_SECONDS is not evicted while it is copied
        placed, damaged = [], False
        with self._locked():
            try:
                for file, dst, sha256 in placing:
                    placed.append(dst)
                    if _place(self.entry_dir(key) / file, dst) != sha256:
                        damaged, self.problem = True, f"sha256 of {file} differs from its record"
                        break
                    if fault is not None:
                        fault_point(fault)
            except FileNotFoundError:  # removed (as damaged, by another run) since its record was read
                damaged, self.problem = True, "a file of it is missing"
        if damaged:
            for path in placed:
                path.unlink(missing_ok=True)
            self._discard(key, record)
            return False
        if not self.remote:
            self._touch(key)
        return True

    def _read_extra(self, key: str, record: dict, part: str) -> bytes:
        """One of the entry's extra files (not a unit file: what `accept` judges it by), checked."""
        return self._read_checked(key, record["extra"][part]["file"], record["extra"][part]["sha256"])

    def _read_checked(self, key: str, file: str, sha256: str) -> bytes:
        path = self.entry_dir(key) / file
        data = path.read_bytes()
        if hashlib.new(CHECKSUM, data).hexdigest() != sha256:
            raise DamagedFile(path, f"sha256 of {path.name} differs from its record")
        return data

    def prefix(self, key: str, accept: Callable[[dict, Callable[[str], bytes]], bool] | None = None
               ) -> tuple[dict, bytes, bytes] | None:
        """A partial entry (its unit stopped at an earlier run's budget) for a unit that needs more of its
        documents: the entry's unit record and its tokens' and lengths' bytes, checked against their sha256,
        so that the unit goes on from its last document instead of being tokenized again from its first. None
        when there is none, it is complete, `accept` refuses it, or it is damaged (then removed)."""
        record = self._read_entry(key)
        if record is None or record["complete"]:
            return None
        unit = record["unit"]
        try:
            if accept is not None and not accept(record, lambda part: self._read_extra(key, record, part)):
                return None
            with self._locked():  # as a take: no eviction or replacement while its files are read
                tokens = self._read_checked(key, record["files"][TOKENS], unit[f"{TOKENS}_sha256"])
                lengths = self._read_checked(key, record["files"][LENGTHS], unit[f"{LENGTHS}_sha256"])
        except (DamagedFile, FileNotFoundError) as e:
            self.problem = getattr(e, "why", "a file of it is missing")
            self._discard(key, record)
            return None
        self._touch(key)
        return unit, tokens, lengths

    def take_files(self, key: str) -> tuple[dict, dict[str, bytes]] | None:
        """An entry held whole in memory (a stream's holdout documents, HOLDOUT): its record and the bytes of each
        of its files, checked against their sha256 while no eviction can remove it. None when there is none, or
        it is damaged (then removed: `problem` says why)."""
        record = self._read_entry(key)
        if record is None:
            return None
        if self.remote:
            self._touch(key)  # first, as a take: an entry used within STORE_HOLD_SECONDS is not evicted
        try:
            with self._locked():
                files = {part: self._read_extra(key, record, part) for part in record["extra"]}
        except (DamagedFile, FileNotFoundError) as e:
            self.problem = getattr(e, "why", "a file of it is missing")
            self._discard(key, record)
            return None
        if not self.remote:
            self._touch(key)
        return record, files

    def holds(self, key: str, limit: int | None = None) -> int:
        """Tokens the entry would give a unit (0: none, or a partial one short of `limit`), from its record alone
        (for `tokmix plan`; a run checks the files as it takes them)."""
        try:
            record = read_json(self.entry_dir(key) / ENTRY, sealed=True)
        except (DamagedFile, OSError):
            return 0
        if record is None or (not record.get("complete") and (limit is None or record["unit"]["tokens"] < limit)):
            return 0
        return record["unit"]["tokens"]

    def _touch(self, key: str) -> None:
        """Mark the entry used now (LRU)."""
        try:
            if self.remote:
                write_bytes(self.root / "used" / key, str(time.time()).encode())
            else:
                os.utime(self.entry_dir(key) / ENTRY)
        except OSError:
            pass  # an entry evicted meanwhile, a read-only cache: its age is only the eviction's order

    # ------------------------------------------------------------------ fill
    def fill(self, key: str, unit_dir: Path | ObjectPath | None, name: str, unit: dict, complete: bool,
             parts: dict, extra: dict[str, bytes | tuple[Path, str]] | None = None, replace: bool = False,
             kind: str | None = None) -> bool:
        """Add a committed unit (its record `unit`, its files in `unit_dir`) as the entry `key`, unless a
        complete one is there (or a partial one holds as much). Nothing half-made is ever visible: locally the
        entry is made in tmp/ and renamed into place whole; on a store its files come first under names of
        their content, its record last. Two runs filling one entry at once write the same bytes; one wins.
        An entry of another `kind` (HOLDOUT, a benchmark set) has only `extra` files (each its bytes, or a file
        and its sha256: linked where it can be, copied otherwise), and `unit` is the record of what it holds."""
        existing = self._read_entry(key)
        if existing is not None and not replace and (existing["complete"]
                                                     or existing["unit"]["tokens"] >= unit["tokens"]):
            return False
        files = {part: f"{unit[f'{part}_sha256'][:16]}.{part}" for part in CONTENT if f"{part}_sha256" in unit}
        extras = {part: data if isinstance(data, tuple) else (data, hashlib.new(CHECKSUM, data).hexdigest())
                  for part, data in (extra or {}).items()}
        entry = {"key": key, "format": CACHE_FORMAT, **({"kind": kind} if kind else {}), "complete": complete,
                 "unit": unit, "files": files,
                 "extra": {part: {"file": f"{sha[:16]}.{part}", "sha256": sha} for part, (_, sha) in extras.items()},
                 "parts": parts, "bytes": 0, "created": time.time()}
        if self.remote:
            return self._fill_store(key, unit_dir, name, entry, extras)
        tmp = self.root / "tmp" / f"{key}.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}"
        shutil.rmtree(tmp, ignore_errors=True)  # a killed fill of this process and thread's id, long gone
        tmp.mkdir(parents=True)
        try:
            for part, file in files.items():
                got = _place(UnitFiles(unit_dir, name).path(part), tmp / file, check=False)
                if got not in (None, unit[f"{part}_sha256"]):
                    return False  # the run's own unit changed under it: not a unit to share
                entry["bytes"] += (tmp / file).stat().st_size
            for part, (data, sha256) in extras.items():
                if not _put(data, sha256, tmp / entry["extra"][part]["file"], entry):
                    return False  # the run's own file changed under it
            write_record(tmp / ENTRY, entry)
            _fsync_dir(tmp)
            fault_point(_fill_fault(entry), parts.get("stream"))
            target = self.entry_dir(key)
            target.parent.mkdir(parents=True, exist_ok=True)
            with self._locked(exclusive=existing is not None):
                if existing is not None:  # a partial entry, replaced by this larger one
                    self._remove_local(key)
                try:
                    os.rename(tmp, target)
                except OSError as e:
                    if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise
                    return False  # another run filled it first, with the same bytes
            _fsync_dir(target.parent)
            return True
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _fill_store(self, key: str, unit_dir, name: str, entry: dict, extras: dict) -> bool:
        target = self.entry_dir(key)
        for part, file in entry["files"].items():
            got = _place(UnitFiles(unit_dir, name).path(part), target / file)
            if got != entry["unit"][f"{part}_sha256"]:
                return False
            entry["bytes"] += (target / file).stat().st_size
        for part, (data, sha256) in extras.items():
            if not _put(data, sha256, target / entry["extra"][part]["file"], entry):
                return False
        fault_point(_fill_fault(entry), entry["parts"].get("stream"))
        write_record(target / ENTRY, entry)  # the commit: an entry without its record is invisible
        self._touch(key)
        return True

    # ------------------------------------------------------------------ listing, removing
    def entries(self) -> Iterator[Entry]:
        """Every committed entry (a damaged record is reported as such by verify, skipped here)."""
        for record_path in self._entry_records():
            key = record_path.parent.name
            try:
                record = read_json(record_path, sealed=True)
            except DamagedFile:
                continue
            if record is None:
                continue
            yield Entry(key, record, record.get("bytes", 0), *self._use(key, record_path, record))

    def _entry_records(self) -> list:
        if self.remote:
            return self.root.glob(f"entries/*/*/{ENTRY}")
        return sorted((self.root / "entries").glob(f"*/*/{ENTRY}"))

    def _use(self, key: str, record_path, record: dict) -> tuple[float, bool]:
        """(last use, held) of an entry."""
        if self.remote:
            marker = self.root / "used" / key
            try:
                used = float(marker.read_text())
            except (FileNotFoundError, ValueError):
                used = record.get("created", 0.0)
            return used, time.time() - used < STORE_HOLD_SECONDS
        try:
            used = os.stat(record_path).st_mtime
        except FileNotFoundError:
            return 0.0, False
        held = False
        for file in record.get("files", {}).values():
            try:
                held |= os.stat(record_path.parent / file).st_nlink > 1  # a run's units folder links it
            except FileNotFoundError:
                pass
        return used, held

    def _discard(self, key: str, record: dict) -> None:
        """Remove the damaged entry `record` was read from, unless another run has put a new one in its place
        since (a larger unit replacing a partial entry): that one is checked when it is used."""
        if not self.remote:
            with self._locked(exclusive=True):
                try:
                    now = read_json(self.entry_dir(key) / ENTRY, sealed=True)
                except DamagedFile:
                    now = None
                if now is None or now == record:
                    self._remove_local(key)
            return
        self.remove(key)

    def remove(self, key: str) -> None:
        """Remove one entry, its record first (the record is the commit)."""
        if self.remote:
            directory = self.entry_dir(key)
            (directory / ENTRY).unlink(missing_ok=True)
            for path in directory.iterdir():
                path.unlink(missing_ok=True)
            (self.root / "used" / key).unlink(missing_ok=True)
            return
        with self._locked(exclusive=True):
            self._remove_local(key)

    def _remove_local(self, key: str) -> None:
        directory = self.entry_dir(key)
        if not directory.exists():
            return
        gone = self.root / "tmp" / f"removed.{key}.{os.getpid()}.{time.monotonic_ns()}"
        gone.parent.mkdir(parents=True, exist_ok=True)
        os.rename(directory, gone)  # gone from entries/ in one step
        shutil.rmtree(gone, ignore_errors=True)

    def sweep_tmp(self) -> int:
        """Remove what killed fills left in tmp/ (local; older than TMP_STALE_SECONDS); returns how many."""
        if self.remote or not (self.root / "tmp").exists():
            return 0
        swept = 0
        for path in (self.root / "tmp").iterdir():
            try:
                stale = time.time() - path.stat().st_mtime > TMP_STALE_SECONDS or path.name.startswith("removed.")
            except FileNotFoundError:
                continue
            if stale:
                shutil.rmtree(path, ignore_errors=True)
                swept += 1
        return swept

    def size(self) -> tuple[int, int]:
        """(bytes, entries)."""
        total = count = 0
        for entry in self.entries():
            total, count = total + entry.size, count + 1
        return total, count

    def evict(self, cap: int, *, older_than: float | None = None, tokenizer: str | None = None) -> tuple[int, int]:
        """Remove least recently used entries until the cache holds at most `cap` bytes, and (prune) every entry
        last used more than `older_than` seconds ago or made with the tokenizer of sha256 prefix `tokenizer`;
        never one a running run holds. Returns (entries removed, bytes freed)."""
        with self._locked(exclusive=True):
            entries = sorted(self.entries(), key=lambda e: e.used)
            total = sum(e.size for e in entries)
            removed = freed = 0
            now = time.time()
            for entry in entries:
                doomed = ((older_than is not None and now - entry.used > older_than)
                          or (tokenizer is not None
                              and entry.record["parts"].get("tokenizer", "").startswith(tokenizer))
                          or total - freed > cap)
                if not doomed or entry.held:
                    continue
                if self.remote:
                    self.remove(entry.key)
                else:
                    self._remove_local(entry.key)
                removed, freed = removed + 1, freed + entry.size
        self.sweep_tmp()
        return removed, freed

    def verify(self) -> tuple[int, list[str]]:
        """Check every entry's record and files against their sha256; a damaged one is removed. Returns (entries
        whole, one line per damaged entry)."""
        whole, problems = 0, []
        for record_path in self._entry_records():
            key = record_path.parent.name
            why = self._damage(key, record_path)
            if why is None:
                whole += 1
                continue
            problems.append(f"{record_path.parent}: {why}; removed")
            self.remove(key)
        return whole, problems

    def _damage(self, key: str, record_path) -> str | None:
        try:
            record = read_json(record_path, sealed=True)
        except DamagedFile as e:
            return e.why
        if record is None:
            return "its record is gone"
        if record.get("key") != key:
            return "its record is another entry's"
        for part, file in record["files"].items():
            path = record_path.parent / file
            if not path.exists():
                return f"{file} is missing"
            if file_checksum(path) != record["unit"][f"{part}_sha256"]:
                return f"sha256 of {file} differs from its record"
        for extra in record.get("extra", {}).values():
            path = record_path.parent / extra["file"]
            if not path.exists():
                return f"{extra['file']} is missing"
            if file_checksum(path) != extra["sha256"]:
                return f"sha256 of {extra['file']} differs from its record"
        return None


# ---------------------------------------------------------------------------- files
def _place(src: Path | ObjectPath, dst: Path | ObjectPath, check: bool = True) -> str | None:
    """Make `dst` hold `src`'s bytes (a hard link on one filesystem: no second copy; else a copy, committed
    under its final name whole) and return their sha256, read from what `dst` now holds (a link made without
    `check`: None, the caller knows the file's sha256)."""
    if not storage(src).remote and not storage(dst).remote:
        tmp = dst.with_name(f"{dst.name}.tmp-{os.getpid()}")  # as shards' temporary names: swept by a resume
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        else:
            os.replace(tmp, dst)
            return file_checksum(dst) if check else None
        os.replace(tmp, dst)
        return file_checksum(dst)
    if storage(dst).remote:  # an upload: the object appears whole when it completes, or never
        h = hashlib.new(CHECKSUM)
        out = dst.open("wb")
        try:
            with open_read(src, fetch=COPY_BYTES) as f:
                while data := f.read(COPY_BYTES):
                    h.update(data)
                    out.write(data)
        except BaseException:
            abort_upload(out)
            raise
        out.close()
        return h.hexdigest()
    tmp = dst.with_name(f"{dst.name}.tmp-{os.getpid()}")
    h = hashlib.new(CHECKSUM)
    with open_read(src, fetch=COPY_BYTES) as f, open(tmp, "wb") as out:
        while data := f.read(COPY_BYTES):
            h.update(data)
            out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, dst)
    return h.hexdigest()


def _put(data: bytes | Path, sha256: str, dst: Path | ObjectPath, entry: dict) -> bool:
    """An extra file of an entry being filled: its bytes written, or a file placed (linked or copied; False
    when what it holds is not `sha256`); its size added to the entry's."""
    if isinstance(data, bytes):
        write_bytes(dst, data)
        entry["bytes"] += len(data)
        return True
    if _place(data, dst, check=False) not in (None, sha256):
        return False
    entry["bytes"] += dst.stat().st_size
    return True


def _fill_fault(entry: dict) -> str:
    """The fault point inside a fill, before it becomes visible: a unit's, or cache:holdout-fill-before-rename."""
    return f"cache:{entry['kind']}-fill-before-rename" if "kind" in entry else "cache:fill-before-rename"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- what `tokmix cache` shows
def summary(entries: list[Entry]) -> dict:
    """Bytes and entries in all, by kind (work units, streams' holdout documents), by tokenizer (its sha256 and
    path) and by source file."""
    by_kind: dict[str, list] = {}
    by_tokenizer: dict[str, list] = {}
    by_source: dict[str, list] = {}
    for entry in entries:
        row = by_kind.setdefault(f"{entry.record.get('kind', 'unit')}s", [0, 0])
        row[0], row[1] = row[0] + 1, row[1] + entry.size
        parts = entry.record.get("parts", {})
        if "tokenizer" in parts:  # (a benchmark set has none)
            tok = f"{parts['tokenizer'][:12]} {parts.get('tokenizer_path', '')}".strip()
            row = by_tokenizer.setdefault(tok, [0, 0])
            row[0], row[1] = row[0] + 1, row[1] + entry.size
        sources = parts.get("sources") or ["?"]
        for source in sources:
            row = by_source.setdefault(source, [0, 0])
            row[0], row[1] = row[0] + 1, row[1] + entry.size // len(sources)
    return {"entries": len(entries), "bytes": sum(e.size for e in entries),
            "tokens": sum(e.record["unit"].get("tokens", 0) for e in entries),
            "held": sum(1 for e in entries if e.held), "by_kind": by_kind, "by_tokenizer": by_tokenizer,
            "by_source": by_source}
