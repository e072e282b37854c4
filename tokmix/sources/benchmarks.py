"""Benchmark files for n-gram decontamination ([decontaminate.benchmarks.NAME]): their items, each the text of
its fields joined in the recipe's order, with its id, and the sha256 of every file's bytes (part of the run's
identity). JSONL (plain, .gz, .zst), parquet, or plain text (one item per non-empty line); local or fsspec."""

from __future__ import annotations

import codecs
import hashlib
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from tokmix.errors import TokmixError
from tokmix.mirrors import remap
from tokmix.shards import check_input_file
from tokmix.sources import jsonl, parquet
from tokmix.sources.files import expand, literal_brackets, matches_with_literal_brackets, open_file
from tokmix.text import clean_surrogates


@dataclass(frozen=True)
class Item:
    index: int  # in the benchmark, over its files in order, from 0
    id: str  # the item's own id (id_field) or its index
    text: str | tuple[str, ...]  # its fields' texts joined by newlines; its segments (a list field: _field_text)


def benchmark_files(patterns: list[str], name: str, mirrors) -> list[str]:
    try:
        files = [f for p in patterns for f in expand(p, mirrors)]
    except TokmixError as e:  # a glob's URL unreachable, a FIFO it matched: named with the benchmark
        raise TokmixError(f"benchmark {name}: {e}") from None
    if not files:
        for pattern in (p for p in patterns if matches_with_literal_brackets(p, mirrors)):  # as a stream's are
            raise TokmixError(f"benchmark {name}: {pattern!r} matches no file: in a pattern [...] is a set of "
                              "characters, but the path with a literal [ exists; write [[] for each [ (files = "
                              f"[{literal_brackets(pattern)!r}])")
        raise TokmixError(f"benchmark {name}: no file matches {', '.join(patterns)}")
    return files


@contextmanager
def _opened(path: str, name: str, mirrors) -> Iterator:
    """A benchmark file open for reading its bytes; a missing or unreadable one (also while it is read) named."""
    try:
        check_input_file(remap(path, mirrors), f"benchmark {name}: file")  # stat only: a FIFO's open waits
    except OSError as e:  # (a loop of links; a NotAFile names the benchmark itself)
        raise TokmixError(f"benchmark {name}: file {path}: cannot read: {e.strerror or e}") from None
    try:
        with open_file(path, mirrors) as f:
            yield f
    except FileNotFoundError:
        raise TokmixError(f"benchmark {name}: file {path}: not found") from None
    except TokmixError as e:  # a URL's failure (tokmix.sources.files.remote_errors), which names it
        raise TokmixError(f"benchmark {name}: {e}") from None
    except OSError as e:
        raise TokmixError(f"benchmark {name}: file {path}: cannot read: {e}") from None


def file_bytes(path: str, name: str, mirrors) -> bytes:
    with _opened(path, name, mirrors) as f:
        return f.read()


def file_sha256(path: str, name: str, mirrors, copy_to: Path | None = None) -> str:
    """The sha256 of a benchmark file's bytes, read a few MiB at a time, each copied to the local file `copy_to`
    (when given) as it is read."""
    digest = hashlib.sha256()
    with _opened(path, name, mirrors) as f, open(copy_to if copy_to is not None else os.devnull, "wb") as out:
        while chunk := f.read(COPY_BYTES):
            digest.update(chunk)
            if copy_to is not None:
                out.write(chunk)
    return digest.hexdigest()


COPY_BYTES = 8 << 20


