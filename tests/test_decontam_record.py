"""What the streams' contaminated documents become (tokmix.stages.decontam: stream_contamination's arrays, and
contamination.json written a chunk at a time with its seal): the same bytes and index.json entry as the plain
construction written here (a dict a place, the whole record dumped by write_record), on unit records made to
cover it: several streams and benchmarks, JSONL line bases, documents of several items, items in several
streams, a last unit cut by the budget, non-ASCII paths and ids, integer ids, a benchmark found nowhere, more
places than one chunk, no place at all, and a stream record written before the arrays (a list of dicts)."""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict

import pytest

from tokmix.shards import Layout, read_json, write_record
from tokmix.stages.decontam import PLACES_AT_ONCE, stream_contamination, write_contamination


def set_record(counts: dict[str, int]) -> dict:
    ids = []
    for name, count in counts.items():
        ids += [f"{name}/{i}" if i % 3 else i * 10**20 if i % 2 else f"é{i}\u2028" for i in range(count)]
    benchmarks, first = {}, 0
    for name, count in counts.items():
        benchmarks[name] = {"files": {f"/b/{name}.jsonl": "0" * 64}, "fields": ["text"], "id_field": None,
                            "items": count, "first_item": first, "ngrams": 7 * count, "short_items": 1,
                            "empty_items": 0}
        first += count
    return {"normalization": "tokmix-words-v1", "ngram": 13, "min_matches": 1, "action": "drop",
            "fingerprint": "f" * 64, "benchmarks": benchmarks, "ids": ids}


def unit_records(rng: random.Random, units: int, per_unit: int, items: int) -> list[dict]:
    records = []
    for u in range(units):
        pieces = [[f"/data/ström/{u // 3}.jsonl", "jsonl"], [f"/data/{u}.parquet", "parquet"]]
        contaminated, at = [], 0
        for _ in range(rng.randrange(per_unit + 1)):
            at += rng.randrange(1, 4)
            held = sorted(rng.sample(range(items), rng.choice((1, 1, 1, 2, 3))))
            contaminated.append([at, rng.randrange(2), rng.randrange(10**6), rng.randrange(1, 10**5), *held])
        records.append({"pieces": pieces, "lines": [rng.randrange(1, 500), 0], "contaminated": contaminated})
    return records


def plain_stream(records: list[dict], last_docs: int | None, record: dict) -> dict:
    """The stream's places as a list of dicts and its sums, written plainly."""
    owner = [(name, i) for name, bench in record["benchmarks"].items() for i in range(bench["items"])]
    lines: dict[str, int] = {}
    places = []
    for number, unit in enumerate(records):
        base = []
        for (path, kind), n in zip(unit["pieces"], unit["lines"]):
            base.append(lines.get(path, 0) if kind == "jsonl" else 0)
            lines[path] = lines.get(path, 0) + n
        for at, piece, place, tokens, *items in unit["contaminated"]:
            if number == len(records) - 1 and last_docs is not None and at >= last_docs:
                continue
            path, kind = unit["pieces"][piece]
            places.append({"file": path, "kind": kind, "place": place + base[piece], "tokens": tokens,
                           "items": items})
    by_benchmark = {}
    for name in record["benchmarks"]:
        mine = [p for p in places if any(owner[i][0] == name for i in p["items"])]
        by_benchmark[name] = {"documents": len(mine), "tokens": sum(p["tokens"] for p in mine),
                              "items": len({i for p in mine for i in p["items"] if owner[i][0] == name})}
    return {"documents": len(places), "tokens": sum(p["tokens"] for p in places), "by_benchmark": by_benchmark,
            "places": places}


def plain_record(record: dict, metas: dict[str, dict]) -> dict:
    owner = [(name, i) for name, bench in record["benchmarks"].items() for i in range(bench["items"])]
    found = defaultdict(list)
    for stream, meta in metas.items():
        for place in meta["places"]:
            for item in place["items"]:
                found[item].append({"stream": stream, "file": place["file"], "kind": place["kind"],
                                    "place": place["place"], "tokens": place["tokens"]})
    return {"normalization": record["normalization"], "ngram": record["ngram"],
            "min_matches": record["min_matches"], "action": record["action"],
            "set_fingerprint": record["fingerprint"],
            "items": [{"benchmark": owner[i][0], "index": owner[i][1], "id": record["ids"][i], "places": found[i]}
                      for i in sorted(found)]}


@pytest.mark.parametrize("case", ["several", "one chunk and more", "nothing", "old records"])
def test_the_record_is_the_plain_constructions_bytes(tmp_path, case):
    rng = random.Random(case)
    counts = {"humaneval": 40, "mmlu": 300, "none found": 5}
    record = set_record(counts)
    found_in = sum(counts.values()) - 5
    shapes = {"several": {"web": (7, 30, None), "code": (4, 12, 3), "edu": (1, 0, None)},
              "one chunk and more": {"web": (60, 2 * PLACES_AT_ONCE // 60, None), "code": (2, 5, 2)},
              "nothing": {"web": (3, 0, None)},
              "old records": {"web": (5, 20, 4), "code": (3, 9, None)}}[case]
    units = {s: unit_records(rng, u, per, found_in) for s, (u, per, _) in shapes.items()}
    plain = {s: plain_stream(units[s], shapes[s][2], record) for s in units}
    metas = {}
    for s in units:
        mine = stream_contamination(units[s], shapes[s][2], record)
        assert {k: v for k, v in mine.items() if k != "places"} == {k: v for k, v in plain[s].items() if k != "places"}
        if case == "old records":
            mine = plain[s]  # a stream record written before the arrays
        metas[s] = {"benchmark_contamination": json.loads(json.dumps(mine))}  # as read back from its file
    expected = plain_record(record, plain)
    write_record(tmp_path / "plain.json", expected)
    layout = Layout(tmp_path / "out")
    layout.root.mkdir()
    entry = write_contamination(layout, record, metas)
    got = layout.contamination.read_bytes()
    assert got == (tmp_path / "plain.json").read_bytes()
    assert read_json(layout.contamination, sealed=True) == expected
    assert entry["sha256"] == hashlib.sha256(got).hexdigest()
    for name, bench in entry["benchmarks"].items():
        assert bench["items_found"] == sum(1 for item in expected["items"] if item["benchmark"] == name)
    places = sum(len(item["places"]) for item in expected["items"])
    assert (places > PLACES_AT_ONCE) == (case == "one chunk and more") and (places == 0) == (case == "nothing")
    assert entry["benchmarks"]["none found"]["items_found"] == 0
