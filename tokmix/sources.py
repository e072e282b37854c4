"""Source files: find them (local paths, globs, any fsspec URL incl. hf://), split them into holdout and
train (persisted in the split file), cut them into work units, and read documents out of a unit.

Formats: parquet (only the text column, by row group), JSONL (.jsonl, .jsonl.gz, .jsonl.zst; a plain
.jsonl is cut into byte ranges at newlines), and any other file as plain text, one document per file.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # glibc gives arrow buffers back; jemalloc hoards

import fsspec  # noqa: E402
import numpy as np  # noqa: E402
import orjson  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from fsspec.utils import glob_translate  # noqa: E402

from tokmix.backends import clean_surrogates, utf8_pieces  # noqa: E402
from tokmix.errors import TokmixError  # noqa: E402
from tokmix.recipe import Recipe  # noqa: E402
from tokmix.shards import UNIT_BYTES  # noqa: E402

BATCH_DOCS = 1024
BATCH_BYTES = 8 << 20  # one batch of text handed to the tokenizer; a larger document is a batch alone
PARQUET_READ_ROWS = 1024
PARQUET_READ_BYTES = 1 << 20  # Arrow batches of ~1 MiB: its buffers stay in cache and are reused by malloc
HEAVY_ROW_GROUP_BYTES = 64 << 20  # text in a row group's column past which a few rows are read one at a time

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSION_GUESS = 4  # text compresses about 4x with gzip or zstd: a compressed file's size for scheduling
COMPRESSED = {".gz": "gzip", ".zst": "zstd"}


# ---------------------------------------------------------------------------- file systems and mirrors
def parse_mirrors(specs: list[str] | None) -> list[tuple[str, str]]:
    """`hf://datasets/ORG/NAME=LOCAL_DIR` pairs: files under the prefix are read from the local copy."""
    mirrors = []
    for spec in specs or []:
        prefix, sep, local = spec.partition("=")
        if not sep or not prefix or not local:
            raise TokmixError(f"--mirror {spec!r}: expected PREFIX=LOCAL_DIR, e.g. hf://datasets/org/name=/data/name")
        mirrors.append((prefix.rstrip("/"), local.rstrip("/")))
    return mirrors


def remap(url: str, mirrors: list[tuple[str, str]]) -> str:
    for prefix, local in mirrors:
        if url == prefix or url.startswith(prefix + "/"):
            return local + url[len(prefix) :]
    return url


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
    except (TokmixError, FileNotFoundError):
        raise
    except Exception as e:
        if not _is_remote(remap(url, mirrors)):
            raise
        kinds = " ".join(c.__name__ for c in type(e).__mro__)
        offline = isinstance(e, (ConnectionError, TimeoutError, socket.gaierror)) or "Connect" in kinds \
            or "Timeout" in kinds
        how = "unreachable" if offline else "cannot be read"
        detail = (str(e).splitlines() or [""])[0][:200]
        raise TokmixError(f"{url}: {how} ({type(e).__name__}: {detail}); check the network, or read a local copy "
                          f"with --mirror {_mirror_hint(url)}=LOCAL_DIR") from None


def open_file(url: str, mirrors: list[tuple[str, str]], mode: str = "rb"):
    with remote_errors(url, mirrors):
        return fsspec.open(remap(url, mirrors), mode).open()


def file_size(url: str, mirrors: list[tuple[str, str]]) -> int:
    with remote_errors(url, mirrors):
        fs, path = fsspec.core.url_to_fs(remap(url, mirrors))
        return int(fs.size(path))


def _has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _normalize(path: str) -> str:
    return path if "://" in path else os.path.normpath(os.path.abspath(path))


def expand(pattern: str, mirrors: list[tuple[str, str]]) -> list[str]:
    """Files a resolved pattern names, sorted; a URL keeps its protocol, a local path stays a path."""
    if not _has_magic(pattern):
        return [_normalize(pattern)]
    local = remap(pattern, mirrors)
    with remote_errors(pattern, mirrors):
        fs, path = fsspec.core.url_to_fs(local)
        found = sorted(p for p in fs.glob(path) if not fs.isdir(p))
    if local == pattern:  # not mirrored: name files the way the pattern did
        return [fs.unstrip_protocol(p) if "://" in pattern else _normalize(p) for p in found]
    # mirrored: name files by their original URL so the split file does not depend on where the copy lives
    root = remap(pattern.split("*")[0].rsplit("/", 1)[0], mirrors)
    root_path = fsspec.core.url_to_fs(root)[1]
    prefix = pattern.split("*")[0].rsplit("/", 1)[0]
    return [prefix + p[len(root_path) :] for p in found]


def matcher(patterns: list[str]) -> re.Pattern:
    return re.compile("|".join(f"(?:{glob_translate(_normalize(p))})" for p in patterns))


# ---------------------------------------------------------------------------- the holdout / train split
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
            found = [f for f in files if match.fullmatch(_normalize(f))]
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


def create_split(recipe: Recipe, mirrors: list[tuple[str, str]]) -> Split:
    """Per stream, the files _held_out picks are held out, the rest train, each in sorted order."""
    split: Split = {d: {"holdout": [], "train": []} for d in recipe.domains}
    for name, stream in recipe.streams.items():
        files = list(dict.fromkeys(f for p in stream.files for f in expand(recipe.resolve(p), mirrors)))
        held = set(_held_out(recipe, name, files))
        split[stream.domain]["holdout"] += [_split_entry(recipe, f) for f in files if f in held]
        split[stream.domain]["train"] += [_split_entry(recipe, f) for f in files if f not in held]
    return split


def load_or_create_split(recipe: Recipe, mirrors: list[tuple[str, str]]) -> Split:
    """The persisted split: used as given when it exists, written once when it does not."""
    path = recipe.splits_path
    fs, fpath = fsspec.core.url_to_fs(path)
    if fs.isdir(fpath):
        raise TokmixError(f"split file {path}: is a directory; [holdout] splits names the split file (JSON)")
    if fs.exists(fpath):
        try:
            with fs.open(fpath, "rb") as f:
                split = json.loads(f.read())
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            raise TokmixError(f"split file {path}: not valid JSON: {e}") from None
        except OSError as e:
            raise TokmixError(f"split file {path}: cannot read it ({e.strerror or e})") from None
        _check_split_shape(split, path)
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
    match = matcher([recipe.resolve(p) for p in spec.files])
    files = [f for f in (recipe.resolve(e) for e in split[spec.domain][part]) if match.fullmatch(_normalize(f))]
    if not files:
        raise TokmixError(
            f"stream {stream}: no {part} file in split file {recipe.splits_path} matches {spec.files}"
        )
    return [_normalize(f) for f in files]


# ---------------------------------------------------------------------------- work units
@dataclass(frozen=True)
class Piece:
    """A contiguous part of one file: parquet row groups [start, stop), JSONL bytes [start, stop), or the
    whole file (start = 0, stop = -1) for compressed JSONL and plain text."""

    path: str
    kind: str  # "parquet" | "jsonl" | "text"
    start: int = 0
    stop: int = -1
    first_row: int = 0  # row (parquet) number of the piece's first document, for messages
    size: int = 0  # source bytes it holds (uncompressed, estimated for compressed files): for scheduling
    file_bytes: int = 0  # its whole file's size when planned: a resume refuses a file that has another now


@dataclass(frozen=True)
class Unit:
    stream: str
    index: int
    pieces: tuple[Piece, ...]

    @property
    def name(self) -> str:
        return f"{self.index:06d}"

    @property
    def size(self) -> int:
        return sum(p.size for p in self.pieces)

    def describe(self) -> list[list]:
        return [[p.path, p.kind, p.start, p.stop] for p in self.pieces]

    def file_bytes(self) -> list[int]:
        return [p.file_bytes for p in self.pieces]


def file_kind(path: str) -> str:
    name = path.lower()
    if name.endswith(".parquet"):
        return "parquet"
    stem, ext = os.path.splitext(name)
    if ext in COMPRESSED:
        name = stem
    return "jsonl" if name.endswith(JSONL_SUFFIXES) else "text"


def _file_pieces(path: str, mirrors: list[tuple[str, str]], unit_bytes: int, stream: str) -> Iterator[Piece]:
    kind = file_kind(path)
    try:
        if kind == "parquet":
            yield from _parquet_pieces(path, mirrors, unit_bytes)
        elif kind == "jsonl" and not path.lower().endswith(tuple(COMPRESSED)):
            size = file_size(path, mirrors)
            for start in range(0, max(size, 1), unit_bytes):
                yield Piece(path, kind, start, min(start + unit_bytes, size), size=min(unit_bytes, size - start),
                            file_bytes=size)
        else:
            size = file_size(path, mirrors)
            compressed = path.lower().endswith(tuple(COMPRESSED))
            yield Piece(path, kind, size=size * (COMPRESSION_GUESS if compressed else 1), file_bytes=size)
    except FileNotFoundError:
        raise TokmixError(f"stream {stream}: file {path}: not found") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise TokmixError(f"stream {stream}: file {path}: cannot read: {e}") from None


def _parquet_pieces(path: str, mirrors: list[tuple[str, str]], unit_bytes: int) -> Iterator[Piece]:
    with open_file(path, mirrors) as f:
        meta = pq.ParquetFile(f).metadata
        f.seek(0, os.SEEK_END)
        file_bytes = f.tell()
    start, size, row, first_row = 0, 0, 0, 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        size += rg.total_byte_size
        row += rg.num_rows
        if size >= unit_bytes or g == meta.num_row_groups - 1:
            yield Piece(path, "parquet", start, g + 1, first_row, size, file_bytes)
            start, size, first_row = g + 1, 0, row


def plan_units(
    stream: str, files: list[str], mirrors: list[tuple[str, str]], unit_bytes: int = UNIT_BYTES
) -> Iterator[Unit]:
    """The stream's work units in canonical order, planned lazily: only the files a run reaches are opened.
    Small whole-file pieces are grouped so that 10,000 small files do not make 10,000 units."""
    index, group, group_bytes = 0, [], 0
    for path in files:
        for piece in _file_pieces(path, mirrors, unit_bytes, stream):
            if piece.stop == -1 and piece.kind == "text":
                group.append(piece)
                group_bytes += piece.size
                if group_bytes >= unit_bytes:
                    yield Unit(stream, index, tuple(group))
                    index, group, group_bytes = index + 1, [], 0
                continue
            if group:
                yield Unit(stream, index, tuple(group))
                index, group, group_bytes = index + 1, [], 0
            yield Unit(stream, index, (piece,))
            index += 1
    if group:
        yield Unit(stream, index, tuple(group))


# ---------------------------------------------------------------------------- reading documents
class SourceError(TokmixError):
    pass


class HugeText:
    """A document too large to hold as one Python string (200 MB of text with a single emoji is 800 MB as a
    str): its UTF-8 bytes, which the tokenizing worker turns into str pieces one at a time."""

    def __init__(self, data, path: str, stream: str):
        self.data, self.path, self.stream = data, path, stream

    def __len__(self) -> int:
        return len(self.data)

    def pieces(self) -> Iterator[str]:
        try:
            yield from utf8_pieces(self.data)
        except UnicodeDecodeError as e:
            where = f"byte {e.start} of a {len(self):,}-byte document"
            raise _bad(self.stream, self.path, where, "invalid UTF-8") from None

    def utf8(self):
        return self.data


def _bad(stream: str, path: str, where: str, what: str) -> SourceError:
    return SourceError(f"stream {stream}: file {path}: {where}: {what}")


def _parquet_texts(piece: Piece, field: str, stream: str, mirrors, huge: int | None,
                   skip_huge: bool = False) -> Iterator[str | HugeText]:
    with open_file(piece.path, mirrors) as f:
        pf = pq.ParquetFile(f)
        if field not in pf.schema_arrow.names:
            raise _bad(stream, piece.path, "schema", f"no column {field!r} (columns: {pf.schema_arrow.names})")
        column_type = pf.schema_arrow.field(field).type
        if pa.types.is_dictionary(column_type):  # a dictionary-encoded column: its values are the texts
            column_type = column_type.value_type
        if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
            raise _bad(stream, piece.path, f"column {field!r}", f"type {column_type} is not a string type")
        row = piece.first_row
        schema = pf.metadata.schema
        column_index = next(i for i in range(len(schema)) if schema.column(i).path == field)
        for group in range(piece.start, piece.stop):
            meta = pf.metadata.row_group(group)
            heavy = huge is not None and meta.column(column_index).total_uncompressed_size > HEAVY_ROW_GROUP_BYTES
            if heavy and skip_huge:
                row += meta.num_rows
                continue
            if heavy and meta.num_rows <= PARQUET_READ_ROWS:
                batches = _rows_one_at_a_time(f, pf.metadata, group, field)
            else:
                rows = _batch_rows(meta, column_index)
                # decoded on this thread, not handed to Arrow's pool for the one column: over 12 alternating
                # whole runs of the bench corpus, streams 1.34 -> 1.23 s and holdout 0.68 -> 0.62 s (medians)
                batches = (b.column(0) for b in pf.iter_batches(batch_size=rows, row_groups=[group], columns=[field],
                                                                use_threads=False))
            for column in batches:
                yield from _column_texts(column, piece, field, stream, huge, row)
                row += len(column)


def _rows_one_at_a_time(f, metadata: pq.FileMetaData, group: int, field: str) -> list[pa.Array]:
    """A row group of a few huge documents, one row per Arrow batch: pyarrow then sizes each value's buffer
    to the value (a batch that goes on past a huge value doubles its buffer, copying the value). Its pages
    are streamed unbuffered, and the whole group is read before any of its documents is tokenized, so the
    reader's page buffers are gone by then: a 200 MB value peaks at ~600 MiB of transient buffers, not ~800."""
    light = pq.ParquetFile(f, metadata=metadata, pre_buffer=False, buffer_size=1 << 20)
    rows = light.iter_batches(batch_size=1, row_groups=[group], columns=[field], use_threads=False)
    return [b.column(0) for b in rows]


