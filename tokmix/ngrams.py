"""Word n-grams for benchmark decontamination: the normalization that turns texts into words (docs/recipe.md;
NORMALIZATION names it and is part of the identity of every run that uses it), and the 64-bit hashes of
their words and n-grams, computed for a group of documents at once in numpy (no Python object per word).

A hash only finds candidates: the stage compares every candidate with the benchmark item's own words, so a
collision never drops a document (tokmix.stages.decontam)."""

from __future__ import annotations

import functools
import os
import threading
import unicodedata
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

NORMALIZATION = "tokmix-words-v1"  # NFKC, lowercase, words = runs of letters and digits (see words())

# Every byte of the normalized UTF-8 text mapped: an ASCII letter to its lowercase, a digit to itself, any
# other ASCII byte to 0 (a separator); a byte >= 0x80 (part of a non-ASCII character) to itself.
_BYTE_MAP = np.array([b if b >= 0x80 or chr(b).isdigit() or chr(b).islower() else
                      ord(chr(b).lower()) if chr(b).isupper() else 0 for b in range(256)], np.uint8)
_BYTE_TABLE = _BYTE_MAP.tobytes()

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_STEP = np.uint64(0x100000001B3)
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        return x ^ (x >> np.uint64(31))


def _punctuation(data: np.ndarray) -> np.ndarray:
    """The positions of the bytes of non-ASCII punctuation that NFKC leaves (as UTF-8): U+0080-U+00BF (Latin-1
    controls, punctuation, signs), U+2000-U+206F (General Punctuation: dashes, curly quotes, odd spaces,
    bullets) and U+3000-U+303F (CJK punctuation). A lead byte never occurs inside another character."""
    lead = np.flatnonzero((data == 0xC2) | (data == 0xE2) | (data == 0xE3))
    lead = lead[lead + 2 < len(data)]  # the joined texts end with a separator: a lead byte has its followers
    second, third = data[lead + 1], data[lead + 2]
    kind = data[lead]
    two = lead[(kind == 0xC2) & (second >= 0x80) & (second <= 0xBF)]
    three = lead[((kind == 0xE2) & ((second == 0x80) | ((second == 0x81) & (third <= 0xAF))))
                 | ((kind == 0xE3) & (second == 0x80))]
    return np.concatenate([two, two + 1, three, three + 1, three + 2])


def normalized_bytes(text: str) -> bytes:
    """A text's UTF-8 bytes before the byte map: NFKC and lowercase (an ASCII text is its own NFKC form and is
    lowercased by the map)."""
    if text.isascii():
        return text.encode()
    return _nfkc(text).lower().encode("utf-8", "replace")


def _nfkc(text: str) -> str:
    """unicodedata.normalize("NFKC", text), only where the quick check says the text is not in NFKC form (most
    text is), a no-break space made a space first: NFKC makes it one, and it is a starter that composes with
    nothing on either side, so the form is the same (NFKD's is, character by character, and NFC composes the
    same pairs); a text whose only character out of NFKC form was one (the corpus's most common) then passes
    the quick check."""
    if "\u00a0" in text:
        text = text.replace("\u00a0", " ")
    return text if unicodedata.is_normalized("NFKC", text) else unicodedata.normalize("NFKC", text)


@dataclass
class Words:
    """A group of texts as words: the mapped bytes of all of them end to end (a separator between texts), each
    word's first byte and end, its hash, and each text's first word (`first`, one more entry: the end)."""

    data: np.ndarray  # uint8, mapped
    offsets: np.ndarray  # each text's first byte in data (one more entry: the end)
    starts: np.ndarray
    ends: np.ndarray
    hashes: np.ndarray
    first: np.ndarray

    def word(self, w: int) -> bytes:
        return self.data[self.starts[w]:self.ends[w]].tobytes()

    def text_words(self, t: int) -> list[bytes]:
        return [self.word(w) for w in range(int(self.first[t]), int(self.first[t + 1]))]

    def grams(self, n: int, member: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(hash, first word) of every run of `n` words inside one text whose words are all `member`s (all
        runs without it); runs of different lengths hash apart."""
        count = len(self.hashes) - n + 1
        if count <= 0:
            return np.empty(0, np.uint64), np.empty(0, np.int64)
        # the words a run may not have before its last: a text's last word, a non-member
        outside = np.zeros(len(self.hashes) + 1, np.int32)
        outside[self.first[1:] - 1] = 1  # (-1 for texts before the first word: the spare last entry)
        if member is not None:
            outside[:-1] += ~member
        before = np.concatenate([[0], np.cumsum(outside[:-1], dtype=np.int64)])
        # words i..i+n-1 are a run when none of i..i+n-2 is outside, and the last is a member
        at = np.flatnonzero(before[n - 1:n - 1 + count] - before[:count] == 0)
        if member is not None:
            at = at[member[at + n - 1]]
        if len(at) * SLICES_FROM < count:  # few runs: gathers at them
            return gram_hashes_at(self.hashes, at, n), at
        return gram_hashes(self.hashes, n)[at], at  # most: slices of the word hashes (the same values)

    def text_of(self, w: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.first, w, side="right") - 1


SLICES_FROM = 4  # n-grams at more than 1 in this many positions are hashed at all of them, by slices


def split_words(texts: list[str]) -> Words:
    """The texts' words: NFKC, lowercase; every ASCII character that is not a letter or a digit (punctuation,
    '_', whitespace, controls) and the non-ASCII punctuation of _punctuation separates words; a word is a
    maximal run of the rest (letters, digits, any other non-ASCII character)."""
    raw, data, offsets = _joined([normalized_bytes(t) for t in texts])
    return _words_of(raw, data, offsets, not all(t.isascii() for t in texts))


def _joined(parts: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parts end to end with a zero byte before and between them and 9 after them (prefix_hashes reads 8
    bytes from a word's start), the same bytes through _BYTE_MAP, and each part's first byte in them (one more
    entry: the end). Both arrays are writable (bytearrays); bytes.translate maps them in one C loop, a few
    times faster than numpy's gather."""
    joined, offsets = _concatenated(parts)
    return np.frombuffer(joined, np.uint8), np.frombuffer(joined.translate(_BYTE_TABLE), np.uint8), offsets


