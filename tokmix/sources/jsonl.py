"""JSONL sources (.jsonl, .ndjson, .json; gzip- or zstd-compressed too): one JSON object a line, its text field
a document. A plain file's pieces are byte ranges cut at newlines; a compressed file is one piece."""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import zlib
from collections.abc import Iterator

import orjson

from tokmix.errors import TokmixError
from tokmix.sources.files import file_size, open_file
from tokmix.sources.pieces import HugeText, Piece, Places, Sample, bad, document_id
from tokmix.text import clean_surrogates

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSION_GUESS = 4  # text compresses about 4x with gzip or zstd: a compressed file's size for scheduling
COMPRESSED = {".gz": "gzip", ".zst": "zstd"}
SAMPLE_READ_BYTES = 64 << 10
SAMPLE_FEED_BYTES = 4 << 10  # compressed bytes fed to a decompressor at a time: the grain of a sample's byte count


def codec(path: str) -> str | None:
    """"gzip", "zstd" or None, from the file's name."""
    return COMPRESSED.get(os.path.splitext(path.lower())[1])


def claims(path: str) -> bool:
    name = path.lower()
    stem, ext = os.path.splitext(name)
    return (stem if ext in COMPRESSED else name).endswith(JSONL_SUFFIXES)


def pieces(path: str, mirrors, unit_bytes: int) -> Iterator[Piece]:
    """Byte ranges of `unit_bytes` of a plain file (each line belongs to the range it starts in); a compressed
    file whole, its size scaled by COMPRESSION_GUESS."""
    size = file_size(path, mirrors)
    if codec(path):
        yield Piece(path, "jsonl", size=size * COMPRESSION_GUESS, file_bytes=size)
        return
    for start in range(0, max(size, 1), unit_bytes):
        yield Piece(path, "jsonl", start, min(start + unit_bytes, size), size=min(unit_bytes, size - start),
                    file_bytes=size)


def json_text(line: bytes, field: str, stream: str, path: str, where) -> str:
    # orjson parses UTF-8 text faster than json (docs/benchmarks.md), and a string it gives is valid UTF-8: no
    # lone surrogate to clean. It rejects what json would turn into one (an escape \ud800, surrogate bytes), a
    # BOM, NaN and more: any line it does not take to a dict whose field is a string goes to json, whose result
    # and error messages are the ones kept.
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        record = None
    if isinstance(record, dict) and isinstance(text := record.get(field), str):
        return text
    try:
        record = json.loads(line)
    except ValueError as e:
        raise bad(stream, path, where(), f"invalid JSON ({e})") from None
    except RecursionError:  # orjson stops at 1024 levels, json at Python's recursion limit
        raise bad(stream, path, where(), "JSON nested too deeply to read (over 1,024 levels of arrays or "
                   "objects)") from None
    if not isinstance(record, dict):
        kind = "null" if record is None else f"a JSON {type(record).__name__}"
        raise bad(stream, path, where(), f"no field {field!r}: the line is {kind}, not an object")
    if field not in record:
        raise bad(stream, path, where(), f"no field {field!r} (fields: {list(record)[:20]})")
    text = record[field]
    if not isinstance(text, str):
        kind = "null" if text is None else f"a {type(text).__name__}, not a string"
        raise bad(stream, path, where(), f"{field!r} is {kind}")
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
            raise bad(stream, path, where(), f"invalid JSON ({e})") from None
        data += clean_surrogates(piece).encode("utf-8")
        start = cut
    return HugeText(data, path, stream)


