"""The contamination record at scale (issue 29, bounded memory): what the streams' contaminated documents cost
once the units are tokenized, for --documents of them (default 1M) over --streams streams. In a fresh process
per code (this one, and --before DIR's tokmix package, alternating, --repeat times): unit records made as the
streams stage writes them (2,000 contaminated documents a unit, 1-3 items each of a 100k-item set), then what
a run does with them: stream_contamination of each stream, its record written (sealed JSON) and read back, and
write_contamination (contamination.json and index.json's entry). Prints the peak RSS that adds over the unit
records already in memory (VmHWM reset through /proc/self/clear_refs), the seconds of each step, and the
sha256 of contamination.json (the same for two codes that write the same bytes), with the load average.

    .venv/bin/python bench/contamination_record.py [--documents 1000000] [--streams 4] [--before DIR] [--repeat 1]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ITEMS = 100_000
PER_UNIT = 2000


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def set_record() -> dict:
    return {"normalization": "tokmix-words-v1", "ngram": 13, "min_matches": 1, "action": "drop",
            "fingerprint": "f" * 64, "ids": [f"synthetic/{i}" for i in range(ITEMS)],
            "benchmarks": {"synthetic": {"files": {"/bench/items.jsonl": "0" * 64}, "fields": ["question", "answer"],
                                         "id_field": "id", "items": ITEMS, "first_item": 0, "ngrams": 9_879_890,
                                         "short_items": 0, "empty_items": 0}}}


def unit_records(stream: str, documents: int, rng: random.Random) -> list[dict]:
    records = []
    for u in range(0, documents, PER_UNIT):
        path = f"/data/corpus/{stream}/train_{u // (PER_UNIT * 8):03d}.parquet"
        contaminated = []
        for k in range(min(PER_UNIT, documents - u)):
            held = sorted(rng.sample(range(ITEMS), rng.choice((1, 1, 1, 2, 3))))
            contaminated.append([3 * k, 0, rng.randrange(10**6), rng.randrange(100, 10**5), *held])
        records.append({"pieces": [[path, "parquet", 0, 1]], "lines": [0], "contaminated": contaminated})
    return records


def measure(documents: int, streams: int) -> dict:
    """In this process (the code on sys.path): the steps after the units, their peak RSS over the records'."""
    from tokmix.shards import Layout, read_json, write_record
    from tokmix.stages.decontam import stream_contamination, write_contamination

    rng = random.Random(29)
    names = ["web", "edu", "code_py", "code_other"][:streams] + [f"s{i}" for i in range(4, streams)]
    record = set_record()
    units = {name: unit_records(name, documents // streams, rng) for name in names}
    base = rss("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here
    times = {}
    with tempfile.TemporaryDirectory(dir=ROOT / "bench" / "work") as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        for name in names:
            meta = {"name": name, "benchmark_contamination": stream_contamination(units[name], None, record)}
            write_record(out / f"{name}.json", meta)
            del meta
        times["stream_contamination + its record"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        metas = {name: read_json(out / f"{name}.json", sealed=True) for name in names}
        times["records read back"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        layout = Layout(out)
        write_contamination(layout, record, metas)
        times["write_contamination"] = time.perf_counter() - t0
        peak = rss("VmHWM")
        digest = hashlib.sha256()
        with open(layout.contamination, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        digest = digest.hexdigest()
        size = layout.contamination.stat().st_size
        meta_bytes = sum((out / f"{name}.json").stat().st_size for name in names)
    return {"records_rss_mib": base / 2**20, "added_peak_mib": (peak - base) / 2**20, "seconds": times,
            "contamination_sha256": digest[:16], "contamination_mib": size / 2**20, "meta_mib": meta_bytes / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--before", type=Path, help="a folder holding another tokmix package, run alternating")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the fresh process's side
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.documents, args.streams)))
        return
    codes = {"this code": None, **({"--before": args.before.resolve()} if args.before else {})}
    for r in range(args.repeat):
        for tag, code in codes.items() if r % 2 == 0 else reversed(list(codes.items())):
            env = dict(os.environ)
            if code is not None:
                env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [env.get("PYTHONPATH")])])
            was = load()
            done = subprocess.run([sys.executable, __file__, "--measure", "--documents", str(args.documents),
                                   "--streams", str(args.streams)], capture_output=True, text=True, env=env)
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            got = json.loads(done.stdout.splitlines()[-1])
            steps = ", ".join(f"{k} {v:.2f} s" for k, v in got["seconds"].items())
            print(f"{tag:10s} {args.documents:,} documents: peak RSS +{got['added_peak_mib']:.0f} MiB over the unit "
                  f"records' {got['records_rss_mib']:.0f} MiB; {steps}; stream records {got['meta_mib']:.1f} MiB, "
                  f"contamination.json {got['contamination_mib']:.1f} MiB sha256 {got['contamination_sha256']}; "
                  f"load {was} -> {load()}", flush=True)


if __name__ == "__main__":
    main()
