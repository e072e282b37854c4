"""Output on object storage (s3://, gs://, any fsspec URL): the run works in a local directory, with its
atomic renames and resumable state, and publishes the validated result. An object store has no atomic
rename, so publishing relies on what it does have: an object appears whole or not at all. Every file is
uploaded under a temporary name and moved to its final, write-once name; index.json, the commit record,
goes last, so a reader that finds it finds every file it names. A publish that was interrupted is simply
run again: objects already there with the right size are kept."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import fsspec

from tokmix.errors import TokmixError
from tokmix.faults import fault_point
from tokmix.shards import INDEX_NAME, read_index


def is_remote(out: str | os.PathLike) -> bool:
    text = str(out)
    return "://" in text and not text.startswith("file://")


def local_path(out: str | os.PathLike) -> Path:
    text = str(out)
    return Path(text[len("file://"):] if text.startswith("file://") else text)


def staging_dir(url: str, work: str | os.PathLike | None) -> Path:
    """Where a run for `url` works: --work, or a folder under the user's cache named after the URL."""
    if work:
        return Path(work)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "tokmix" / "runs" / hashlib.sha256(url.encode()).hexdigest()[:16]


def published_files(local: Path) -> list[str]:
    """The files a consumer reads, in upload order: holdouts, shards (each with its provenance index), the
    tokenizer if trained, index last."""
    index = read_index(local)
    entries = [*index.get("val", {}).values(), *index.get("shards", [])]
    names = [name for e in entries for name in (e["file"], e.get("provenance", {}).get("file")) if name]
    if (local / "tokenizer.json").exists():
        names.append("tokenizer.json")
    return [*names, INDEX_NAME]


def publish(local: Path, url: str) -> list[str]:
    """Upload a finished run to `url`; returns the names uploaded (those already there are skipped)."""
    fs, root = fsspec.core.url_to_fs(url)
    try:
        fs.makedirs(root, exist_ok=True)
    except OSError as e:
        raise TokmixError(f"output {url}: cannot create it ({e})") from None
    for stale in fs.glob(f"{root.rstrip('/')}/*.tmp-*"):  # left by an interrupted publish
        fs.rm(stale)
    uploaded = []
    for name in published_files(local):
        src, dst = local / name, f"{root.rstrip('/')}/{name}"
        if name != INDEX_NAME and fs.exists(dst) and fs.size(dst) == src.stat().st_size:
            continue  # written by an earlier, interrupted publish: write-once names, same content
        tmp = f"{dst}.tmp-{os.getpid()}"
        try:
            fs.put_file(str(src), tmp)
            fault_point("publish:before-move")
            fs.mv(tmp, dst)
        except OSError as e:
            raise TokmixError(f"output {url}: uploading {name} failed ({e}); run the same command again to "
                              "resume the upload") from None
        uploaded.append(name)
    return uploaded
