"""Output on object storage (s3://, gs://, any fsspec URL): `ObjectPath`, the part of pathlib.Path that tokmix's
stages use, over an fsspec store, so that workers write units and shards straight to the store. An object store
has no rename: an object is written under its final, write-once name (it appears whole when its upload
completes, or not at all), and a small record written after it commits it. The run's lock and its bookkeeping
stay in a local working directory (`work_dir`): the kernel lock cannot live on a store."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any, BinaryIO

# Bytes an upload buffers before it sends them as one part of a multipart upload (S3 takes parts of 5 MiB to
# 5 GiB, GCS multiples of 256 KiB): a writer holds at most this much of an object in memory.
UPLOAD_PART_BYTES = 16 << 20
READ_BLOCK_BYTES = 1 << 20  # bytes fetched per read request when a reader does not say


def is_url(out: str | os.PathLike | ObjectPath) -> bool:
    """Whether `out` names a store rather than a local path (a file:// URL is the local path it names)."""
    if isinstance(out, ObjectPath):
        return True
    text = str(out)
    return "://" in text and not text.startswith("file://")


def local_path(out: str | os.PathLike) -> Path:
    text = str(out)
    return Path(text[len("file://"):] if text.startswith("file://") else text)


def as_path(path: str | os.PathLike | ObjectPath) -> Path | ObjectPath:
    """A local Path, or an ObjectPath for a URL: what a task description's path strings are turned back into."""
    if isinstance(path, (Path, ObjectPath)):
        return path
    return ObjectPath(str(path)) if is_url(path) else local_path(path)


def work_dir(url: str, work: str | os.PathLike | None) -> Path:
    """Where a run writing to `url` keeps its lock and bookkeeping: --work, or a folder under the user's cache
    named after the URL."""
    if work:
        return Path(os.path.abspath(work))
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "tokmix" / "runs" / hashlib.sha256(url.encode()).hexdigest()[:16]


def check_store_url(url: str) -> None:
    """Refuse, in one line, a URL that tokmix's stage process and workers cannot share."""
    from tokmix.errors import TokmixError

    if "::" in url:
        raise TokmixError(f"output {url}: chained URLs are not an output tokmix writes to; name the store itself")
    if url.startswith("memory://"):
        raise TokmixError(f"output {url}: fsspec's memory filesystem lives in one process, and tokmix writes "
                          "from its stage process and workers: use a local directory or a real store")


class ObjectPath:
    """A path on an fsspec store, `scheme://bucket/key`, with the part of pathlib.Path's interface that the
    stages use. Folders are prefixes: making one does nothing, and it exists while an object is under it.
    Every question about what is there asks the store (fsspec's listing cache is dropped first: another
    process, a worker, may have written since)."""

    __slots__ = ("url",)

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    # ------------------------------------------------------------------ names (no I/O)
    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"ObjectPath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __lt__(self, other: ObjectPath) -> bool:
        return self.url < other.url

    def __truediv__(self, name: str | os.PathLike) -> ObjectPath:
        return ObjectPath(f"{self.url}/{str(name).strip('/')}")

    @property
    def _split(self) -> tuple[str, str]:
        scheme, _, rest = self.url.partition("://")
        return scheme, rest

    @property
    def name(self) -> str:
        return PurePosixPath(self._split[1]).name

    @property
    def stem(self) -> str:
        return PurePosixPath(self._split[1]).stem

    @property
    def suffix(self) -> str:
        return PurePosixPath(self._split[1]).suffix

    @property
    def parts(self) -> tuple[str, ...]:
        return PurePosixPath(self._split[1]).parts

    @property
    def parent(self) -> ObjectPath:
        scheme, rest = self._split
        return ObjectPath(f"{scheme}://{PurePosixPath(rest).parent}") if "/" in rest else self

    @property
    def parents(self) -> list[ObjectPath]:
        found, path = [], self
        while path.parent != path:
            path = path.parent
            found.append(path)
        return found

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    def relative_to(self, other: ObjectPath) -> PurePosixPath:
        if not self.url.startswith(other.url + "/"):
            raise ValueError(f"{self} is not under {other}")
        return PurePosixPath(self.url[len(other.url) + 1:])

    # ------------------------------------------------------------------ the store
    @property
    def _fs(self) -> tuple[Any, str]:
        import fsspec  # only here: the supervisor imports this module, and most runs are local

        fs, path = fsspec.core.url_to_fs(self.url)
        return fs, path

    def _fresh(self) -> tuple[Any, str]:
        fs, path = self._fs
        fs.invalidate_cache(path)
        return fs, path

    def _child(self, path: str) -> ObjectPath:
        return ObjectPath(f"{self._split[0]}://{path.rstrip('/')}")

    def exists(self) -> bool:
        fs, path = self._fresh()
        return fs.exists(path)

    def is_file(self) -> bool:
        fs, path = self._fresh()
        return fs.isfile(path)

    def is_dir(self) -> bool:
        fs, path = self._fresh()
        return fs.isdir(path)

    def is_symlink(self) -> bool:
        return False  # a store has no links

    def stat(self) -> SimpleNamespace:
        fs, path = self._fresh()
        return SimpleNamespace(st_size=fs.size(path))

    def iterdir(self) -> list[ObjectPath]:
        fs, path = self._fresh()
        try:
            return sorted(self._child(p) for p in fs.ls(path, detail=False) if p.rstrip("/") != path)
        except FileNotFoundError:
            return []

    def glob(self, pattern: str) -> list[ObjectPath]:
        fs, path = self._fs
        fs.invalidate_cache()  # a pattern may span several prefixes
        return sorted(self._child(p) for p in fs.glob(f"{path}/{pattern}"))

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """A folder on a store is the prefix of its objects: nothing to make."""

    def rmdir(self) -> None:
        """A prefix goes with its last object."""

    def unlink(self, missing_ok: bool = False) -> None:
        fs, path = self._fresh()
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def open(self, mode: str = "rb", buffering: int = -1) -> BinaryIO:
        """A file object: reading fetches `buffering` bytes per request; writing uploads UPLOAD_PART_BYTES per
        part, and the object appears, whole, when the file is closed (ObjectWriter.abort: never)."""
        fs, path = self._fs
        if "r" in mode:
            return fs.open(path, mode, block_size=buffering if buffering > 0 else READ_BLOCK_BYTES)
        return fs.open(path, mode, block_size=UPLOAD_PART_BYTES)

    def read_bytes(self) -> bytes:
        fs, path = self._fs
        return fs.cat_file(path)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def read_range(self, start: int, stop: int) -> bytes:
        fs, path = self._fs
        return fs.cat_file(path, start=start, end=stop)


def abort_upload(f: BinaryIO) -> None:
    """Give up an upload: the object never appears (s3fs aborts its multipart upload). A store file object's
    close() would complete the upload, also when the garbage collector calls it: marked closed here instead."""
    discard = getattr(f, "discard", None)
    if discard is not None:
        discard()
    f.closed = True
