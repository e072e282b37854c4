"""The first pass's compiled split (tokmix/_scan.c, tokmix.ngrams.scan) against numpy's (_scan_numpy, the
reference): the same arrays, byte for byte, on fuzzed texts; and the same verdicts of the whole check with the
compiled path on and forced off (TOKMIX_NATIVE=0) on real training files with HumanEval planted in them. And a
stale or broken .so (an editable install does not rebuild it after _scan.c changes), compiled for real into a
copy of the package: the numpy first pass, the same verdicts, and the one line that says why.

Under CI (CI=true) a skip fails (tests/conftest.py): CI builds the extension (scripts/test.sh's editable
install), so there these tests always run against it."""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import sysconfig
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.corpus import make_corpus
from tests.test_decontam import (
    NGRAM,
    ROOT,
    ROWS_PER_GROUP,
    changed,
    humaneval,
    humaneval_set,
    oracle_contaminated,
    oracle_grams,
    oracle_words,
    plant,
    prefiltered,
)
from tokmix import ngrams

FIELDS = ("joined", "raw", "offsets", "forced", "starts", "ends", "heads", "wild", "held", "link")
TABLES = [ngrams.PairTable.of(np.random.default_rng(bits).random(1 << (2 * bits)) < density, bits)
          for bits, density in ((10, 1 / 32), (10, 0.5), (3, 0.3), (1, 1.0), (1, 0.5))]
# triple filters of 2**16 and 2**20 bits (shift 48 and 44), from none set to all: dense ones make long chains
TRIPLES = [ngrams.TripleFilter(np.packbits(np.random.default_rng(7).random(1 << (64 - shift)) < density,
                                           bitorder="little"), shift)
           for shift, density in ((48, 0.0), (48, 0.05), (44, 0.7), (48, 0.93), (48, 1.0))]


@pytest.fixture(scope="module")
def native():
    try:
        from tokmix import _scan
    except ImportError:
        pytest.skip("tokmix._scan is not built (no C compiler at install): the numpy path alone")
    return _scan


def assert_same_scan(native, texts: list[str]) -> None:
    """The same arrays without a pair table and with each of TABLES (its links looked up in the loop)."""
    for table in [None, *TABLES]:
        same_scan(ngrams._scan_numpy(texts, table), ngrams._scan_native(texts, native, table), texts)


def same_scan(want, got, texts: list[str]) -> None:
    for field in FIELDS:
        a, b = getattr(want, field), getattr(got, field)
        if a is None:
            assert b is None, field
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), (field, texts)
        else:
            assert type(a) is type(b) and a == b, (field, texts)


# characters a fuzzed text is made of: ASCII letters, digits and punctuation, NUL and controls, Latin-1, other
# BMP (Greek sigmas, combining marks, CJK, General Punctuation), _JOINT (U+E000) and near it, astral (emoji)
ALPHABETS = ("abcXYZ019", " \t\n.,;'_-", "\0\x01\x7f", "\u00e9\u00c9\u00a0\u00bd\u00ff\u0080",
             "\u03a3\u03c3\u03c2\u0301\u0338\u4e2d\u2014\u201c\u3000\uff0c\ufb01\u212a\u0130",
             "\ue000\ue001\udfff"[:2], "\U0001f600\U00010000\U0010ffff")


def fuzzed_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.05:
        return ""
    if kind < 0.1:  # a lone huge word, ASCII or not
        return rng.choice("aZ9\u00e9\u4e2d") * rng.randrange(8, 200_000)
    if kind < 0.2:  # random bytes as Latin-1 characters (one byte each, 0x00-0xFF)
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))).decode("latin-1")
    alphabets = rng.sample(ALPHABETS, rng.randrange(1, len(ALPHABETS) + 1))
    chars = "".join(alphabets)
    out = []
    for _ in range(rng.randrange(1, 60)):  # words of 1-30 characters (many over 8 bytes), and separators
        out.append("".join(rng.choice(chars) for _ in range(rng.randrange(1, 30))))
        out.append(rng.choice([" ", "", "\0", ".", "\u00e9", "\u2014"]))
    text = "".join(out)
    if rng.random() < 0.2:  # ending in non-ASCII, or starting with it
        text += rng.choice("\u00e9\u4e2d\U0001f600\ue000")
    if rng.random() < 0.1:
        text = rng.choice("\u00e9\u0301\ue000") + text
    if rng.random() < 0.03:  # a lone surrogate: str.encode() refuses it (forced)
        at = rng.randrange(len(text) + 1)
        text = text[:at] + rng.choice("\ud800\udfff") + text[at:]
    return text


