"""Benchmark decontamination ([decontaminate]): the benchmark items' word n-grams built once per run into its
state folder (a sorted uint64 hash array, the item of each, a bit filter and the items' normalized words, all
memory-mapped by every worker of a machine), and the check of a batch of training documents against them.

A document is contaminated by an item when they share at least `min_matches` distinct n-grams (an item of
fewer words than `ngram`: its whole word sequence). The hashes only find candidates: each candidate n-gram is
compared word for word with the item's own, so a hash collision never drops a document. The streams stage
drops contaminated documents before tokenization (action "drop") or keeps and counts them ("report")."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
from collections import defaultdict, deque
from collections.abc import Callable
from itertools import chain
from pathlib import Path

import numpy as np

from tokmix import ngrams as ngrams_module
from tokmix.cache import UnitCache
from tokmix.errors import TokmixError, os_error_message
from tokmix.faults import fault_point
from tokmix.format.commit import commit, tmp_name
from tokmix.mirrors import remap
from tokmix.ngrams import (
    NORMALIZATION,
    Links,
    PairTable,
    TripleFilter,
    WordFilter,
    Words,
    gram_hashes_at,
    head_prefixes,
    pair_hashes,
    prefix_hashes,
    run_candidates,
    split_words,
    table_links,
    word_bounds,
    word_classes,
    word_ends,
)
from tokmix.recipe import Recipe
from tokmix.shards import CONTAMINATION_NAME, RECORD_SEAL, DamagedFile, file_checksum, read_json, write_record
from tokmix.sources import HugeText
from tokmix.sources import benchmarks as benchmarks_module
from tokmix.sources.benchmarks import benchmark_files, file_bytes, file_format, file_sha256, iter_items
from tokmix.stages import cached, release_memory
from tokmix.store import storage

FILTER_BITS_PER_GRAM = 16  # the bit filter's size: ~1/16 of a text's n-grams reach the sorted array's search
MIN_FILTER_BITS = 1 << 16
WORD_FILTER_LOG2 = 24  # the items' words' filter: 2 MiB, 16 bits per word for a million distinct words
GROUP_CHARS = 1 << 20  # documents checked together: their words' Python objects stay ~10x this in memory
ITEMS_KEPT = 8192  # items' words a process keeps for checking candidates (about their text's size each)
FIRST_PASS_GROUPS = 8  # the first pass's last groups that tell whether it pays (BenchmarkSet._first_pass_pays)
FIRST_PASS_PROBE = 16
GRAMS_KEPT = 16384  # candidate n-grams a process keeps the verdict of (the items holding each)
RUN_MIN = 2  # consecutive candidates of one item checked together (BenchmarkSet._runs)
ARRAYS = ("grams", "items", "filter", "words", "word_starts", "word_filter", "pairs", "triples", "mixed", "buckets")
# arrays that only spare work, not in the set's fingerprint: the pair and triple filters (ngrams.run_candidates),
# the hashes whose items' n-grams are not all the same words ("mixed", a function of the fingerprinted words) and
# where each bucket of the sorted hashes starts ("buckets", a function of the fingerprinted hashes)
PREFILTER = ("pairs", "triples", "mixed", "buckets")
GRAMS_PER_BUCKET = 8  # about, at most: the sorted hashes' buckets (by their top bits) a search starts from
# a set whose items' words take more than this gets a filter of their triples (three consecutive words): its
# pairs of common words are most pairs of a text, so the pair filter alone lets nearly every text through
TRIPLE_FILTER_WORD_BYTES = 1 << 20


def set_files(directory: Path) -> dict[str, Path]:
    return {kind: directory / f"{kind}.npy" for kind in ARRAYS}


def bit_filter(hashes: np.ndarray) -> tuple[int, np.ndarray]:
    """A bit per slot of FILTER_BITS_PER_GRAM per hash (a power of two), set where a hash's top bits fall: (the
    shift that gives a hash's slot, the bits). Hashes in order set them ~4x faster (the slots' bytes in cache)."""
    shift, filt = empty_filter(len(hashes))
    set_bits(filt, shift, hashes)
    return shift, filt


def empty_filter(count: int) -> tuple[int, np.ndarray]:
    bits = max(MIN_FILTER_BITS, 1 << int(np.ceil(np.log2(max(1, count) * FILTER_BITS_PER_GRAM))))
    return 64 - int(np.log2(bits)), np.zeros(bits // 8, np.uint8)


def set_bits(filt: np.ndarray, shift: int, hashes: np.ndarray) -> None:
    for at in range(0, len(hashes), SET_BITS_AT_ONCE):  # bounded: each hash's temporaries are ~40 bytes
        set_slots(filt, hashes[at:at + SET_BITS_AT_ONCE] >> np.uint64(shift))


def set_slots(filt: np.ndarray, slots: np.ndarray) -> None:
    """Set the filter's bits `slots` (unsigned integers: uint64, or uint32 for a filter of at most 2**32 bits)."""
    kind = slots.dtype.type
    np.bitwise_or.at(filt, slots >> kind(3), np.left_shift(1, (slots & kind(7)).astype(np.uint8), dtype=np.uint8))


def set_scattered_slots(filt: np.ndarray, slots: np.ndarray) -> None:
    """set_slots for slots in no order over a filter far larger than the caches (the pair and triple filters):
    one bit position of a byte at a time, a plain fancy-indexed |= (a byte that several of its slots name gets
    the same value from each, it | that bit: exact). 1.7x faster than np.bitwise_or.at there (1.05 -> 0.59
    CPU-s for 10M slots of a 32 MiB filter), 1.7x slower on slots in order or a filter in cache (the n-gram and
    word filters: set_slots)."""
    kind = slots.dtype.type
    byte = (slots >> kind(3)).astype(np.intp)
    bit = (slots & kind(7)).astype(np.uint8)
    for k in range(8):
        at = byte[bit == k]
        filt[at] |= np.uint8(1 << k)


def top_filter(parts: list[np.ndarray]) -> tuple[int, np.ndarray]:
    """bit_filter of the hashes whose top 32 bits `parts` hold (uint32: the build holds pairs and triples so,
    half the memory), from those bits without a uint64 copy of them (0.3 CPU-s and 86 MB for the 100k set's
    pairs). Sorting them first sets the bits in order, ~4x faster, but the sort costs as much."""
    tops = np.concatenate(parts) if parts else np.empty(0, np.uint32)
    shift, filt = empty_filter(len(tops))
    for at in range(0, len(tops), SET_BITS_AT_ONCE):
        chunk = tops[at:at + SET_BITS_AT_ONCE]
        set_scattered_slots(filt, chunk >> np.uint32(shift - 32) if shift >= 32 else
                            chunk.astype(np.uint64) << np.uint64(32 - shift))
    return shift, filt


SET_BITS_AT_ONCE = 1 << 20


def in_filter(filt: np.ndarray, shift: np.uint64, hashes: np.ndarray) -> np.ndarray:
    """Whether each hash's slot is set: True for every hash of the filter, and for a few others."""
    slots = hashes >> shift
    return ((filt[(slots >> np.uint64(3)).astype(np.int64)] >> (slots & np.uint64(7)).astype(np.uint8)) & 1) == 1


ITEMS_PER_GROUP = 1024  # benchmark items normalized and hashed together


