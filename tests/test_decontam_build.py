"""The build of a benchmark set (tokmix.stages.decontam.build_set) against plain code written here: its sorted
n-grams and items are each item's n-grams sorted by (hash, item); the sort of values that gives their order is
numpy's stable argsort, ties of the top bits and of whole hashes included; the words' numbers are equal exactly
when their bytes are, across groups, past the table's growth and when distinct words share a hash; the pair and
triple filters from their top 32 bits are the bit filter of those hashes."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.corpus import make_inputs
from tests.test_decontam import (
    HUMANEVAL,
    NGRAM,
    ROOT,
    oracle_contaminated,
    oracle_grams,
    oracle_words,
    set_recipe,
)
from tokmix.ngrams import gram_hashes, split_words
from tokmix.stages.decontam import (
    WORD_TABLE_BITS,
    WordNumbers,
    _stable_order,
    bit_filter,
    build_set,
    set_scattered_slots,
    top_filter,
)


def test_the_set_holds_each_items_ngrams_sorted_by_hash_then_item(tmp_path):
    """HumanEval with items added: one of fewer words than ngram, one empty, one twice, one holding an n-gram
    twice. grams.npy and items.npy are every distinct (hash, item) of the items' n-grams (a short item: the
    hash of all its words), in (hash, item) order, each computed here one item at a time."""
    rows = [json.loads(line) for line in gzip.decompress(HUMANEVAL.read_bytes()).splitlines()]
    texts = [r["prompt"] + "\n" + r["canonical_solution"] for r in rows]
    texts += ["a few short words", "", texts[3], " ".join(["again and again"] * 10), texts[3]]
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    build_set(set_recipe(tmp_path, [path], ["text"], None), tmp_path / "set", [])
    expected = set()
    for item, text in enumerate(texts):
        words = split_words([text])
        k = min(NGRAM, len(words.hashes))
        if k:
            expected |= {(h, item) for h in gram_hashes(words.hashes, k).tolist()}
    expected = sorted(expected)
    grams, items = (np.load(tmp_path / "set" / f"{kind}.npy") for kind in ("grams", "items"))
    assert grams.tolist() == [h for h, _ in expected]
    assert items.tolist() == [i for _, i in expected]


def test_the_sort_of_values_is_the_stable_argsort():
    """Hashes that share their top bits and differ below (the sort's index bits), equal hashes at distant
    places, an empty and a one-element array: the order and the sorted hashes of np.argsort(kind="stable")."""
    rng = np.random.default_rng(29)
    hashes = rng.integers(0, 2**64, 50_000, dtype=np.uint64, endpoint=False)
    hashes[::97] = hashes[5]  # equal hashes, far apart
    hashes[1000:1300] = (hashes[1000:1300] & ~np.uint64(0xFFFF)) | np.uint64(0xABCD0000)  # ties of the top bits
    hashes[2000:2100] = np.uint64(0x1234567800000000) + rng.integers(0, 1 << 16, 100, dtype=np.uint64)
    for values in (hashes, hashes[:1], hashes[:0], np.full(7, 3, np.uint64), hashes[2000:2100][::-1].copy()):
        order, ordered = _stable_order(values)
        expected = np.argsort(values, kind="stable")
        assert order.tolist() == expected.tolist()
        assert ordered.tolist() == values[expected].tolist()


def test_word_numbers_are_equal_exactly_when_the_bytes_are():
    """Groups of words (short, exactly 8 and 16 bytes, longer ones differing only inside, words with the same first
    8 bytes, or first and last) numbered by one
    WordNumbers, more distinct words than its first table has slots; then the same words with hashes
    that distinct words share (a function of the bytes, as a hash is: the word's length, or one value for all):
    each number stands for one byte string and each byte string for one number."""
    rng = random.Random(29)
    alphabet = "abcdefghij"
    vocabulary = ["".join(rng.choices(alphabet, k=rng.choice([1, 3, 8, 9, 15, 16, 17, 30]))) for _ in range(200_000)]
    vocabulary += ["q" * 8 + c + "q" * 8 for c in alphabet] * 1000  # 17 bytes, the same first and last 8
    vocabulary += ["abcdefgh" + c for c in alphabet] * 1000  # the same first 8 bytes, length
    vocabulary += ["abcdefgh" + c + "bcdefgh" for c in alphabet] * 1000  # 16 bytes, the same first 8
    vocabulary += ["a" * k for k in range(8, 17)] * 1000  # the same first and last 8 bytes
    vocabulary += ["yyyyyyyyabcdefgh", "xxxxxxxxabcdefgh"] * 1000  # the same last 8 bytes, length
    groups = [split_words([" ".join(rng.choices(vocabulary, k=200)) for _ in range(100)]) for _ in range(10)]
    by_length = [dataclasses.replace(g, hashes=(g.ends - g.starts).astype(np.uint64)) for g in groups]
    one = [dataclasses.replace(g, hashes=np.full(len(g.hashes), 7, np.uint64)) for g in groups]
    # the table's word of the one hash: one that only its length, last 8 bytes or first 8 tell from others
    led = [[dataclasses.replace(split_words([word]), hashes=np.full(1, 7, np.uint64)), *one]
           for word in ("a" * 9, "abcdefgha", "zzzzzzzzabcdefgh")]
    for batch in (groups, by_length, one, *led):
        numbering = WordNumbers()
        seen: dict[bytes, int] = {}
        owner: dict[int, bytes] = {}
        for group in batch:
            numbers = numbering.numbers(group).tolist()
            for w, number in enumerate(numbers):
                word = group.word(w)
                assert seen.setdefault(word, number) == number
                assert owner.setdefault(number, word) == word
        assert len(seen) > 1 << WORD_TABLE_BITS or batch is not groups  # more than its first slots
        assert numbering.bits > WORD_TABLE_BITS or batch is not groups  # the table grew


def test_the_top_bits_filter_is_the_bit_filter_of_those_hashes():
    rng = np.random.default_rng(3)
    for count in (0, 1, 5_000, 300_000):
        tops = rng.integers(0, 1 << 32, count, dtype=np.uint64).astype(np.uint32)
        parts = np.array_split(tops, 7) if count else []
        shift, filt = top_filter(parts)
        expected_shift, expected = bit_filter(tops.astype(np.uint64) << np.uint64(32))
        assert shift == expected_shift and filt.tobytes() == expected.tobytes()



def test_setting_a_filters_bits_is_what_bitwise_or_at_sets(tmp_path):
    """set_scattered_slots (a fancy-indexed |= per bit position: the pair and triple filters') against
    np.bitwise_or.at (set_slots): the same bytes for uint64 and uint32 slots, slots named many times, several
    slots of one byte, all eight bits of a byte, none, and a filter with bits set already; and the real HumanEval
    set's n-gram and word filters made again here from their own hashes."""
    def reference(filt: np.ndarray, slots: np.ndarray) -> None:
        kind = slots.dtype.type
        np.bitwise_or.at(filt, slots >> kind(3), np.left_shift(1, (slots & kind(7)).astype(np.uint8), dtype=np.uint8))

    rng = np.random.default_rng(29)
    for kind in (np.uint64, np.uint32):
        for slots in (rng.integers(0, 1 << 20, 300_000, dtype=np.uint64).astype(kind), np.arange(64, dtype=kind),
                      np.full(1000, 77, kind), np.empty(0, kind), np.array([7, 15, 8, 0, 7, 7], kind)):
            for start in (np.zeros(1 << 17, np.uint8), rng.integers(0, 256, 1 << 17, dtype=np.uint8)):
                got, want = start.copy(), start.copy()
                set_scattered_slots(got, slots)
                reference(want, slots)
                assert got.tobytes() == want.tobytes()
    from tokmix.stages.decontam import BenchmarkSet

    rows = [json.loads(line) for line in gzip.decompress(HUMANEVAL.read_bytes()).splitlines()]
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"text": r["prompt"] + "\n" + r["canonical_solution"]}) + "\n" for r in rows))
    build_set(set_recipe(path.parent, [path], ["text"], None), path.parent / "set", [])
    bench = BenchmarkSet(str(path.parent / "set"))
    want = np.zeros_like(bench.filter)
    reference(want, bench.grams >> bench.shift)
    assert bench.filter.tobytes() == want.tobytes()
    words = split_words([r["prompt"] + "\n" + r["canonical_solution"] for r in rows])
    want = np.zeros_like(bench.word_filter)
    reference(want, words.hashes >> bench.word_shift)
    assert bench.word_filter.tobytes() == want.tobytes()


