"""The cost of decontamination's check alone (BenchmarkSet.contaminating, issue 29), in one process: the first
--docs documents of each bench corpus stream's train_000 (bench/work/corpus, built by bench/corpus.py; 1,500:
5,600 documents, 53.0 MB) checked against HumanEval (tests/data/human_eval, prompt + canonical_solution) or the
100k-item set of bench/decontam.py (run it once first: it writes the items file).

    .venv/bin/python bench/decontam_check.py [--set humaneval|100k] [--docs 1500] [--passes 3] [--whole] [--pieces]
        [--word-filter]
    .venv/bin/python bench/decontam_check.py --build [--set 100k]

Prints the CPU seconds of the check (time.process_time, the least of --passes passes, each with a fresh
BenchmarkSet so that what it keeps between groups starts empty as in a run), the documents it finds and the
sha256 of its verdicts (to compare two versions of the code), and the load average. Compare two versions in
fresh processes, alternating. With --callgrind, under `valgrind --tool=callgrind --instr-atstart=no`, one pass is
instrumented alone (callgrind_control turns it on and off around the call): its instruction count does not
depend on the machine's load. With --build, only the set's build (build_set, in this fresh process): its CPU
seconds, the process's peak RSS (the build is all it did), the set's fingerprint and a digest of the sha256 of
all its arrays (to compare two versions of the build: the same arrays, byte for byte).

--whole: every document of every stream's train files (the streams stage reads ~70% of them), checked in
batches of 600 as the stage's tokenizer batches. --pieces: also the CPU seconds of each piece of the check
(each function's calls timed by the thread's CPU clock, inclusive of what it calls; the last pass), to see
where the check's time goes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from tokmix.recipe import recipe_from_dict
from tokmix.stages.decontam import BenchmarkSet, build_set

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "bench" / "work" / "corpus"
SETS = {"humaneval": (ROOT / "tests" / "data" / "human_eval" / "HumanEval.jsonl.gz", ["prompt", "canonical_solution"]),
        "100k": (ROOT / "bench" / "work" / "decontam" / "synthetic-words-100000.jsonl", ["question", "answer"])}


def documents(per_stream: int, whole: bool = False) -> list[str]:
    texts = []
    for stream in ("web", "edu", "code_py", "code_other"):
        paths = sorted((CORPUS / stream).glob("train_*.parquet")) if whole else [CORPUS / stream / "train_000.parquet"]
        for path in paths:
            column = pq.read_table(path, columns=["text"])["text"].to_pylist()
            texts += [t for t in (column if whole else column[:per_stream]) if t]
    return texts


BATCH = 600  # --whole: documents per call, as the streams stage's tokenizer batches


# the pieces of the check --pieces times: (module, attribute path) of functions, each wrapped in place
PIECES = [("tokmix.stages.decontam", "BenchmarkSet.contaminating"), ("tokmix.stages.decontam", "run_candidates"),
          ("tokmix.ngrams", "scan"), ("tokmix.ngrams", "_candidates_native"), ("tokmix.ngrams", "_chained"),
          ("tokmix.stages.decontam", "BenchmarkSet.linked"), ("tokmix.ngrams", "_wild_words"),
          ("tokmix.ngrams", "_chains"), ("tokmix.ngrams", "_pieces"), ("tokmix.stages.decontam", "split_words"),
          ("tokmix.ngrams", "normalized_bytes"), ("tokmix.stages.decontam", "BenchmarkSet._matches"),
          ("tokmix.stages.decontam", "BenchmarkSet.member"), ("tokmix.ngrams", "Words.grams"),
          ("tokmix.stages.decontam", "BenchmarkSet.candidates"), ("tokmix.stages.decontam", "BenchmarkSet._holding"),
          ("tokmix.ngrams", "add_normal_forms"), ("tokmix.stages.decontam", "bucket_search"),
          ("tokmix.stages.decontam", "in_filter"), ("tokmix.stages.decontam", "BenchmarkSet._runs"),
          ("tokmix.stages.decontam", "Found.all_items"), ("tokmix.stages.decontam", "Found.add_run")]


def timed_pieces() -> dict[str, list[float]]:
    """Wrap PIECES in place; returns what they add up: per piece, [calls, thread CPU seconds]."""
    import functools
    import importlib

    spent: dict[str, list[float]] = {}
    for module, path in PIECES:
        owner = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        fn = getattr(owner, name, None)
        if fn is None:
            continue

        def wrapped(*args, _fn=fn, _key=path, **kwargs):
            start = time.thread_time()
            try:
                return _fn(*args, **kwargs)
            finally:
                got = spent.setdefault(_key, [0, 0.0])
                got[0] += 1
                got[1] += time.thread_time() - start

        setattr(owner, name, functools.wraps(fn)(wrapped))
    return spent


def built_set(name: str, directory: Path) -> Path:
    path, fields = SETS[name]
    data = {"seed": 1, "tokenizer": {"path": "t.json"}, "layout": {"steps": 1, "seqs_per_step": 1},
            "holdout": {"tokens": 1, "eval_windows": 0},
            "streams": {"a": {"domain": "a", "share": 1.0, "files": ["x"]}},
            "decontaminate": {"benchmarks": {name: {"files": [str(path)], "fields": fields}}}}
    build_set(recipe_from_dict(data, directory), directory / "set", [])
    return directory / "set"


def build_only(name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.process_time()
        directory = built_set(name, Path(tmp))
        seconds = time.process_time() - start
        record = json.loads((directory / "set.json").read_text())
        arrays = hashlib.sha256(json.dumps({kind: hashlib.sha256((directory / f"{kind}.npy").read_bytes()).hexdigest()
                                            for kind in sorted(record["arrays"])}).encode()).hexdigest()[:16]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{name}: build {seconds:.2f} CPU-s, peak RSS {peak:.0f} MiB, fingerprint {record['fingerprint'][:16]}, "
          f"arrays {arrays}, load "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def callgrind(switch: str) -> None:
    subprocess.run(["callgrind_control", "-i", switch, str(os.getpid())], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", choices=sorted(SETS), default="humaneval")
    parser.add_argument("--docs", type=int, default=1500)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--build", action="store_true", help="time the set's build alone")
    parser.add_argument("--whole", action="store_true", help="every document of the train files, in batches")
    parser.add_argument("--pieces", action="store_true", help="the CPU seconds of each piece of the check")
    parser.add_argument("--word-filter", action="store_true",
                        help="the set's member test as an ngrams.WordFilter (a code whose BenchmarkSet does not)")
    args = parser.parse_args()
    if args.build:
        build_only(args.set)
        return
    texts = documents(args.docs, args.whole)
    batches = [texts[at:at + BATCH] for at in range(0, len(texts), BATCH)] if args.whole else [texts]
    with tempfile.TemporaryDirectory() as tmp:
        directory = built_set(args.set, Path(tmp))
        seconds = []
        spent = None
        for p in range(1 if args.callgrind else args.passes):
            if args.pieces and p == args.passes - 1:
                spent = timed_pieces()
            bench = BenchmarkSet(str(directory))
            if args.word_filter:
                from tokmix.ngrams import WordFilter

                bench.member = WordFilter(bench.word_filter, int(bench.word_shift))
            if args.callgrind:
                callgrind("on")
            start = time.process_time()
            found = [verdict for batch in batches for verdict in bench.contaminating(batch)]
            seconds.append(time.process_time() - start)
            if args.callgrind:
                callgrind("off")
    verdicts = hashlib.sha256(json.dumps(found).encode()).hexdigest()[:16]
    print(f"{args.set}: {len(texts):,} documents, {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB: check "
          f"{min(seconds):.3f} CPU-s (of {', '.join(f'{s:.3f}' for s in seconds)}), {sum(map(bool, found)):,} "
          f"contaminated, verdicts {verdicts}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for key, (calls, cpu) in (spent or {}).items():
        print(f"  {key:32s} {calls:8,} calls {cpu:7.3f} CPU-s")


if __name__ == "__main__":
    main()