def test_scan_equals_numpy_on_fuzzed_texts(native):
    rng = random.Random(4)
    assert_same_scan(native, [])
    for group in (["", ""], ["a"], ["\u00e9"], ["\0"], ["\0\u00e9"], ["a\0\u00e9b"], ["\ue000"], ["x\ue000"],
                  ["\ud800"], ["ab", "\ud800", "\u00e9"], ["abcdefghijklmnop"], ["ABCDEFGH", "abcdefg\u00e9"]):
        assert_same_scan(native, group)
    # words across the compiled loop's 64-byte blocks, their one non-ASCII character or _JOINT in any block
    for at in (0, 1, 62, 63, 64, 65, 127, 128, 200):
        for char in ("\u00e9", "\ue000", "\u4e2d", " ", "\0"):
            assert_same_scan(native, ["a" * at + char + "b" * (300 - at), "x" * at + char])
    for _ in range(400):
        assert_same_scan(native, [fuzzed_text(rng) for _ in range(rng.randrange(1, 12))])


def member_of(seed: int):
    """A member test of word hashes: all (seed 0), or about half of them, by a bit of the hash."""
    return (lambda hashes: np.ones(len(hashes), bool)) if not seed else (
        lambda hashes: ((hashes >> np.uint64(seed)) & np.uint64(1)).astype(bool))


def long_text(rng: random.Random) -> str:
    """Fuzzed texts between plain English runs of 0-1,500 bytes: wild runs far apart and near each other (the
    compiled pass merges two of a text's pieces with wild runs within 512 bytes), texts over many 64-byte blocks."""
    filler = "the cat sat on a mat and then it ran away from the dog while we "
    out = []
    for _ in range(rng.randrange(1, 8)):
        out.append(fuzzed_text(rng)[:400])
        out.append(filler * rng.randrange(0, 24) + filler[:rng.randrange(len(filler))])
    return " ".join(out)


