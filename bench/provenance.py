"""The provenance index's costs (issue 21): the overhead of writing it on a whole run, its bytes per document, and
`tokmix trace` latency at the GPT-U-20M layout.

    .venv/bin/python bench/provenance.py [--mb 40] [--repeat 3] [--workers 2] [--skip-runs] [--skip-trace]

Overhead: a corpus of --mb MB of documents of 0.5-8 kB (the Python installation's modules cut at random places,
a parquet stream and a JSONL stream, 4 train files and a holdout file each) is built under
bench/work/provenance/ with a recipe in blocks of 1,024 tokens and the demo's trained tokenizer (4,096 ids);
then the recipe runs whole (`tokmix run`, a fresh output directory each time) with the index
on and off ([layout] provenance = false), alternating which goes first, --repeat times each. The ratios are of
the medians: wall time, CPU time of the run's whole process tree (user + system, from getrusage: steadier
than wall time on a shared machine), and each stage's seconds (tokmix-state/timings.json). The train and
holdout files of the two are compared byte for byte.

Trace latency: a synthetic output directory at the full layout (2,616,320 blocks of 1,024 tokens in 500M-token
shards, sparse token files of the right size, ~1.5M documents of random lengths around 1,790 tokens in real
.docs files with their checksums in index.json); `tokmix trace OUT --step N --rank R --world-size 8` timed as a
user runs it (a fresh interpreter with its byte code cached, as an installed tokmix has it: start-up, reading
index.json and one shard's index, printing), and tokmix.trace.trace_blocks in-process, for steps spread over
the run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import tokmix
from tokmix.demo import build_demo_corpus
from tokmix.provenance import DOC_DTYPE

# measured without the token cache (a second run would take its units from it): bench/cache.py measures it
os.environ.setdefault("TOKMIX_CACHE", "off")

WORK = Path(__file__).resolve().parent / "work" / "provenance"

# the GPT-U-20M layout (recipes/gpt-u-20m.toml)
SEQ_LEN, BLOCKS, SEQS_PER_STEP, TRAIN_STEPS = 1024, 2_616_320, 128, 19_840
SHARD_TOKENS = 500_000_000
DOCUMENTS = 1_500_000


def load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


# ---------------------------------------------------------------------------- overhead on a whole run
STREAMS = {"prose": ("parquet", 0.6), "code": ("jsonl", 0.4)}  # name: (format, share)


def corpus_texts(mb: float, seed: int = 0) -> list[str]:
    """~mb MB of documents of 0.5-8 kB (a web page's size): the Python installation's modules cut at random
    places, in a seeded order; a module used again is marked, so no two documents are equal."""
    import sysconfig

    rng = np.random.default_rng(seed)
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    texts, size, round_no = [], 0, 0
    while size < mb * 1e6:
        for path in (files[i] for i in rng.permutation(len(files))):
            text = path.read_text(encoding="utf-8", errors="replace")
            at = 0
            while at < len(text):
                n = int(rng.integers(500, 8000))
                piece = text[at : at + n] + (f"\n# copy {round_no}" if round_no else "")
                texts.append(piece)
                size += len(piece)
                at += n
            if size >= mb * 1e6:
                break
        round_no += 1
    return texts


def write_corpus(root: Path, mb: float, tokenizer: Path) -> Path:
    """Two streams (parquet and JSONL), 4 train files and 1 holdout file each, a split file and a recipe that
    needs ~70% of the train tokens (at ~3.3 bytes a token) in blocks of 1,024."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = corpus_texts(mb)
    split, cut = {}, 0
    for name, (kind, share) in STREAMS.items():
        mine = texts[cut : cut + int(len(texts) * share)]
        cut += len(mine)
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        held, train = mine[:300], mine[300:]
        paths = []
        for k, part in enumerate([held, *np.array_split(np.array(train, dtype=object), 4)]):
            path = folder / (f"part-{k}.parquet" if kind == "parquet" else f"part-{k}.jsonl")
            if kind == "parquet":
                pq.write_table(pa.table({"text": list(part)}), path, row_group_size=1000)
            else:
                path.write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
            paths.append(str(path))
        split[name] = {"holdout": paths[:1], "train": paths[1:]}
    (root / "file_splits.json").write_text(json.dumps(split, indent=1))
    train_bytes = sum(len(t.encode()) for t in texts) - 600 * 5000
    blocks = int(train_bytes / 3.3 * 0.7) // 1024
    steps = blocks // 32
    lines = ["seed = 1234", "", "[tokenizer]", f'path = "{tokenizer}"', "", "[layout]", "seq_len = 1024",
             f"steps = {steps}", "seqs_per_step = 32", "shard_tokens = 4_000_000", "", "[holdout]",
             "tokens = 200_000", "eval_windows = 10", 'splits = "file_splits.json"']
    for name, (_, share) in STREAMS.items():
        lines += ["", f"[streams.{name}]", f'domain = "{name}"', f"share = {share}",
                  f'files = ["{name}/*"]']
    recipe = root / "on.toml"
    recipe.write_text("\n".join(lines) + "\n")
    return recipe


def recipes(mb: float, workers: int) -> tuple[Path, Path]:
    """The corpus's recipe, with provenance on and off; its tokenizer trained once on the demo corpus."""
    tokenizer = WORK / "tokenizer.json"
    if not tokenizer.exists():
        demo = build_demo_corpus(WORK / "demo", 1.0)
        warm = WORK / "warm-up"
        shutil.rmtree(warm, ignore_errors=True)
        tokmix.run(tokmix.load_recipe(demo), warm, workers=workers)
        shutil.copy(warm / "tokenizer.json", tokenizer)
        shutil.rmtree(warm)
    corpus = WORK / f"corpus-{mb:g}mb"
    on = corpus / "on.toml"
    if not on.exists():
        write_corpus(corpus, mb, tokenizer)
    off = corpus / "off.toml"
    off.write_text(on.read_text().replace("[layout]\n", "[layout]\nprovenance = false\n"))
    return on, off


def timed_run(recipe: Path, out: Path, workers: int) -> dict:
    """Wall seconds, CPU seconds (user + system of the whole process tree: on a shared machine the steadier
    figure) and each stage's seconds (timings.json) of one `tokmix run`."""
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--workers",
                    str(workers)], check=True, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    stages = json.loads((out / "tokmix-state" / "timings.json").read_text())
    return {"wall": wall, "cpu": cpu, **stages}


