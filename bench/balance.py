"""How even the mix is step by step: the bench corpus's recipe (bench/work/corpus/bench.toml) run with the
reference's global interleave and with the balanced one, and a 3-phase schedule over the same corpus. For each
run, from the shards' provenance index (each document's stream and tokens, in train order): every stream's worst
deviation from its share over any 1M-token window (starting at every document start, in percentage points),
the worst over the run's fixed 5M-token pieces, and its worst cumulative drift from share x position (tokens);
for the schedule, each phase's requested and realized shares.

    .venv/bin/python bench/balance.py [--corpus bench/work/corpus] [--window 1e6]

Tokenizer: GPT-2's ranks (tests/data/vocab). Outputs go to bench/work/balance/ (deleted by --clean after the
figures are printed)."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tokmix  # noqa: E402
from tokmix.report import documents_in_order  # noqa: E402
from tokmix.shards import read_index  # noqa: E402

# measured without the token cache (a second run would take its units from it): bench/cache.py measures it
os.environ.setdefault("TOKMIX_CACHE", "off")

WORK = HERE / "work" / "balance"
SCHEDULE = """
[[schedule]]
name = "main"
steps = {main}
shares = {{ web = 0.45, edu = 0.35, code_py = 0.07, code_other = 0.13 }}

[[schedule]]
name = "anneal"
steps = {anneal}
ramp_steps = {ramp}
shares = {{ web = 0.30, edu = 0.45, code_py = 0.10, code_other = 0.15 }}

[[schedule]]
name = "final"
steps = {final}
shares = {{ web = 0.50, edu = 0.35, code_py = 0.05, code_other = 0.10 }}
"""


def documents(out: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Every document of the run in train order: its stream (position in the recipe) and its tokens in the run."""
    index = read_index(out)
    return index.stream_names, *documents_in_order(out, index)


def window_deviation(names: list[str], labels: np.ndarray, tokens: np.ndarray, shares: np.ndarray,
                     window: int, quantile: float | None = None, short: bool = False) -> dict[str, float]:
    """Every stream's worst |tokens in the window / window - share| (percentage points; or its `quantile`) over
    the windows of `window` tokens starting at each document start (a document cut by the window counted by its
    tokens in it); `short`: only the windows that no document of a tenth of the window or more touches."""
    ends = np.cumsum(tokens)
    starts = ends - tokens
    n = len(names)
    cum = np.zeros((len(labels) + 1, n), dtype=np.int64)
    np.add.at(cum[1:], (np.arange(len(labels)), labels), tokens)
    cum = np.cumsum(cum, axis=0)
    points = np.concatenate([[0], ends])

    def at(x: np.ndarray) -> np.ndarray:  # every stream's tokens before token position x
        d = np.minimum(np.searchsorted(ends, x, side="right"), len(labels) - 1)
        out = cum[d].astype(np.float64)
        inside = x - points[d]
        out[np.arange(len(x)), labels[d]] += np.minimum(inside, tokens[d])
        return out

    lo = starts[starts + window <= ends[-1]]
    if short:  # no long document overlaps [lo, lo + window)
        long = np.flatnonzero(tokens >= window / 10)
        first = np.searchsorted(ends, lo, side="right")
        last = np.searchsorted(ends, lo + window - 1, side="right")
        lo = lo[np.searchsorted(long, first, side="left") == np.searchsorted(long, last, side="right")]
    share = (at(lo + window) - at(lo)) / window
    off = np.abs(share - shares[None, :]) * 100
    pick = (lambda x: np.quantile(x, quantile)) if quantile is not None else np.max
    return {name: round(float(pick(off[:, s])), 2) if len(lo) else None for s, name in enumerate(names)}


def drift(names: list[str], labels: np.ndarray, tokens: np.ndarray, targets) -> dict[str, int]:
    """Every stream's worst |tokens_s(P) - target_s(P)| at a document boundary, in tokens."""
    ends = np.cumsum(tokens)
    per = np.zeros((len(labels), len(names)), dtype=np.int64)
    per[np.arange(len(labels)), labels] = tokens
    dev = np.cumsum(per, axis=0) - targets(ends)
    return {name: int(np.abs(dev[:, s]).max()) for s, name in enumerate(names)}


