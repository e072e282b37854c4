"""Whether a run may write an output directory, decided before anything is written there: the directory is
new, empty or a tokmix run (it holds tokmix's record of what it created, see shards.Layout), and it overlaps
none of the run's inputs: no source file, split file, tokenizer or mirrored copy lies in it, and no source
pattern would match a file that tokmix writes there. Imports no reader (pyarrow, fsspec's file systems): the
supervisor stays small."""

from __future__ import annotations

import glob
import os
import re

from tokmix.errors import TokmixError
from tokmix.mirrors import mirror_pairs, remap
from tokmix.recipe import Recipe
from tokmix.shards import LOCK_NAME, STATE_DIR, STORE_RUN_NAME, WRITERS_NAME, Layout
from tokmix.store import store_problem
from tokmix.unit_files import sample_files

MAGIC = "*?["


def _where_read(path: str, mirrors: list[tuple[str, str]]) -> str:
    """Where a recipe path is read from: through a mirror, a file:// URL as the path it names."""
    path = remap(path, mirrors)
    path = path[len("file://"):] if path.startswith("file://") else path
    return path if "://" in path else os.path.abspath(path)


def _inputs(recipe: Recipe, mirrors: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(what it is, path or pattern) of everything the run reads."""
    found = [(f"stream {name}'s source", recipe.resolve(p)) for name, s in recipe.streams.items() for p in s.files]
    found.append(("the split file", recipe.splits_path))
    if recipe.tokenizer_path:
        found.append(("the tokenizer", recipe.tokenizer_path))
    found += [(f"--mirror {prefix}'s local copy", local) for prefix, local in mirrors]
    return [(what, _where_read(path, mirrors)) for what, path in found]


def _static_part(pattern: str) -> str:
    """The folder a glob pattern starts from; a plain path is itself."""
    if not any(c in pattern for c in MAGIC):
        return pattern
    return pattern[: min(pattern.index(c) for c in MAGIC if c in pattern)].rsplit("/", 1)[0] or "/"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _real(path: str) -> str:
    return path if "://" in path else os.path.realpath(path)


def _check_input(out: str, layout: Layout, what: str, pattern: str) -> None:
    real_out, static = _real(out), _static_part(pattern)
    real_static = _real(static)
    magic = static != pattern
    if _inside(real_static, real_out):
        named = min(glob.glob(pattern, recursive=True), default=pattern) if magic and "://" not in pattern else pattern
        raise TokmixError(f"output directory {out}: it holds {what} {named}; tokmix writes and removes files "
                          "there: choose another --out")
    if magic and _inside(real_out, real_static):
        from fsspec.utils import glob_translate  # fsspec's import is not free: only for this rare case

        translated = re.compile(glob_translate(pattern))
        for sample in layout.sample_paths(sample_files(layout.units("s"))):
            rel = os.path.relpath(str(sample), str(layout.root))
            as_named = os.path.join(static, os.path.relpath(os.path.join(real_out, rel), real_static))
            if translated.fullmatch(as_named):
                raise TokmixError(f"output directory {out}: {what} pattern {pattern} would match files tokmix "
                                  f"writes there ({rel}); choose an --out outside it")
    if magic and "://" not in pattern:  # a source that is a link into the output directory
        for path in glob.iglob(pattern, recursive=True):
            if _inside(os.path.realpath(path), real_out):
                raise TokmixError(f"output directory {out}: it holds {what} {path} (through a link); tokmix "
                                  "writes and removes files there: choose another --out")


def _check_ours(layout: Layout) -> None:
    """A directory tokmix may write: new, empty (but for the locks of a run killed before its first record),
    or a tokmix run."""
    root = layout.root
    if not root.is_dir():
        return
    state = layout.state
    # A run that took the lock and is writing its first record right now, or was killed doing so, leaves only
    # its locks and the record's temporary file: a starting run creates nothing else, in the state folder or
    # beside it, before its record is committed (tokmix.runner: the lock, then _claim). So the folder is listed
    # first and the record looked for after: anything else the listings saw, a run made after its record, which
    # the look finds. (Looked for first, a run starting at the same moment could commit its record and write
    # beside it in between: "not empty and not a tokmix run" for a run of tokmix, not "another tokmix run".)
    leftover = state.is_dir() and not state.is_symlink() and all(
        p.name in (LOCK_NAME, WRITERS_NAME) or ".tmp-" in p.name for p in state.iterdir())
    foreign = sorted(p.name for p in root.iterdir() if not (p == state and leftover))
    if layout.is_run():
        return
    if foreign and not state.is_symlink() and layout.done.is_file():  # a finished run, of a tokmix before the record
        raise TokmixError(f"output directory {root}: a run of an earlier tokmix version, which kept no record of "
                          "what it created, so tokmix cannot tell its files from others: remove it yourself or "
                          "choose a new or empty directory")
    if foreign:
        what = f"{state.name} without tokmix's record of what it created" if foreign == [state.name] else foreign[0]
        raise TokmixError(f"output directory {root}: not empty and not a tokmix run (it holds {what}); choose a "
                          "new or empty directory")


def _check_store_ours(layout: Layout) -> None:
    """A prefix on a store tokmix may write: one that holds nothing yet, or a tokmix run's (its record of what it
    created is there). The lock is not: it is in the run's local working folder (tokmix.store)."""
    bucket = layout.root.parents[-1] if layout.root.parents else layout.root
    try:  # a listing first: fsspec's exists() answers False for refused credentials and lost networks too
        bucket.iterdir()
        there = bucket.exists()
    except FileNotFoundError:
        there = False
    except Exception as e:  # no credentials, none that may read it, no network: said as such
        if (problem := store_problem(e)) is None:
            raise
        raise TokmixError(f"output {layout.root}: {problem}; nothing was written") from None
    if not there:
        raise TokmixError(f"output {layout.root}: bucket {bucket} does not exist (tokmix writes into a bucket, it "
                          "does not create one)")
    found = layout.root.iterdir()
    claimed = (layout.root / STATE_DIR / STORE_RUN_NAME).is_file()  # a run claimed it and is making its record
    if found and not layout.is_run() and not claimed:
        raise TokmixError(f"output {layout.root}: not empty and not a tokmix run (it holds {found[0].name}); "
                          "choose a new or empty prefix")


def check_output_dir(recipe: Recipe, out: str, mirrors: list[str]) -> None:
    """Refuse, in one line naming the file, an output directory (a local path or a URL) that is a file, holds
    or would be matched by one of the run's inputs, or is not empty and not a tokmix run."""
    layout = Layout(out)
    if "://" not in out and (layout.root.is_file() or layout.root.is_symlink() and not layout.root.is_dir()):
        raise TokmixError(f"output directory {out}: is a file, not a directory")
    for what, pattern in _inputs(recipe, mirror_pairs(mirrors)):
        if ("://" in pattern) == ("://" in out):
            _check_input(out, layout, what, pattern)
    if layout.remote:
        _check_store_ours(layout)
    else:
        _check_ours(layout)