def streamed_json_text(f, first: bytes, field: str, stream: str, path: str, where,
                       huge: int) -> tuple[str | HugeText | None, int]:
    """huge_json_text for a line of a seekable file that starts with `first` (its first huge + 1 bytes) and goes on
    in `f`, never held whole: the line is read through to its newline a MiB at a time, keeping the rest of the line
    with every string literal longer than `huge` swapped for an empty one (_Literals), and the field's literal is
    read again from the file a piece at a time, so memory holds its decoded UTF-8 and one piece, not also the line
    (a 300 MB line peaked at ~840 MiB of the tree: docs/benchmarks.md). (The text or None for a blank line, the
    line's bytes.) `f` is left after the line."""
    scan, chunk = _Literals(f.tell() - len(first), huge), first
    while chunk:
        scan.feed(chunk)
        if chunk.endswith(b"\n"):
            break
        chunk = f.readline(1 << 20)
    short, after = scan.short(), f.tell()
    if short.isspace():
        return None, scan.size
    text = json_text(short, field, stream, path, where)
    if text or (span := scan.swapped.get(_value_offset(short, field))) is None:
        return text, scan.size
    start, stop = span
    data = bytearray()
    while start < stop:
        f.seek(start)
        window = f.read(min(huge, stop - start) + 1)  # with the byte after it, which _escape_free_cut looks at
        cut = _escape_free_cut(window, 0, len(window) - 1, stop - start)
        if cut > len(window) - 1:  # no place to cut (a text of nothing but escapes): the rest whole
            f.seek(start)
            window = f.read(cut)
        try:
            piece = json.loads(b'"' + window[:cut] + b'"')
        except ValueError as e:
            raise bad(stream, path, where(), f"invalid JSON ({e})") from None
        data += clean_surrogates(piece).encode("utf-8")
        start += cut
    f.seek(after)
    return HugeText(data, path, stream), scan.size


class _Literals:
    """A line fed in chunks: the line with every JSON string literal longer than `huge` bytes (quotes included)
    swapped for "", and where each swapped one's content lies in the file (as _string_literals finds literals: a
    quote closes one unless an odd run of backslashes precedes it, runs that may span chunks)."""

    def __init__(self, start: int, huge: int):
        self.at, self.huge, self.size = start, huge, 0  # the file offset of the next byte fed
        self.parts: list[bytes] = []
        self.kept = 0  # bytes in parts
        self.swapped: dict[int, tuple[int, int]] = {}  # offset of its "" in the short line -> content's (start, end)
        self.literal: list[bytes] | None = None  # the literal under way while it is short enough to keep
        self.opened = -1  # the file offset of its opening quote; -1 outside a literal
        self.length = self.backslashes = 0  # its bytes so far; the run of backslashes that ends them

    def feed(self, chunk: bytes) -> None:
        i, n = 0, len(chunk)
        while i < n:
            q = chunk.find(b'"', i)
            end = n if q == -1 else q
            if self.opened < 0:
                self._keep(chunk[i:end])
                if q != -1:
                    self.opened, self.literal, self.length, self.backslashes = self.at + q, [b'"'], 1, 0
                i = end + 1
                continue
            segment = chunk[i:end]
            run = len(segment) - len(segment.rstrip(b"\\"))
            run += self.backslashes if run == len(segment) else 0
            self._grow(segment)
            if q == -1:
                self.backslashes = run
                break
            self._grow(b'"')
            self.backslashes = 0
            if run % 2 == 0:  # the closing quote
                if self.literal is None:
                    self.swapped[self.kept] = (self.opened + 1, self.at + q)
                    self._keep(b'""')
                else:
                    self._keep(b"".join(self.literal))
                self.opened = -1
            i = end + 1
        self.at += n
        self.size += n

    def _grow(self, data: bytes) -> None:
        self.length += len(data)
        if self.literal is not None:
            self.literal.append(data)
            if self.length > self.huge:
                self.literal = None

    def _keep(self, data: bytes) -> None:
        self.parts.append(data)
        self.kept += len(data)

    def short(self) -> bytes:
        if self.opened >= 0:  # unterminated: what there is, for the parse to name
            self._keep(b"".join(self.literal) if self.literal is not None else b'"')
        return b"".join(self.parts)


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


def _open(piece: Piece, mirrors) -> io.BufferedIOBase:
    raw = open_file(piece.path, mirrors)
    kind = codec(piece.path)
    source = gzip.GzipFile(fileobj=raw) if kind == "gzip" else _ZstdFrames(raw) if kind == "zstd" else raw
    # lines are read through a 1 MiB buffer: with a file's default 8 KiB one, a line of web text takes
    # several reads joined (measured: docs/benchmarks.md, "Choices measured in the code")
    return io.BufferedReader(source, buffer_size=1 << 20)