def _hash_items(texts: list[str], n: int, first: int, out: dict) -> None:
    """One group of items: their n-gram hashes and the item of each in item order (an item of fewer words: the
    hash of all of them), appended to the build's part files; their word hashes and each two consecutive words'
    and three into the filters' inputs; their mapped bytes (the words, separated by zeros) to the words part, and where
    each starts."""
    segments, item_of = _segments(texts)
    group = split_words(segments)
    counts = np.bincount(item_of, np.diff(group.first), len(texts)).astype(np.int64)  # each item's words
    first_word = group.first[np.searchsorted(item_of, np.arange(len(texts)))]  # each item's first
    hashes, at = group.grams(n)  # (inside one segment each)
    owner = item_of[group.text_of(at)]
    short = (counts > 0) & (counts < n) & (np.bincount(item_of, minlength=len(texts)) == 1)
    for k in np.unique(counts[short]).tolist():  # the short items of k words: the hash of all of them
        out["short_lengths"].add(k)
        mine = np.flatnonzero(short & (counts == k))
        hashes = np.concatenate([hashes, gram_hashes_at(group.hashes, first_word[mine], k)])
        owner = np.concatenate([owner, mine])
    lengths = np.full(len(hashes), n, np.uint8)
    lengths[len(at):] = counts[owner[len(at):]]
    places = np.concatenate([at, first_word[owner[len(at):]]]) + out["word_count"]  # each one's first word
    if len(hashes) > len(at):  # the items in order (the n-grams' are): one stable sort by hash then orders both
        order = np.argsort(owner, kind="stable")
        hashes, owner, places, lengths = hashes[order], owner[order], places[order], lengths[order]
    hashes.tofile(out["grams"])
    (owner + first).astype(np.uint32).tofile(out["owners"])
    places.astype(np.uint32).tofile(out["places"])
    lengths.tofile(out["lengths"])
    out["ngrams"] += len(hashes)
    out["vocabulary"].numbers(group).tofile(out["ids"])
    out["word_count"] += len(group.starts)
    if out["word_count"] >= 1 << 32:
        raise ValueError("benchmark items of more than 4,294,967,295 words in all")
    set_bits(out["word_filter"], out["word_shift"], group.hashes)  # the items' words, as they come
    prefix = prefix_hashes(group.data, group.starts, group.ends)
    lasts = group.first[1:] - 1  # each item's last word (-1 for an item before the first word)
    pairs = pair_hashes(prefix[:-1], prefix[1:])
    inside = np.ones(len(pairs), bool)  # each two consecutive words of one item
    inside[lasts[(lasts >= 0) & (lasts < len(inside))]] = False
    out["pairs"].append((pairs[inside] >> np.uint64(32)).astype(np.uint32))  # (the filter's top bits)
    three = inside[:-1] & inside[1:]  # each three
    out["triples"].append((pair_hashes(pairs[:-1], prefix[2:])[three] >> np.uint64(32)).astype(np.uint32))
    data, starts = _item_words(group, item_of, len(texts))
    base = out["bytes"]
    data.tofile(out["words"])
    out["starts"].append(base + starts)
    out["bytes"] = base + len(data)
    out["short"] += int(short.sum())
    matched = np.zeros(len(texts), bool)
    matched[owner] = True
    out["empty"] += int((~matched).sum())  # no words, or segments all shorter than ngram


SEGMENT_MARK = b"\x01"  # between two segments of an item in its mapped words: no text's word (it separates)


def _segments(texts: list) -> tuple[list[str], np.ndarray]:
    """The items' segments (an item of list fields: a tuple of them, tokmix.sources.benchmarks._field_text;
    else its text) and the item of each."""
    segments: list[str] = []
    item_of: list[int] = []
    for i, text in enumerate(texts):
        if isinstance(text, tuple):
            segments += text
            item_of += [i] * len(text)
        else:
            segments.append(text)
            item_of.append(i)
    return segments, np.array(item_of, np.int64)