def _concatenated(parts: list[bytes]) -> tuple[bytearray, np.ndarray]:
    offsets = np.cumsum([1] + [len(p) + 1 for p in parts])
    joined = bytearray(b"\0")
    joined += bytearray(b"\0").join(parts)
    joined += bytes(9)
    return joined, offsets


def _letters(parts: list[bytes], wide: list[int]) -> tuple[bytearray, np.ndarray, np.ndarray, np.ndarray,
                                                           np.ndarray]:
    """_joined's joined parts (as they are and as an array), whether each byte is one of a word's (an ASCII letter
    or digit, or a byte of a non-ASCII character), each part's first byte, and where the bytes of non-ASCII
    characters are, looked for in the parts `wide` only (the others are ASCII). In numpy's loops, which let other
    threads take the GIL (bytes.translate holds it: its share of the GIL was the first pass's largest, in py-spy
    --gil)."""
    joined, offsets = _concatenated(parts)
    raw = np.frombuffer(joined, np.uint8)
    scratch = raw | np.uint8(0x20)  # an ASCII letter lowercase
    scratch -= np.uint8(ord("a"))
    letter = scratch < 26
    np.subtract(raw, np.uint8(ord("0")), out=scratch)
    letter |= scratch < 10
    high = [np.flatnonzero(raw[offsets[t]:offsets[t + 1]] >= 0x80) + offsets[t] for t in wide]
    high = np.concatenate(high) if high else np.empty(0, np.int64)
    letter[high] = True
    return joined, raw, letter, offsets, high


def _words_of(raw: np.ndarray, data: np.ndarray, offsets: np.ndarray, non_ascii: bool,
              cuts: np.ndarray | None = None) -> Words:
    """split_words of the texts' normalized bytes joined and mapped (_joined); `cuts`: more bytes that separate."""
    if non_ascii:
        data[_punctuation(raw)] = 0
    if cuts is not None:
        data[cuts] = 0
    starts, ends = word_bounds(data != 0)
    first = np.searchsorted(starts, offsets)
    return Words(data, offsets, starts, ends, word_hashes(data, starts, ends), first)