def token_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


def overhead(mb: float, repeat: int, workers: int) -> dict:
    on, off = recipes(mb, workers)
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for r in range(repeat):
        order = [("on", on), ("off", off)] if r % 2 == 0 else [("off", off), ("on", on)]
        for mode, recipe in order:
            before = load()
            runs[mode].append(timed_run(recipe, WORK / f"run-{mode}", workers))
            got = runs[mode][-1]
            print(f"  {mode:>3}: {got['wall']:.2f} s, cpu {got['cpu']:.2f} s, streams {got['streams']:.2f} s, "
                  f"assemble {got['assemble']:.2f} s (load {before} -> {load()})", flush=True)
    assert token_files(WORK / "run-on") == token_files(WORK / "run-off"), "the token files differ"
    out = WORK / "run-on"
    index = json.loads((out / "index.json").read_text())
    entries = [*index["shards"], *index["val"].values()]
    documents = sum(e["provenance"]["documents"] for e in entries)
    index_bytes = sum((out / e["provenance"]["file"]).stat().st_size for e in entries)
    tables = len(json.dumps(index["provenance"]["sources"])) + sum(
        len(json.dumps(v["provenance"]["sources"])) for v in index["val"].values())
    keys = ["wall", "cpu", "holdout", "streams", "assemble", "validate"]
    medians = {mode: {k: statistics.median(r[k] for r in runs[mode]) for k in keys} for mode in runs}
    return {
        "mb": mb, "repeat": repeat, "workers": workers, "train_tokens": index["total"]["tokens"],
        "documents": documents, "runs": runs, "medians": medians,
        "ratio": {k: medians["on"][k] / medians["off"][k] for k in keys if medians["off"][k] > 0},
        "bytes_per_document": index_bytes / documents, "table_bytes": tables,
        "table_bytes_per_document": tables / documents, "sources": len(index["provenance"]["sources"]),
    }