def _batch_rows(group: pq.RowGroupMetaData, column_index: int) -> int:
    """Rows per Arrow batch for about PARQUET_READ_BYTES of text: pyarrow builds a batch's text with up to
    ~3x its size in transient buffers."""
    size = max(group.column(column_index).total_uncompressed_size, 1)
    return max(1, min(PARQUET_READ_ROWS, group.num_rows * PARQUET_READ_BYTES // size))


def _column_texts(column: pa.Array, piece: Piece, field: str, stream: str, huge: int | None,
                  row: int) -> Iterator[str | HugeText]:
    """One batch's documents; `row` is the file's row number of its first."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.null_count:
        first = column.is_null().index(True).as_py()
        raise _bad(stream, piece.path, f"row {row + first}", f"{field!r} is null")
    if huge is None or pc.max(pc.binary_length(column)).as_py() <= huge:
        yield from column.to_pylist()
    else:  # documents past `huge` bytes stay Arrow bytes, never one Python string
        for value in column:
            data = value.as_buffer()
            yield HugeText(data, piece.path, stream) if len(data) > huge else value.as_py()


def json_text(line: bytes, field: str, stream: str, path: str, where) -> str:
    # orjson parses UTF-8 text ~3x faster than json, and a string it gives is valid UTF-8: no lone surrogate to
    # clean. It rejects what json would turn into one (an escape \ud800, surrogate bytes), a BOM, NaN and
    # more: any line it does not take to a dict whose field is a string goes to json, whose result and error
    # messages are the ones kept.
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        record = None
    if isinstance(record, dict) and isinstance(text := record.get(field), str):
        return text
    try:
        record = json.loads(line)
    except ValueError as e:
        raise _bad(stream, path, where(), f"invalid JSON ({e})") from None
    except RecursionError:  # orjson stops at 1024 levels, json at Python's recursion limit
        raise _bad(stream, path, where(), "JSON nested too deeply to read (over 1,024 levels of arrays or "
                   "objects)") from None
    if not isinstance(record, dict) or field not in record:
        raise _bad(stream, path, where(), f"no field {field!r}")
    text = record[field]
    if not isinstance(text, str):
        kind = "null" if text is None else f"a {type(text).__name__}, not a string"
        raise _bad(stream, path, where(), f"{field!r} is {kind}")
    # JSON may escape lone surrogates ("\ud800"); parquet and UTF-8 text files cannot hold them
    return clean_surrogates(text)


_ESCAPE_SPAN = 12  # the longest JSON escape: a surrogate pair, \ud83d\ude00


def huge_json_text(line: bytes, field: str, stream: str, path: str, where, huge: int) -> str | HugeText:
    """json_text for a line longer than `huge` bytes, without holding its text as one Python string (a 200 MB
    text with one character beyond U+FFFF is an 800 MB str): every string literal longer than `huge` is
    swapped for an empty one, the rest of the line is parsed (so it is checked as JSON), and when the field's
    value is such a literal (found by where it stands in the line, never by what it holds: no text can pass
    for a swapped one), its escapes are decoded a piece at a time into UTF-8 bytes."""
    parts, swapped, last, at = [], {}, 0, 0
    for start, end in _string_literals(line):
        if end - start > huge:
            parts.append(line[last:start])
            at += start - last
            swapped[at] = (start + 1, end - 1)  # where its "" stands in the shortened line -> its content
            parts.append(b'""')
            at += 2
            last = end
    short = b"".join([*parts, line[last:]])
    text = json_text(short, field, stream, path, where)
    if text or (span := swapped.get(_value_offset(short, field))) is None:
        return text  # a swapped literal parses as "": a text that is not empty, or stands elsewhere, is the field's
    start, stop = span
    data = bytearray()
    while start < stop:
        cut = _escape_free_cut(line, start, min(start + huge, stop), stop)
        try:
            piece = json.loads(b'"' + line[start:cut] + b'"')
        except ValueError as e:
            raise _bad(stream, path, where(), f"invalid JSON ({e})") from None
        data += clean_surrogates(piece).encode("utf-8")
        start = cut
    return HugeText(data, path, stream)


def _value_offset(line: bytes, field: str) -> int | None:
    """Byte offset in a JSON object's line (already parsed once, so valid) of the value of its top-level key
    `field`, the last one when the key repeats (as json and orjson keep it)."""
    text = line.decode(json.detect_encoding(line), "surrogatepass")
    decoder, skip = json.JSONDecoder(), json.decoder.WHITESPACE.match
    i = skip(text, 0).end() + 1  # past "{"
    found = None
    while text[(i := skip(text, i).end())] != "}":
        key, i = decoder.raw_decode(text, i)
        i = skip(text, skip(text, i).end() + 1).end()  # past ":"
        if key == field:
            found = i
        _, i = decoder.raw_decode(text, i)
        i = skip(text, i).end()
        i += text[i] == ","
    return None if found is None else len(text[:found].encode("utf-8", "surrogatepass")) + line.startswith(
        b"\xef\xbb\xbf") * 3


def _string_literals(line: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of every JSON string literal in a line, quotes included: outside literals JSON has no
    quote, and inside one a quote closes it unless an odd run of backslashes precedes it. (A regular
    expression would keep a backtracking record per escape: ~1 GB for a 200 MB text.)"""
    start = line.find(b'"')
    while start != -1:
        end = line.find(b'"', start + 1)
        while end != -1:
            run = end
            while line[run - 1] == 0x5C:  # a backslash; the opening quote stops the run
                run -= 1
            if (end - run) % 2 == 0:
                break
            end = line.find(b'"', end + 1)
        if end == -1:
            return  # unterminated: the parse of the rest says so
        yield start, end + 1
        start = line.find(b'"', end + 1)


def _escape_free_cut(line: bytes, start: int, end: int, stop: int) -> int:
    """A place at or before `end` (after `start`) that neither a UTF-8 character nor an escape sequence spans:
    not a continuation byte, and the _ESCAPE_SPAN bytes before it hold no backslash. `stop` when there is none
    (a text of nothing but escapes is decoded whole)."""
    while end - start > _ESCAPE_SPAN:
        while 0x80 <= line[end] < 0xC0:
            end -= 1
        backslash = line.rfind(b"\\", end - _ESCAPE_SPAN, end)
        if backslash == -1:
            return end
        end = backslash
    return stop


def _open_jsonl(piece: Piece, mirrors) -> io.BufferedIOBase:
    raw = open_file(piece.path, mirrors)
    codec = COMPRESSED.get(os.path.splitext(piece.path.lower())[1])
    source = gzip.GzipFile(fileobj=raw) if codec == "gzip" else _ZstdFrames(raw) if codec == "zstd" else raw
    # lines are read through a 1 MiB buffer: with a file's default 8 KiB one, a line of web text takes
    # several reads joined (readline over the bench corpus's web text: 0.11 -> 0.04 CPU-s for 95 MB)
    return io.BufferedReader(source, buffer_size=1 << 20)


class _ZstdFrames(io.RawIOBase):
    """Decompresses every frame of a .zst file and, unlike zstandard's stream_reader, raises on a file that
    ends inside a frame: a truncated download must not pass for a short file."""

    def __init__(self, raw):
        import zstandard

        self.raw, self.zstd = raw, zstandard
        self.frame, self.pending, self.started = zstandard.ZstdDecompressor().decompressobj(), b"", False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            if self.frame.eof:  # the next frame starts with what the last one left over, or with the next read
                rest = self.frame.unused_data or self.raw.read(1 << 20)
                if not rest:
                    return 0  # the file ends where a frame ends
                self.frame = self.zstd.ZstdDecompressor().decompressobj()
                self.pending = self.frame.decompress(rest)
                continue
            chunk = self.raw.read(1 << 20)
            if not chunk:
                if self.started:
                    raise EOFError("the file ends inside a zstd frame")
                return 0  # an empty file: no documents
            self.started = True
            self.pending = self.frame.decompress(chunk)
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def _line_number(piece: Piece, mirrors, offset: int) -> int:
    """1-based line number of the line starting at byte `offset`; counted only when reporting an error."""
    with open_file(piece.path, mirrors) as f:
        return f.read(offset).count(b"\n") + 1


def _jsonl_texts(piece: Piece, field: str, stream: str, mirrors, huge: int | None,
                 skip_huge: bool = False) -> Iterator[str | HugeText]:
    longest = huge + 1 if huge is not None and skip_huge else -1  # readline's limit: -1 is none
    ranged = piece.stop != -1
    with _open_jsonl(piece, mirrors) as f:
        offset, line_no = piece.start, 0
        if ranged and piece.start > 0:
            f.seek(piece.start - 1)
            offset = piece.start - 1 + len(f.readline())  # the line under way belongs to the previous piece
        try:
            while not ranged or offset < piece.stop:
                line = f.readline(longest)
                if not line:
                    break
                line_no += 1
                size = len(line)
                if len(line) == longest and not line.endswith(b"\n"):  # skip_huge: a longer line is skipped
                    while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                        size += len(rest)
                    offset += size + len(rest)
                    continue
                if not line.isspace():  # (strip() would copy a 200 MB line)
                    where = (
                        (lambda o=offset: f"line {_line_number(piece, mirrors, o)}")
                        if ranged
                        else (lambda n=line_no: f"line {n}")
                    )
                    if huge is not None and size > huge:
                        text = huge_json_text(line, field, stream, piece.path, where, huge)
                    else:
                        text = json_text(line, field, stream, piece.path, where)
                    del line  # a 200 MB line must not stay alive beside its text while it is tokenized
                    yield text
                offset += size
        except TokmixError:
            raise
        except Exception as e:  # EOFError, BadGzipFile, zstandard's ZstdError: a truncated or corrupt file
            raise _bad(stream, piece.path, f"line {line_no + 1}", f"truncated or corrupt file ({e})") from None


def _text_document(piece: Piece, stream: str, mirrors, huge: int | None) -> str | HugeText:
    with open_file(piece.path, mirrors) as f:
        data = f.read()
    if huge is not None and len(data) > huge:
        return HugeText(data, piece.path, stream)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _bad(stream, piece.path, f"byte {e.start}", "invalid UTF-8") from None


def read_texts(unit_or_piece: Unit | Piece, field: str, stream: str, mirrors,
               huge: int | None = None, skip_huge: bool = False) -> Iterator[str | HugeText]:
    """Every document text of a unit (or one piece) in order, empty ones included. With `huge`, a parquet or
    plain-text document or JSONL text of more bytes comes as a HugeText, or, with `skip_huge` (a sample that
    needs no such document), is skipped without being read whole: a parquet row group of more than
    HEAVY_ROW_GROUP_BYTES of text, a longer JSONL line, a larger text file."""
    pieces = unit_or_piece.pieces if isinstance(unit_or_piece, Unit) else (unit_or_piece,)
    for piece in pieces:
        try:
            with remote_errors(piece.path, mirrors):
                if piece.kind == "parquet":
                    yield from _parquet_texts(piece, field, stream, mirrors, huge, skip_huge)
                elif piece.kind == "jsonl":
                    yield from _jsonl_texts(piece, field, stream, mirrors, huge, skip_huge)
                elif not (skip_huge and huge is not None and piece.size > huge):
                    yield _text_document(piece, stream, mirrors, huge)
        except FileNotFoundError:
            raise _bad(stream, piece.path, "open", "file not found") from None
        except (pa.ArrowException, OSError) as e:
            raise _bad(stream, piece.path, "read", f"corrupt or unreadable ({e})") from None


def iter_file_texts(paths: list[str], field: str, stream: str, mirrors,
                    huge: int | None = None, skip_huge: bool = False) -> Iterator[str | HugeText]:
    """Documents of whole files in order (the holdout stage reads files this way)."""
    for path in paths:
        for piece in _file_pieces(path, mirrors, 1 << 62, stream):
            yield from read_texts(piece, field, stream, mirrors, huge, skip_huge)


def batches(
    texts: Iterator[str], huge: int = 1 << 62, max_chars: Callable[[int], int] | None = None
) -> Iterator[list[str]]:
    """Group non-empty texts into tokenizer batches bounded in count and size; a text longer than `huge`
    characters is a batch alone. `max_chars(chars yielded so far)`, asked at the start of each batch, bounds
    its size further."""
    batch, size, limit, yielded = [], 0, BATCH_BYTES, 0
    for text in texts:
        if not text:
            continue
        if not batch and max_chars is not None:
            limit = min(BATCH_BYTES, max(1, max_chars(yielded)))
        if len(text) > huge:
            if batch:
                yield batch
            yield [text]
            batch, size, yielded = [], 0, yielded + size + len(text)
            continue
        batch.append(text)
        size += len(text)
        if len(batch) >= BATCH_DOCS or size >= limit:
            yield batch
            batch, size, yielded = [], 0, yielded + size
    if batch:
        yield batch


def text_hashes(texts: list[str]) -> np.ndarray:
    """64-bit hashes of documents' exact UTF-8 bytes (no normalisation): the decontamination key."""
    digests = b"".join(hashlib.blake2b(t.utf8() if isinstance(t, HugeText) else t.encode("utf-8"),
                                       digest_size=8).digest() for t in texts)
    return np.frombuffer(digests, dtype=np.uint64)