class Decompressor:
    """Streaming gzip / zstd / identity: bytes of the file in, bytes of text out, across gzip members and zstd
    frames (a file may hold several, one after the other)."""

    def __init__(self, codec: str | None):
        self.codec = codec
        self._new()

    def _new(self) -> None:
        self.started = False  # bytes were fed to the current member or frame
        if self.codec == "gzip":
            self.obj = zlib.decompressobj(wbits=31)
        elif self.codec == "zstd":
            import zstandard

            self.obj = zstandard.ZstdDecompressor().decompressobj()
        else:
            self.obj = None

    def __call__(self, data: bytes) -> bytes:
        if self.obj is None:
            return data
        if self.obj.eof:  # the next member or frame starts with these bytes
            self._new()
        self.started = self.started or bool(data)
        out = [self.obj.decompress(data)]
        while self.obj.eof and self.obj.unused_data:
            rest = self.obj.unused_data
            self._new()
            self.started = True
            out.append(self.obj.decompress(rest))
        return b"".join(out)

    @property
    def inside(self) -> bool:
        """The bytes fed so far end inside a member or frame: a file that ends here is truncated."""
        return self.obj is not None and self.started and not self.obj.eof


class _ZstdFrames(io.RawIOBase):
    """Decompresses every frame of a .zst file and, unlike zstandard's stream_reader, raises on a file that
    ends inside a frame: a truncated download must not pass for a short file."""

    def __init__(self, raw):
        self.raw, self.decompress, self.pending = raw, Decompressor("zstd"), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            chunk = self.raw.read(1 << 20)
            if not chunk:
                if self.decompress.inside:
                    raise EOFError("the file ends inside a zstd frame")
                return 0  # the file is empty or ends where a frame ends
            self.pending = self.decompress(chunk)
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def ids(path: str, field: str, stream: str, mirrors, lines: list[int]) -> list[str | int]:
    """The ids (field `field`) of the documents at `lines` (0-based line numbers, ascending) of the file."""
    wanted, found = set(lines), {}
    with _open(Piece(path, "jsonl"), mirrors) as f:
        for n, line in enumerate(f):
            if n in wanted:
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    record = None
                if not isinstance(record, dict) or isinstance(record.get(field), float):
                    record = _exact_record(line)  # (orjson makes an integer outside 64 bits a float)
                if not isinstance(record, dict) or field not in record:
                    fields = list(record)[:20] if isinstance(record, dict) else []
                    raise bad(stream, path, f"line {n + 1}", f"no id field {field!r} (fields: {fields})")
                value = record[field]
                if isinstance(value, _LongInteger):
                    raise bad(stream, path, f"line {n + 1}", f"id field {field!r} is an integer of {value.digits:,} "
                              f"digits: over the {_int_digits_limit():,} Python reads and writes (a "
                              "string id has no such limit)")
                found[n] = document_id(value, field, stream, path, f"line {n + 1}")
                if len(found) == len(wanted):
                    break
    missing = sorted(wanted - found.keys())
    if missing:
        raise bad(stream, path, f"line {missing[0] + 1}", "not in the file any more (it holds fewer lines)")
    return [found[n] for n in lines]


class _LongInteger:
    """A JSON integer with more digits than Python converts (sys.get_int_max_str_digits()), kept to be named."""

    def __init__(self, literal: str):
        self.digits = len(literal.lstrip("-"))


def _int_digits_limit() -> int:
    """The most digits Python converts an integer from or to (0: no limit; a Python before 3.10.7 has none)."""
    return getattr(sys, "get_int_max_str_digits", lambda: 0)()


def _parse_int(literal: str) -> int | _LongInteger:
    limit = _int_digits_limit()
    return _LongInteger(literal) if limit and len(literal.lstrip("-")) > limit else int(literal)


def _exact_record(line: bytes):
    """A JSONL line as json reads it: every integer exactly, whatever its size (orjson makes one outside 64 bits a
    float), one too long for Python to convert a _LongInteger."""
    return json.loads(line, parse_int=_parse_int)