# ---------------------------------------------------------------------------- trace latency at the full layout
def full_layout(root: Path, seed: int = 0) -> Path:
    """A synthetic finished run at the GPT-U-20M layout: sparse token files, real provenance indexes."""
    out = root / "full"
    if (out / "index.json").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    per_shard = SHARD_TOKENS // SEQ_LEN
    blocks = [per_shard] * (BLOCKS // per_shard) + ([BLOCKS % per_shard] if BLOCKS % per_shard else [])
    total = BLOCKS * SEQ_LEN + 1
    mean = total / DOCUMENTS
    lengths = np.maximum(1, rng.exponential(mean, DOCUMENTS + DOCUMENTS // 10)).astype(np.int64)
    ends = np.cumsum(lengths)
    lengths = lengths[: int(np.searchsorted(ends, total)) + 1]
    lengths[-1] -= int(lengths.sum()) - total  # the run's last document cut where its blocks end
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    sources = [["web", 1, "parquet", f"/data/web/train_{i:04d}.parquet"] for i in range(2000)]
    shards, first = [], 0
    for k, n in enumerate(blocks):
        lo, hi = first * SEQ_LEN, (first + n) * SEQ_LEN + 1  # the shard's tokens of the run (the last repeated)
        a = int(np.searchsorted(starts, lo, side="right")) - 1
        b = int(np.searchsorted(starts, hi, side="left"))
        records = np.zeros(b - a, DOC_DTYPE)
        doc_ends = np.minimum(starts[a:b] + lengths[a:b], hi)
        records["tokens"] = doc_ends - np.maximum(starts[a:b], lo)
        records["source"] = rng.integers(0, len(sources), b - a)
        records["place"] = rng.integers(0, 1_000_000, b - a)
        records["crc32"] = rng.integers(0, 2**32, b - a, dtype=np.uint64)
        name = f"train_{k:03d}"
        (out / f"{name}.docs").write_bytes(records.tobytes())
        with open(out / f"{name}.bin", "wb") as f:
            f.truncate((hi - lo) * 2)  # sparse: TrainBlocks checks sizes, trace reads no token
        shards.append({"file": f"{name}.bin", "tokens": hi - lo, "blocks": n, "tokens_by_stream": {"web": hi - lo},
                       "provenance": {"file": f"{name}.docs", "documents": b - a, "skip": int(lo - starts[a]),
                                      "checksum": hashlib.sha256(records.tobytes()).hexdigest()}})
        first += n
    index = {"dtype": "uint16", "seq_len": SEQ_LEN, "block": SEQ_LEN + 1, "stride": SEQ_LEN, "blocks": BLOCKS,
             "train_steps": TRAIN_STEPS, "seqs_per_step": SEQS_PER_STEP, "margin_steps": 600, "shards": shards,
             "provenance": {"record": [[n, DOC_DTYPE.fields[n][0].str] for n in DOC_DTYPE.names],
                            "sources": sources, "text_fields": {"web": "text"}}}
    (out / "index.json").write_text(json.dumps(index))
    return out


def installed_env(root: Path) -> dict[str, str]:
    """The environment of an installed tokmix: byte code cached (here under `root`, not beside the sources).
    Without it (PYTHONDONTWRITEBYTECODE=1, as on the bench machine) every command compiles ~300 modules first:
    ~0.9 s of a trace's ~1.2 s measured that way."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(root / "pycache")}


def trace_latency(root: Path, samples: int = 5) -> dict:
    from tokmix.trace import step_blocks, trace_blocks

    out = full_layout(root)
    env = installed_env(root)
    subprocess.run([sys.executable, "-m", "tokmix.cli", "trace", str(out), "--step", "0"], env=env,
                   capture_output=True, check=True)  # the byte code, written once
    index = json.loads((out / "index.json").read_text())
    documents = sum(s["provenance"]["documents"] for s in index["shards"])
    steps = np.linspace(0, TRAIN_STEPS - 1, samples).astype(int).tolist()
    cli, api = [], []
    for step in steps:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "trace", str(out), "--step", str(step),
                               "--rank", "3", "--world-size", "8"], capture_output=True, text=True, check=True,
                              env=env)
        cli.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        traced = trace_blocks(out, step_blocks(out, step, 3, 8))
        api.append(time.perf_counter() - t0)
    assert len(traced) == SEQS_PER_STEP // 8 and proc.stdout.count("block ") >= SEQS_PER_STEP // 8
    startup = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tokmix.cli", "--version"], capture_output=True, check=True, env=env)
        startup.append(time.perf_counter() - t0)
    return {"documents": documents, "shards": len(index["shards"]), "steps": steps, "cli_seconds": cli,
            "api_seconds": api, "cli_median": statistics.median(cli), "api_median": statistics.median(api),
            "cli_startup_median": statistics.median(startup), "example": proc.stdout}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=40.0, help="MB of text in the corpus")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-runs", action="store_true")
    parser.add_argument("--skip-trace", action="store_true")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    results = {}
    if not args.skip_runs:
        print(f"overhead: {args.mb:g} MB corpus, {args.repeat} runs each, {args.workers} workers", flush=True)
        results["overhead"] = o = overhead(args.mb, args.repeat, args.workers)
        print(f"  {o['train_tokens']:,} train tokens, {o['documents']:,} documents, {o['sources']} sources")
        for stage, ratio in o["ratio"].items():
            print(f"  {stage:>8}: on {o['medians']['on'][stage]:.3f} s / off {o['medians']['off'][stage]:.3f} s"
                  f" = {ratio:.3f}")
        print(f"  index: {o['bytes_per_document']:.1f} bytes/document + tables {o['table_bytes']:,} bytes "
              f"({o['table_bytes_per_document']:.2f} bytes/document)")
    if not args.skip_trace:
        print("trace latency at the full layout (synthetic index)", flush=True)
        results["trace"] = t = trace_latency(WORK)
        print(f"  {t['documents']:,} documents in {t['shards']} shards; steps {t['steps']}")
        print(f"  tokmix trace --step N --rank 3 --world-size 8: median {t['cli_median']:.3f} s "
              f"(each: {', '.join(f'{s:.3f}' for s in t['cli_seconds'])}); `tokmix --version` alone "
              f"{t['cli_startup_median']:.3f} s")
        print(f"  trace_blocks in-process: median {t['api_median'] * 1000:.1f} ms")
    (WORK / "results.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
