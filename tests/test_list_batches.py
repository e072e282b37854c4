"""The streams stage batches a parquet unit's documents an Arrow batch at a time (streams.list_batches): the same
batches as sources.batches gives over the same documents one at a time, with huge documents alone, limited units'
size bounds and empty texts, and the same documents read from a real parquet file."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq

from tokmix.sources import Places, batches, plan_units, read_texts
from tokmix.sources.parquet import unit_text_lists
from tokmix.stages.streams import list_batches


def _random_lists(rng: random.Random) -> list[list[str]]:
    lists = []
    for _ in range(rng.randrange(0, 12)):
        lists.append([rng.choice(["", "a" * rng.randrange(1, 40), "é" * rng.randrange(1, 9000)])
                      for _ in range(rng.randrange(0, 700))])
    return lists


def test_same_batches_as_one_document_at_a_time():
    rng = random.Random(7)
    for case in range(100):
        lists = _random_lists(rng)
        huge = rng.choice([1 << 62, 30, 5000])
        # a limited unit's bound: a function of the characters yielded so far, asked at each batch's start
        step = rng.randrange(1, 50_000)

        def bound(read, step=step):
            return max(1, 200_000 - read) if read < 200_000 else step

        one = list(batches(iter([t for texts in lists for t in texts]), huge, bound))
        assert list(list_batches(iter(lists), huge, bound)) == one, case
        assert list(list_batches(iter(lists), huge)) == list(batches(iter([t for x in lists for t in x]), huge))


def test_a_parquet_unit_reads_the_same(tmp_path):
    rng = random.Random(3)
    texts = [rng.choice(["", "x" * rng.randrange(1, 3000), "日本語" * rng.randrange(1, 500)]) for _ in range(5000)]
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=700)
    unit = next(plan_units("s", [str(path)], [], 1 << 40))
    places_one, places_many = Places(checksums=True, kept=True), Places(checksums=True, kept=True)
    one = list(batches(read_texts(unit, "text", "s", [], 1 << 20, places=places_one), 1 << 20))
    many = list(list_batches(unit_text_lists(unit.pieces, "text", "s", [], 1 << 20, places_many), 1 << 20))
    assert many == one
    assert sum(map(len, many)) == sum(1 for t in texts if t)
    n = sum(map(len, many))
    assert (places_many.take_kept(n) == places_one.take_kept(n)).all()