def _item_words(group: Words, item_of: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The group's mapped bytes (its words separated by zeros) and where each item's start in them: an item's
    segments with SEGMENT_MARK between them, so that an n-gram across two is never one of its (the check
    compares a candidate's words with the item's)."""
    if len(item_of) == count:
        return group.data[:group.offsets[-1]], group.offsets[:-1]  # one segment each: without the padding
    data = bytearray(b"\0")
    starts = np.empty(count, np.int64)
    raw = group.data.tobytes()
    offsets = group.offsets.tolist()
    for s, item in enumerate(item_of.tolist()):
        if s and item_of[s - 1] == item:
            data += SEGMENT_MARK + b"\0"
        else:
            starts[item] = len(data)
        data += raw[offsets[s]:offsets[s + 1]]
    return np.frombuffer(bytes(data), np.uint8), starts


class WordNumbers:
    """Each word as a number, the same for the same bytes (exact), to compare n-grams by. A word of at most 16
    bytes is looked up by its hash (ngrams.word_hashes) in an open-addressing table of numpy arrays, a whole
    group at once, and taken only if its first and last 8 bytes and length are the entry's (together all of
    such a word); a longer word, or one whose hash another word holds there, is numbered in a dictionary of its
    bytes. (A dictionary lookup per distinct word of each group took 2.5 of the 100k set's 10.7 CPU-s, a
    searchsorted of sorted arrays more.)"""

    def __init__(self):
        self.others: dict[bytes, int] = {}
        self.count = 0
        self._empty(WORD_TABLE_BITS)

    def _empty(self, bits: int) -> None:
        self.bits, self.size = bits, 0
        self.full = np.zeros(1 << bits, bool)
        self.hashes, self.heads, self.tails = (np.zeros(1 << bits, np.uint64) for _ in range(3))
        self.lengths = np.zeros(1 << bits, np.uint8)
        self.values = np.zeros(1 << bits, np.uint32)

    def numbers(self, group: Words) -> np.ndarray:
        numbers = np.empty(len(group.starts), np.uint32)
        if not len(numbers):
            return numbers
        head, tail, lengths = word_ends(group.data, group.starts, group.ends)
        key = (group.hashes, head, tail, lengths)
        short = np.flatnonzero(lengths <= 16)
        listed, found = self._find(key, short, numbers)
        fresh = short[~listed]  # hashes not in the table: each one's first word enters it
        done = [short[found]]
        if len(fresh):
            hashes, first = np.unique(group.hashes[fresh], return_index=True)
            self._add(hashes, *(part[fresh[first]] for part in key[1:]))
            done.append(fresh[self._find(key, fresh, numbers)[1]])
        rest = np.ones(len(numbers), bool)
        rest[np.concatenate(done)] = False
        data = group.data
        for w in np.flatnonzero(rest).tolist():  # long words, and words whose hash another word has
            word = data[group.starts[w]:group.ends[w]].tobytes()
            if word not in self.others:
                self.others[word] = self._next(1)
            numbers[w] = self.others[word]
        return numbers

    def _find(self, key: tuple, words: np.ndarray, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether each of `words` has its hash in the table, and whether it is the entry's word (then numbered)."""
        hashes, head, tail, lengths = (part[words] for part in key)
        slot, listed = self._probe(hashes)
        at = slot[listed]
        found = np.zeros(len(words), bool)
        found[listed] = ((self.heads[at] == head[listed]) & (self.tails[at] == tail[listed])
                         & (self.lengths[at] == lengths[listed]))
        numbers[words[found]] = self.values[slot[found]]
        return listed, found

    def _probe(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each hash's slot in the table and whether it is there (else the empty slot its probe ended at)."""
        slot = (hashes >> np.uint64(64 - self.bits)).astype(np.int64)
        listed = np.zeros(len(hashes), bool)
        pending = np.arange(len(hashes))
        while len(pending):  # linear probing, the table at most half full: a few rounds, each on fewer
            at = slot[pending]
            full = self.full[at]
            hit = full & (self.hashes[at] == hashes[pending])
            listed[pending[hit]] = True
            pending = pending[full & ~hit]
            slot[pending] = (slot[pending] + 1) & ((1 << self.bits) - 1)
        return slot, listed

    def _add(self, hashes: np.ndarray, heads: np.ndarray, tails: np.ndarray, lengths: np.ndarray) -> None:
        """Enter words of distinct hashes that are not in the table, each with a new number."""
        if 2 * (self.size + len(hashes)) > len(self.full):  # grown to at most half full
            full = self.full
            old = (self.hashes[full], self.heads[full], self.tails[full], self.lengths[full], self.values[full])
            self._empty(max(self.bits + 1, int(2 * (self.size + len(hashes))).bit_length() + 1))
            self._put(*old)
        first = self._next(len(hashes))
        self._put(hashes, heads, tails, lengths, np.arange(first, first + len(hashes), dtype=np.uint32))

    def _put(self, hashes: np.ndarray, *entry: np.ndarray) -> None:
        slot = (hashes >> np.uint64(64 - self.bits)).astype(np.int64)
        pending = np.arange(len(hashes))
        while len(pending):
            at = slot[pending]
            empty = np.flatnonzero(~self.full[at])
            _, first = np.unique(at[empty], return_index=True)  # one word per empty slot this round
            won = empty[first]
            mine, where = pending[won], at[won]
            self.full[where] = True
            for table, new in zip((self.hashes, self.heads, self.tails, self.lengths, self.values), (hashes, *entry)):
                table[where] = new[mine]
            left = np.ones(len(pending), bool)
            left[won] = False
            pending = pending[left]
            slot[pending] = (slot[pending] + 1) & ((1 << self.bits) - 1)
        self.size += len(hashes)

    def _next(self, count: int) -> int:
        first, self.count = self.count, self.count + count
        if self.count > 1 << 32:
            raise ValueError("benchmark items of more than 4,294,967,296 distinct words")
        return first


WORD_TABLE_BITS = 16  # the word table's first size (slots); it doubles to stay at most half full


# what a build appends to as it reads the items (PART files, then removed): the n-grams' hashes, items, first
# words (in the ids) and lengths, the items' mapped bytes, their words as numbers
PARTS = ("grams", "owners", "places", "lengths", "words", "ids")


def build_set(recipe: Recipe, directory: Path, mirrors, triples: bool | None = None,
              data: dict[str, bytes] | None = None) -> dict:
    """Read every benchmark file by file, hash its items' n-grams group by group into part files, sort them once
    (bounded: the n-grams' hashes twice and their order at the sort, 20 bytes each, and the texts of one file;
    the 100k set's build peaks at ~340 MiB), write the arrays and the sealed record (`set.json`, the last file
    written: the commit). `triples`: whether the set gets its triple filter (None: when its items' words take
    more than TRIPLE_FILTER_WORD_BYTES; else the filter is empty). `data`: the files' bytes read already, by path
    (benchmark_checksums' `keep`: not read twice)."""
    spec = recipe.decontaminate
    n = spec.ngram
    directory.mkdir(parents=True, exist_ok=True)
    parts = {kind: directory / f"{kind}.part" for kind in PARTS}
    out = {kind: open(path, "wb") for kind, path in parts.items()}
    out.update({"word_shift": 64 - WORD_FILTER_LOG2, "word_filter": np.zeros((1 << WORD_FILTER_LOG2) // 8, np.uint8),
                "starts": [], "bytes": 0, "short_lengths": set(), "short": 0, "empty": 0, "pairs": [], "triples": [],
                "ngrams": 0, "vocabulary": WordNumbers(), "word_count": 0})
    benchmarks, ids = {}, []
    try:
        for name, bench in spec.benchmarks.items():
            checksums: dict[str, str] = {}
            first, out["short"], out["empty"] = len(ids), 0, 0
            group: list[str] = []
            for item in iter_items(name, [recipe.resolve(f) for f in bench.files], bench.fields, bench.id_field,
                                   mirrors, checksums, data):
                ids.append(item.id)
                group.append(item.text)
                if len(group) == ITEMS_PER_GROUP:
                    _hash_items(group, n, len(ids) - len(group), out)
                    group = []
                    fault_point("benchmarks:after-group")
            if group:
                _hash_items(group, n, len(ids) - len(group), out)
            benchmarks[name] = {"files": checksums, "fields": bench.fields, "id_field": bench.id_field,
                                "items": len(ids) - first, "first_item": first, "short_items": out["short"],
                                "empty_items": out["empty"]}
    except BaseException:  # a bad benchmark file: none of the build left behind
        for kind in PARTS:
            out[kind].close()
            parts[kind].unlink(missing_ok=True)
        raise
    finally:
        for kind in PARTS:
            out[kind].close()
    files = set_files(directory)
    pair_shift, pair_filt = top_filter(out.pop("pairs"))  # before the n-grams are loaded and sorted
    triple_shift, triple_filt = 0, np.empty(0, np.uint8)
    if triples or (triples is None and out["bytes"] > TRIPLE_FILTER_WORD_BYTES):
        triple_shift, triple_filt = top_filter(out["triples"])
    del out["triples"]
    written = {"pairs": _write_npy(files["pairs"], pair_filt), "triples": _write_npy(files["triples"], triple_filt)}
    del pair_filt, triple_filt  # (not held while the n-grams are sorted: 32 MiB each for the 100k set)
    del out["vocabulary"]
    release_memory()  # the groups' and filters' freed arrays (glibc keeps ~100 MiB of them) before the sort
    hashes = np.fromfile(parts["grams"], np.uint64)
    order, hashes = _stable_order(hashes)  # by hash, then item (the parts are in item order)
    mixed = _mixed(hashes, order, parts)
    items = _gather(np.fromfile(parts["owners"], np.uint32), order)
    del order
    distinct = np.ones(len(hashes), bool)  # an n-gram an item has twice is one entry
    distinct[1:] = (hashes[1:] != hashes[:-1]) | (items[1:] != items[:-1])
    hashes, items = hashes[distinct], items[distinct]
    del distinct
    for bench in benchmarks.values():  # distinct n-grams of each benchmark's items
        bench["ngrams"] = int(np.count_nonzero((items >= bench["first_item"])
                                               & (items < bench["first_item"] + bench["items"])))
    starts = np.concatenate([*out["starts"], [out["bytes"]]]).astype(np.int64)
    short_lengths = out["short_lengths"]
    shift, filt = bit_filter(hashes)
    bucket_shift, buckets = gram_buckets(hashes)
    word_shift, word_filt = out["word_shift"], out["word_filter"]
    arrays = {"grams": hashes, "items": items, "filter": filt, "words": parts["words"],
              "word_starts": starts, "word_filter": word_filt, "mixed": mixed, "buckets": buckets}
    for kind, array in arrays.items():
        written[kind] = _write_npy(files[kind], array)
        fault_point("benchmarks:after-array")
    checksums = {kind: written[kind] for kind in ARRAYS}
    for path in parts.values():
        path.unlink()
    record = {"normalization": NORMALIZATION, "ngram": n, "min_matches": spec.min_matches, "action": spec.action,
              "filter_shift": shift, "word_filter_shift": word_shift, "pair_filter_shift": pair_shift,
              "triple_filter_shift": triple_shift, "bucket_shift": bucket_shift,
              "short_lengths": sorted(short_lengths),
              "benchmarks": benchmarks, "ids": ids,
              "arrays": checksums}
    record["fingerprint"] = set_fingerprint(record)
    fault_point("benchmarks:before-record")
    write_record(directory / "set.json", record)
    return record


def set_fingerprint(record: dict) -> str:
    """What decides which documents go: the rules and every array (the items' words check the candidates), not
    the arrays that only spare work (PREFILTER)."""
    decisive = {kind: value for kind, value in record["arrays"].items() if kind not in PREFILTER}
    return hashlib.sha256(json.dumps([record["normalization"], record["ngram"], record["min_matches"],
                                      record["action"], decisive], sort_keys=True).encode()).hexdigest()


def _stable_order(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.argsort(hashes, kind="stable") (uint32 when that holds every index) and the hashes in that order, from
    numpy's sort of values (vectorized: 0.7 CPU-s for 10M uint64 against 1.9 for its argsort): each hash's top
    bits with its index in the low ones, then each run of equal top bits put in (hash, index) order."""
    count = len(hashes)
    bits = max(1, (count - 1).bit_length())
    low = np.uint64((1 << bits) - 1)
    keys = hashes & ~low
    for at in range(0, count, SET_BITS_AT_ONCE):
        keys[at:at + SET_BITS_AT_ONCE] |= np.arange(at, min(count, at + SET_BITS_AT_ONCE), dtype=np.uint64)
    keys.sort()
    tie = np.empty(max(0, count - 1), bool)  # the same top bits as the next one's (a million at a time: bounded)
    for at in range(0, len(tie), SET_BITS_AT_ONCE):
        end = min(count, at + SET_BITS_AT_ONCE + 1)
        tie[at:end - 1] = (keys[at + 1:end] ^ keys[at:end - 1]) <= low
    keys &= low
    order = keys.astype(np.uint32) if count <= 1 << 32 else keys.astype(np.int64)
    del keys
    ordered = _gather(hashes, order)
    if tie.any():
        inside = np.zeros(count, bool)  # the entries of a run of equal top bits
        inside[1:] |= tie
        inside[:-1] |= tie
        at = np.flatnonzero(inside)
        by = np.lexsort((order[at], ordered[at]))
        order[at], ordered[at] = order[at][by], ordered[at][by]
    return order, ordered


def _gather(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """values[order], a million at a time: numpy makes a uint32 index int64 first (80 MB for 10M n-grams)."""
    out = np.empty(len(order), values.dtype)
    for at in range(0, len(order), SET_BITS_AT_ONCE):
        out[at:at + SET_BITS_AT_ONCE] = values[order[at:at + SET_BITS_AT_ONCE]]
    return out


def _mixed(hashes: np.ndarray, order: np.ndarray, parts: dict[str, Path]) -> np.ndarray:
    """The hashes (sorted) that n-grams of different words share: every n-gram (in `order`, which sorts the
    part files by hash) compared word for word with the first of its hash, as word numbers. Any other hash
    stands for one sequence of words, so one comparison tells whether a candidate is each item's of the hash.
    Only the n-grams after another of their hash are read from the part files (mapped)."""
    later = np.flatnonzero(hashes[1:] == hashes[:-1]) + 1  # an n-gram after another of its hash
    if not len(later):
        return np.empty(0, np.uint64)
    run = np.ones(len(later), bool)  # later[i] is the second n-gram of its hash: its first is later[i] - 1
    run[1:] = later[1:] != later[:-1] + 1
    head = (later[run] - 1)[np.cumsum(run) - 1]  # the first n-gram of each one's hash
    ids, places, lengths = (np.memmap(parts[kind], dtype, mode="r") if parts[kind].stat().st_size else
                            np.zeros(1, dtype) for kind, dtype in (("ids", np.uint32), ("places", np.uint32),
                                                                   ("lengths", np.uint8)))
    differ = []
    last = len(ids) - 1
    for at in range(0, len(later), SET_BITS_AT_ONCE):
        mine, first = order[later[at:at + SET_BITS_AT_ONCE]], order[head[at:at + SET_BITS_AT_ONCE]]
        size = lengths[mine]
        same = size == lengths[first]
        a, b = places[mine].astype(np.int64), places[first].astype(np.int64)
        for j in range(int(size.max())):
            inside = j < size
            same &= ~inside | (ids[np.minimum(a + j, last)] == ids[np.minimum(b + j, last)])
        differ.append(hashes[later[at:at + SET_BITS_AT_ONCE][~same]])
    return np.unique(np.concatenate(differ))


def _write_npy(path: Path, array: np.ndarray | Path) -> str:
    """Write and commit an .npy file without a copy of the array in memory (a Path: the raw bytes of a uint8
    array, copied in chunks); returns its sha256."""
    tmp = tmp_name(path)
    with open(tmp, "wb") as f:
        if isinstance(array, Path):
            size = array.stat().st_size
            np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": (size,)})
            with open(array, "rb") as raw:
                while chunk := raw.read(CHUNK_BYTES):
                    f.write(chunk)
        else:
            np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)
    commit(tmp, path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


CHUNK_BYTES = 8 << 20


SMALL_BENCHMARK_BYTES = 4 << 20  # benchmark files this small are built in the stage process (a fresh one costs more)


def small_benchmarks(recipe: Recipe, mirrors) -> bool:
    """Whether the benchmark files are all local and together small, so that their set is built in the stage
    process (a few MiB of arrays) rather than in a fresh one (whose arrays leave with it)."""
    total = 0
    for name, bench in recipe.decontaminate.benchmarks.items():
        for path in benchmark_files([recipe.resolve(f) for f in bench.files], name, mirrors):
            if "://" in path or not os.path.isfile(path):
                return False
            total += os.path.getsize(path)
    return total <= SMALL_BENCHMARK_BYTES


def benchmark_checksums(recipe: Recipe, mirrors, keep: dict[str, bytes | Path] | None = None,
                        copies: Path | None = None) -> dict[str, dict[str, str]]:
    """Every benchmark's files and the sha256 of each: with NORMALIZATION, the run identity's "benchmarks" key;
    each file read once (a file matched twice is hashed once). `keep`: a dict given, for build_set's `data`, the
    bytes of each file (a small set, built in this process: read once), or with `copies` (a local folder) a
    copy made there as it is read of each file not on this machine (a large set's build, in a process of its own,
    reads the copy: one download); a local file is then read again by the build, which tells if it changed
    (prepare_set)."""
    checksums: dict[str, dict[str, str]] = {}
    read: dict[str, str] = {}
    for name, bench in recipe.decontaminate.benchmarks.items():
        checksums[name] = {}
        for path in benchmark_files([recipe.resolve(f) for f in bench.files], name, mirrors):
            if path in read:
                pass
            elif keep is not None and copies is None:
                keep[path] = file_bytes(path, name, mirrors)
                read[path] = hashlib.sha256(keep[path]).hexdigest()
            elif keep is not None and "://" in remap(path, mirrors):
                keep[path] = tmp_name(copies / f"file-{len(keep)}")
                read[path] = file_sha256(path, name, mirrors, keep[path])
            else:
                read[path] = file_sha256(path, name, mirrors)
            checksums[name][path] = read[path]
    return checksums


def set_checksums(record: dict) -> dict[str, dict[str, str]]:
    """A built set's benchmark files and the sha256 of the bytes it was built from (benchmark_checksums' form)."""
    return {name: bench["files"] for name, bench in record["benchmarks"].items()}


def changed_while_read(record: dict, checksums: dict[str, dict[str, str]]) -> str | None:
    """The one line naming a benchmark file whose bytes the set was built from are not those `checksums` pinned
    (it changed between the two reads), None when none."""
    built = set_checksums(record)
    for name, files in checksums.items():
        for path, digest in files.items():
            now = built.get(name, {}).get(path)
            if now != digest:
                return (f"benchmark {name}: file {path}: changed while this run read it (sha256 {digest[:12]}... "
                        f"when pinned, {str(now)[:12]}... when its n-grams were built): run again once it is whole")
    return None


def remove_set(directory: Path) -> None:
    """A built set's files, its record first (the commit): not taken by a resume."""
    (directory / "set.json").unlink(missing_ok=True)
    for path in set_files(directory).values():
        path.unlink(missing_ok=True)


def arrays_damage(directory: Path, record: dict) -> str | None:
    for kind, path in set_files(directory).items():
        if not path.is_file() or kind not in record["arrays"]:  # (a set built before the kind existed)
            return f"{path} is missing"
        if file_checksum(path) != record["arrays"][kind]:
            return f"{path}: sha256 differs from its record"
    return None


def whole_set(directory: Path, log, recipe: Recipe) -> dict | None:
    """The record of the set built in `directory` when it is there whole and of the recipe's rules; damaged
    arrays or another recipe's set (a state folder's set put there from another run): the record removed, said,
    None (built again). Its files' bytes are the caller's to check (set_checksums)."""
    path = directory / "set.json"
    record = read_json(path, sealed=True)  # damaged: its one line (what it recorded cannot be remade)
    if record is None:
        return None
    damage = arrays_damage(directory, record)
    if damage is None and (other := _other_rules(record, recipe)) is not None:
        damage = f"{path}: a set of {other}"
    if damage is None:
        return record
    log(f"benchmark n-grams: {damage}; built again")
    path.unlink()
    return None


def _other_rules(record: dict, recipe: Recipe) -> str | None:
    """What of the recipe's [decontaminate] a built set's record has otherwise, in words; None when none."""
    spec = recipe.decontaminate
    want = {"normalization": NORMALIZATION, "ngram": spec.ngram, "min_matches": spec.min_matches,
            "action": spec.action,
            "benchmarks": [[name, b.fields, b.id_field] for name, b in spec.benchmarks.items()]}
    have = {"normalization": record["normalization"], "ngram": record["ngram"], "min_matches": record["min_matches"],
            "action": record["action"],
            "benchmarks": [[name, b.get("fields"), b.get("id_field")] for name, b in record["benchmarks"].items()]}
    changed = [f"{key} {json.dumps(have[key])}, not {json.dumps(want[key])}" for key in want if have[key] != want[key]]
    return "; ".join(changed) or None


def prepare_set(recipe: Recipe, directory: Path, mirrors, log, build=build_set, cache: str | None = None,
                checksums: dict[str, dict[str, str]] | None = None,
                later: Callable[[Callable[[], None]], None] | None = None) -> dict | None:
    """The run's benchmark set: its own when whole (whole_set), else the token cache's set of the same key
    (`cache`: its root; checked as it is taken), else built (by `build`, which the pipeline runs in a fresh
    process for large sets; None: not built, None returned) from the files the run's identity pinned
    (tokmix.identity, "benchmarks": `checksums`; a file the build found other bytes in is refused, naming it, and
    nothing of the set kept) and kept in the cache for the next run: by `later(keep)` when the cache is on a
    store (`later`: e.g. a thread's, beside the streams stage: the upload of the 100k set's 273 MiB is not
    waited for), else at once (links)."""
    record = whole_set(directory, log, recipe)
    if record is None and cache is not None:
        checksums = checksums if checksums is not None else benchmark_checksums(recipe, mirrors)
        key, parts = set_key(recipe, checksums, mirrors)
        record = _take_cached(cache, key, parts, recipe, checksums, directory, log)
    if record is None:
        if build is None:
            return None
        record = build(recipe, directory, mirrors)
        if checksums is not None and (changed := changed_while_read(record, checksums)) is not None:
            remove_set(directory)
            raise TokmixError(changed)
        if cache is not None:
            def keep() -> None:
                _keep_cached(cache, key, parts, record, checksums, directory, log)

            if later is not None and UnitCache(cache).remote:
                later(keep)
            else:
                keep()
    say_set(record, log)
    return record


def say_set(record: dict, log) -> None:
    for name, bench in record["benchmarks"].items():
        log(f"benchmark {name}: {bench['items']:,} items, {bench['ngrams']:,} {record['ngram']}-grams")


# ---------------------------------------------------------------------------- built sets kept across runs
SET_FORMAT = 2  # what a built set's files hold: another one (or other build code, BUILD_CODE) misses every entry
CACHE_KIND = "benchmark-set"  # the token cache's entries of built sets (tokmix.cache, an entry's "kind")
BUILD_CODE = (ngrams_module.__file__, __file__, benchmarks_module.__file__)  # what builds a set: their bytes


def set_key(recipe: Recipe, checksums: dict[str, dict[str, str]], mirrors) -> tuple[str, dict]:
    """The token cache's key of the run's benchmark set and what it is made of: what the set's fingerprint
    covers, and only that: the rules (normalization, ngram, min_matches, action), each benchmark's files by
    content (sha256, in the order they are read, a file matched twice twice, with the format their bytes are read
    in), its fields and id field, and the set's format (SET_FORMAT and the bytes of the code that builds it). Not
    the benchmarks' names nor their files' paths: a run's record takes those from its recipe (_for_run)."""
    spec = recipe.decontaminate
    code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in BUILD_CODE)).hexdigest()
    read = {name: benchmark_files([recipe.resolve(f) for f in bench.files], name, mirrors)
            for name, bench in spec.benchmarks.items()}  # as iter_items reads them
    parts = {"kind": CACHE_KIND, "format": SET_FORMAT, "code": code, "normalization": NORMALIZATION,
             "ngram": spec.ngram, "min_matches": spec.min_matches, "action": spec.action,
             "benchmarks": [{"files": [[file_format(path), checksums[name][path]] for path in read[name]],
                             "fields": bench.fields, "id_field": bench.id_field}
                            for name, bench in spec.benchmarks.items()]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest(), parts


def _for_run(cached: dict, recipe: Recipe, checksums: dict[str, dict[str, str]]) -> dict:
    """A cached set's record as this run's build would write it: its benchmarks under the run's names, each
    with the run's files (the same contents, in the same order: the key)."""
    benchmarks = {name: {**bench, "files": dict(checksums[name])}
                  for name, bench in zip(recipe.decontaminate.benchmarks, cached["benchmarks"].values())}
    return {**cached, "benchmarks": benchmarks}


def _entry_damage(entry: dict, parts: dict) -> str | None:
    """Why a cache entry (its files checked already) is not the set of `parts`' key: None when it is."""
    record = entry["unit"]
    if entry.get("kind") != CACHE_KIND or {k: v for k, v in entry["parts"].items() if k != "sources"} != parts:
        return "its record is another set's"
    if record["arrays"] != {kind: extra["sha256"] for kind, extra in entry["extra"].items()}:
        return "its set record names other arrays than its files"
    if record["fingerprint"] != set_fingerprint(record) or len(record["benchmarks"]) != len(parts["benchmarks"]):
        return "its set record does not fit together"
    return None


def _take_cached(root: str, key: str, parts: dict, recipe: Recipe, checksums: dict, directory: Path,
                 log) -> dict | None:
    """The set of `key` from the token cache: its arrays linked (or copied) into `directory`, each checked
    against its sha256, and the run's record written (the commit); None, said in one line, when the entry is
    damaged (removed) or the cache cannot be read."""
    cache = UnitCache(root)
    directory.mkdir(parents=True, exist_ok=True)
    files = set_files(directory)
    try:
        entry = cache.place(key, files, "cache:after-take-set-file")
        if entry is not None and (why := _entry_damage(entry, parts)) is not None:
            cache.problem = why
            cache.remove(key)
            entry = None
    except OSError as e:
        log(f"benchmark n-grams: token cache {root}: {os_error_message(e)}; built")
        entry = None
    if entry is None:
        if cache.problem is not None:
            log(f"benchmark n-grams: token cache {cache.entry_dir(key)}: damaged ({cache.problem}); removed, "
                "built again")
        for path in files.values():
            path.unlink(missing_ok=True)
        return None
    record = _for_run(entry["unit"], recipe, checksums)
    write_record(directory / "set.json", record)
    log(f"benchmark n-grams: taken from the token cache ({cache.entry_dir(key)})")
    return record


def _keep_cached(root: str, key: str, parts: dict, record: dict, checksums: dict, directory: Path, log) -> None:
    """The built set added to the token cache (its arrays linked where they can be: no second copy), unless the
    cache cannot take it (said). (A set built from other bytes than the key's never gets here: prepare_set.)"""
    files = set_files(directory)
    cache = UnitCache(root)
    sources = [path for files_of in checksums.values() for path in files_of]
    try:
        kept = cache.fill(key, None, CACHE_KIND, record, True, {**parts, "sources": sources},
                          {kind: (files[kind], record["arrays"][kind]) for kind in ARRAYS}, kind=CACHE_KIND)
    except (OSError, DamagedFile) as e:
        log(f"benchmark n-grams: not kept in the token cache {root} ({getattr(e, 'why', None) or os_error_message(e)})")
        return
    if kept:
        log(f"benchmark n-grams: kept in the token cache ({cache.entry_dir(key)})")


# ---------------------------------------------------------------------------- worker side
PAIR_TABLE_WORD_BYTES = 1 << 20  # a set of items' words this small may get a table of its pairs in each process
PAIR_TABLE_BITS = 10  # a word's class (ngrams.word_classes): a table of 1 MiB, within L2 caches
PAIR_TABLE_DENSEST = 1 / 32  # a table with more pairs set lets more through than the set's pair filter


def pair_table(words: np.ndarray, word_starts: np.ndarray) -> PairTable | None:
    """For each two classes of words, whether an item has a word of the first and a word of the second one after
    the other: one bool per pair of classes (its index: first << PAIR_TABLE_BITS | second), from the items'
    words as the set holds them (each between zero bytes; item i's from byte word_starts[i]). A lookup there costs
    a few times less than the pair filter's hash and test (numpy, per 1 MB group); None when it is too full."""
    data = np.concatenate([np.zeros(1, np.uint8), words, np.zeros(9, np.uint8)])
    starts, ends = word_bounds(data != 0)
    classes = word_classes(data, starts, ends, PAIR_TABLE_BITS)
    item = np.searchsorted(word_starts, starts - 1, side="right")  # (data has a byte before the words)
    table = np.zeros(1 << (2 * PAIR_TABLE_BITS), bool)
    table[((classes[:-1] << PAIR_TABLE_BITS) | classes[1:])[item[1:] == item[:-1]]] = True
    return PairTable.of(table, PAIR_TABLE_BITS) if table.mean() <= PAIR_TABLE_DENSEST else None


def _spaced(group: Words) -> tuple[bytes, np.ndarray]:
    """The group's mapped bytes with each run of zeros (separators) made one zero, and where each byte is in them:
    the words p[s:e] (s a word's first byte, e a word's end) one zero apart are spaced[at[s]:at[e - 1] + 1]."""
    keep = group.data != 0
    keep[1:] |= group.data[:-1] != 0  # a run of zeros' first
    return group.data[keep].tobytes(), np.cumsum(keep) - 1


def gram_buckets(hashes: np.ndarray) -> tuple[int, np.ndarray]:
    """Where each bucket of the sorted hashes starts, a bucket the hashes of the same top bits (the shift that
    gives a hash's bucket; 2 buckets or more, about GRAMS_PER_BUCKET hashes each), and one more entry: their
    count (uint32 when that holds it)."""
    bits = max(1, int(np.log2(max(1, len(hashes)) / GRAMS_PER_BUCKET)) if len(hashes) > GRAMS_PER_BUCKET else 1)
    shift = 64 - bits
    starts = np.searchsorted(hashes, np.arange(1 << bits, dtype=np.uint64) << np.uint64(shift))
    return shift, np.append(starts, len(hashes)).astype(np.uint32 if len(hashes) < 1 << 32 else np.int64)


def bucket_search(values: np.ndarray, buckets: np.ndarray, shift: np.uint64, keys: np.ndarray) -> np.ndarray:
    """np.searchsorted(values, keys) for the sorted `values` and their gram_buckets: each key's binary search
    within its bucket (all keys a step at a time, as many steps as the largest bucket's bits). A 10M-gram set's
    searches read ~2 of its cache lines a key, not ~14: 166k keys (the 100k set over the bench corpus) 0.13 ->
    0.03 CPU-s."""
    if len(keys) < 64:
        return np.searchsorted(values, keys)
    slot = (keys >> shift).astype(np.int64)
    at = buckets[slot].astype(np.int64)
    size = buckets[slot + 1].astype(np.int64) - at
    last = len(values) - 1
    while len(size) and size.max() > 0:  # the first index of the bucket's values[at:at + size] >= the key
        half = size >> 1
        middle = at + half
        below = (values[np.minimum(middle, last)] < keys) & (size > 0)
        at = np.where(below, middle + 1, at)
        size = np.where(below, size - half - 1, half)
    return at


class BenchmarkSet:
    """The run's benchmark n-grams as a worker reads them: the arrays memory-mapped (shared by every process of
    the machine through the page cache), an item's words read only when one of its n-grams is a candidate."""

    def __init__(self, directory: str):
        record = read_json(Path(directory) / "set.json", sealed=True)
        if record is None:
            raise DamagedFile(Path(directory) / "set.json", "missing")
        files = set_files(Path(directory))
        self.n, self.min_matches = record["ngram"], record["min_matches"]
        self.fingerprint = record["fingerprint"]  # part of the token cache's key (tokmix.cache)
        self.shift = np.uint64(record["filter_shift"])
        self.word_shift = np.uint64(record["word_filter_shift"])
        # plain arrays over the mapped files: a memmap's slices cost a Python object each
        self.grams, self.items, self.filter, self.words, self.word_starts, self.word_filter, self.pairs = (
            np.asarray(np.load(files[kind], mmap_mode="r"))
            for kind in ("grams", "items", "filter", "words", "word_starts", "word_filter", "pairs"))
        self.pair_shift = np.uint64(record["pair_filter_shift"])
        triples = np.asarray(np.load(files["triples"], mmap_mode="r"))
        self.triples = triples if len(triples) else None  # a large set's triple filter
        self.triple_shift = np.uint64(record["triple_filter_shift"])
        self.buckets = np.asarray(np.load(files["buckets"], mmap_mode="r"))
        self.bucket_shift = np.uint64(record["bucket_shift"])
        # the word filter as the first pass takes it: tokmix._scan's loop then tests a wild run's words itself
        self.word_bits = WordFilter(self.word_filter, int(self.word_shift))
        self.pair_table = (pair_table(self.words, self.word_starts)  # (linked takes the triple filter over it)
                           if len(self.words) <= PAIR_TABLE_WORD_BYTES and self.triples is None else None)
        self.mixed_hashes = np.load(files["mixed"])  # sorted
        self.mixed = set(self.mixed_hashes.tolist())
        self.lengths = sorted({self.n, *record["short_lengths"]})  # every k-gram a document is hashed at
        self._items: dict[int, tuple[bytes, int]] = {}
        self._verified: dict[tuple[int, bytes], tuple[object, np.ndarray] | None] = {}
        self._first_pass: deque[tuple[int, int]] = deque(maxlen=FIRST_PASS_GROUPS)  # (characters read, kept)
        self._groups = 0
        self._pass_lock = threading.Lock()  # the set is shared by the stage process's worker threads

    def item_words(self, item: int) -> list[bytes]:
        """An item's words, as normalized (its mapped bytes: words separated by zeros)."""
        blob = bytes(self.words[int(self.word_starts[item]):int(self.word_starts[item + 1])])
        return [w for w in blob.split(b"\0") if w]

    def _item_bytes(self, item: int) -> tuple[bytes, int]:
        """An item's words as one byte string (each between zero bytes) and how many there are."""
        if item not in self._items:
            if len(self._items) >= ITEMS_KEPT:  # bounded: a corpus full of matches does not grow it
                self._items.clear()
            words = self.item_words(item)
            self._items[item] = (b"\0" + b"\0".join(words) + b"\0", len(words))
        return self._items[item]

    def _holding(self, hash_value: int, lo: int, hi: int, k: int, gram: bytes) -> tuple[object, object] | None:
        """The items whose k-grams (an item of k words: all of them) include `gram` (its words, each between
        zero bytes), among those with an n-gram of its hash (grams[lo:hi]), as Found.add takes them (a key that
        is the same for the same gram, and `hi`: items[lo:hi], or the items themselves): None when no item holds
        it. A hash stands for one sequence of words (the build compared them; "mixed" otherwise), so the first
        item tells for all of them: one comparison, however many items share it."""
        key = (k, gram)
        if key not in self._verified:
            if len(self._verified) >= GRAMS_KEPT:
                self._verified.clear()
            if hash_value in self.mixed:
                held = np.array([item for item in self.items[lo:hi].tolist() if self._holds(item, k, gram)], np.uint32)
                self._verified[key] = (key, held) if len(held) else None
            else:
                self._verified[key] = (lo, hi) if self._holds(int(self.items[lo]), k, gram) else None
        return self._verified[key]

    def _holds(self, item: int, k: int, gram: bytes) -> bool:
        words, count = self._item_bytes(item)
        return words == gram if count == k else (k == self.n and count > k and gram in words)

    def candidates(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Indices of the hashes that are in the set, and where each one's entries start and end in it."""
        none = np.empty(0, np.int64)
        if not len(hashes) or not len(self.grams):
            return none, none, none
        maybe = np.flatnonzero(in_filter(self.filter, self.shift, hashes))
        if not len(maybe):
            return maybe, none, none
        at = bucket_search(self.grams, self.buckets, self.bucket_shift, hashes[maybe])
        found = (at < len(self.grams)) & (self.grams[np.minimum(at, len(self.grams) - 1)] == hashes[maybe])
        maybe, lo = maybe[found], at[found]
        hi = lo + 1  # most hashes have one entry: the second search only for those with more
        more = self.grams[np.minimum(hi, len(self.grams) - 1)] == hashes[maybe]
        more &= hi < len(self.grams)
        if more.any():
            hi[more] = np.searchsorted(self.grams, hashes[maybe[more]], side="right")
        return maybe, lo, hi

    def linked(self, heads: np.ndarray, lengths: np.ndarray) -> Links:
        """Whether each word (its first 8 bytes lowercased and its length, ngrams.run_candidates) and the next may
        be two consecutive words of an item (True for all such, and for a few others), and whether each word and
        the next two may be three (None: unknown). A small set: its pair table. A large one: its triple filter,
        the pairs left to run_candidates (two words of a triple that may be) unless an item has two words."""
        if self.pair_table is not None:  # (a set with a triple filter has none)
            return table_links(heads, self.pair_table.table, PAIR_TABLE_BITS), None
        prefix = head_prefixes(heads, lengths)
        pairs = pair_hashes(prefix[:-1], prefix[1:])
        link = None if self.triples is not None and self.lengths[0] >= 3 else (
            in_filter(self.pairs, self.pair_shift, pairs))
        if self.triples is None:
            return link, None
        return link, in_filter(self.triples, self.triple_shift, pair_hashes(pairs[:-1], prefix[2:]))

    def first_pass_pairs(self):
        """What run_candidates takes as `pairs`: a small set's pair table itself (the compiled first pass looks it
        up in its loop), a large set's triple filter when its items all have 3 words or more (ngrams.TripleFilter:
        linked's links, looked up in the compiled loop too), else linked."""
        if self.pair_table is not None:
            return self.pair_table
        if self.triples is not None and self.lengths[0] >= 3:
            return TripleFilter(self.triples, int(self.triple_shift))
        return self.linked

    def member(self, hashes: np.ndarray) -> np.ndarray:
        """Whether each word hash may be an item's word (True for all of them, and for a few others)."""
        return in_filter(self.word_filter, self.word_shift, hashes)

    def _matches(self, group: Words, found: Found) -> None:
        """Add to `found` the n-grams each text of the group shares with an item, every candidate compared byte
        for byte with the item's words: a run of them at once where it can be (_runs), else one by one."""
        member = self.member(group.hashes)  # words of some item (or a few more)
        spaced = None
        for k in self.lengths:
            hashes, at = group.grams(k, member)
            cand, lo, hi = self.candidates(hashes)
            if not len(cand):
                continue
            starts, values = at[cand], hashes[cand]
            texts = group.text_of(starts)
            spaced = spaced or _spaced(group)
            if k == self.n and len(cand) >= RUN_MIN:
                left = self._runs(group, spaced, starts, texts, values, lo, hi, found)
                starts, texts, values, lo, hi = (part[left] for part in (starts, texts, values, lo, hi))
            data, place = spaced
            first, last = place[group.starts[starts]], place[group.ends[starts + k - 1] - 1] + 1
            for text, value, a, b, s, e in zip(texts.tolist(), values.tolist(), lo.tolist(), hi.tolist(),
                                               first.tolist(), last.tolist()):
                gram = b"\0" + data[s:e] + b"\0"  # one zero between words
                held = self._holding(value, a, b, k, gram)
                if held is not None:
                    found.add(text, *held)

    def _runs(self, group: Words, spaced: tuple[bytes, np.ndarray], starts: np.ndarray, texts: np.ndarray,
              values: np.ndarray, lo: np.ndarray, hi: np.ndarray, found: Found) -> np.ndarray:
        """The candidate n-grams (of ngram words, in word order: `starts`, their first words) checked a run at a
        time: a run of candidates at consecutive words of one text whose hashes' first item is the same, none of
        them "mixed", is that item's n-grams all when the run's whole word sequence is in that item's words (each
        n-gram in the run is then one of the item's, and its hash's items are all that hold it: _holding's
        verdict for each). A planted passage of 110 words gives ~100 such candidates: one comparison instead of
        a hundred. `spaced`: _spaced(group). Returns the candidates left to check one by one (the runs that are
        not an item's)."""
        n = self.n
        first = self.items[lo]
        new = np.ones(len(starts), bool)  # a run starts here
        new[1:] = (starts[1:] != starts[:-1] + 1) | (texts[1:] != texts[:-1]) | (first[1:] != first[:-1])
        if self.mixed:  # a mixed hash's candidate is checked alone
            alone = np.isin(values, self.mixed_hashes)
            new |= alone
            new[1:] |= alone[:-1]
        heads = np.flatnonzero(new)
        ends = np.append(heads[1:], len(starts))
        long = ends - heads >= RUN_MIN
        if not long.any():
            return np.arange(len(starts))
        left = np.ones(len(starts), bool)
        heads, ends = heads[long], ends[long]
        data, place = spaced  # the run's first word's first byte, its last word's end
        begin = place[group.starts[starts[heads]]].tolist()
        finish = (place[group.ends[starts[ends - 1] + n - 1] - 1] + 1).tolist()
        for a, b, s, e, item, text in zip(heads.tolist(), ends.tolist(), begin, finish, first[heads].tolist(),
                                          texts[heads].tolist()):
            words = b"\0" + data[s:e] + b"\0"
            if words in self._item_bytes(item)[0]:  # (more words than ngram: the item has more too)
                found.add_run(text, lo[a:b].tolist(), hi[a:b].tolist())
                left[a:b] = False
        return np.flatnonzero(left)

    def contaminating(self, texts: list) -> list[list[int]]:
        """For each text, the items it shares at least min_matches n-grams with (sorted; [] for most)."""
        found = Found(self.min_matches, self.items)
        group: list[int] = []
        chars = 0
        pieces: list[str] = []  # what the groups' first passes kept, checked together (GROUP_CHARS at a time)
        owners: list[int] = []

        def check(group: list[int]) -> None:
            nonlocal pieces, owners
            if not self._first_pass_pays():
                pieces += [texts[i] for i in group]
                owners += group
            else:
                size, kept = sum(len(texts[i]) for i in group), len(pieces)
                for at, spans in run_candidates([texts[i] for i in group], self.first_pass_pairs(), self.word_bits,
                                                self.lengths[0]):
                    spans = [texts[group[at]]] if spans is None else spans  # (None: the whole text)
                    pieces += spans
                    owners += [group[at]] * len(spans)
                with self._pass_lock:
                    self._first_pass.append((size, sum(map(len, pieces[kept:]))))
            if sum(map(len, pieces)) >= GROUP_CHARS:
                match()

        def match() -> None:
            nonlocal pieces, owners
            if pieces:  # a text's pieces: its n-grams are their n-grams (a key the same in each, counted once)
                self._matches(split_words(pieces), found.renumbered(owners))
            pieces, owners = [], []

        for i, text in enumerate(texts):
            if isinstance(text, HugeText):
                self._huge(text, found.renumbered([i]))
                continue
            group.append(i)
            chars += len(text)
            if chars >= GROUP_CHARS:
                check(group)
                group, chars = [], 0
        if group:
            check(group)
        match()
        return found.all_items(len(texts))

    def _first_pass_pays(self) -> bool:
        """Whether to run the cheap first pass on the next group: while it has let through at most half of the
        text of its last groups in this process, and on every FIRST_PASS_PROBE-th group (a set whose items
        share pairs of common words with the corpus lets nearly all through: then the pass only costs). Either
        way the verdicts are the same: the pass keeps every text that may hold an item's n-gram."""
        with self._pass_lock:  # another thread's append while this one sums the deque would raise
            self._groups += 1
            groups, last = self._groups, list(self._first_pass)
        read, kept = sum(r for r, _ in last), sum(k for _, k in last)
        return 2 * kept <= read or groups % FIRST_PASS_PROBE == 0

    def _huge(self, text: HugeText, found: Found) -> None:
        """A huge document piece by piece, each piece checked after the last words of the one before (so no
        n-gram across a cut is lost; the same n-gram counts once)."""
        keep = max(self.lengths) - 1
        tail = ""
        for piece in text.pieces():
            group = split_words([tail + " " + piece])
            self._matches(group, found)
            last = group.text_words(0)[-keep:] if keep else []
            tail = b" ".join(last).decode("utf-8", "replace")


class Found:
    """What texts share with items: per text, each distinct n-gram it shares (a key) and the items holding it:
    for a key that is an int `lo`, an int `hi` (the set's items[lo:hi], the items of a hash: `by_text`), else the
    items themselves (`held_by_text`); a text's items are those holding at least min_matches of its n-grams.
    `renumbered(texts)`: the same, for a group whose text t is texts[t]."""

    def __init__(self, min_matches: int, items: np.ndarray, base: Found | None = None,
                 texts: list[int] | None = None):
        self.min_matches = min_matches
        self.set_items = items
        self.by_text: dict[int, dict[int, int]] = base.by_text if base is not None else defaultdict(dict)
        self.held_by_text: dict[int, dict] = base.held_by_text if base is not None else defaultdict(dict)
        self.texts = texts

    def renumbered(self, texts: list[int]) -> Found:
        return Found(self.min_matches, self.set_items, self, texts)

    def add(self, text: int, key, held) -> None:
        text = self.texts[text] if self.texts is not None else text
        (self.by_text if type(key) is int else self.held_by_text)[text][key] = held

    def add_run(self, text: int, los: list[int], his: list[int]) -> None:
        """add(text, lo, hi) for each of the hashes items[lo:hi] of a run."""
        text = self.texts[text] if self.texts is not None else text
        self.by_text[text].update(zip(los, his))

    def all_items(self, count: int) -> list[list[int]]:
        """For each of the texts 0..count-1, the items holding at least min_matches of its n-grams (sorted): every
        text's (text, item) pairs at once, counted where min_matches is more than 1 (an item holds a gram once,
        so a pair's count is how many of the text's grams it holds)."""
        out: list[list[int]] = [[] for _ in range(count)]
        if not self.by_text and not self.held_by_text:
            return out
        texts = list(self.by_text)
        lo, hi = (np.fromiter(chain.from_iterable(getattr(self.by_text[t], part)() for t in texts), np.int64)
                  for part in ("keys", "values"))
        sizes = hi - lo
        owners = np.repeat(np.repeat(np.array(texts, np.int64), [len(self.by_text[t]) for t in texts]), sizes)
        at = np.arange(int(sizes.sum())) + np.repeat(lo - (np.cumsum(sizes) - sizes), sizes)
        parts = [(owners << 32) | self.set_items[at].astype(np.int64)]
        for text, grams in self.held_by_text.items():
            parts += [(np.int64(text) << 32) | np.asarray(held, np.int64) for held in grams.values()]
        pairs, counts = np.unique(np.concatenate(parts), return_counts=True)
        if self.min_matches != 1:
            pairs = pairs[counts >= self.min_matches]
        owners, items = (pairs >> 32).tolist(), (pairs & 0xFFFFFFFF).tolist()
        cuts = [0, *(np.flatnonzero(np.diff(pairs >> 32)) + 1).tolist(), len(items)]
        for a, b in zip(cuts, cuts[1:]):
            if a < b:
                out[owners[a]] = items[a:b]
        return out


def benchmark_set(directory: str) -> BenchmarkSet:
    """The process's BenchmarkSet of `directory`, loaded once while its record is unchanged."""
    stat = os.stat(Path(directory) / "set.json")
    return cached(("benchmark set", directory, stat.st_mtime_ns, stat.st_size), lambda: BenchmarkSet(directory))


# ---------------------------------------------------------------------------- what the streams dropped
# A stream record's contaminated documents ("places" of its benchmark_contamination) as arrays, each in base64:
# a document's file (in "files": [path, kind]), item count, place and tokens; then every document's items in
# order. ~28 bytes a document in memory where a dict each took ~1 KiB with contamination.json's (1M documents).
PLACES_FORMAT = 1
DOCUMENT_DTYPE = np.dtype([("file", "<u4"), ("items", "<u4"), ("place", "<i8"), ("tokens", "<i8")])
ITEM_DTYPE = np.dtype("<u4")
PLACES_AT_ONCE = 4096  # contamination.json's items written a chunk of this many places at a time


def item_firsts(record: dict) -> tuple[list[str], np.ndarray]:
    """The set's benchmarks and where each one's items start in the set's item numbers (one more: the end)."""
    names = list(record["benchmarks"])
    return names, np.cumsum([0] + [record["benchmarks"][name]["items"] for name in names])


def stream_contamination(records: list[dict], last_docs: int | None, record: dict) -> dict:
    """A stream's contaminated documents, from the records of the units it tokenized (in order; `last_docs`:
    the documents the last one gives the stream, None for all): each one's file, place (parquet row, JSONL
    line in the file, 0-based), tokens and items (as arrays: PLACES_FORMAT), and the sums per benchmark."""
    lines: dict[str, int] = {}
    files: dict[tuple[str, str], int] = {}
    documents, items = [], []
    for number, unit in enumerate(records):
        base = []
        for (path, kind, *_), n in zip(unit["pieces"], unit.get("lines") or [0] * len(unit["pieces"])):
            base.append(lines.get(path, 0) if kind == "jsonl" else 0)
            lines[path] = lines.get(path, 0) + n
        rows, held = [], []
        for at, piece, place, tokens, *its in unit.get("contaminated", []):
            if number == len(records) - 1 and last_docs is not None and at >= last_docs:
                continue  # past the stream's last document
            path, kind = unit["pieces"][piece][:2]
            rows.append((files.setdefault((path, kind), len(files)), len(its), place + base[piece], tokens))
            held += its
        documents.append(np.array(rows, DOCUMENT_DTYPE))
        items.append(np.array(held, ITEM_DTYPE))
    docs = np.concatenate(documents) if documents else np.empty(0, DOCUMENT_DTYPE)
    held = np.concatenate(items) if items else np.empty(0, ITEM_DTYPE)
    names, firsts = item_firsts(record)
    doc_of = np.repeat(np.arange(len(docs)), docs["items"])
    bench_of = np.searchsorted(firsts, held, side="right") - 1
    by_benchmark = {}
    for b, name in enumerate(names):
        mine = bench_of == b
        theirs = np.unique(doc_of[mine])
        by_benchmark[name] = {"documents": len(theirs), "tokens": int(docs["tokens"][theirs].sum()),
                              "items": len(np.unique(held[mine]))}
    places = {"format": PLACES_FORMAT, "files": [list(f) for f in files],
              "documents": base64.b64encode(docs.tobytes()).decode("ascii"),
              "items": base64.b64encode(held.tobytes()).decode("ascii")}
    return {"documents": len(docs), "tokens": int(docs["tokens"].sum()), "by_benchmark": by_benchmark,
            "places": places}


def stream_places(places: dict | list) -> tuple[list[list[str]], np.ndarray, np.ndarray]:
    """A stream record's places as (files, documents, items): stream_contamination's arrays (or the list of
    dicts, one a document, of a record written before them)."""
    if isinstance(places, dict):
        return (places["files"], np.frombuffer(base64.b64decode(places["documents"]), DOCUMENT_DTYPE),
                np.frombuffer(base64.b64decode(places["items"]), ITEM_DTYPE))
    files: dict[tuple[str, str], int] = {}
    docs = np.array([(files.setdefault((p["file"], p["kind"]), len(files)), len(p["items"]), p["place"], p["tokens"])
                     for p in places], DOCUMENT_DTYPE)
    return [list(f) for f in files], docs, np.array([i for p in places for i in p["items"]], ITEM_DTYPE)


def write_contamination(layout, record: dict, metas: dict[str, dict]) -> dict:
    """Write contamination.json (sealed) beside index.json: every contaminated item (benchmark, index, id) with
    the training places that matched it (stream, file, row or line), in benchmark and item order, each item's in
    stream and place order. Returns index.json's entry for it. Written PLACES_AT_ONCE places at a time, its seal
    and checksum computed on the way: write_record's bytes, without the whole record in memory (json.dumps of
    a dict a place took ~1 KiB a place)."""
    streams = list(metas)
    parts = [stream_places(meta["benchmark_contamination"]["places"]) for meta in metas.values()]
    item = np.concatenate([held for _, _, held in parts] + [np.empty(0, ITEM_DTYPE)])
    stream = np.concatenate([np.full(len(held), s, np.uint32) for s, (_, _, held) in enumerate(parts)]
                            + [np.empty(0, np.uint32)])
    doc = np.concatenate([np.repeat(np.arange(len(docs), dtype=np.int64), docs["items"])
                          for _, docs, _ in parts] + [np.empty(0, np.int64)])
    order = np.argsort(item, kind="stable")  # by item, each one's in stream and place order
    item, stream, doc = item[order], stream[order], doc[order]
    del order
    names, firsts = item_firsts(record)
    found = np.bincount(np.searchsorted(firsts, np.unique(item), side="right") - 1, minlength=len(names))
    head = {"normalization": record["normalization"], "ngram": record["ngram"],
            "min_matches": record["min_matches"], "action": record["action"],
            "set_fingerprint": record["fingerprint"], "items": ITEMS_MARK}
    before, after = json.dumps({**head, RECORD_SEAL: SEAL_MARK}, indent=2).split(json.dumps(ITEMS_MARK))
    middle, end = after.split(json.dumps(SEAL_MARK))
    sorted_before, sorted_after = json.dumps(head, sort_keys=True).split(json.dumps(ITEMS_MARK))
    seal, checksum = hashlib.sha256(), hashlib.sha256()
    pending = storage(layout.contamination).create(layout.contamination)

    def write(text: str) -> None:
        data = text.encode()
        checksum.update(data)
        pending.f.write(data)
        pending.written()

    try:
        write(before)
        seal.update(sorted_before.encode())
        for indented, compact in _items_json(record, names, firsts, streams, parts, item, stream, doc):
            write(indented)
            seal.update(compact.encode())
        seal.update(sorted_after.encode())
        write(middle + json.dumps(seal.hexdigest()) + end)
        pending.commit()
    except BaseException:
        pending.abort()
        raise
    return index_entry(record, metas, dict(zip(names, found.tolist())), checksum.hexdigest())


def _items_json(record: dict, names: list[str], firsts: np.ndarray, streams: list[str], parts: list,
               item: np.ndarray, stream: np.ndarray, doc: np.ndarray):
    """contamination.json's "items" list as json.dumps writes it in the record (indent=2) and in its seal
    (sort_keys), in pieces of PLACES_AT_ONCE places: (item, stream, document) of each place sorted by item, the
    places' file, place and tokens gathered from the streams' arrays a chunk at a time."""
    if not len(item):
        yield "[]", "[]"
        return
    new = np.concatenate([[True], item[1:] != item[:-1]])
    last = np.append(new[1:], True)
    quoted = [[(json.dumps(path), json.dumps(kind)) for path, kind in files] for files, _, _ in parts]
    streams_json = [json.dumps(s) for s in streams]
    names_json = [json.dumps(name) for name in names]
    for lo in range(0, len(item), PLACES_AT_ONCE):
        hi = min(len(item), lo + PLACES_AT_ONCE)
        rows_stream, rows_doc = stream[lo:hi], doc[lo:hi]
        file, place, tokens = (np.empty(hi - lo, np.int64) for _ in range(3))
        for s, (_, docs, _) in enumerate(parts):
            mine = rows_stream == s
            if mine.any():
                chosen = docs[rows_doc[mine]]
                file[mine], place[mine], tokens[mine] = chosen["file"], chosen["place"], chosen["tokens"]
        values = item[lo:hi]
        bench = (np.searchsorted(firsts, values, side="right") - 1).tolist()
        indented, compact = [], []
        for r, (i, b, s, f, p, t, first, end) in enumerate(zip(
                values.tolist(), bench, rows_stream.tolist(), file.tolist(), place.tolist(), tokens.tolist(),
                new[lo:hi].tolist(), last[lo:hi].tolist()), lo):
            path, kind = quoted[s][f]
            if first:
                name, ident = names_json[b], record["ids"][i]
                ident = json.dumps(ident) if isinstance(ident, (str, int)) else None
                if ident is None:  # (an id is a string or an integer: benchmarks.iter_items)
                    raise TypeError(f"item {i}'s id is a {type(record['ids'][i]).__name__}")
                index = i - int(firsts[b])
                indented.append((",\n    " if r else "[\n    ") + f'{{\n      "benchmark": {name},\n      "index": '
                                f'{index},\n      "id": {ident},\n      "places": [\n        ')
                compact.append((", " if r else "[") + f'{{"benchmark": {name}, "id": {ident}, "index": {index}, '
                               '"places": [')
            else:
                indented.append(",\n        ")
                compact.append(", ")
            indented.append(f'{{\n          "stream": {streams_json[s]},\n          "file": {path},\n          "kind": '
                            f'{kind},\n          "place": {p},\n          "tokens": {t}\n        }}')
            compact.append(f'{{"file": {path}, "kind": {kind}, "place": {p}, "stream": {streams_json[s]}, '
                           f'"tokens": {t}}}')
            if end:
                indented.append("\n      ]\n    }")
                compact.append("]}")
        if hi == len(item):
            indented.append("\n  ]")
            compact.append("]")
        yield "".join(indented), "".join(compact)


ITEMS_MARK, SEAL_MARK = "\0items\0", "\0seal\0"  # where the items and the seal go in the dump of the rest


def index_entry(record: dict, metas: dict[str, dict], found: dict[str, int], checksum: str) -> dict:
    """index.json's "benchmark_decontamination": the set, and per benchmark and stream what was found (`found`:
    the items found of each benchmark)."""
    benchmarks = {}
    for name, bench in record["benchmarks"].items():
        by_stream = {s: m["benchmark_contamination"]["by_benchmark"][name] for s, m in metas.items()}
        benchmarks[name] = {
            "files": bench["files"], "fields": bench["fields"], "items": bench["items"], "ngrams": bench["ngrams"],
            "short_items": bench["short_items"], "empty_items": bench["empty_items"],
            "items_found": found[name], "by_stream": by_stream,
        }
    return {"normalization": record["normalization"], "ngram": record["ngram"],
            "min_matches": record["min_matches"], "action": record["action"],
            "set_fingerprint": record["fingerprint"],
            "documents": sum(m["benchmark_contamination"]["documents"] for m in metas.values()),
            "tokens": sum(m["benchmark_contamination"]["tokens"] for m in metas.values()),
            "benchmarks": benchmarks, "file": CONTAMINATION_NAME, "sha256": checksum}