# ---------------------------------------------------------------------------- a bad benchmark file, early
def run_cli(recipe: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": "4000"}
    env.pop("TOKMIX_CACHE", None)
    return subprocess.run([sys.executable, "-m", "tokmix", "run", str(recipe), "--out", str(out), "--workers", "2",
                           "--no-cache"], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A real corpus, split file, tokenizer and recipe (no [decontaminate] yet)."""
    root = tmp_path_factory.mktemp("bad-benchmarks")
    return make_inputs(root, doc_limit=200, rows_per_group=8)


def bad_gzip(path: Path) -> None:
    path.write_bytes(b"this is not gzip data\n")


def jsonl_lines(*lines: str):
    return lambda path: path.write_text("".join(line + "\n" for line in lines))


def parquet_of(**columns):
    return lambda path: pq.write_table(pa.table(columns), path)


GOOD = json.dumps({"prompt": "def add(a, b): return a + b"})
BAD_FILES = [  # (file name, how it is written (None: not at all), the line the run must end with, after the path)
    ("missing.jsonl", None, ": not found"),
    ("broken.jsonl.gz", bad_gzip, ": cannot decompress"),
    ("no-field.jsonl", jsonl_lines(GOOD, GOOD, json.dumps({"question": "x"})), ": line 3: no field 'prompt'"),
    ("number.jsonl", jsonl_lines(GOOD, json.dumps({"prompt": 7})), ": line 2: field 'prompt' is int, not text"),
    ("mixed-list.jsonl", jsonl_lines(json.dumps({"prompt": ["a b", 3]})),
     ": line 1: field 'prompt' is a list holding int (element 1), not a list of texts"),
    ("not-json.jsonl", jsonl_lines(GOOD, '{"prompt": "unclosed'), ": line 2: not JSON"),
    ("number.parquet", parquet_of(prompt=[1, 2]), ": row 0: field 'prompt' is int, not text"),
    # not a regular file: the set is then built in a process of its own (small_benchmarks), whose refusal must
    # reach the run as its one line (it was "internal error: BrokenProcessPool": NotAFile did not unpickle)
    ("folder.jsonl", lambda path: path.mkdir(), ": is a directory, not a regular file"),
    ("fifo.jsonl", os.mkfifo, ": is a FIFO, not a regular file"),
]


@pytest.mark.parametrize("name, write, said", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_bad_benchmark_file_ends_the_run_before_any_stage_writes(corpus, tmp_path, name, write, said):
    """Through the CLI: a benchmark file that cannot be read, or a row whose field is missing or not text, or a
    line that is not JSON, ends the run before the holdout stage, in one line naming the benchmark, the file
    and the row or line: a non-zero exit, no traceback, no shard or holdout file in the output folder."""
    bench = tmp_path / name
    if write is not None:
        write(bench)
    recipe = corpus.with_name(f"bad-{name}.toml")  # (the recipe's paths are its folder's)
    recipe.write_text(corpus.read_text() + '\n[decontaminate]\n[decontaminate.benchmarks.evalset]\n'
                      f'files = ["{bench}"]\nfields = ["prompt"]\n')
    out = tmp_path / "out"
    failed = run_cli(recipe, out)
    assert failed.returncode != 0
    lines = [line for line in failed.stderr.splitlines() if "benchmark evalset" in line]
    assert len(lines) == 1 and str(bench) in lines[0] and said in lines[0], failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    written = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert not [p for p in written if p.suffix in (".bin", ".idx", ".npy", ".part") or "holdout" in p.name
                or "unit" in p.name or p.name == "benchmarks.json"], written  # (benchmarks.json: the files pinned)


# ---------------------------------------------------------------------------- fields that are lists of texts
def oracle_items(rows: list[dict], fields: list[str], n: int) -> list[set]:
    """docs/recipe.md's rule, written again: an item's segments are each run of its text fields (joined by
    newlines) and each element of a list field; its n-grams are those inside one segment; an item of one segment
    shorter than n words is its whole word sequence."""
    items = []
    for row in rows:
        segments, run = [], []
        for field in fields:
            value = row.get(field)
            if isinstance(value, list):
                segments += ["\n".join(run)] if run else []
                segments += [e for e in value if e is not None]
                run = []
            elif value is not None:
                run.append(value)
        segments += ["\n".join(run)] if run else []
        words = [oracle_words(s) for s in segments]
        if len(words) == 1:
            items.append(oracle_grams(words[0], n))
        else:
            items.append({g for w in words if len(w) >= n for g in oracle_grams(w, n)})
    return items


def list_rows(rng: random.Random, vocabulary: list[str], count: int) -> list[dict]:
    def text(low: int, high: int) -> str:
        return " ".join(rng.choice(vocabulary) for _ in range(rng.randint(low, high)))

    rows = [{"id": f"q{i}", "question": text(5, 30), "choices": [text(1, 25) for _ in range(4)]}
            for i in range(count)]
    rows[0]["choices"][1] = None  # skipped
    rows[1]["choices"] = []  # the question alone, one segment
    rows[2]["question"] = None  # the choices alone
    return rows


def test_list_fields_give_each_element_as_a_segment_of_its_own(tmp_path):
    """A parquet list<string> column and a JSONL array field (MMLU-like questions and choices, of HumanEval's
    words): the documents the set takes are the oracle's, on documents planted with n-grams inside a question,
    inside a choice, across the question and a choice, across two choices, and a short item whole; the n-grams
    across segments are kept (the oracle joining the segments would drop them); the set's fingerprint is not the
    one of the same texts joined into one string."""
    from tokmix.stages.decontam import BenchmarkSet

    rng = random.Random(29)
    rows = [json.loads(line) for line in gzip.decompress(HUMANEVAL.read_bytes()).splitlines()]
    vocabulary = sorted({w for r in rows for w in oracle_words(r["prompt"])})
    parquet_rows, jsonl_rows = list_rows(rng, vocabulary, 40), list_rows(rng, vocabulary, 40)
    pq.write_table(pa.table({"id": [r["id"] for r in parquet_rows],
                             "question": pa.array([r["question"] for r in parquet_rows], pa.string()),
                             "choices": pa.array([r["choices"] for r in parquet_rows], pa.list_(pa.string()))}),
                   tmp_path / "mmlu.parquet")
    (tmp_path / "mmlu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in jsonl_rows))
    fields = ["question", "choices"]
    recipe = set_recipe(tmp_path, [tmp_path / "mmlu.parquet", tmp_path / "mmlu.jsonl"], fields, "id")
    record = build_set(recipe, tmp_path / "set", [])
    bench = BenchmarkSet(str(tmp_path / "set"))
    all_rows = parquet_rows + jsonl_rows
    items = oracle_items(all_rows, fields, NGRAM)
    joined = oracle_items([{"q": "\n".join([r["question"] or "", *[c for c in r["choices"] if c]])}
                           for r in all_rows], ["q"], NGRAM)
    noise = lambda k: " ".join(rng.choice(["zebra", "quartz", "violin", "ember"]) for _ in range(k))  # noqa: E731
    docs, crossing = [], []
    for row in all_rows:
        segments = [s for s in [row["question"], *row["choices"]] if s]
        words = [s.split() for s in segments]
        for a, b in zip(words, words[1:]):  # across two segments: 6 words of one, 7 of the next
            if len(a) >= 6 and len(b) >= 7:
                crossing.append(len(docs))
                docs.append(f"{noise(20)} {' '.join(a[-6:] + b[:7])}. {noise(20)}")
        for w in words:  # inside one segment
            if len(w) >= NGRAM:
                at = rng.randrange(len(w) - NGRAM + 1)
                docs.append(f"{noise(30)} {' '.join(w[at:at + NGRAM]).upper()}, {noise(5)}")
        docs.append(f"{noise(10)} {' '.join(words[0])} {noise(10)}")  # a short question whole
    docs += [noise(200) for _ in range(20)]
    expected = [oracle_contaminated(d, items, {NGRAM, *record["short_lengths"]}) for d in docs]
    assert bench.contaminating(docs) == expected
    assert sum(map(bool, expected)) > 40 and sum(not e for e in expected) > 40
    assert len(crossing) > 40 and not any(expected[d] for d in crossing)
    assert all(oracle_contaminated(docs[d], joined, {NGRAM}) for d in crossing)  # (joined, they would drop)
    assert record["benchmarks"]["bench"]["items"] == 80 and bench.item_words(2)  # the choices alone
    (tmp_path / "joined.jsonl").write_text("".join(json.dumps({"id": r["id"], "q": "\n".join(
        [r["question"] or "", *[c for c in r["choices"] if c]])}) + "\n" for r in jsonl_rows))
    as_lists = build_set(set_recipe(tmp_path, [tmp_path / "mmlu.jsonl"], fields, "id"), tmp_path / "lists", [])
    as_text = build_set(set_recipe(tmp_path, [tmp_path / "joined.jsonl"], ["q"], "id"), tmp_path / "text", [])
    assert as_lists["fingerprint"] != as_text["fingerprint"]
