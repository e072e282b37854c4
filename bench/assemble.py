"""Issue 28's assemble figure, with the noise taken apart: the assemble stage alone, global against balanced, over
one finished run's kept units (a full GPT-U-20M layout run with --keep-streams: `bench/cache.py full --keep`).

    .venv/bin/python bench/assemble.py RUN_DIR [--pairs 3] [--rule 5]

`--rule`: the interleave alone, in this process, N times each in turn: the reference's global shuffle of every
document's label (interleave_order, as assemble writes it) and the balanced order (balanced_order: the rule over
the units' .len files and the deviation it records), CPU seconds (process_time) of each; the difference is what
the balanced rule adds to assemble, measured without the shards' I/O.

`--pairs`: the whole assemble stage (run_assemble: the labels, the plan, every shard written, fsynced and
recorded), each in a fresh process, global and balanced in pairs whose order alternates (a load that drifts
favours neither); for each run its wall and CPU seconds (the stage process's threads, where the local executor's
workers run), and per pair balanced / global. Each run rewrites the run's shards (~5.4 GB at the full layout):
RUN_DIR's shards are those of the last run, its index.json the original run's. The load average is printed
beside every figure (a shared machine)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def context(run: Path, kind: str):
    """The run's recorded recipe with interleave `kind`, its layout and its streams' records."""
    from tokmix.identity import load_recorded_recipe
    from tokmix.shards import Layout
    from tokmix.stages.streams import load_meta

    layout = Layout(run)
    recipe = load_recorded_recipe(layout)
    recipe = recipe.model_copy(update={"layout": recipe.layout.model_copy(update={"interleave": kind})})
    return recipe, layout, load_meta


def rule(run: Path, repeat: int) -> None:
    """The interleave alone: CPU seconds of the global shuffle and of the balanced order, in turn."""
    import numpy as np

    from tokmix.interleave import interleave_order
    from tokmix.shards import Layout
    from tokmix.stages.assemble import StreamUnits, balanced_order

    recipe, layout, _ = context(run, "balanced")
    metas = {n: json.loads(Layout(run).stream_meta(n).read_text()) for n in recipe.streams}
    docs = [metas[n]["docs"] for n in recipe.streams]
    units = [StreamUnits(layout.units(n), metas[n]["units"]) for n in recipe.streams]
    took: dict[str, list[float]] = {"global": [], "balanced": []}
    for _ in range(repeat):
        for kind in took:
            t0 = time.process_time()
            if kind == "global":
                order = interleave_order(docs, recipe.seed)
                np.asarray(order).tofile(os.devnull)
            else:
                balanced_order(recipe, docs, units, None)
            took[kind].append(time.process_time() - t0)
        print(f"  rule: global {took['global'][-1]:.2f} CPU-s, balanced {took['balanced'][-1]:.2f} CPU-s; load "
              f"{load()}", flush=True)
    print(f"rule over {sum(docs):,} documents, {repeat} rounds: global median {statistics.median(took['global']):.2f}"
          f" CPU-s (min {min(took['global']):.2f}), balanced median {statistics.median(took['balanced']):.2f} CPU-s "
          f"(min {min(took['balanced']):.2f}); the balanced rule adds "
          f"{statistics.median(took['balanced']) - statistics.median(took['global']):.2f} CPU-s")


def assemble_once(run: Path, kind: str) -> dict:
    """One assemble stage (in this fresh process): the shards and what assemble keeps removed first."""
    import resource

    from tokmix.executors import local_workers, make_executor
    from tokmix.lock import RunWriter
    from tokmix.pipeline import Timings, build_context
    from tokmix.process import RunOptions
    from tokmix.progress import RunProgress
    from tokmix.stages.assemble import run_assemble

    recipe, layout, load_meta = context(run, kind)
    for path in [*run.glob("train_*.bin"), *run.glob("train_*.docs"), layout.interleave_labels, layout.balance,
                 layout.documents_used, *layout.shard_record(layout.train(0).name).parent.glob("*")]:
        path.unlink(missing_ok=True)
    options = RunOptions(cache=None)
    progress = RunProgress(layout, 3600.0)
    ctx = build_context(recipe, layout, options, Timings(layout), progress)
    ctx.writer = RunWriter.of(layout)
    metas = {n: load_meta(ctx, n) for n in recipe.streams}
    encoder = (ctx.tokenizer_path, ctx.backend)
    processes = ctx.executor == "processes"
    workers = local_workers(ctx.workers, options.max_memory, ctx.vocab_size) if processes else ctx.workers
    with make_executor(ctx.executor, workers, None, encoder) as ctx.pool:
        before, children = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        run_assemble(ctx, metas)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - before
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    progress.stop()
    cpu += (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    return {"kind": kind, "wall": wall, "cpu": cpu}


def pairs(run: Path, count: int) -> None:
    results: list[dict] = []
    for p in range(count):
        kinds = ("global", "balanced") if p % 2 == 0 else ("balanced", "global")
        pair = {}
        for kind in kinds:
            before = load()
            proc = subprocess.run([sys.executable, __file__, str(run), "--once", kind], capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"assemble {kind} failed:\n{proc.stderr[-3000:]}")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            got["load"] = [before, load()]
            pair[kind] = got
            print(f"  pair {p + 1} {kind:<8}: wall {got['wall']:6.1f} s, CPU {got['cpu']:6.1f} s; load {before} -> "
                  f"{got['load'][1]}", flush=True)
        results.append(pair)
        print(f"pair {p + 1}: balanced / global wall {pair['balanced']['wall'] / pair['global']['wall']:.3f}x, CPU "
              f"{pair['balanced']['cpu'] / pair['global']['cpu']:.3f}x (balanced - global: "
              f"{pair['balanced']['cpu'] - pair['global']['cpu']:+.1f} CPU-s)", flush=True)
    for what in ("wall", "cpu"):
        ratios = [r["balanced"][what] / r["global"][what] for r in results]
        means = [statistics.mean(r[kind][what] for r in results) for kind in ("balanced", "global")]
        print(f"balanced / global {what}: median {statistics.median(ratios):.3f}x over {count} pairs "
              f"({', '.join(f'{x:.3f}' for x in ratios)}); means {means[0]:.1f} / {means[1]:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rule", type=int, default=5)
    parser.add_argument("--once", choices=("global", "balanced"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["TOKMIX_CACHE"] = "off"
    if args.once:
        print(json.dumps(assemble_once(args.run.resolve(), args.once)))
        return
    print(f"{args.run}: load {load()}")
    if args.rule:
        rule(args.run.resolve(), args.rule)
    if args.pairs:
        pairs(args.run.resolve(), args.pairs)


if __name__ == "__main__":
    main()