def _field_text(row: dict, fields: list[str], name: str, where: str) -> str | tuple[str, ...]:
    """An item's text: its fields' texts joined by newlines in the recipe's order (n-grams run across them). A
    field holding a list of strings (a JSON array, a parquet list<string>, e.g. MMLU's choices) gives each
    element as a segment of its own, and the fields after it start another: the item is then the tuple of its
    segments, and no n-gram runs across two of them (docs/recipe.md, [decontaminate])."""
    segments: list[str] = []
    parts: list[str] = []
    for field in fields:
        if field not in row:
            raise TokmixError(f"benchmark {name}: {where}: no field {field!r} (it has {', '.join(map(str, row))})")
        value = row[field]
        if value is None:
            continue
        if isinstance(value, str):
            parts.append(clean_surrogates(value))  # a JSON escape \ud800: U+FFFD, as in the documents
            continue
        if not isinstance(value, list):
            kind = "int" if isinstance(value, jsonl._LongInteger) else type(value).__name__  # (json: 4,300+ digits)
            raise TokmixError(f"benchmark {name}: {where}: field {field!r} is {kind}, not text "
                              "or a list of texts")
        for k, element in enumerate(value):
            if element is not None and not isinstance(element, str):
                raise TokmixError(f"benchmark {name}: {where}: field {field!r} is a list holding "
                                  f"{type(element).__name__} (element {k}), not a list of texts")
        if parts:
            segments.append("\n".join(parts))
            parts = []
        segments += [clean_surrogates(element) for element in value if element is not None]
    if parts:
        segments.append("\n".join(parts))
    return tuple(segments) if len(segments) > 1 else "".join(segments)