def _line_number(piece: Piece, mirrors, offset: int) -> int:
    """1-based line number of the line starting at byte `offset`; counted only when reporting an error."""
    with open_file(piece.path, mirrors) as f:
        return f.read(offset).count(b"\n") + 1


def texts(piece: Piece, field: str, stream: str, mirrors, huge: int | None,
          skip_huge: bool = False, places: Places | None = None) -> Iterator[str | HugeText]:
    """The piece's documents, line by line; with `huge`, see tokmix.sources.units.read_texts."""
    ranged = piece.stop != -1
    with _open(piece, mirrors) as f:
        # readline's limit (-1 is none): a longer line is skipped (skip_huge), or, in a file that can seek (not a
        # compressed one), streamed (streamed_json_text)
        streamed = huge is not None and not skip_huge and f.seekable()
        longest = huge + 1 if huge is not None and (skip_huge or streamed) else -1
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
                long = len(line) == longest and not line.endswith(b"\n")
                if long and skip_huge:  # a longer line is skipped
                    while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                        size += len(rest)
                    offset += size + len(rest)
                    continue
                if long or not line.isspace():  # (strip() would copy a 200 MB line)
                    where = (
                        (lambda o=offset: f"line {_line_number(piece, mirrors, o)}")
                        if ranged
                        else (lambda n=line_no: f"line {n}")
                    )
                    if long:
                        text, size = streamed_json_text(f, line, field, stream, piece.path, where, huge)
                        if text is None:  # a blank line
                            offset += size
                            continue
                    elif huge is not None and size > huge:
                        text = huge_json_text(line, field, stream, piece.path, where, huge)
                    else:
                        text = json_text(line, field, stream, piece.path, where)
                    del line  # a 200 MB line must not stay alive beside its text while it is tokenized
                    if places is not None:
                        places.add(line_no - 1, empty=not text)
                    yield text
                offset += size
            if places is not None:
                places.lines[places.piece] = line_no
        except TokmixError:
            raise
        except Exception as e:  # EOFError, BadGzipFile, zstandard's ZstdError: a truncated or corrupt file
            raise bad(stream, piece.path, f"line {line_no + 1}", f"truncated or corrupt file ({e})") from None


def sample(path: str, field: str, stream: str, mirrors, limit: int) -> Sample:
    """The first whole lines of a JSONL file, decompressed, about `limit` bytes of them. A compressed file's
    bytes used are the compressed bytes that gave the output (counted when the output last grew: a codec holds
    back a block until it is whole), in proportion to the whole lines in that output."""
    decompress = Decompressor(codec(path))
    data, fed, fed_at_output, eof, has_newline = bytearray(), 0, 0, False, False
    try:
        with open_file(path, mirrors) as raw:
            while len(data) < limit or not has_newline:
                chunk = raw.read(SAMPLE_READ_BYTES)
                if not chunk:
                    eof = True
                    break
                for at in range(0, len(chunk), SAMPLE_FEED_BYTES):
                    fed += len(chunk[at : at + SAMPLE_FEED_BYTES])
                    new = decompress(chunk[at : at + SAMPLE_FEED_BYTES])
                    if new:
                        fed_at_output = fed
                        has_newline = has_newline or b"\n" in new
                        data += new
                        if len(data) >= limit and has_newline:
                            break
    except FileNotFoundError:
        raise TokmixError(f"stream {stream}: file {path}: not found") from None
    except Exception as e:  # OSError, zlib.error, zstandard.ZstdError: unreadable or corrupt
        raise TokmixError(f"stream {stream}: file {path}: cannot read: {e}") from None
    cut = len(data) if eof else data.rfind(b"\n") + 1
    used = fed if eof else round(fed_at_output * cut / max(len(data), 1))
    found = []
    for n, line in enumerate(bytes(data[:cut]).split(b"\n"), start=1):
        if line.strip():
            found.append(json_text(line, field, stream, path, lambda n=n: f"line {n}"))
    return Sample(found, used, eof)


def byte_count(path: str, field: str, mirrors) -> int:
    """The file's size: a compressed file is counted in compressed bytes (a sample's rate holds its ratio)."""
    return file_size(path, mirrors)
