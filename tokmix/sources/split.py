"""The holdout/train split of each stream's files: computed once from the recipe, persisted in the split file
and used as given from then on; a stream's train files in split order are its canonical document order."""

from __future__ import annotations

import hashlib
import json
import math
import os

import fsspec

from tokmix.errors import TokmixError
from tokmix.recipe import Recipe
from tokmix.shards import NotAFile, check_input_file, check_regular
from tokmix.sources.files import expand, literal_brackets, matcher, matches_with_literal_brackets, normalize

Split = dict[str, dict[str, list[str]]]


def _split_entry(recipe: Recipe, path: str) -> str:
    """How the split file names a file: relative to the recipe's directory when it lies under it."""
    if "://" in path:
        return path
    rel = os.path.relpath(path, recipe.base_dir)
    return path if rel.startswith("..") else rel


def _held_out(recipe: Recipe, name: str, files: list[str]) -> list[str]:
    """The stream's files to hold out: those its `holdout_files` names, or its last files (sorted order) by its
    count or `holdout_fraction` (rounded up), else by [holdout] holdout_files. At least one file trains."""
    stream = recipe.streams[name]
    if isinstance(stream.holdout_files, list):
        held = []
        for pattern in stream.holdout_files:
            match = matcher([recipe.resolve(pattern)])
            found = [f for f in files if match.fullmatch(normalize(f))]
            if not found:
                raise TokmixError(f"stream {name}: holdout_files entry {pattern!r} matches none of the stream's "
                                  f"{len(files)} file(s) (its files: {stream.files})")
            held += found
        held = [f for f in files if f in set(held)]  # the stream's order, each file once
        rule = f"holdout_files {stream.holdout_files}"
    else:
        if stream.holdout_fraction is not None:
            n, rule = math.ceil(stream.holdout_fraction * len(files)), f"holdout_fraction={stream.holdout_fraction}"
        elif stream.holdout_files is not None:
            n, rule = stream.holdout_files, f"holdout_files={stream.holdout_files}"
        else:
            n, rule = recipe.holdout.holdout_files, f"holdout_files={recipe.holdout.holdout_files}"
        held = files[len(files) - n :] if n <= len(files) else files
    if len(held) >= len(files):
        raise TokmixError(f"stream {name}: {len(files)} file(s) match {stream.files} and {rule} holds out "
                          f"{len(held)}: keep at least one to train on")
    return held


def _file_identity(path: str) -> tuple:
    """What makes two names one file: the same inode (a link, a hard link, another spelling), else the URL."""
    if "://" in path and not path.startswith("file://"):
        return ("url", path)
    try:
        st = os.stat(path.removeprefix("file://"))
    except OSError:
        return ("path", os.path.realpath(path))
    return ("inode", st.st_dev, st.st_ino)


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def check_isolation(recipe: Recipe, split: Split) -> None:
    """A file held out anywhere is never trained on anywhere, whatever the streams' domains and patterns and
    whether decontamination is on: a stream whose train files include a file some stream holds out (the same
    file, through a link or another spelling, or a local copy of it byte for byte) is refused, naming the file
    and both streams. Copies are found by size first: only a train file of a held-out file's size is read."""
    held: dict[tuple, tuple[str, str]] = {}  # identity -> (file, the stream or domain holding it out)
    for name in recipe.streams:
        for f in _part_files(recipe, split, name, "holdout"):
            held.setdefault(_file_identity(f), (f, f"stream {name}"))
    for domain, parts in split.items():  # listed as held out by the split file, whether a stream reads it or not
        for f in (normalize(recipe.resolve(e)) for e in parts.get("holdout", [])):
            held.setdefault(_file_identity(f), (f, f"domain {domain}'s holdout in the split file"))
    sizes: dict[int, list[tuple[str, str]]] = {}
    for identity, (f, who) in held.items():
        if identity[0] == "inode" and (size := os.path.getsize(f)) > 0:  # an empty file holds no document
            sizes.setdefault(size, []).append((f, who))
    digests: dict[str, str] = {}
    for name in recipe.streams:
        for f in _part_files(recipe, split, name, "train"):
            found = held.get(_file_identity(f))
            how = "" if found is None or found[0] == f else f" (the same file as {found[0]})"
            if found is None and (candidates := sizes.get(_size(f))):
                mine = _digest(f)
                for other, who in candidates:
                    if digests.setdefault(other, _digest(other)) == mine:
                        found, how = (other, who), f" (a copy of {other}, byte for byte)"
                        break
            if found is not None:
                raise TokmixError(f"stream {name}: trains on {f}{how}, which {found[1]} holds out; a held-out file "
                                  "is never trained on: take it out of one of the two (the stream's files, or "
                                  "the split file)")