def document_id(value: object, field: str, name: str, where: str) -> str | int:
    """An item's own id: a string or an integer, as a document's (anything else's str() would be Python's)."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TokmixError(f"benchmark {name}: {where}: id field {field!r} is a {type(value).__name__}, not a string or "
                      "an integer")


def file_format(path: str) -> str:
    """How a benchmark file's bytes are read, from its name: "parquet", "jsonl" (with its codec: "jsonl gzip")
    or "text". With the bytes' sha256, what its items are (the benchmark set cache's key)."""
    if parquet.claims(path):
        return "parquet"
    if jsonl.claims(path):
        return " ".join(filter(None, ("jsonl", jsonl.codec(path))))
    return "text"


def _rows(path: str, data: bytes, name: str, id_field: str | None) -> Iterator[tuple[str, dict | str]]:
    """(where, row) of every item of one file, one at a time: a dict of its columns, or a plain-text line."""
    kind = file_format(path)
    if kind == "parquet":
        try:
            table = pq.read_table(io.BytesIO(data))
        except pa.ArrowException as e:
            raise TokmixError(f"benchmark {name}: file {path}: not a readable parquet file ({e})") from None
        i = 0
        for batch in table.to_batches(ROWS_AT_ONCE):
            for row in batch.to_pylist():
                yield f"file {path}: row {i}", row
                i += 1
    elif kind.startswith("jsonl"):
        decompress = jsonl.Decompressor(jsonl.codec(path))
        try:
            text = decompress(data)
        except Exception as e:  # zlib.error, zstandard.ZstdError
            raise TokmixError(f"benchmark {name}: file {path}: cannot decompress ({e})") from None
        if decompress.inside:  # a download cut short: not a benchmark of fewer items
            raise TokmixError(f"benchmark {name}: file {path}: truncated: it ends inside a compressed member or frame")
        for i, line in enumerate(_lines(text)):
            if not line.strip():
                continue
            try:
                row = _json_row(line, id_field)
            except (ValueError, RecursionError) as e:  # (json: at Python's recursion limit)
                alone = ("; it holds a carriage return (\\r) that no \\n follows: JSONL lines end with \\n or \\r\\n "
                         "only (convert the file's line ends)" if b"\r" in line else "")
                raise TokmixError(f"benchmark {name}: file {path}: line {i + 1}: not JSON ({e}){alone}") from None
            if not isinstance(row, dict):
                raise TokmixError(f"benchmark {name}: file {path}: line {i + 1}: not a JSON object")
            yield f"file {path}: line {i + 1}", row
    else:
        bom = len(codecs.BOM_UTF8) * data.startswith(codecs.BOM_UTF8)  # an editor's mark, not the first item's
        try:
            text = str(memoryview(data)[bom:], "utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, bom + e.start) + 1  # the item's, as a JSONL file's bad line is named
            raise TokmixError(f"benchmark {name}: file {path}: line {line}: byte {bom + e.start} is not UTF-8 "
                              "text") from None
        # lines end at \n (a \r before it goes with it), as a JSONL file's do: str.splitlines would also cut at
        # form feeds, U+2028 and other breaks inside a line, making short items that match as a whole
        for i, line in enumerate(text.split("\n")):
            line = line.removesuffix("\r")
            if "\r" in line:  # line ends of \r alone: the whole file would be one item
                raise TokmixError(f"benchmark {name}: file {path}: line {i + 1}: holds a carriage return (\\r) that "
                                  "no \\n follows: lines end with \\n or \\r\\n only (convert the file's line ends)")
            if line.strip():
                yield f"file {path}: line {i + 1}", line


def _json_row(line: bytes, id_field: str | None) -> object:
    """A JSONL line as json.loads reads it, as a stream's lines are (tokmix.sources.jsonl.json_text): orjson
    first (faster), json for what orjson refuses (a byte-order mark, NaN, a lone surrogate escape) and for a line
    whose id orjson gives as a float: it makes an integer outside 64 bits one (2**64 -> 1.8446744073709552e+19),
    which json reads exactly (one of more digits than Python converts: a jsonl._LongInteger, named by iter_items)."""
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return jsonl._exact_record(line)
    if id_field is not None and isinstance(row, dict) and isinstance(row.get(id_field), float):
        return jsonl._exact_record(line)
    return row


ROWS_AT_ONCE = 1024  # parquet rows made Python objects together


def _lines(data: bytes) -> Iterator[bytes]:
    """The lines of JSONL bytes one by one, as bytes.splitlines() cuts them, without a list of all of them."""
    for line in io.BytesIO(data):
        yield line.rstrip(b"\r\n")


def iter_items(name: str, patterns: list[str], fields: list[str], id_field: str | None, mirrors,
               checksums: dict[str, str], data: dict[str, bytes | Path] | None = None) -> Iterator[Item]:
    """The benchmark's items in file order, one file's bytes held at a time; each file's sha256 (of the bytes
    the items were read from) put in `checksums` as it is read. `data`: files read already (by
    tokmix.stages.decontam.benchmark_checksums: a file is read once per run), by path: their bytes, or a local
    copy of them."""
    index = 0
    for path in benchmark_files(patterns, name, mirrors):
        if file_format(path) == "text" and (fields != ["text"] or id_field is not None):  # else silently not used
            raise TokmixError(f"benchmark {name}: file {path}: read as plain text (one item a line), which has no "
                              "fields: fields and id_field are for JSONL and parquet files (.jsonl, .jsonl.gz, "
                              ".parquet, ...)")
        held = data.get(path) if data is not None else None
        held = held.read_bytes() if isinstance(held, Path) else held if held is not None else (
            file_bytes(path, name, mirrors))
        checksums[path] = hashlib.sha256(held).hexdigest()
        for where, row in _rows(path, held, name, id_field):
            if isinstance(row, str):
                yield Item(index, str(index), row)
            else:
                item_id = str(index)
                if id_field is not None:
                    if row.get(id_field) is None:
                        what = "is null" if id_field in row else f"is missing (it has {', '.join(map(str, row))})"
                        raise TokmixError(f"benchmark {name}: {where}: id field {id_field!r} {what}")
                    if isinstance(row[id_field], jsonl._LongInteger):
                        raise TokmixError(f"benchmark {name}: {where}: id field {id_field!r} is an integer of "
                                          f"{row[id_field].digits:,} digits: over the {jsonl._int_digits_limit():,} "
                                          "Python reads and writes (a string id has no such limit)")
                    item_id = str(document_id(row[id_field], id_field, name, where))
                yield Item(index, item_id, _field_text(row, fields, name, where))
            index += 1
        del held
