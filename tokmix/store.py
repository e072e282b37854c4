"""Where output is stored, chosen once per path by `storage()`: local files (`LOCAL`: written under a temporary
name and renamed into place, tokmix.format.commit) or an object store (`OBJECTS`: s3://, gs://, any fsspec
URL, through `ObjectPath`, the part of pathlib.Path that tokmix's stages use, so that workers write units and
shards straight to the store). An object store has no rename: an object is written under its final,
write-once name (it appears whole when its upload completes, or not at all), and a small record written after
it commits it. The run's lock and its bookkeeping stay in a local working directory (`work_dir`): the kernel
lock cannot live on a store. No other module asks which of the two a path is."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, BinaryIO

from tokmix.format.commit import (
    check_regular,
    commit,
    drop_tmp,
    open_regular,
    publish,
    start_writeback,
    tmp_name,
    write_in_halves,
)

if TYPE_CHECKING:  # numpy is imported where arrays are mapped or read: a supervisor or `tokmix status` needs none
    import numpy as np

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


def store_problem(e: BaseException) -> str | None:
    """What a store's failure means, in the user's words (credentials, permissions, unreachable, no bucket), from
    the exception botocore, s3fs, aiohttp, gcsfs or google-auth raised; None when it is not a store's failure."""
    kinds = " ".join(c.__name__ for c in type(e).__mro__)
    text = f"{kinds} {e}"
    detail = (str(e).splitlines() or [""])[0][:160] or type(e).__name__
    if any(k in text for k in ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError",
                               "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                               "Unable to locate credentials", "RefreshError")):
        return f"the store refused the credentials ({type(e).__name__}: {detail}): check them (AWS_* / " \
               "GOOGLE_APPLICATION_CREDENTIALS, or fsspec's config)"
    if isinstance(e, PermissionError) or any(k in text for k in ("AccessDenied", "Forbidden", " 403")):
        return f"permission denied ({type(e).__name__}: {detail}): the credentials may not read and write there"
    if isinstance(e, (ConnectionError, TimeoutError)) or any(k in kinds for k in (
            "EndpointConnectionError", "ConnectionError", "ClientConnectorError", "ConnectTimeout", "ReadTimeout",
            "ServerDisconnectedError", "ClientOSError")):
        return f"the store is unreachable ({type(e).__name__}: {detail})"
    if "NoSuchBucket" in text:
        return f"no such bucket ({detail})"
    return None


def _lost_requests(loop, context: dict) -> None:
    """The exception handler of an async store's event loop (s3fs, gcsfs: fsspec's IO thread). When the store
    goes away, aiohttp leaves the requests in flight as tasks whose exception nobody awaits, and asyncio prints
    each with its traceback; the call that failed already raised the same failure, which the run reports in one
    line (store_problem). Those are dropped; anything else is asyncio's to print."""
    error = context.get("exception")
    if error is not None and store_problem(error) is not None:
        return
    loop.default_exception_handler(context)


def claim_object(path: ObjectPath, data: bytes) -> bool:
    """Create the object only if there is none (S3's If-None-Match, GCS's generation match: the store decides, so
    of writers racing to create it exactly one does); False when it already exists."""
    fs, key = path._fresh()
    try:
        fs.pipe_file(key, data, mode="create")
    except FileExistsError:
        return False
    except Exception as e:  # a store that answers the condition with its own error type
        if "PreconditionFailed" in f"{type(e).__name__} {e}" or getattr(e, "code", None) == 412:
            return False
        raise
    return True


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
        if getattr(fs, "loop", None) is not None and fs.loop.get_exception_handler() is not _lost_requests:
            fs.loop.set_exception_handler(_lost_requests)
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


# ---------------------------------------------------------------------------- the two storages, one interface
class Pending:
    """A file being written (`f`), visible under its final name only once committed."""

    def __init__(self, path: Path | ObjectPath, f: BinaryIO, tmp: Path | None):
        self.path, self.f, self.tmp = path, f, tmp

    def written(self) -> None:
        """Called after each write: a local file's pages start going to disk."""
        if self.tmp is not None:
            start_writeback(self.f)

    def commit(self, before_commit=None) -> None:
        """Make the file visible, whole; `before_commit` runs between writing and renaming (for a store: before
        the upload completes)."""
        if self.tmp is None:
            if before_commit:
                before_commit()
            self.f.close()
            return
        try:
            self.f.flush()
            os.fsync(self.f.fileno())
        except OSError as e:  # a full disk shows at the flush too: say which file
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        self.f.close()
        if before_commit:
            before_commit()
        publish(self.tmp, self.path)

    def abort(self) -> None:
        if self.tmp is None:
            abort_upload(self.f)
            return
        self.f.close()
        drop_tmp(self.tmp)


class LocalFiles:
    """A local or shared filesystem."""

    remote = False

    def write(self, path: Path, data: bytes | memoryview, durable: bool = True) -> None:
        tmp = tmp_name(path)
        try:
            with open(tmp, "wb") as f:
                write_in_halves(f, data)
            commit(tmp, path, durable)
        except OSError as e:  # a full disk: the message names the file being written, which the OS does not
            drop_tmp(tmp)
            raise OSError(e.errno, e.strerror, str(path)) from None

    def write_array(self, path: Path, array: np.ndarray) -> None:
        tmp = tmp_name(path)
        array.tofile(tmp)  # no copy of the array in bytes
        commit(tmp, path)

    def create(self, path: Path) -> Pending:
        tmp = tmp_name(path)
        return Pending(path, open(tmp, "wb"), tmp)

    def map(self, path: Path, dtype: np.dtype | str) -> np.ndarray:
        """The file's items, memory-mapped read-only: a plain ndarray over the mapping, not an np.memmap (slicing a
        memmap runs Python code for every slice, which per-document gathers pay for). Only a regular file is
        mapped or read (check_regular: a FIFO or a device in a shard's place is named, never opened)."""
        import numpy as np

        if check_regular(path).st_size == 0:
            return np.empty(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r").view(np.ndarray)

    def open_read(self, path: Path, buffering: int, fetch: int) -> BinaryIO:
        return os.fdopen(open_regular(path), "rb", buffering=buffering)

    def read_array(self, path: Path, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
        import numpy as np

        check_regular(path)
        return np.fromfile(path, dtype=dtype, count=count, offset=offset * dtype.itemsize)


class ObjectStore:
    """An fsspec object store, through ObjectPath."""

    remote = True

    def write(self, path: ObjectPath, data: bytes | memoryview, durable: bool = True) -> None:
        """One object, whole or not at all: its upload completes at close (an error or a kill on the way leaves
        no object under its name)."""
        f = path.open("wb")
        try:
            write_in_halves(f, data)
        except BaseException:
            abort_upload(f)
            raise
        f.close()

    def write_array(self, path: ObjectPath, array: np.ndarray) -> None:
        import numpy as np

        self.write(path, memoryview(np.ascontiguousarray(array)).cast("B"))

    def create(self, path: ObjectPath) -> Pending:
        return Pending(path, path.open("wb"), None)  # the object's upload, under its final name

    def map(self, path: ObjectPath, dtype: np.dtype | str) -> np.ndarray:
        """An object is read whole."""
        import numpy as np

        return np.frombuffer(path.read_bytes(), dtype=dtype)

    def open_read(self, path: ObjectPath, buffering: int, fetch: int) -> BinaryIO:
        return path.open("rb", buffering=fetch)

    def read_array(self, path: ObjectPath, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
        import numpy as np

        stop = None if count < 0 else (offset + count) * dtype.itemsize
        return np.frombuffer(path.read_range(offset * dtype.itemsize, stop), dtype=dtype)


LOCAL, OBJECTS = LocalFiles(), ObjectStore()


def storage(path: str | os.PathLike | ObjectPath) -> LocalFiles | ObjectStore:
    """Where `path` is stored: the one place that asks."""
    return OBJECTS if isinstance(as_path(path), ObjectPath) else LOCAL