def _size(path: str) -> int | None:
    try:
        return os.path.getsize(path) if "://" not in path else None
    except OSError:
        return None


def _part_files(recipe: Recipe, split: Split, stream: str, part: str) -> list[str]:
    """The split's `part` files of the stream's domain that match its patterns ([] where there are none)."""
    spec = recipe.streams[stream]
    match = matcher([recipe.resolve(p) for p in spec.files])
    entries = split.get(spec.domain, {}).get(part, [])
    return [f for f in (normalize(recipe.resolve(e)) for e in entries) if match.fullmatch(f)]


def create_split(recipe: Recipe, mirrors: list[tuple[str, str]]) -> Split:
    """Per stream, the files _held_out picks are held out, the rest train, each in sorted order."""
    split: Split = {d: {"holdout": [], "train": []} for d in recipe.domains}
    for name, stream in recipe.streams.items():
        found = {p: expand(recipe.resolve(p), mirrors) for p in stream.files}
        for pattern in (p for p, matched in found.items() if not matched):
            if matches_with_literal_brackets(recipe.resolve(pattern), mirrors):
                raise TokmixError(f"stream {name}: {pattern!r} matches no file: in a pattern [...] is a set of "
                                  f"characters, but the path with a literal [ exists; write [[] for each [ "
                                  f"(files = [{literal_brackets(pattern)!r}])")
        files = list(dict.fromkeys(f for matched in found.values() for f in matched))
        held = set(_held_out(recipe, name, files))
        split[stream.domain]["holdout"] += [_split_entry(recipe, f) for f in files if f in held]
        split[stream.domain]["train"] += [_split_entry(recipe, f) for f in files if f not in held]
    check_isolation(recipe, split)
    return split


def load_or_create_split(recipe: Recipe, mirrors: list[tuple[str, str]]) -> Split:
    """The persisted split: used as given when it exists, written once when it does not."""
    path = recipe.splits_path
    fs, fpath = fsspec.core.url_to_fs(path)
    if fs.isdir(fpath):
        raise TokmixError(f"split file {path}: is a directory; [holdout] splits names the split file (JSON)")
    if fs.exists(fpath):
        check_input_file(path, "split file")
        try:
            with fs.open(fpath, "rb") as f:
                split = json.loads(f.read())
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            raise TokmixError(f"split file {path}: not valid JSON: {e}") from None
        except OSError as e:
            raise TokmixError(f"split file {path}: cannot read it ({e.strerror or e})") from None
        _check_split_shape(split, path)
        check_isolation(recipe, split)
        return split
    split = create_split(recipe, mirrors)
    fs.makedirs(fs._parent(fpath), exist_ok=True)
    tmp = f"{fpath}.tmp-{os.getpid()}"
    with fs.open(tmp, "w") as f:
        json.dump(split, f, indent=2)
    fs.mv(tmp, fpath)
    return split


def _check_split_shape(split: object, path: str) -> None:
    ok = isinstance(split, dict) and all(
        isinstance(v, dict)
        and all(isinstance(v.get(k), list) and all(isinstance(x, str) for x in v[k]) for k in ("holdout", "train"))
        for v in split.values()
    )
    if not ok:
        raise TokmixError(f'split file {path}: expected {{domain: {{"holdout": [files], "train": [files]}}}}')


def stream_files(recipe: Recipe, split: Split, stream: str, part: str) -> list[str]:
    """The split file's `part` ("holdout"/"train") entries of the stream's domain that match its patterns,
    in the split file's order: that order is the stream's canonical document order."""
    spec = recipe.streams[stream]
    if spec.domain not in split:
        raise TokmixError(f"stream {stream}: split file {recipe.splits_path} has no domain {spec.domain!r}")
    files = _part_files(recipe, split, stream, part)
    if not files:
        raise TokmixError(
            f"stream {stream}: no {part} file in split file {recipe.splits_path} matches {spec.files}"
        )
    for f in files:
        if "://" not in f:  # stat only: a FIFO or a device is named before anything opens it (it could block)
            try:
                check_regular(f)
            except NotAFile as e:
                raise TokmixError(f"stream {stream}: file {f}: is {e.kind}, not a regular file; tokmix reads "
                                  "only regular files") from None
            except FileNotFoundError:
                pass  # named by the reader, with the stream, as before
    return files


