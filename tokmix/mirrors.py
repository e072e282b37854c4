"""`--mirror PREFIX=LOCAL_DIR`: read the files under a URL prefix from a local copy. The one parser of the
option, for the supervisor (which makes LOCAL_DIR absolute and keeps the output directory off the inputs), the
stage process and the commands that read sources. Imports `errors` alone."""

from __future__ import annotations

import os

from tokmix.errors import TokmixError

Mirrors = list[tuple[str, str]]  # (URL prefix, local folder), neither ending in "/"


def split_mirror(spec: str) -> tuple[str, str] | None:
    """A `PREFIX=LOCAL_DIR` spec's two parts, None when it is not one."""
    prefix, sep, local = spec.partition("=")
    return (prefix, local) if sep and prefix and local else None


def parse_mirrors(specs: list[str] | None) -> Mirrors:
    """`hf://datasets/ORG/NAME=LOCAL_DIR` pairs: files under the prefix are read from the local copy."""
    mirrors = []
    for spec in specs or []:
        if (parts := split_mirror(spec)) is None:
            raise TokmixError(f"--mirror {spec!r}: expected PREFIX=LOCAL_DIR, e.g. hf://datasets/org/name=/data/name")
        mirrors.append((parts[0].rstrip("/"), parts[1].rstrip("/")))
    return mirrors


def mirror_pairs(specs: list[str]) -> Mirrors:
    """The well-formed of `specs` as pairs (a malformed one is left to the stage process to name)."""
    return [(prefix.rstrip("/"), local.rstrip("/")) for prefix, local in filter(None, map(split_mirror, specs))]


def absolute_mirror(spec: str) -> str:
    """`PREFIX=LOCAL_DIR` with LOCAL_DIR made absolute (a URL, or a malformed spec, is left as it is)."""
    parts = split_mirror(spec)
    if parts is None or "://" in parts[1]:
        return spec
    return f"{parts[0]}={os.path.abspath(parts[1])}"


def remap(url: str, mirrors: Mirrors) -> str:
    """Where `url` is read from: its mirror's local copy, or itself."""
    for prefix, local in mirrors:
        if url == prefix or url.startswith(prefix + "/"):
            return local + url[len(prefix) :]
    return url
