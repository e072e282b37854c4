"""The exact check's runs (BenchmarkSet._runs): consecutive candidate n-grams of one text whose hashes' first item
is the same are verified at once, by their whole word sequence against that item's words, and one by one when
it is not there. Documents built to stress it, each checked against the oracle of tests/test_decontam.py (its
own words and n-grams), at several min_matches: a passage that two overlapping items hold, one that matches two
items end to end, a run broken by one changed word, a word changed to another of the same hash (a run of one
item's candidates that is not the item's), an item whose n-grams repeat (a run of its n-grams not in it), hashes
that items of different words share ("mixed"), a run that would cross two texts, and short items."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tests.test_decontam import NGRAM, oracle_words, set_recipe

rng = random.Random(2029)
VOCABULARY = [f"v{i}q" for i in range(500)]
NOISE = [f"n{i}z" for i in range(200)]  # no item's word


def words(count: int) -> list[str]:
    return [rng.choice(VOCABULARY) for _ in range(count)]


def noise(count: int, pick: random.Random = rng) -> str:
    return " ".join(pick.choice(NOISE) for _ in range(count))


X, Z = "q" * 8 + "x" + "q" * 8, "q" * 8 + "z" + "q" * 8  # one word hash (its first and last 8 bytes, its length)
Y = "q" * 8 + "y" + "q" * 8
P, Q, R, S, T = words(120), words(60), words(20), words(61), words(24)
S[30] = X
ITEMS = [
    " ".join(P[:70]),  # 0 and 1 overlap by 30 words
    " ".join(P[40:]),
    " ".join(Q),  # 2
    " ".join(R + R),  # 3: its n-grams repeat (period 20)
    " ".join(S),  # 4: a long word in its middle
    " ".join(T[:12] + [X] + T[12:]),  # 5 and 6: n-grams of different words, one hash ("mixed")
    " ".join(T[:12] + [Y] + T[12:]),
    " ".join(words(5)),  # 7: short
    " ".join(P[:70]),  # 8: item 0 again
]


def documents() -> list[str]:
    pick = random.Random(29)  # the same documents for each test
    changed = P[:60] + [NOISE[0]] + P[61:]
    docs = [
        f"{noise(20, pick)} {' '.join(P)} {noise(5, pick)}",  # items 0, 1 and 8, their overlap
        " ".join(P[:70] + Q[:30]),  # two items end to end
        " ".join(changed),  # a run broken by one word
        " ".join(S[:30] + [Z] + S[31:]),  # the same hashes, not the same words
        " ".join(S[:30] + [Z] + S[31:45]) + f" {noise(3, pick)} " + " ".join(S),  # then the item itself
        " ".join(R * 3),  # item 3's n-grams, a run longer than the item
        " ".join(R + R[:13]),
        f"{noise(2, pick)} " + " ".join(T[:12] + [X] + T[12:]) + f" {noise(2, pick)}",
        " ".join(T[:12] + [Y] + T[12:20]) + " " + " ".join(T[:12] + [X] + T[12:]),
        " ".join(T[:12] + [Z] + T[12:]),
        f"x {ITEMS[7].upper()} y",
        " ".join(P[:30] + P[:30]),  # the same n-grams twice
        " ".join(P[60:] + P[:60]),  # halves swapped
        " ".join(P[:70]) + " " + ITEMS[7] + " " + " ".join(Q[:14]),
        f"{noise(5, pick)} " + " ".join(P[:20]),  # this text ends where the next one's passage goes on
        " ".join(P[20:40]) + f" {noise(5, pick)}",
        " ".join(P[57:70]),  # one n-gram of the overlap
        " ".join(w.upper() for w in P[5:40]),
        noise(40, pick),
    ]
    for _ in range(40):  # random cuts of the passages, glued
        parts = []
        for _ in range(pick.randrange(1, 5)):
            source = pick.choice([P, Q, R + R, S, [pick.choice(VOCABULARY) for _ in range(30)]])
            at = pick.randrange(len(source))
            parts.append(" ".join(source[at:at + pick.randrange(5, 60)]))
        docs.append(f" {pick.choice(NOISE)} ".join(parts))
    return docs


def oracle(docs: list[str], min_matches: int) -> list[list[int]]:
    """Each document's items holding at least min_matches distinct n-grams of it (a short item: its whole)."""
    grams = []
    for item in ITEMS:
        w = oracle_words(item)
        k = min(NGRAM, len(w))
        grams.append({tuple(w[i:i + k]) for i in range(len(w) - k + 1)})
    lengths = {len(next(iter(g))) for g in grams}
    out = []
    for doc in docs:
        w = oracle_words(doc)
        mine = {tuple(w[i:i + k]) for k in lengths for i in range(len(w) - k + 1)}
        out.append([i for i, g in enumerate(grams) if len(g & mine) >= min_matches])
    return out