def test_compiled_candidates_equal_numpy(native, monkeypatch):
    """run_candidates with a pair table: tokmix._scan.candidates' one loop (no array per word; the pieces with
    wild runs split by _chained) gives numpy's kept texts and pieces exactly (TOKMIX_NATIVE=0), for every table
    of TABLES, n-grams of 2, 3 or 13 words and members all or half the words (two of the four each): fuzzed
    texts, ASCII texts read where they are (lengths around the 64-byte blocks), lone surrogates and _JOINT (the
    text whole)."""
    rng = random.Random(12)
    groups = [[], [""], ["a b"], ["\ue000 a b c"], ["a b \ud800 c d"], ["\u00e9"], ["a " * 40 + "\u03a3 " + "b " * 40]]
    groups += [["ab " * (n // 3) + "x" * (n % 3) for n in range(60, 70)], ["w" * 64, "v " * 32, "u " * 33]]
    groups += [[fuzzed_text(rng) for _ in range(rng.randrange(1, 12))] for _ in range(50)]
    groups += [[long_text(rng) for _ in range(rng.randrange(1, 6))] for _ in range(25)]
    for texts in groups:
        for table in TABLES:
            for shortest, seed in rng.sample([(2, 0), (3, 3), (13, 0), (13, 5)], 2):
                monkeypatch.delenv(ngrams.NATIVE_ENV, raising=False)
                got = ngrams.run_candidates(texts, table, member_of(seed), shortest)
                monkeypatch.setenv(ngrams.NATIVE_ENV, "0")
                want = ngrams.run_candidates(texts, table, member_of(seed), shortest)
                assert got == want, (texts, table.bits, shortest, seed)


def test_compiled_triple_candidates_equal_numpy(native, monkeypatch):
    """run_candidates with a triple filter (a large set's first pass): tokmix._scan.triple_candidates' one loop
    (its chains the blocks of triples that may be, the pieces with wild runs split by _chained) gives numpy's
    kept texts and pieces exactly (TOKMIX_NATIVE=0: _chained with the filter's links), for every filter of
    TRIPLES, n-grams of 3, 5 or 13 words and members all or half the words: the texts of
    test_compiled_candidates_equal_numpy, and runs of one repeated phrase (its triples all in a dense filter or
    none) around wild runs and block bounds."""
    rng = random.Random(13)
    groups = [[], [""], ["a b"], ["a b c"], ["\ue000 a b c"], ["a b \ud800 c d"], ["\u00e9"], ["a \u00e9 b"],
              ["a " * 40 + "\u03a3 " + "b " * 40], ["x y z " * 30 + "\u00e9\u0301 " + "x y z " * 30]]
    groups += [["ab " * (n // 3) + "x" * (n % 3) for n in range(60, 70)], ["w" * 64, "v " * 32, "u " * 33]]
    groups += [[("one two three four " * k)[:-1] + rng.choice(["", " \u00e9", "\u00e9", ". ", " \u2014 "])
                for k in range(1, 12)] for _ in range(4)]
    groups += [[fuzzed_text(rng) for _ in range(rng.randrange(1, 12))] for _ in range(50)]
    groups += [[long_text(rng) for _ in range(rng.randrange(1, 6))] for _ in range(25)]
    for texts in groups:
        for triples in TRIPLES:
            for shortest, seed in rng.sample([(3, 0), (3, 3), (5, 0), (13, 0), (13, 5)], 3):
                monkeypatch.delenv(ngrams.NATIVE_ENV, raising=False)
                got = ngrams.run_candidates(texts, triples, member_of(seed), shortest)
                monkeypatch.setenv(ngrams.NATIVE_ENV, "0")
                want = ngrams.run_candidates(texts, triples, member_of(seed), shortest)
                assert got == want, (texts, triples.shift, shortest, seed)
    with pytest.raises(ValueError):  # a filter of another size than its shift says, and pairs of two words
        native.triple_candidates(["a b c"], np.zeros(100, np.uint8), 48, 3)
    with pytest.raises(ValueError):
        native.triple_candidates(["a b c"], TRIPLES[0].bits, 48, 2)


# characters of many scripts for the wild runs normalized in the loop: Latin-1 and Latin Extended letters, their
# combining marks (the run left to _chained), Greek (sigmas: a member), Cyrillic, Arabic and Hebrew, CJK and
# fullwidth forms, Hangul syllables and jamo (a trailing jamo composes with the syllable before it), characters
# NFKC expands (ligatures, superscripts, fractions, ellipsis, roman numerals, squared units, U+FDFA's 18
# characters), Indic vowel signs that compose with their consonant, General and CJK punctuation (separators),
# emoji with a joiner and a modifier, private use, astral CJK (beyond the table)
SCRIPTS = ("\u00e9\u00c9\u00f1\u00df\u0153\u0142\u0131\u0130\u01c4\u1e9e", "e\u0301\u0308\u0327\u0338\u20dd\u302a",
           "\u03b1\u03a3\u03c3\u03c2\u0390\u1f00\u0386", "\u0430\u0416\u0451\u0419", "\u0627\u0644\u05d0\u05b0\ufdfa",
           "\u4e2d\u6587\u3042\u30a2\uff21\uff41\uff11\uff0c\u3002", "\uac00\ud55c\u1100\u1161\u11a8\u3131",
           "\ufb01\ufb03\u00b2\u2075\u00bd\u2153\u2026\u2163\u3392\u2122\u212b\u00aa\u02b0\u1d43",
           "\u0915\u093c\u0b47\u0b3e\u0bc6\u0bbe\u0d46\u0d3e", "\u2014\u2013\u201c\u201d\u2019\u00a0\u2009\u3000\u00a9",
           "\U0001f600\u200d\U0001f3fb\ufe0f\ue001\U00020000\U0001d400")


def script_text(rng: random.Random) -> str:
    """Words of ASCII letters and of SCRIPTS' characters, between ASCII and non-ASCII separators."""
    chars = "abcXYZ019" + "".join(rng.sample(SCRIPTS, rng.randrange(1, len(SCRIPTS) + 1)))
    out = []
    for _ in range(rng.randrange(1, 40)):
        out.append("".join(rng.choice(chars) for _ in range(rng.randrange(1, 12))))
        out.append(rng.choice([" ", " ", " ", ". ", "'", "\n", "\u2014", " \u201c", "\u3000", ""]))
    return "".join(out)


def word_filters(texts: list[str]) -> list[ngrams.WordFilter]:
    """Word filters (ngrams.WordFilter) of none, about half and all of the texts' normalized words, and a random
    half of all slots: members, non-members and a member in most wild runs."""
    hashes = ngrams.split_words(texts).hashes if texts else np.empty(0, np.uint64)
    rng = np.random.default_rng(len(texts))
    out = []
    for share in (0.0, 0.5, 1.0):
        bits = np.zeros(1 << 13, np.uint8)  # 2**16 slots: shift 48
        slots = (hashes[rng.random(len(hashes)) < share] >> np.uint64(48)).astype(np.int64)
        np.bitwise_or.at(bits, slots >> 3, (1 << (slots & 7)).astype(np.uint8))
        out.append(ngrams.WordFilter(bits, 48))
    out.append(ngrams.WordFilter(np.random.default_rng(3).integers(0, 256, 1 << 13, dtype=np.uint8), 48))
    return out


def test_wild_runs_normalized_in_the_loop_equal_numpy(native, monkeypatch):
    """run_candidates with a pair table and a WordFilter: the compiled loop normalizes the wild runs whose
    characters all have a context-free normal form (ngrams.normal_forms) and decides them itself; the kept texts
    and pieces are numpy's exactly (TOKMIX_NATIVE=0) and the loop's without the word filter's bits (a plain
    callable: every wild run left to _chained), for texts of many scripts, combining marks, characters NFKC
    expands, the fuzzed and long texts of the tests above; the table empty at first (its blocks built as the loop
    meets them) and whole."""
    rng = random.Random(41)
    groups = [[], [""], ["a b"], ["\u00e9"], ["caf\u00e9 na\u00efve r\u00e9sum\u00e9 " * 12],
              ["\u201cthe cat\u201d " * 30], ["\ufb01ne \uff21\uff22 x\u00b2 " * 20],
              ["\uac00\u11a8 \u0b47\u0b3e e\u0301 " * 15], ["a " * 40 + "\u03a3 " + "b " * 40]]
    groups += [[script_text(rng) for _ in range(rng.randrange(1, 10))] for _ in range(80)]
    groups += [[fuzzed_text(rng) for _ in range(rng.randrange(1, 12))] for _ in range(20)]
    groups += [[long_text(rng) + script_text(rng) for _ in range(rng.randrange(1, 6))] for _ in range(15)]
    decided = loop_equals_numpy(monkeypatch, rng, groups, TABLES[:3], [2, 3, 13])
    assert decided > 100_000  # (most characters of planes 0 and 1 are context-free)


def loop_equals_numpy(monkeypatch, rng: random.Random, groups: list[list[str]], filters: list,
                      lengths: list[int]) -> int:
    """For each group, with two of `filters` (pair tables or triple filters), two of its word filters and two of
    `lengths` as the shortest item: run_candidates' compiled loop deciding wild runs (a WordFilter) gives what it
    gives with every wild run left to _chained (a plain callable) and what numpy gives (TOKMIX_NATIVE=0); the
    forms empty at first, then whole. Returns the code points the forms held decided, summed over the two."""
    monkeypatch.setattr(ngrams, "_forms", (np.zeros(ngrams.FORMS_END, np.uint32), b""))
    decided = 0
    for whole in (False, True):
        if whole:
            ngrams.add_normal_forms(list(range(ngrams.FORMS_END // ngrams.FORMS_BLOCK)))
        for texts in groups:
            for pairs in rng.sample(filters, 2):
                for words in rng.sample(word_filters(texts), 2):
                    for shortest in rng.sample(lengths, 2):
                        monkeypatch.delenv(ngrams.NATIVE_ENV, raising=False)
                        got = ngrams.run_candidates(texts, pairs, words, shortest)
                        before = ngrams.run_candidates(texts, pairs, words.__call__, shortest)
                        monkeypatch.setenv(ngrams.NATIVE_ENV, "0")
                        want = ngrams.run_candidates(texts, pairs, words, shortest)
                        assert got == want == before, (texts, getattr(pairs, "shift", pairs.bits), shortest)
        decided += int((ngrams.normal_forms()[0] > 1).sum())
    return decided


def test_wild_runs_decided_in_the_triple_loop_equal_numpy(native, monkeypatch):
    """run_candidates with a triple filter and a WordFilter: the compiled loop (triple_candidates) decides the wild
    runs whose characters all have a context-free normal form and finds the chains around them; the kept texts
    and pieces are numpy's exactly (TOKMIX_NATIVE=0) and the loop's with every wild run left to _chained (a plain
    callable), for texts of many scripts (combining marks, capital sigma, characters past plane 1), the fuzzed and
    long texts, phrases of a dense filter around wild runs; the forms empty at first and whole."""
    rng = random.Random(43)
    groups = [[], [""], ["a b c"], ["\u00e9"], ["caf\u00e9 na\u00efve r\u00e9sum\u00e9 " * 12],
              ["x y z " * 30 + "\u00e9\u0301 " + "x y z " * 30], ["x y z " * 30 + "\u03a3\u03b1 " + "x y z " * 30],
              ["x y z " * 30 + "\U00020000 " + "x y z " * 30], ["a " * 40 + "\u03a3 " + "b " * 40]]
    groups += [[("one two three four " * k)[:-1] + rng.choice(["", " \u00e9", "\u0436", ". ", " \u2014 "])
                + (" five six seven eight" * k) for k in range(1, 12)] for _ in range(4)]
    groups += [[script_text(rng) for _ in range(rng.randrange(1, 10))] for _ in range(60)]
    groups += [[fuzzed_text(rng) for _ in range(rng.randrange(1, 12))] for _ in range(20)]
    groups += [[long_text(rng) + script_text(rng) for _ in range(rng.randrange(1, 6))] for _ in range(15)]
    loop_equals_numpy(monkeypatch, rng, groups, TRIPLES, [3, 5, 13])
    with pytest.raises(ValueError):  # a word filter of another size than its shift says
        native.triple_candidates(["a b c"], TRIPLES[0].bits, TRIPLES[0].shift, 3, *ngrams.normal_forms(),
                                 np.zeros(100, np.uint8), 48)


def fuzz_against_chained(native, seed: int, rounds: int) -> None:
    """_candidates_native with a triple filter and a WordFilter against _chained itself, on script texts and wild
    runs side by side: of no word, one, two, 7 and 14 (a chain of its own), after an unlinked one, beside runs left
    to _chained (a combining mark, a capital sigma). A text of context-free runs alone leaves no piece to _chained
    (triple_candidates decides all its wild runs)."""
    rng = random.Random(seed)
    free = ["a", "b", "c", "\u00e9", "x\u00e9", "\u00e9\u2014\u00e9", "\u2014", "\u00e9y", "don\u2019t",
            "\u00e9\u2014" * 7, "\u2014\u00e9" * 14]
    few = [*free, "e\u0301", "\u03a3"]
    ngrams.add_normal_forms([0])  # (all blocks below FORMS_FIRST, the first time: free's)
    for _ in range(rounds):
        texts = [script_text(rng) + rng.choice(["", " one two three four five"]) for _ in range(rng.randrange(1, 8))]
        side = " ".join(rng.choice(free) for _ in range(rng.randrange(1, 12)))  # wild runs side by side
        texts += [" ".join(rng.choice(few) for _ in range(rng.randrange(1, 12))), side]
        for words in word_filters(texts):
            triples, shortest = rng.choice(TRIPLES), rng.choice([3, 4, 13])
            got = ngrams._candidates_native(texts, native, triples, words, shortest)
            assert got == ngrams._chained(texts, triples, words, shortest), (texts, triples.shift, shortest)
            spans = native.triple_candidates([side], triples.bits, triples.shift, shortest, *ngrams.normal_forms(),
                                             words.bits, words.shift)[1]
            assert 2 not in np.frombuffer(spans, np.int64)[1::4].tolist(), (side, triples.shift, shortest)


def test_triple_loop_fuzzed_against_chained(native):
    fuzz_against_chained(native, 44, 400)


def test_normal_forms_are_the_normalization_of_their_runs():
    """Strings of context-free characters (ngrams.normal_forms) and ASCII ones: their NFKC and lowercase through the
    byte map, as ngrams._wild_words normalizes a wild run, is their characters' forms end to end, on random
    strings of all of them and of the commonest scripts; every combining mark and character that composes with
    one before it has no form; no two-character canonical decomposition is above FORMS_END (where the table
    looks for those that compose)."""
    ngrams.add_normal_forms(list(range(ngrams.FORMS_END // ngrams.FORMS_BLOCK)))
    entries, pool = ngrams.normal_forms()
    free = np.flatnonzero(entries > 1)
    assert len(free) > 100_000 and not (entries[0x80:ngrams.FORMS_END] == 0).any()
    after = ngrams._composes_after()
    for c in range(0x80, ngrams.FORMS_END):
        ch = chr(c)
        if unicodedata.combining(ch) or ch in after:
            assert entries[c] == 1, hex(c)
    for c in range(ngrams.FORMS_END, 0x110000):
        mapping = unicodedata.decomposition(chr(c))
        assert not mapping or mapping[0] == "<" or len(mapping.split()) != 2, hex(c)

    def form(c: int) -> bytes:
        if c < 0x80:  # (the byte map lowercases)
            return bytes([ngrams._BYTE_TABLE[c]])
        e = int(entries[c])
        return pool[e >> 8:(e >> 8) + ((e >> 1) & 63)]

    def normalized(text: str) -> bytes:
        raw, data, _ = ngrams._joined([ngrams._normalized_runs(text)])
        data[ngrams._punctuation(raw)] = 0
        return data[1:-9].tobytes()

    rng = random.Random(43)
    common = [c for c in free.tolist() if c < 0x3100 or 0xFF00 <= c < 0xFFF0] + list(range(0x20, 0x7F))
    scripts = [ord(c) for c in "".join(SCRIPTS) if ord(c) < ngrams.FORMS_END and entries[ord(c)] > 1]
    pools = (free.tolist() + list(range(0x20, 0x7F)), common, scripts + [ord("a"), ord(" ")])
    for chars in pools:
        for _ in range(3000):
            codes = [rng.choice(chars) for _ in range(rng.randrange(1, 12))]
            assert normalized("".join(map(chr, codes))) == b"".join(map(form, codes)), [hex(c) for c in codes]
    for c in free.tolist():  # each after and before an ASCII letter; its sigma bit
        codes = [ord("e"), c, ord("a")]
        assert normalized("".join(map(chr, codes))) == b"".join(map(form, codes)), hex(c)
        lowered = unicodedata.normalize("NFKC", chr(c)).lower()
        assert (int(entries[c]) >> 7) & 1 == ("\u03c3" in lowered or "\u03c2" in lowered), hex(c)


def test_a_no_break_space_is_made_a_space_before_nfkc():
    """ngrams._nfkc (NFKC where the quick check says a text is not in NFKC form, a no-break space made a space
    first) is unicodedata's NFKC beside every character that composes, decomposes or is a combining mark, and a
    sample of the others, before, after and between no-break spaces."""
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000 and (
        unicodedata.combining(chr(c)) or unicodedata.decomposition(chr(c)) or c % 97 == 0)]
    assert len(chars) > 8000
    for ch in chars:
        for text in (ch + "\u00a0", "\u00a0" + ch, "a" + ch + "\u00a0" + ch + "\u0301", "\u00a0\u0301" + ch, ch):
            assert ngrams._nfkc(text) == unicodedata.normalize("NFKC", text), (hex(ord(ch)), text)


def test_wild_runs_joined_in_numpy_equal_their_slices_joined():
    """ngrams._joined_runs (the wild runs gathered in numpy, _JOINT between two) is the runs' slices joined by
    _JOINT's UTF-8, for none, one and many runs anywhere in random bytes."""
    rng = random.Random(5)
    for _ in range(2000):
        raw = np.frombuffer(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))), np.uint8)
        bounds = sorted(rng.sample(range(len(raw) + 1), 2 * rng.randrange(0, (len(raw) + 1) // 2 + 1)))
        starts, ends = np.array(bounds[0::2], np.int64), np.array(bounds[1::2], np.int64)
        want = ngrams._JOINT.encode().join(raw[s:e].tobytes() for s, e in zip(starts.tolist(), ends.tolist()))
        assert ngrams._joined_runs(raw, starts, ends) == want


def test_table_links_equal_numpy(native):
    rng = np.random.default_rng(7)
    for bits in (1, 4, 10, 12):
        for n in (0, 1, 2, 3, 1000):
            heads = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
            for density in (0.0, 0.03, 0.5, 1.0):
                table = rng.random(1 << (2 * bits)) < density
                want = ngrams._table_links_numpy(heads, table, bits)
                out = np.empty(max(0, n - 1), bool)
                native.table_links(heads, table, bits, out)
                assert want.dtype == out.dtype and np.array_equal(want, out)
    # the heads of real words (scan's), as BenchmarkSet.linked looks them up
    words = ngrams._scan_native(["The quick brown fox; jumps over\u00a0the lazy dog's back " * 50], native)
    table = rng.random(1 << 20) < 1 / 32
    out = np.empty(len(words.heads) - 1, bool)
    native.table_links(words.heads, table, 10, out)
    assert np.array_equal(out, ngrams._table_links_numpy(words.heads, table, 10))


def test_a_mismatched_table_is_refused(native):
    with pytest.raises(ValueError):
        native.table_links(np.zeros(3, np.uint64), np.zeros(100, bool), 10, np.empty(2, bool))
    with pytest.raises(ValueError):
        native.table_links(np.zeros(3, np.uint64), np.zeros(1 << 20, bool), 10, np.empty(3, bool))
    with pytest.raises(TypeError):
        native.scan(["a", b"b"])
    with pytest.raises(ValueError):
        native.scan(["a b"], np.zeros(1 << 20, bool), 10)  # (a bool table: its bits are asked for)


def test_run_candidates_and_verdicts_equal_with_the_compiled_path_off(native, tmp_path, monkeypatch):
    """Real training files (tests/corpus.py's streams) with HumanEval's problems planted as tests/test_decontam.py
    plants them, plus fuzzed texts: run_candidates' kept texts and pieces, and the check's verdicts, the same with
    the compiled path and with TOKMIX_NATIVE=0; the verdicts the oracle's."""
    files = make_corpus(tmp_path / "corpus", doc_limit=600, rows_per_group=ROWS_PER_GROUP)
    problems = humaneval()
    plant(files, problems)
    texts = [t for paths in files.values() for p in paths for t in pq.read_table(p)["text"].to_pylist() if t]
    rng = random.Random(29)
    texts += [fuzzed_text(rng) for _ in range(200)]
    items = [oracle_grams(oracle_words(p["prompt"] + "\n" + p["canonical_solution"]), NGRAM) for p in problems]
    expected = [oracle_contaminated(t, items, {NGRAM}) for t in texts]
    assert sum(map(bool, expected)) >= 15
    for bench in prefiltered(tmp_path / "sets"):
        # a large set's triple filter as ngrams.TripleFilter (its items all of 3 words or more: no pair filter)
        triples = [] if bench.triples is None else [ngrams.TripleFilter(bench.triples, int(bench.triple_shift))]
        assert not triples or bench.lengths[0] >= 3
        monkeypatch.delenv(ngrams.NATIVE_ENV, raising=False)
        assert ngrams.compiled() is native
        kept = ngrams.run_candidates(texts, bench.linked, bench.member, NGRAM)
        assert ngrams.run_candidates(texts, bench.first_pass_pairs(), bench.member, NGRAM) == kept
        for pairs in triples:
            assert ngrams.run_candidates(texts, pairs, bench.member, NGRAM) == kept
        words = ngrams.WordFilter(bench.word_filter, int(bench.word_shift))  # wild runs decided in the loop
        assert ngrams.run_candidates(texts, bench.first_pass_pairs(), words, NGRAM) == kept
        verdicts = bench.contaminating(texts)
        monkeypatch.setenv(ngrams.NATIVE_ENV, "0")
        assert ngrams.compiled() is None
        assert ngrams.run_candidates(texts, bench.linked, bench.member, NGRAM) == kept
        assert ngrams.run_candidates(texts, bench.first_pass_pairs(), bench.member, NGRAM) == kept
        for pairs in triples:
            assert ngrams.run_candidates(texts, pairs, bench.member, NGRAM) == kept
        assert bench.contaminating(texts) == verdicts == expected
        assert 0 < len(kept) < len(texts)


# In a process whose tokmix is a copy with its own tokmix/_scan*.so: which tokmix.ngrams, whether it runs the
# compiled first pass, its note, and run_candidates' (n-grams of argv[3] words) and the check's verdicts on the
# texts of argv[2] against the set of argv[1] (argv[1] "": the import alone).
CHILD = """
import json, sys, warnings
warnings.simplefilter("always")
from tokmix import ngrams
out = {"file": ngrams.__file__, "compiled": ngrams.compiled() is not None, "note": ngrams.first_pass_note()}
if sys.argv[1]:
    from tokmix.stages.decontam import BenchmarkSet
    bench, texts = BenchmarkSet(sys.argv[1]), json.loads(open(sys.argv[2]).read())
    out["kept"] = ngrams.run_candidates(texts, bench.first_pass_pairs(), bench.member, int(sys.argv[3]))
    out["verdicts"] = bench.contaminating(texts)
print(json.dumps(out))
"""


def compile_scan(source: Path, package: Path, *flags: str) -> None:
    """source built as the extension tokmix._scan into the package copy, with this Python's compiler and
    headers (as setup.py's build_ext builds it, -O1 for speed)."""
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    target = package / f"_scan{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run([*cc, "-shared", "-fPIC", "-O1", f"-I{sysconfig.get_paths()['include']}", *flags, str(source),
                    "-o", str(target)], check=True)


def in_copy(tmp_path: Path, name: str, build, *args: str) -> tuple[dict, str]:
    """A copy of the tokmix package under tmp_path/name (no .so of its own), `build(package)` putting one in,
    and CHILD run with it first on sys.path (this clone's tests after it): CHILD's output and its stderr."""
    package = tmp_path / name / "tokmix"
    shutil.copytree(ROOT / "tokmix", package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    build(package)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package.parent), str(ROOT)])}
    env.pop(ngrams.NATIVE_ENV, None)
    done = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, check=True)
    out = json.loads(done.stdout)
    assert Path(out["file"]).resolve() == (package / "ngrams.py").resolve()
    return out, done.stderr


def test_a_stale_or_broken_extension_falls_back_to_numpy_and_says_why(native, tmp_path, monkeypatch):
    """tokmix/_scan.c compiled for real with another ABI number (a .so older than the tokmix.ngrams beside it),
    a module tokmix._scan of the days before the ABI constant, and a .so that does not load (a missing symbol):
    each process runs the numpy first pass, warns once and its run's note says why in one line; the stale one's
    candidates and verdicts are those of the compiled path here (and the oracle's) on HumanEval planted in
    texts."""
    monkeypatch.delenv(ngrams.NATIVE_ENV, raising=False)
    assert native.ABI == ngrams.SCAN_ABI and ngrams.compiled() is native and ngrams.first_pass_note() is None
    problems = humaneval()
    rng = random.Random(31)
    filler = "the cat sat on a mat and then it ran away from the dog " * 20
    texts = [fuzzed_text(rng) for _ in range(120)] + [filler] * 30
    texts += [p["prompt"] + p["canonical_solution"] for p in problems[:8]]
    texts += [changed(p["prompt"] + "\n" + p["canonical_solution"]) for p in problems[8:16]]
    for p in problems[16:24]:  # one 13-gram of an item inside a long document
        words = oracle_words(p["prompt"] + "\n" + p["canonical_solution"])
        texts.append(filler + " ".join(words[5:5 + NGRAM]) + " " + filler)
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    items = [oracle_grams(oracle_words(p["prompt"] + "\n" + p["canonical_solution"]), NGRAM) for p in problems]
    bench = humaneval_set(tmp_path / "set")
    kept = [list(map(json.loads, map(json.dumps, k))) for k in ngrams.run_candidates(
        texts, bench.first_pass_pairs(), bench.member, NGRAM)]
    verdicts = bench.contaminating(texts)
    assert verdicts == [oracle_contaminated(t, items, {NGRAM}) for t in texts] and sum(map(bool, verdicts)) >= 24

    stale = ngrams.SCAN_ABI + 1
    out, err = in_copy(tmp_path, "stale", lambda package: compile_scan(
        package / "_scan.c", package, f"-DTOKMIX_SCAN_ABI={stale}"), str(tmp_path / "set" / "set"),
        str(tmp_path / "texts.json"), str(NGRAM))
    why = (f"tokmix._scan is stale (ABI {stale}, expected {ngrams.SCAN_ABI}): rebuild it with `python setup.py "
           f"build_ext --inplace`")
    assert not out["compiled"] and why in out["note"] and out["note"].startswith("decontaminate: the first pass in")
    assert "\n" not in out["note"] and err.count(why) == 1 and "using the numpy first pass" in err
    assert out["kept"] == kept and out["verdicts"] == verdicts

    def pre_abi(package: Path) -> None:  # a module as every .so built before the ABI constant: no ABI
        (package.parent / "old.c").write_text(
            '#include <Python.h>\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, NULL};\n'
            "PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&m); }\n")
        compile_scan(package.parent / "old.c", package)

    out, err = in_copy(tmp_path, "pre-abi", pre_abi, "")
    why = f"tokmix._scan is stale (ABI none, expected {ngrams.SCAN_ABI})"
    assert not out["compiled"] and why in out["note"] and err.count(why) == 1

    def broken(package: Path) -> None:  # a .so that needs a symbol this Python does not have: it does not load
        (package.parent / "broken.c").write_text(
            "#include <Python.h>\nPyObject *PyTokmix_Missing(void);\n"
            "PyMODINIT_FUNC PyInit__scan(void) { return PyTokmix_Missing(); }\n")
        compile_scan(package.parent / "broken.c", package)

    out, err = in_copy(tmp_path, "broken", broken, "")
    assert not out["compiled"] and "tokmix._scan does not load (" in out["note"] and "\n" not in out["note"]
    assert err.count("tokmix._scan does not load (") == 1


def block_text(rng: random.Random, wide: bool) -> str:
    """Runs of 1-150 bytes between separators of 1-140 (a run over whole 64-byte blocks, a block without one, a
    run that ends at a block's first byte), non-ASCII characters in some runs (`wide`) or none."""
    out = []
    for _ in range(rng.randrange(1, 40)):
        run = "".join(rng.choice("abcXYZ09") for _ in range(rng.randrange(1, 150)))
        if wide and rng.random() < 0.3:
            at = rng.randrange(len(run) + 1)
            run = run[:at] + rng.choice(["\u00e9", "\u2014", "\u043e", "\u4e2d", "\U0001f600"]) + run[at:]
        out.append(run + rng.choice([" ", ".", "\n"]) * rng.choice([1, 1, 2, 63, 64, 65, 140]))
    return "".join(out)[:rng.randrange(1, 4000)]


def test_runs_across_blocks_and_cached_utf8_equal_numpy(native, monkeypatch):
    """The compiled loop's runs (two edges of a block's mask an iteration, a run on across blocks) and a str's
    UTF-8 read from CPython's cache instead of encoded: scan's arrays and run_candidates' pieces the same as
    numpy's, and candidates' and triple_candidates' output the same with the cache filled (PyUnicode_AsUTF8AndSize)
    as without."""
    import ctypes
    fill = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
    fill.argtypes, fill.restype = [ctypes.py_object, ctypes.c_void_p], ctypes.c_void_p
    rng = random.Random(47)
    for _ in range(60):
        texts = [block_text(rng, rng.random() < 0.6) for _ in range(rng.randrange(1, 6))]
        assert_same_scan(native, texts)
        for table in TABLES:
            shortest = rng.choice([2, 3, 13])
            monkeypatch.delenv(ngrams.NATIVE_ENV, raising=False)
            got = ngrams.run_candidates(texts, table, member_of(0), shortest)
            monkeypatch.setenv(ngrams.NATIVE_ENV, "0")
            assert got == ngrams.run_candidates(texts, table, member_of(0), shortest), (texts, table.bits)
            fresh = [text.encode().decode() for text in texts]  # (new strs, their cache empty)
            triples = rng.choice(TRIPLES)
            plain = (native.candidates(fresh, table.packed, table.bits, shortest),
                     native.triple_candidates(fresh, triples.bits, triples.shift, max(3, shortest)))
            for text in fresh:
                if not text.isascii():
                    fill(text, None)
            assert (native.candidates(fresh, table.packed, table.bits, shortest),
                    native.triple_candidates(fresh, triples.bits, triples.shift, max(3, shortest))) == plain, texts
