"""Word n-grams for benchmark decontamination: the normalization that turns texts into words (docs/recipe.md;
NORMALIZATION names it and is part of the identity of every run that uses it), and the 64-bit hashes of
their words and n-grams, computed for a group of documents at once in numpy (no Python object per word).

A hash only finds candidates: the stage compares every candidate with the benchmark item's own words, so a
collision never drops a document (tokmix.stages.decontam)."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np

NORMALIZATION = "tokmix-words-v1"  # NFKC, lowercase, words = runs of letters and digits (see words())

# Every byte of the normalized UTF-8 text mapped: an ASCII letter to its lowercase, a digit to itself, any
# other ASCII byte to 0 (a separator); a byte >= 0x80 (part of a non-ASCII character) to itself.
_BYTE_MAP = np.array([b if b >= 0x80 or chr(b).isdigit() or chr(b).islower() else
                      ord(chr(b).lower()) if chr(b).isupper() else 0 for b in range(256)], np.uint8)

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
    if not unicodedata.is_normalized("NFKC", text):  # the quick check: most text is in NFKC form already
        text = unicodedata.normalize("NFKC", text)
    return text.lower().encode("utf-8", "replace")


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
        if member is None:  # every run is hashed: slices of the word hashes, not gathers
            return gram_hashes(self.hashes, n)[at], at
        at = at[member[at + n - 1]]
        return gram_hashes_at(self.hashes, at, n), at

    def text_of(self, w: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.first, w, side="right") - 1


def split_words(texts: list[str]) -> Words:
    """The texts' words: NFKC, lowercase; every ASCII character that is not a letter or a digit (punctuation,
    '_', whitespace, controls) and the non-ASCII punctuation of _punctuation separates words; a word is a
    maximal run of the rest (letters, digits, any other non-ASCII character)."""
    parts = [normalized_bytes(t) for t in texts]
    # each text's first byte in the joined bytes, which start and end with a separator
    offsets = np.cumsum([1] + [len(p) + 1 for p in parts])
    raw = np.frombuffer(b"\0" + b"\0".join(parts) + b"\0", np.uint8)
    data = _BYTE_MAP[raw]
    if not all(t.isascii() for t in texts):
        data[_punctuation(raw)] = 0
    letter = data != 0
    starts = np.flatnonzero(letter[1:] & ~letter[:-1]) + 1
    ends = np.flatnonzero(letter[:-1] & ~letter[1:]) + 1
    first = np.searchsorted(starts, offsets)
    return Words(data, offsets, starts, ends, word_hashes(data, starts, ends), first)


def word_hashes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """One 64-bit value per word data[starts[i]:ends[i]]: its first 8 bytes, its last 8 and its length, mixed.
    Per word, not per byte: two long words that differ only inside have the same value, which the word-for-word
    check of every candidate tells apart."""
    if not len(starts):
        return np.empty(0, np.uint64)
    padded = np.concatenate([np.zeros(8, np.uint8), data, np.zeros(8, np.uint8)])
    # every 8 bytes from each offset, as one little-endian uint64 (an unaligned view, no copy)
    eights = np.ndarray((len(padded) - 7,), "<u8", buffer=padded, strides=(1,))
    lengths = (ends - starts).astype(np.uint64)
    short = np.minimum(lengths, np.uint64(8))
    keep = np.where(short == 8, _M64, (np.uint64(1) << (short * np.uint64(8))) - np.uint64(1))
    head = eights[starts + 8] & keep  # the word's first bytes, the rest masked off
    tail = eights[ends] >> ((np.uint64(8) - short) * np.uint64(8))  # its last bytes, ending where the word does
    with np.errstate(over="ignore"):
        return _mix(_mix(head ^ lengths * _STEP) + tail)


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