def word_bounds(letter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each maximal run of True's first index and end (`letter` starts and ends with False)."""
    edges = np.flatnonzero(letter[1:] != letter[:-1]) + 1
    return edges[0::2], edges[1::2]


Links = tuple[np.ndarray, np.ndarray | None]  # run_candidates' pairs: (each word and the next, each and the next two)

NATIVE_ENV = "TOKMIX_NATIVE"  # "0": the first pass in numpy even where tokmix._scan is built (docs/architecture.md)
SCAN_ABI = 6  # tokmix/_scan.c's TOKMIX_SCAN_ABI, its module's ABI: bump both on any change to its functions'
REBUILD = "rebuild it with `python setup.py build_ext --inplace` (or `pip install -e .`)"


def _load_compiled():
    """The first pass's split in one compiled loop (tokmix/_scan.c, built by setup.py where a C compiler is) and
    None, or None and why not (not built, or a .so that does not load or is stale: an editable install does not
    rebuild it after _scan.c changes, and one whose ABI is not SCAN_ABI would take other arguments); numpy then
    computes the same arrays (_scan_numpy). A stale or broken one also warns, once, at import."""
    try:
        from tokmix import _scan
    except ModuleNotFoundError as e:
        if e.name != "tokmix._scan":
            raise
        return None, "tokmix._scan is not built (no C compiler when tokmix was installed; docs/architecture.md)"
    except ImportError as e:
        why = f"tokmix._scan does not load ({str(e).splitlines()[0] if str(e) else type(e).__name__}): {REBUILD}"
    else:
        abi = getattr(_scan, "ABI", None)
        if abi == SCAN_ABI:
            return _scan, None
        why = f"tokmix._scan is stale (ABI {'none' if abi is None else abi}, expected {SCAN_ABI}): {REBUILD}"
    warnings.warn(f"{why}; using the numpy first pass", RuntimeWarning, stacklevel=2)
    return None, why


_compiled, _not_compiled = _load_compiled()


def compiled():
    """tokmix._scan where it is built (and its ABI is SCAN_ABI) and TOKMIX_NATIVE is not "0" (read at each call),
    else None."""
    return None if os.environ.get(NATIVE_ENV) == "0" else _compiled


def first_pass_note() -> str | None:
    """The one line a run's log and `tokmix plan` say when the first pass runs in numpy on this machine."""
    if os.environ.get(NATIVE_ENV) == "0":
        return f"decontaminate: the first pass in numpy ({NATIVE_ENV}=0)"
    if _compiled is None:
        return f"decontaminate: the first pass in numpy, about 1.5x the compiled check's CPU: {_not_compiled}"
    return None


@dataclass
class RawWords:
    """A group of texts split as run_candidates splits their raw UTF-8 bytes (scan): `joined`, the texts' UTF-8
    as _concatenated joins them (a text that does not encode, one with a lone surrogate, `forced`, as no bytes),
    `raw` the same as an array, each text's first byte in them (`offsets`, one more entry: the end), the runs of
    the letter mask (`starts`, `ends`), each run's first 8 bytes lowercased (`heads`, _first_bytes' `lower`),
    the runs with non-ASCII bytes (`wild`) but those holding _JOINT (`held`, in order each), and with a pair
    table, table_links of the heads (`link`, else None)."""

    joined: bytearray
    raw: np.ndarray
    offsets: np.ndarray
    forced: list[int]
    starts: np.ndarray
    ends: np.ndarray
    heads: np.ndarray
    wild: np.ndarray
    held: np.ndarray
    link: np.ndarray | None


@dataclass(frozen=True)
class PairTable:
    """A pair table of word classes (table_links: `table`, bool, `bits` bits a class) and the same as bits
    (`packed`, little-endian: what tokmix._scan's loop reads, 1/8 of the bytes)."""

    table: np.ndarray
    bits: int
    packed: np.ndarray

    @classmethod
    def of(cls, table: np.ndarray, bits: int) -> PairTable:
        return cls(table, bits, np.packbits(table, bitorder="little"))


@dataclass(frozen=True)
class TripleFilter:
    """A bit filter of each three consecutive words of a set's items as run_candidates' `pairs` (a set too large
    for a pair table; its items all of 3 words or more: no pair filter, two words are linked when they are two of
    a triple that may be an item's): `bits`, uint8, a bit per slot, little-endian in each byte; a triple's slot,
    its hash (pair_hashes of its first two words' pair_hashes and the third's prefix_hashes) >> `shift`. Called as
    `pairs` is, it gives numpy's links: (None, whether each word and the next two may be an item's three); in
    tokmix._scan's loop where it is built (triple_candidates)."""

    bits: np.ndarray
    shift: int

    def __call__(self, heads: np.ndarray, lengths: np.ndarray) -> Links:
        prefix = head_prefixes(heads, lengths)
        pairs = pair_hashes(prefix[:-1], prefix[1:])
        slots = pair_hashes(pairs[:-1], prefix[2:]) >> np.uint64(self.shift)
        return None, ((self.bits[(slots >> np.uint64(3)).astype(np.int64)] >> (slots & np.uint64(7)).astype(np.uint8))
                      & 1) == 1


@dataclass(frozen=True)
class WordFilter:
    """A bit filter of word hashes as run_candidates' `member`: `bits`, uint8, a bit per slot, little-endian in
    each byte; a hash's slot, its value >> `shift`. Called on hashes, whether each one's slot is set. tokmix._scan's
    loop (a pair table's or a triple filter's) tests it itself and so normalizes most wild runs there (normal_forms)."""

    bits: np.ndarray
    shift: int

    def __call__(self, hashes: np.ndarray) -> np.ndarray:
        slots = hashes >> np.uint64(self.shift)
        return ((self.bits[(slots >> np.uint64(3)).astype(np.int64)] >> (slots & np.uint64(7)).astype(np.uint8))
                & 1) == 1


# Each character's normal form for the compiled loop's wild runs: NFKC and lowercase of the character alone,
# through _BYTE_MAP with _punctuation's bytes made separators (zeros), as one uint32 per code point below FORMS_END
# (0: its block of FORMS_BLOCK not built yet; 1: the character is not context-free, its run is left to _chained;
# else form << 8 | sigma << 7 | length << 1 | 1, its form's `length` bytes at `form` in the pool, `sigma` if they
# hold a small sigma). Built from unicodedata itself, a block the first time the loop meets one of its characters.
FORMS_END = 0x20000  # planes 0 and 1 (beyond: CJK extensions, left to _chained)
FORMS_BLOCK = 128
_forms: tuple[np.ndarray, bytes] = (np.zeros(FORMS_END, np.uint32), b"")
_forms_lock = threading.Lock()


def normal_forms() -> tuple[np.ndarray, bytes]:
    """The characters' normal forms built so far (entries, pool): a snapshot that is never changed (a block built
    makes a new one), so a loop may read it without the GIL while another thread adds blocks."""
    return _forms


FORMS_AT_ONCE = 32  # blocks built together: a missing one's aligned 4,096 code points (a script's neighbours)
FORMS_FIRST = 0xA000  # and the first time, every block below it (Latin to CJK's ideographs: 0.02 CPU-s)


def add_normal_forms(blocks: list[int]) -> None:
    """Build the blocks (code point // FORMS_BLOCK) that normal_forms lacks, with the others of their FORMS_AT_ONCE
    (and the first time all below FORMS_FIRST): each group that meets a block not built runs the loop twice
    (_candidates_native), so a run's text of many scripts (the bench corpus's train files meet 297 blocks)
    should meet few."""
    global _forms
    with _forms_lock:
        entries, pool = _forms
        wanted = {b // FORMS_AT_ONCE * FORMS_AT_ONCE + k for b in blocks for k in range(FORMS_AT_ONCE)}
        if not pool:
            wanted.update(range(FORMS_FIRST // FORMS_BLOCK))
        blocks = sorted({b for b in wanted if 0 <= b < FORMS_END // FORMS_BLOCK and not entries[b * FORMS_BLOCK]})
        if not blocks:
            return
        entries, pool = entries.copy(), bytearray(pool)
        chars, forms = [], []
        for block in blocks:
            entries[block * FORMS_BLOCK:(block + 1) * FORMS_BLOCK] = 1
            _block_forms(block, chars, forms)
        raw, data, offsets = _joined(forms)  # the forms joined, mapped: the pool's new part, as it is
        data[_punctuation(raw)] = 0
        starts, lengths = offsets[:-1], offsets[1:] - 1 - offsets[:-1]
        lead = np.flatnonzero(raw[:-1] == 0xCF)  # a small sigma's UTF-8: CF 82, CF 83
        sigma = np.zeros(len(chars), np.int64)
        sigma[np.searchsorted(starts, lead[(raw[lead + 1] == 0x82) | (raw[lead + 1] == 0x83)], side="right") - 1] = 1
        keep = lengths < 64  # (the longest form is 54 bytes)
        if len(pool) + len(data) < 1 << 24:
            values = (len(pool) + starts) << 8 | sigma << 7 | lengths << 1 | 1
            entries[np.array(chars, np.int64)[keep]] = values[keep].astype(np.uint32)
            pool += data.tobytes()
        _forms = (entries, bytes(pool))


def _block_forms(block: int, chars: list[int], forms: list[bytes]) -> None:
    """The context-free characters of one block (normal_forms) and their forms' UTF-8, appended. A character is
    context-free when its NFKD form starts with a starter (combining class 0) that composes with no character
    before it (_composes_after) and its NFKC form holds no capital sigma (lowercased by its context): then in any
    string of such characters and ASCII ones, the NFKD forms end to end start each with a starter that nothing
    before it reorders or composes with, so NFKC of the string is the characters' NFKC forms end to end, and so
    is its lowercase (Python's only contextual lowercasing is a capital sigma's). Its form: unicodedata's NFKC of
    the character alone, lowercased. A block in NFKD form whole (CJK's: no character of it decomposes, so each is
    its own NFKD and NFKC form) without a capital sigma and lowercased character for character: its characters
    tested at once."""
    after = _composes_after()
    codes = [c for c in range(block * FORMS_BLOCK, (block + 1) * FORMS_BLOCK)
             if c >= 0x80 and not 0xD800 <= c < 0xE000]  # (ASCII: the loop's own; a surrogate never reaches it)
    text = "".join(map(chr, codes))
    lowered = text.lower()
    if unicodedata.is_normalized("NFKD", text) and "\u03a3" not in text and len(lowered) == len(text):
        for c, ch, low in zip(codes, text, lowered):
            if not unicodedata.combining(ch) and ch not in after:
                chars.append(c)
                forms.append(low.encode())
        return
    for c in codes:
        ch = chr(c)
        first = unicodedata.normalize("NFKD", ch)[0]
        if unicodedata.combining(ch) or unicodedata.combining(first) or ch in after or first in after:
            continue
        form = unicodedata.normalize("NFKC", ch)
        if "\u03a3" not in form:
            chars.append(c)
            forms.append(form.lower().encode())


@functools.cache
def _composes_after() -> frozenset[str]:
    """Every character that canonical composition may join to a character before it: the second of each
    two-character canonical decomposition below FORMS_END (composition exclusions included: more than needed,
    never less; none is above it, tests/test_ngrams_native.py), and the Hangul vowel and trailing jamo."""
    after = {chr(c) for c in [*range(0x1161, 0x1176), *range(0x11A7, 0x11C3)]}
    for block in range(0, FORMS_END, FORMS_BLOCK):
        chars = [chr(c) for c in range(block, block + FORMS_BLOCK) if not 0xD800 <= c < 0xE000]
        if unicodedata.is_normalized("NFD", "".join(chars)):  # (then no character of it decomposes)
            continue
        for ch in chars:
            mapping = unicodedata.decomposition(ch)
            if mapping and mapping[0] != "<":
                parts = mapping.split()
                if len(parts) == 2:
                    after.add(chr(int(parts[1], 16)))
    return frozenset(after)


def scan(texts: list[str], table: PairTable | None = None) -> RawWords:
    """run_candidates' split of the texts (and `table`'s links): in tokmix._scan's loop where it is built
    (compiled()), else numpy's."""
    native = compiled()
    return _scan_numpy(texts, table) if native is None else _scan_native(texts, native, table)


def _scan_native(texts: list[str], native, table: PairTable | None = None) -> RawWords:
    joined, offsets, starts, ends, heads, wild, held, forced, link = native.scan(texts, *(
        () if table is None else (table.packed, table.bits)))
    whole = [np.frombuffer(b, np.int64) for b in (offsets, starts, ends, wild, held)]
    return RawWords(joined, np.frombuffer(joined, np.uint8), whole[0], forced, whole[1], whole[2],
                    np.frombuffer(heads, np.uint64), whole[3], whole[4], None if link is None else
                    np.frombuffer(link, bool))


def _scan_numpy(texts: list[str], table: PairTable | None = None) -> RawWords:
    """scan in numpy: the reference of tokmix._scan (tests/test_ngrams_native.py compares them)."""
    forced, parts = [], []
    for i, text in enumerate(texts):
        try:
            parts.append(text.encode())
        except UnicodeEncodeError:  # a lone surrogate: checked the slow way
            forced.append(i)
            parts.append(b"")
    joined, raw, letter, offsets, high = _letters(parts, [t for t, text in enumerate(texts) if not text.isascii()])
    if len(high):
        letter[high - 1] = True  # a separator before a non-ASCII character may compose with it
        letter[offsets - 1] = False  # never across two texts
    starts, ends = word_bounds(letter)
    heads, _ = _first_bytes(raw, starts, ends, True)
    wild = held = np.empty(0, np.int64)
    if len(high):
        wild = _distinct(np.searchsorted(starts, high, side="right") - 1)
        joints = _joints(raw)
        if len(joints):  # a run holding _JOINT itself
            held = _distinct(np.searchsorted(starts, joints, side="right") - 1)
            wild = np.setdiff1d(wild, held)
    link = None if table is None else _table_links_numpy(heads, table.table, table.bits)
    return RawWords(joined, raw, offsets, forced, starts, ends, heads, wild, held, link)


def run_candidates(texts: list[str], pairs: Callable[[np.ndarray, np.ndarray], Links] | PairTable | TripleFilter,
                   member: Callable[[np.ndarray], np.ndarray], shortest: int) -> list[tuple[int, list[str] | None]]:
    """The texts that may hold `shortest` consecutive words (after normalization) each two of which may be two
    consecutive words of an item, and each three three (`pairs(heads, lengths)`, of each word's first 8 bytes
    lowercased as prefix_hashes' `lower` says, a plain run's as its mapped bytes', and its length: whether each
    word and the next may be, None: whenever they are two of three that may be, which needs `shortest` >= 3; and
    whether each word and the next two may be, None: unknown, all may; or a pair table, PairTable, whose
    table_links are whether each word and the next may be, no triples; or a TripleFilter, `shortest` >= 3) and each
    a `member` (of their word
    hashes), each with the pieces of it that hold every such run of words (its chains, below; None: the whole
    text); no other text, and no other part of one, holds an n-gram of a benchmark item. Cheap: the raw UTF-8
    bytes are split as split_words splits an ASCII text (scan: one compiled loop where tokmix._scan is built,
    numpy's same arrays otherwise), and only the runs with non-ASCII characters are normalized.

    Why that is exact: NFKC never changes an ASCII character that no non-ASCII one follows (an ASCII character
    composes with nothing before it, only with combining marks after it), and lowercasing one is ASCII's. So a
    run of ASCII letters and digits between ASCII separators that no non-ASCII character follows ("plain") is
    one normalized word between separators. Each other run ("wild": non-ASCII characters with the ASCII letters
    and digits joined to them, and an ASCII separator just before one) is normalized alone: it is cut before
    ASCII characters, where NFKC may cut a text, and where lowercasing's one context, a final sigma, ends but
    across case-ignorable ASCII (a wild run with a sigma counts as a member). A wild run gives its words: none
    (it links its neighbours), some with a member (taken as all members, linked to both neighbours) or no member
    (it breaks the chain). A chain of linked runs must hold `shortest` words, and three plain runs in a row are
    in one chain only if they may be an item's three words (they are three consecutive words; a triple with a
    wild run always may, whatever its words): two chains may share a run.

    Why a chain's piece alone has the text's words there: it starts and ends at run bounds, so the characters
    on both sides of it are ASCII separators and it is cut before ASCII characters (NFKC's form of the text is
    the pieces' forms end to end, and no word crosses a cut). Lowercasing is the same alone but for a final
    sigma, whose context may reach across case-ignorable ASCII ("'", ".", ":"): a text with a piece whose NFKC
    form holds a capital sigma is checked whole."""
    if shortest <= 1:  # an item of one word: any word may be one
        return [(t, None) for t in range(len(texts))]
    native = compiled()
    if native is not None and (isinstance(pairs, PairTable) or (isinstance(pairs, TripleFilter) and shortest >= 3)):
        return _candidates_native(texts, native, pairs, member, shortest)
    return _chained(texts, pairs, member, shortest)


def _candidates_native(texts: list[str], native, table: PairTable | TripleFilter,
                       member: Callable[[np.ndarray], np.ndarray], shortest: int) -> list[tuple[int, list[str] | None]]:
    """run_candidates with a pair table in tokmix._scan's one loop (candidates; a triple filter: triple_candidates):
    the chains of plain runs come out of it whole; each piece of a text holding wild runs (a segment of runs
    linked as their NFKC may link them, with the plain runs beside them: an unlinked pair of plain runs at both
    ends, where the text's chains end too) is split by _chained as a text of its own, and its pieces are the
    text's there. No array per word for the rest (most of a corpus). With a pair table and a WordFilter, the loop
    decides a wild run itself when each of its characters has a context-free normal form (normal_forms: the
    run's NFKC and lowercase are their forms end to end), its words hashed and tested as _wild_words tests them,
    and links it as _chained links it; only the segments around the other wild runs (combining marks, characters
    that compose with the one before, a capital sigma, CJK beyond plane 1, a block not built yet) are _chained's.
    With a triple filter and a WordFilter, the loop decides the same wild runs and finds the chains around them
    as _chained's _chains finds them (a run's words counted, the triples with a linked one all may be); the
    segments around the others are _chained's. The same pieces either way (tests/test_ngrams_native.py)."""
    if isinstance(member, WordFilter):  # most wild runs normalized in the loop
        for _ in range(2):  # the blocks met and not built yet, built and the loop run again once (cheaper
            entries, pool = normal_forms()  # than _chained's numpy over their runs)
            if isinstance(table, PairTable):
                joined, spans, forced, missing = native.candidates(texts, table.packed, table.bits, shortest,
                                                                   entries, pool, member.bits, member.shift)
            else:
                joined, spans, forced, missing = native.triple_candidates(texts, table.bits, table.shift, shortest,
                                                                          entries, pool, member.bits, member.shift)
            if not any(missing):
                break
            add_normal_forms(np.flatnonzero(np.unpackbits(np.frombuffer(missing, np.uint8),
                                                          bitorder="little")).tolist())
    elif isinstance(table, PairTable):
        joined, spans, forced = native.candidates(texts, table.packed, table.bits, shortest)
    else:
        joined, spans, forced = native.triple_candidates(texts, table.bits, table.shift, shortest)
    spans = np.frombuffer(spans, np.int64).reshape(-1, 4).tolist()
    view = memoryview(joined)
    wild = [i for i, span in enumerate(spans) if span[1] == 2]
    refined = {wild[at]: pieces for at, pieces in _chained(
        [str(view[spans[i][2]:spans[i][3]], "utf-8") for i in wild], table, member, shortest)} if wild else {}
    found: dict[int, list[str] | None] = {t: None for t in forced}
    for i, (t, kind, a, b) in enumerate(spans):
        if kind == 2 and i not in refined:  # a segment without chains
            continue
        pieces = found.setdefault(t, [])
        if pieces is None:
            continue
        if kind != 2:
            pieces.append(texts[t][a:b] if kind == 0 else str(view[a:b], "utf-8"))
        elif refined[i] is None:  # a run that needs the whole text (a capital sigma)
            found[t] = None
        else:
            pieces += refined[i]
    return sorted(found.items())


def _chained(texts: list[str], pairs: Callable[[np.ndarray, np.ndarray], Links] | PairTable | TripleFilter,
             member: Callable[[np.ndarray], np.ndarray], shortest: int) -> list[tuple[int, list[str] | None]]:
    """run_candidates from scan's arrays (numpy's chains and pieces)."""
    words = scan(texts, pairs if isinstance(pairs, PairTable) else None)
    starts, ends, raw, wild = words.starts, words.ends, words.raw, words.wild
    forced = list(words.forced)
    if not len(starts):
        return [(t, None) for t in forced]
    first = np.searchsorted(starts, words.offsets)
    # word i and i + 1 may be an item's two words, i to i + 2 three
    link, triple = (words.link, None) if words.link is not None else pairs(words.heads, ends - starts)
    if len(words.held):  # a run holding _JOINT itself: its text is checked the slow way
        forced += (np.searchsorted(first, words.held, side="right") - 1).tolist()
    linked, counts = np.empty(0, bool), np.empty(0, np.int64)
    if len(wild):
        counts, found = _wild_words(raw, starts[wild], ends[wild], member)
        linked = ~((counts > 0) & ~found)  # its words link to both sides, unless none is a member
        counts[~linked] = 0
    if triple is not None:
        for back in range(3):  # a linked wild run's words are not its value: a triple with it always may be
            triple[wild[linked & (wild >= back) & (wild - back < len(triple))] - back] = True
        if link is None:  # two words in a row of an item of three or more: the first two or last two of a triple
            link = np.zeros(len(starts) - 1, bool)
            link[:len(triple)] |= triple
            link[1:] |= triple
    link[wild[wild < len(link)]] = linked[wild < len(link)]
    link[wild[wild > 0] - 1] = linked[wild > 0]
    heads = first[1:-1]
    link[heads[(heads > 0) & (heads < len(starts))] - 1] = False  # never across two texts
    heads, lasts = _chains(link, triple, wild, counts, shortest)
    owners = np.searchsorted(first, heads, side="right") - 1
    return _pieces(words.joined, forced, owners, starts[heads], ends[lasts])


def _chains(link: np.ndarray, triple: np.ndarray | None, wild: np.ndarray, counts: np.ndarray,
            shortest: int) -> tuple[np.ndarray, np.ndarray]:
    """The first and last run of every chain (runs each linked to the next: link[i], run i to run i + 1, and
    each three in a row a `triple`: triple[i], runs i to i + 2; None: all are) that holds at least `shortest`
    words (> 1): a run holds one word, a wild run (`wild`, in order) its `counts`. A triple that is not ends a
    chain at its middle run and starts the next there. Found from the linked pairs alone, a few of all."""
    ones = np.flatnonzero(link)
    new = np.ones(len(ones), bool)
    new[1:] = ones[1:] != ones[:-1] + 1
    if triple is not None and len(ones):
        new[1:] |= ~triple[ones[:-1]]
    at = np.flatnonzero(new)
    heads, lasts = ones[at], ones[np.append(at[1:], len(ones))[:len(at)] - 1] + 1  # (no linked pair: no chain)
    words = lasts - heads + 1
    if len(wild):
        chain = np.searchsorted(heads, wild, side="right") - 1
        inside = chain >= 0
        inside[inside] = wild[inside] <= lasts[chain[inside]]
        np.add.at(words, chain[inside], counts[inside] - 1)
        lone = ~inside & (counts >= shortest)  # a wild run of many words, linked to no other
        alone = wild[lone]
        if len(alone):
            heads, lasts, words = (np.concatenate(a) for a in ((heads, alone), (lasts, alone), (words, counts[lone])))
            order = np.argsort(heads, kind="stable")
            heads, lasts, words = heads[order], lasts[order], words[order]
    good = words >= shortest
    return heads[good], lasts[good]


def _pieces(joined: bytearray, forced: list[int], owners: np.ndarray, begins: np.ndarray,
            ends: np.ndarray) -> list[tuple[int, list[str] | None]]:
    """Each text with chains (`owners`, in order) and their pieces (the joined UTF-8 bytes begins[i]:ends[i]),
    the forced ones whole (None), in text order."""
    found: dict[int, list[str] | None] = {t: None for t in forced}
    for t, a, b in zip(owners.tolist(), begins.tolist(), ends.tolist()):
        pieces = found.setdefault(t, [])
        if pieces is not None:
            pieces.append(joined[a:b].decode())
    for t, pieces in found.items():
        if pieces is not None and any(not p.isascii() and "\u03a3" in unicodedata.normalize("NFKC", p)
                                      for p in pieces):
            found[t] = None  # a capital sigma: lowercased in the whole text's context
    return sorted(found.items())


def _distinct(ordered: np.ndarray) -> np.ndarray:
    """np.unique of an array already in order, without sorting it again."""
    keep = np.ones(len(ordered), bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def prefix_hashes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, lower: bool = False) -> np.ndarray:
    """A cheaper word value than word_hashes for run_candidates: a word's first 8 bytes and its length, mixed by
    one multiplication (its top bits depend on every bit; words that differ only after their 8th byte share
    it: a candidate more, never one less). `data` ends with 8 zero bytes (_joined). `lower`: `data` is raw
    bytes, each byte of a word set its 0x20 bit, which makes an ASCII letter lowercase and keeps a digit: the
    value of a word of ASCII letters and digits as in mapped bytes (and no other word's, which no caller needs)."""
    return head_prefixes(*_first_bytes(data, starts, ends, lower))


def head_prefixes(heads: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """prefix_hashes of words from their first 8 bytes and lengths (_first_bytes)."""
    with np.errstate(over="ignore"):
        return (heads ^ lengths.astype(np.uint64) * _STEP) * _MIX1


def word_classes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, bits: int, lower: bool = False) -> np.ndarray:
    """A word's class, cheaper than prefix_hashes: the top `bits` bits of its first 8 bytes times one odd
    constant (its length not mixed in: words that differ only after their 8th byte share it, as they share their
    prefix_hashes). `data` and `lower` as for prefix_hashes."""
    return head_classes(_first_bytes(data, starts, ends, lower)[0], bits)


def head_classes(heads: np.ndarray, bits: int) -> np.ndarray:
    """word_classes of words from their first 8 bytes (_first_bytes)."""
    with np.errstate(over="ignore"):
        classes = heads * _MIX1
    classes >>= np.uint64(64 - bits)
    return classes.view(np.int64)  # (below 2**bits: the same values)


def table_links(heads: np.ndarray, table: np.ndarray, bits: int) -> np.ndarray:
    """For each word and the next (of their first 8 bytes, _first_bytes), `table`'s bool at their classes
    (head_classes): first << bits | second. In tokmix._scan's loop where it is built, else numpy's."""
    native = compiled()
    if native is None or len(heads) < 2:
        return _table_links_numpy(heads, table, bits)
    out = np.empty(len(heads) - 1, bool)
    native.table_links(np.ascontiguousarray(heads, np.uint64), np.ascontiguousarray(table, bool), bits, out)
    return out


def _table_links_numpy(heads: np.ndarray, table: np.ndarray, bits: int) -> np.ndarray:
    classes = head_classes(heads, bits)
    return table[(classes[:-1] << bits) | classes[1:]]


def _first_bytes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, lower: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each word's first 8 bytes as a little-endian uint64 (a word's own only: the rest masked off), lowercased as
    prefix_hashes says with `lower`, and its length."""
    eights = np.ndarray((len(data) - 7,), "<u8", buffer=data, strides=(1,))
    heads = eights[starts] | _LOWER if lower else eights[starts]  # (a new array either way)
    lengths = ends - starts
    heads &= _KEEP[np.minimum(lengths, 8)]
    return heads, lengths


_KEEP = np.array([(1 << (8 * k)) - 1 for k in range(9)], np.uint64)  # a word's first k bytes of 8
_LOWER = np.uint64(0x2020202020202020)


def pair_hashes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The value of two consecutive words from their prefix_hashes (of three: of the first two's pair_hashes and
    the third's prefix_hashes)."""
    with np.errstate(over="ignore"):
        return _mix(a * _STEP ^ b)


_SIGMAS = (0x82, 0x83)  # the second byte of ς and σ in UTF-8 (0xCF 0x82, 0xCF 0x83)
_JOINT = "\ue000"  # between two wild runs: a starter nothing composes with, not cased, never lowered


def _joints(data: np.ndarray) -> np.ndarray:
    """Where _JOINT's UTF-8 bytes start in `data`."""
    lead = np.flatnonzero(data[:-2] == 0xEE)
    return lead[(data[lead + 1] == 0x80) & (data[lead + 2] == 0x80)]


def _wild_words(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                member: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """For each wild run raw[starts[i]:ends[i]]: how many normalized words it has and whether one of them is a
    member (or it has a sigma). All are normalized at once, _JOINT between two (NFKC keeps the cut, a sigma's
    context ends there; no run holds _JOINT itself)."""
    text = _joined_runs(raw, starts, ends).decode()
    normal, data, offsets = _joined([_normalized_runs(text)])
    cuts = _joints(normal)
    if len(cuts) != len(starts) - 1:  # (no character's NFKC form holds _JOINT: it has none)
        raise AssertionError(f"{len(cuts)} cuts between {len(starts)} wild runs")
    words = _words_of(normal, data, offsets, True, np.concatenate([cuts, cuts + 1, cuts + 2]))
    run = np.searchsorted(cuts, words.starts)  # which wild run each word is in
    count = np.bincount(run, minlength=len(starts))
    found = np.bincount(run, weights=member(words.hashes), minlength=len(starts)) > 0
    lead = np.flatnonzero(normal[:-1] == 0xCF)
    found[np.searchsorted(cuts, lead[np.isin(normal[lead + 1], _SIGMAS)])] = True
    return count, found


def _joined_runs(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> bytes:
    """The runs raw[starts[i]:ends[i]] (in order, apart) end to end, _JOINT's UTF-8 between two: gathered in
    numpy (a slice per run in Python was most of the wild runs' cost on a corpus with many of them)."""
    if not len(starts):
        return b""
    lengths = ends - starts
    total = np.cumsum(lengths)
    body = raw[np.arange(total[-1]) + np.repeat(starts - (total - lengths), lengths)]
    joint = np.frombuffer(_JOINT.encode(), np.uint8)
    return np.insert(body, np.repeat(total[:-1], len(joint)), np.tile(joint, len(starts) - 1)).tobytes()


def _normalized_runs(text: str) -> bytes:
    """normalized_bytes of wild runs joined by _JOINT, NFKC applied only to the pieces of about RUNS_CHARS
    characters (cut before a _JOINT, a starter that composes with nothing: the pieces' forms end to end are
    the whole's) that are not in NFKC form already: one character that is not (a no-break space, an
    ellipsis, "\u00b4") made half the corpus's groups normalize all their wild runs."""
    pieces, at = [], 0
    while at < len(text):
        cut = text.find(_JOINT, at + RUNS_CHARS)
        piece = text[at:cut] if cut >= 0 else text[at:]
        pieces.append(_nfkc(piece))
        at += len(piece)
    return "".join(pieces).lower().encode("utf-8", "replace")


RUNS_CHARS = 256


def word_hashes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """One 64-bit value per word data[starts[i]:ends[i]]: its first 8 bytes, its last 8 and its length, mixed.
    Per word, not per byte: two long words that differ only inside have the same value, which the word-for-word
    check of every candidate tells apart."""
    if not len(starts):
        return np.empty(0, np.uint64)
    head, tail, lengths = word_ends(data, starts, ends)
    with np.errstate(over="ignore"):
        return _mix(_mix(head ^ lengths * _STEP) + tail)


def word_ends(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each word's first 8 bytes and last 8 (fewer for a shorter word, as a little-endian uint64 each) and its
    length: together all of a word of at most 16 bytes."""
    padded = np.concatenate([np.zeros(8, np.uint8), data, np.zeros(8, np.uint8)])
    # every 8 bytes from each offset, as one little-endian uint64 (an unaligned view, no copy)
    eights = np.ndarray((len(padded) - 7,), "<u8", buffer=padded, strides=(1,))
    lengths = (ends - starts).astype(np.uint64)
    short = np.minimum(lengths, np.uint64(8))
    keep = np.where(short == 8, _M64, (np.uint64(1) << (short * np.uint64(8))) - np.uint64(1))
    head = eights[starts + 8] & keep  # the word's first bytes, the rest masked off
    tail = eights[ends] >> ((np.uint64(8) - short) * np.uint64(8))  # its last bytes, ending where the word does
    return head, tail, lengths


def gram_hashes_at(hashes: np.ndarray, at: np.ndarray, n: int) -> np.ndarray:
    """gram_hashes at the runs starting at `at` only."""
    acc = np.full(len(at), np.uint64(n), np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):
            acc = acc * _STEP ^ hashes[at + i]
    return _mix(acc)


def gram_hashes(hashes: np.ndarray, n: int) -> np.ndarray:
    """The hash of every run of `n` consecutive words (position i: words i..i+n-1), from their word hashes."""
    count = len(hashes) - n + 1
    if count <= 0:
        return np.empty(0, np.uint64)
    acc = np.full(count, np.uint64(n), np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):
            acc = acc * _STEP ^ hashes[i:i + count]
    return _mix(acc)


def words(text: str) -> list[bytes]:
    """One text's words after normalization (split_words)."""
    return split_words([text]).text_words(0)
