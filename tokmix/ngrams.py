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
_POSITIONS = 32  # a word's byte j is hashed by the table of position j mod 32


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        return x ^ (x >> np.uint64(31))


# a random 64-bit value per (position in the word mod 32, byte): a word's hash is the sum of its bytes' values
_BYTE_VALUES = _mix(np.arange(_POSITIONS * 256, dtype=np.uint64) * np.uint64(0x2545F4914F6CDD1D))
_BYTE_VALUES[::256] = 0  # byte 0, a separator, adds nothing


def _punctuation(data: np.ndarray) -> np.ndarray:
    """Where the non-ASCII punctuation is that NFKC leaves (as UTF-8 bytes): U+0080-U+00BF (Latin-1 controls,
    punctuation, signs), U+2000-U+206F (General Punctuation: dashes, curly quotes, odd spaces, bullets) and
    U+3000-U+303F (CJK punctuation). A lead byte never occurs inside another character."""
    out = np.zeros(len(data), bool)
    if len(data) < 2:
        return out
    a, b = data[:-1], data[1:]
    two = (a == 0xC2) & (b >= 0x80) & (b <= 0xBF)
    out[:-1] |= two
    out[1:] |= two
    if len(data) >= 3:
        c = data[2:]
        three = ((a[:-1] == 0xE2) & ((b[:-1] == 0x80) | ((b[:-1] == 0x81) & (c <= 0xAF)))) \
            | ((a[:-1] == 0xE3) & (b[:-1] == 0x80))
        out[:-2] |= three
        out[1:-1] |= three
        out[2:] |= three
    return out


def normalized_bytes(text: str) -> bytes:
    """A text's UTF-8 bytes before the byte map: NFKC and lowercase (an ASCII text is its own NFKC form and is
    lowercased by the map)."""
    if text.isascii():
        return text.encode()
    return unicodedata.normalize("NFKC", text).lower().encode("utf-8", "replace")


@dataclass
class Words:
    """A group of texts as words: the mapped bytes of all of them end to end (a separator between texts), each
    word's first byte and end, its hash, and each text's first word (`first`, one more entry: the end)."""

    data: np.ndarray  # uint8, mapped
    starts: np.ndarray
    ends: np.ndarray
    hashes: np.ndarray
    first: np.ndarray

    def word(self, w: int) -> bytes:
        return self.data[self.starts[w]:self.ends[w]].tobytes()

    def text_words(self, t: int) -> list[bytes]:
        return [self.word(w) for w in range(int(self.first[t]), int(self.first[t + 1]))]

    def grams(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(hash, first word) of every run of `n` words inside one text; runs of different lengths hash apart."""
        hashes = gram_hashes(self.hashes, n)
        at = np.arange(len(hashes))
        text = np.searchsorted(self.first, at, side="right") - 1
        inside = at + n <= self.first[text + 1]
        return hashes[inside], at[inside]

    def text_of(self, w: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.first, w, side="right") - 1


def split_words(texts: list[str]) -> Words:
    """The texts' words: NFKC, lowercase; every ASCII character that is not a letter or a digit (punctuation,
    '_', whitespace, controls) and the non-ASCII punctuation of _punctuation separates words; a word is a
    maximal run of the rest (letters, digits, any other non-ASCII character)."""
    parts = [normalized_bytes(t) for t in texts]
    offsets = np.cumsum([0] + [len(p) + 1 for p in parts])  # each text's first byte in the joined bytes
    raw = np.frombuffer(b"\0".join(parts) + b"\0", np.uint8)
    data = _BYTE_MAP[raw]
    if len(raw) and raw.max() >= 0x80:
        data[_punctuation(raw)] = 0
    letter = data != 0
    edge = np.diff(letter.view(np.int8), prepend=0, append=0)
    starts, ends = np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)
    first = np.searchsorted(starts, offsets)
    return Words(data, starts, ends, word_hashes(data, starts, ends), first)


def word_hashes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """One 64-bit value per word data[starts[i]:ends[i]] (separators are 0): its bytes' values by position in
    the word, summed, and its length, mixed. Computed over all bytes at once: a separator's value is 0."""
    if not len(starts):
        return np.empty(0, np.uint64)
    index = np.arange(len(data))
    mark = np.zeros(len(data), np.int64)
    mark[starts] = starts
    word_start = np.maximum.accumulate(mark)  # each byte's word's first byte (separators: the one before)
    values = _BYTE_VALUES[((index - word_start) & (_POSITIONS - 1)) * 256 + data]
    with np.errstate(over="ignore"):
        total = np.cumsum(values)
        before = np.where(starts > 0, total[starts - 1], np.uint64(0))
        return _mix(total[ends - 1] - before + (ends - starts).astype(np.uint64) * _STEP)


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