def run(recipe: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    tokmix.run(tokmix.load_recipe(recipe), out)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=HERE / "work" / "corpus")
    ap.add_argument("--window", type=float, default=1e6)
    ap.add_argument("--clean", action="store_true", help="delete the runs afterwards")
    args = ap.parse_args()
    base = (args.corpus / "bench.toml").read_text()
    WORK.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus.resolve()
    for folder in [p for p in corpus.iterdir() if p.is_dir()]:  # the recipe's relative paths, read in place
        link = WORK / folder.name
        if not link.exists():
            link.symlink_to(folder)
    shutil.copy(corpus / "file_splits.json", WORK / "file_splits.json")
    vocab = HERE.parent / "tests" / "data" / "vocab" / "gpt2.tiktoken.gz"
    (WORK / "gpt2.tiktoken").write_bytes(gzip.decompress(vocab.read_bytes()))
    steps = int(re.search(r"^steps = (\d+)", base, re.M).group(1))
    main_steps, anneal = int(steps * 0.78), int(steps * 0.17)
    schedule = SCHEDULE.format(main=main_steps, anneal=anneal, ramp=anneal // 2, final=steps - main_steps - anneal)
    texts = {
        "global": base,
        "balanced": base.replace("[layout]\n", '[layout]\ninterleave = "balanced"\n'),
        "schedule": re.sub(r"^share = .*\n", "", base.replace("[layout]\n", '[layout]\ninterleave = "balanced"\n'),
                           flags=re.M) + schedule,
    }
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
          f"window {args.window:,.0f} tokens", flush=True)
    results = {}
    for kind, text in texts.items():
        # GPT-2's ranks (tests/data/vocab, from a PyPI package): real ids without training a tokenizer per run
        text = re.sub(r"\[tokenizer.train\]\nvocab_size = \d+", '[tokenizer]\ntiktoken = "gpt2.tiktoken"', text)
        recipe = WORK / f"{kind}.toml"
        recipe.write_text(text)
        seconds = run(recipe, WORK / kind)
        index = json.loads((WORK / kind / "index.json").read_text())
        names, labels, tokens = documents(WORK / kind)
        shares = np.array([index["mix"]["target_share_by_stream"][n] for n in names])
        entry = {"seconds": round(seconds, 1), "tokens": int(tokens.sum()), "documents": len(labels),
                 "longest_document": int(tokens.max())}
        if kind != "schedule":
            entry["window_pp"] = window_deviation(names, labels, tokens, shares, int(args.window))
            entry["window_median_pp"] = window_deviation(names, labels, tokens, shares, int(args.window), 0.5)
            entry["window_p99_pp"] = window_deviation(names, labels, tokens, shares, int(args.window), 0.99)
            entry["window_without_long_documents_pp"] = window_deviation(names, labels, tokens, shares,
                                                                         int(args.window), short=True)
            entry["shard_5m_pp"] = window_deviation(names, labels, tokens, shares, 5_000_000)
            entry["drift_tokens"] = drift(names, labels, tokens, lambda p, w=shares: p[:, None] * w)
        if "balance" in index["mix"]:
            entry["balance"] = index["mix"]["balance"]
        if kind == "schedule":
            entry["phases"] = [{"name": p["name"], "steps": p["steps"], "ramp_steps": p["ramp_steps"],
                                "requested": p["requested_share_by_stream"],
                                "target": {n: round(p["target_tokens_by_stream"][n] / (p["tokens"][1] - p["tokens"][0]),
                                                    5) for n in names},
                                "realized": {n: round(v, 5) for n, v in p["share_by_stream"].items()},
                                "off_tokens": {n: round(p["tokens_by_stream"][n] - p["target_tokens_by_stream"][n])
                                               for n in names}}
                               for p in index["phases"]]
        results[kind] = entry
        print(kind, json.dumps(entry, indent=1), flush=True)
    (WORK / "results.json").write_text(json.dumps(results, indent=2))
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    if args.clean:
        for kind in texts:
            shutil.rmtree(WORK / kind, ignore_errors=True)


if __name__ == "__main__":
    main()
