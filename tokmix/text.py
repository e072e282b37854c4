"""Text helpers that know no tokenizer: lone surrogates cleaned before any encoder sees a document, a long
document cut into pieces where a word ends, as a str or as UTF-8 bytes (tokmix.backends.can_cut_documents says
which tokenizers give the same ids for the pieces as for the whole), and the CRC-32 documents are checked by."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

# the provenance CRC-32s (tokmix.provenance, tokmix.sources.parquet): ISA-L's, zlib's values at ~4x its speed
# (10.3 against 2.5 GB/s here: docs/benchmarks.md), or zlib's on a platform without isal's wheel
try:
    from isal.isal_zlib import crc32  # noqa: F401
except ImportError:
    from zlib import crc32  # noqa: F401


def clean_surrogates(text: str) -> str:
    """Replace lone surrogates with U+FFFD (and join a split surrogate pair) so every backend sees valid text.

    HF cannot encode them at all, so the pipeline cleans each document once, upstream of any encoder. Most text has
    none: ASCII is a flag check, anything else one UTF-8 encode.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


HUGE_DOC_CHARS = 4 << 20  # a longer document is encoded piece by piece: fastokens needs several bytes a char whole
# Unicode White_Space: what the tokenizers' regex engine calls \s (Python's \s also takes \x1c-\x1f)
_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B))))
_SPACE_CLASS = "".join(re.escape(c) for c in sorted(_SPACE))
_WORD_END = re.compile(f"[^{_SPACE_CLASS}](?=[{_SPACE_CLASS}])")


# nor is a cut made after a "▁", the character a SentencePiece model writes a space as (its whitespace pieces,
# "▁▁", would join the two)
_NOT_BEFORE_CUT = _SPACE | {"\u2581"}
_SPACE_BEFORE = re.compile(f"(?<=[^{_SPACE_CLASS}\u2581]) ")


def _cut(text: str, p: int, letter: bool) -> bool:
    """Whether p is a place to cut `text`: a space after a non-space (GPT-2's regex always ends a pre-token
    there), and with `letter` an ASCII space with a letter after it and neither whitespace nor "▁" before it,
    where tiktoken's cl100k and o200k patterns and DeepSeek-V3's splits end one too (none of their alternatives
    takes a space after its first character) and start the next with that space (a space and letters, in every
    one of them), and no piece of a SentencePiece model tokmix cuts spans it (backends.can_cut_documents)."""
    if letter:
        return (text[p] == " " and text[p - 1] not in _NOT_BEFORE_CUT and p + 1 < len(text)
                and text[p + 1].isalpha())
    return text[p] in _SPACE and text[p - 1] not in _SPACE


def _word_end(text: str, lo: int, hi: int, letter: bool) -> int | None:
    """The last p in (lo, hi] to cut at (_cut), searched backwards from hi; in prose the first tries succeed."""
    for p in range(min(hi, len(text) - 1), lo, -1):
        if _cut(text, p, letter):
            return p
    return None


def _next_cut(text: str, at: int, letter: bool) -> int | None:
    if not letter:
        found = _WORD_END.search(text, at)
        return None if found is None else found.end()
    return next((m.start() for m in _SPACE_BEFORE.finditer(text, at) if _cut(text, m.start(), True)), None)


def document_pieces(text: str, piece_chars: int = HUGE_DOC_CHARS, letter: bool = True) -> Iterator[str]:
    """A long text in pieces of about piece_chars, each cut where a word ends and a space before a letter starts
    (_cut; `letter` False: before any whitespace, for the tokenizer trainer's words, which these pieces it has
    always been given keep); a text with no such place in a piece's second half is cut at the next one after
    it, or not at all (one 200 MB word)."""
    start = 0
    while len(text) - start > piece_chars:
        end = _word_end(text, start + piece_chars // 2, start + piece_chars, letter)
        if end is None:
            end = _next_cut(text, start + piece_chars, letter)
            if end is None:
                break
        yield text[start:end]
        start = end
    yield text[start:]


def without_cut_spaces(pieces: Iterable[str]) -> Iterator[str]:
    """A document's pieces (document_pieces, utf8_pieces) as a tokenizer that puts "▁" before every text it
    encodes is given them: each after the first without the space it was cut at, which that "▁" stands for."""
    for i, piece in enumerate(pieces):
        yield piece[1:] if i else piece  # (a cut is always at an ASCII space)


def _char_before(data, p: int) -> str:
    """The character that ends just before byte p of UTF-8 data."""
    start = p - 1
    while start > 0 and p - start < 4 and data[start] & 0xC0 == 0x80:  # continuation bytes
        start -= 1
    return bytes(data[start:p]).decode("utf-8", "replace")[-1:]


def _char_at(data, p: int) -> str:
    """The character that starts at byte p of UTF-8 data ("" past its end, U+FFFD for a byte no character
    starts with)."""
    lead = data[p] if p < len(data) else 0
    size = 1 if lead < 0x80 else 2 if 0xC0 <= lead < 0xE0 else 3 if lead < 0xF0 else 4
    return bytes(data[p : p + size]).decode("utf-8", "replace")[:1]


def _byte_cut(view, p: int) -> bool:
    """_cut with a letter, at byte p of UTF-8 data: an ASCII space after a non-space (nor "▁"), before a letter."""
    return view[p] == 0x20 and _char_before(view, p) not in _NOT_BEFORE_CUT and _char_at(view, p + 1).isalpha()


def utf8_pieces(data, piece_bytes: int = HUGE_DOC_CHARS) -> Iterator[str]:
    """document_pieces for a document held as UTF-8 bytes (never one Python string): cut at an ASCII space that
    follows a non-space character and comes before a letter, each piece decoded on its own (a cut at an ASCII
    byte is always a character boundary). Raises UnicodeDecodeError on invalid UTF-8, with the offset of the
    piece in `.start`."""
    view = memoryview(data)
    start, n = 0, len(view)
    while start < n:
        end = n
        if n - start > piece_bytes:
            end = next((p for p in range(start + piece_bytes, start + piece_bytes // 2, -1) if _byte_cut(view, p)),
                       None)
            if end is None:
                end = next((p for p in range(start + piece_bytes, n) if _byte_cut(view, p)), n)
        try:
            yield bytes(view[start:end]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise UnicodeDecodeError(e.encoding, e.object, start + e.start, start + e.end, e.reason) from None
        start = end


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def size_bytes(text: str) -> int:
    """'1GiB', '512M', '2g', '1073741824' -> bytes (binary units); ValueError for anything else."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(text)
    return int(float(m.group(1)) * 1024 ** "bkmgt".index((m.group(2) or "b").lower()))