@pytest.mark.parametrize("min_matches", [1, 5, 21, 30, 40])
def test_runs_give_the_oracles_items(tmp_path, min_matches):
    from tokmix.stages.decontam import BenchmarkSet, build_set

    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ITEMS))
    docs = documents()
    expected = oracle(docs, min_matches)
    if min_matches == 1:
        assert expected[:4] == [[0, 1, 8], [0, 1, 2, 8], [0, 1, 8], [4]] and expected[5] == [3] and expected[9] == []
        assert expected[14] == expected[15] == [0, 8] and not expected[-41]
    for triples in (False, True):
        recipe = set_recipe(tmp_path, [path], ["text"], None, NGRAM, min_matches)
        build_set(recipe, tmp_path / f"set{triples}", [], triples=triples)
        bench = BenchmarkSet(str(tmp_path / f"set{triples}"))
        assert len(bench.mixed) == 13  # T's n-grams holding X or Y
        assert bench.lengths == [5, NGRAM]
        assert bench.contaminating(docs) == expected
        one = [bench.contaminating([doc])[0] for doc in docs]  # each alone in its group
        assert one == expected


def test_a_run_is_checked_at_once_and_a_miss_one_by_one(tmp_path):
    """What _runs leaves to the one-by-one check: nothing of a passage that is an item's, the whole run of one
    whose words another word of the same hash changed (then only its n-grams without that word are found)."""
    from tokmix.ngrams import split_words
    from tokmix.stages.decontam import BenchmarkSet, Found, _spaced, build_set

    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ITEMS))
    build_set(set_recipe(tmp_path, [path], ["text"], None), tmp_path / "set", [])
    bench = BenchmarkSet(str(tmp_path / "set"))
    for doc, left, found in ((" ".join(S), 0, 49), (" ".join(S[:30] + [Z] + S[31:]), 49, 36)):
        group = split_words([doc])
        hashes, at = group.grams(NGRAM, bench.member(group.hashes))
        cand, lo, hi = bench.candidates(hashes)
        starts = at[cand]
        assert len(cand) == 49
        kept = Found(1, bench.items)
        rest = bench._runs(group, _spaced(group), starts, group.text_of(starts), hashes[cand], lo, hi, kept)
        assert len(rest) == left
        bench._matches(group, kept := Found(1, bench.items))
        assert len(kept.by_text[0]) == found and kept.all_items(1) == [[4]]
    assert np.array_equal(bench.mixed_hashes, np.sort(bench.mixed_hashes))


@pytest.mark.parametrize("min_matches", [1, 12])
def test_one_word_ngrams_runs_stop_at_a_texts_end(tmp_path, min_matches):
    """ngram = 1: a text's last word and the next text's first are consecutive candidates (no n-gram spans
    them, so nothing else parts them): each text keeps its own n-grams."""
    from tokmix.stages.decontam import BenchmarkSet, build_set

    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ITEMS))
    build_set(set_recipe(tmp_path, [path], ["text"], None, 1, min_matches), tmp_path / "set", [])
    bench = BenchmarkSet(str(tmp_path / "set"))
    docs = [" ".join(P[:20]), " ".join(P[20:40]), f"{NOISE[1]} {X}", Z, " ".join(S[:15]), " ".join(S[15:40])]
    items = [set(oracle_words(item)) for item in ITEMS]
    expected = [[i for i, item in enumerate(items) if len(item & set(oracle_words(d))) >= min_matches]
                for d in docs]
    assert all(expected[:2]) and expected[3] == []
    assert bench.contaminating(docs) == expected


@pytest.mark.parametrize("count", [0, 1, 8, 9, 1000, 200_000])
def test_the_bucketed_search_is_numpys(count):
    """bucket_search over gram_buckets gives np.searchsorted's index for every key: keys that are values (one of
    many copies too, and values on buckets' bounds), keys between them, below the first and above the last, keys
    of empty buckets, and a bucket that holds a thousand copies of one hash (the search takes its bits' steps
    there)."""
    from tokmix.stages.decontam import bucket_search, gram_buckets

    pick = np.random.default_rng(count)
    values = pick.integers(0, 2**64, count, dtype=np.uint64, endpoint=False)
    if count >= 1000:
        values[: count // 4] = values[0]  # a quarter of them one hash
        values[count // 4: count // 2] >>= np.uint64(8)  # and a quarter in the lowest buckets
        values[-3:] = [0, 2**62, 2**63]  # on the bounds of buckets
    values = np.sort(values)
    shift, buckets = gram_buckets(values)
    assert buckets[0] == 0 and buckets[-1] == count and np.all(np.diff(buckets.astype(np.int64)) >= 0)
    assert len(buckets) - 1 == 1 << (64 - shift) and (count <= 8 or (count + 15) // 16 <= len(buckets) - 1 <= count)
    keys = np.concatenate([values[pick.integers(0, count, 5000)] if count else np.empty(0, np.uint64),
                           values[pick.integers(0, count, 5000)] + np.uint64(1) if count else np.empty(0, np.uint64),
                           pick.integers(0, 2**64, 5000, dtype=np.uint64, endpoint=False),
                           np.array([0, 1, 2**64 - 1, 2**63], np.uint64)])
    for part in (keys, keys[:10], keys[::-1]):  # (under 64 keys: np.searchsorted itself)
        assert np.array_equal(bucket_search(values, buckets, np.uint64(shift), part), np.searchsorted(values, part))
