"""Where source files are and how they are opened: local paths, globs, any fsspec URL (hf:// included), and
--mirror prefixes that read a remote dataset from a local copy. A remote failure is one line naming the URL."""

from __future__ import annotations

import os
import re
import socket
from contextlib import contextmanager

import fsspec
from fsspec.utils import glob_translate

from tokmix.errors import TokmixError
from tokmix.mirrors import remap
from tokmix.shards import NotAFile, check_regular


def _is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


def _mirror_hint(url: str) -> str:
    """The --mirror prefix a user would give for `url`: a Hub dataset's root, else the bucket."""
    scheme, _, rest = url.partition("://")
    keep = 3 if scheme == "hf" and rest.startswith(("datasets/", "spaces/")) else 1
    return f"{scheme}://{'/'.join(rest.split('/')[:keep])}"


@contextmanager
def remote_errors(url: str, mirrors: list[tuple[str, str]]):
    """A remote file system's failure (no network, a refused request: httpx, aiohttp, botocore each raise their
    own types) as one line naming the URL and the local copy --mirror would read instead. Local files and
    tokmix's own errors pass through."""
    try:
        yield
    except TokmixError:
        raise
    except FileNotFoundError as e:  # fsspec's http raises it for a server that does not answer, from the cause
        cause = e.__cause__
        if cause is None or not _is_remote(remap(url, mirrors)) or not _offline(cause):
            raise
        raise _remote_failure(url, cause) from None
    except Exception as e:
        if not _is_remote(remap(url, mirrors)):
            raise
        raise _remote_failure(url, e) from None


def _offline(e: BaseException) -> bool:
    kinds = " ".join(c.__name__ for c in type(e).__mro__)
    return isinstance(e, (ConnectionError, TimeoutError, socket.gaierror)) or "Connect" in kinds or "Timeout" in kinds


def _remote_failure(url: str, e: BaseException) -> TokmixError:
    how = "unreachable" if _offline(e) else "cannot be read"
    detail = (str(e).splitlines() or [""])[0][:200]
    return TokmixError(f"{url}: {how} ({type(e).__name__}: {detail}); check the network, or read a local copy "
                       f"with --mirror {_mirror_hint(url)}=LOCAL_DIR")


def open_file(url: str, mirrors: list[tuple[str, str]], mode: str = "rb"):
    """The file, opened: a local path directly (fsspec's local layer costs ~0.2 ms a call, minutes over a
    stream of 50,000 small files), a URL through fsspec."""
    path = remap(url, mirrors)
    if "://" not in path:
        return open(path, mode)
    with remote_errors(url, mirrors):
        return fsspec.open(path, mode).open()


def file_size(url: str, mirrors: list[tuple[str, str]]) -> int:
    path = remap(url, mirrors)
    if "://" not in path:  # as open_file
        return os.stat(path).st_size
    with remote_errors(url, mirrors):
        fs, path = fsspec.core.url_to_fs(path)
        return int(fs.size(path))


def _has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def normalize(path: str) -> str:
    return path if "://" in path else os.path.normpath(os.path.abspath(path))


def expand(pattern: str, mirrors: list[tuple[str, str]]) -> list[str]:
    """Files a resolved pattern names, sorted; a URL keeps its protocol, a local path stays a path."""
    if not _has_magic(pattern):
        return [normalize(pattern)]
    local = remap(pattern, mirrors)
    with remote_errors(pattern, mirrors):
        fs, path = fsspec.core.url_to_fs(local)
        isdir = os.path.isdir if "://" not in local else fs.isdir
        found = sorted(p for p in fs.glob(path) if not isdir(p))
    if "://" not in local:  # a FIFO, device or socket a glob matches is named here, never opened (it could block)
        for p in found:
            try:
                check_regular(p)
            except NotAFile as e:
                raise TokmixError(f"{p}: matched by {pattern}: is {e.kind}, not a regular file; tokmix reads only "
                                  "regular files (move it away or narrow the pattern)") from None
            except FileNotFoundError:
                pass  # a dangling link: named by the reader
    if local == pattern:  # not mirrored: name files the way the pattern did
        return [fs.unstrip_protocol(p) if "://" in pattern else normalize(p) for p in found]
    # mirrored: name files by their original URL so the split file does not depend on where the copy lives
    root = remap(pattern.split("*")[0].rsplit("/", 1)[0], mirrors)
    root_path = fsspec.core.url_to_fs(root)[1]
    prefix = pattern.split("*")[0].rsplit("/", 1)[0]
    return [prefix + p[len(root_path) :] for p in found]


def literal_brackets(pattern: str) -> str:
    """The pattern with each "[" made literal ("[[]"): how a path holding one is named in a glob."""
    return pattern.replace("[", "[[]")


def matches_with_literal_brackets(pattern: str, mirrors: list[tuple[str, str]]) -> bool:
    """For a pattern that matched nothing: whether literal_brackets(pattern) matches files (a folder named
    "data [v2]", where "[v2]" as a glob is one character of "v" or "2")."""
    if "[" not in pattern:
        return False
    try:
        return bool(expand(literal_brackets(pattern), mirrors))
    except (OSError, TokmixError):
        return False


def matcher(patterns: list[str]) -> re.Pattern:
    return re.compile("|".join(f"(?:{glob_translate(normalize(p))})" for p in patterns))


