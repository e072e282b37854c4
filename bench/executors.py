"""Executor overhead: the same recipe run with the local process pool and with Ray on this machine. Wall time,
time per stage, peak memory of the run's process tree, and what Ray costs: once per run (the stage process
starts one executor for all its stages: a Ray instance, its workers, the shutdown) and per work unit.

    .venv/bin/python bench/executors.py [--recipe R.toml] [--workers 2] [--unit-mb 4] [--repeat 1]
                                        [--ray-address ADDR]

Without --recipe the demo corpus (tokmix.demo, --scale) is built under bench/work/executors/. A local warm-up
run trains the recipe's tokenizer (if it trains one) and fills the page cache; then each executor runs into a
fresh output directory holding a copy of that tokenizer file, so neither measured run trains.

The run's supervisor is this process. A sampler thread sums, every 0.1 s over every process below it, RSS
(what tokmix's memory guard counts: a shared page counts once per process) and PSS (a shared page split
between the processes sharing it). Without --ray-address the stage process starts a private Ray instance of
--workers CPUs, so Ray's daemons are part of the tree. The memory guard is set out of the way (64 GiB): this
measures memory, it does not limit it. The train shards and holdouts of the two runs are compared byte for
byte.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil

import tokmix

SAMPLE_SECONDS = 0.1
WORK = Path(__file__).resolve().parent / "work" / "executors"
TRIVIAL_TASKS = 2000
ROLES = ("stage process", "workers", "ray daemons", "other")

# one executor's costs, in a fresh process as the stage process pays them: start, run one trivial task per worker
# (a worker process must start for it), shut down; and the cost of one more trivial task through the window
EXECUTOR_COSTS = """
import os, sys, time
from tokmix.executors import make_executor

# measured without the token cache (a second run would take its units from it): bench/cache.py measures it
os.environ.setdefault("TOKMIX_CACHE", "off")
kind, workers, address, tasks = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None, int(sys.argv[4])

def drain(pending, limit):
    while len(pending) > limit:
        for ref in ex.wait_any(pending):
            pending.discard(ref)
            ex.result(ref)

t0 = time.perf_counter()
ex = make_executor(kind, workers, address) if address else make_executor(kind, workers)
t1 = time.perf_counter()
pending = {ex.submit(os.path.join, "unit", str(i)) for i in range(workers)}
drain(pending, 0)
t2 = time.perf_counter()
for i in range(tasks):  # the coordinator's pattern: a window of 2 x workers, refilled as tasks finish
    pending.add(ex.submit(os.path.join, "unit", str(i)))
    drain(pending, 2 * workers - 1)
drain(pending, 0)
t3 = time.perf_counter()
ex.close()
print(t1 - t0, t2 - t1, time.perf_counter() - t3, (t3 - t2) / tasks)
"""


def role(cmdline: list[str]) -> str:
    line = " ".join(cmdline)
    if "tokmix.pipeline" in line or "tokmix.runner" in line:  # the stage process's module, new name and old
        return "stage process"
    title = cmdline[0] if cmdline else ""
    if (title.startswith("ray::") and not title.endswith("Agent")) or "default_worker.py" in line:
        return "workers"  # ray::IDLE, ray::tokenize_unit, ray::write_shard
    if "multiprocessing" in line:
        return "workers"  # the local pool's spawned processes
    if "ray" in line:
        return "ray daemons"  # gcs_server, raylet, dashboard, agents, log monitor
    return "other"


class TreeSampler(threading.Thread):
    """Peak RSS and PSS of every process below this one: in total and by role."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.peak_rss = self.peak_pss = 0
        self.peak_rss_by_role: dict[str, int] = defaultdict(int)

    def run(self) -> None:
        me = psutil.Process()
        while not self.done.is_set():
            rss, pss = defaultdict(int), 0
            for proc in me.children(recursive=True):
                try:
                    mem = proc.memory_full_info()
                    rss[role(proc.cmdline())] += mem.rss
                    pss += mem.pss
                except psutil.Error:  # exited between listing and reading
                    continue
            self.peak_rss = max(self.peak_rss, sum(rss.values()))
            self.peak_pss = max(self.peak_pss, pss)
            for name, value in rss.items():
                self.peak_rss_by_role[name] = max(self.peak_rss_by_role[name], value)
            self.done.wait(SAMPLE_SECONDS)

    def stop(self) -> None:
        self.done.set()
        self.join()


def run_once(recipe: Path, out: Path, executor: str, args: argparse.Namespace, tokenizer: Path | None) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if tokenizer:
        shutil.copy(tokenizer, out / "tokenizer.json")  # a [tokenizer.train] recipe reuses it
    extra = {"ray_address": args.ray_address} if executor == "ray" and args.ray_address else {}
    sampler = TreeSampler()
    sampler.start()
    t0 = time.perf_counter()
    index = tokmix.run(
        tokmix.load_recipe(recipe),
        out,
        workers=args.workers,
        executor=executor,
        unit_bytes=int(args.unit_mb * 2**20),
        keep_streams=True,
        max_memory=64 << 30,
        **extra,
    )
    wall = time.perf_counter() - t0
    sampler.stop()
    return {
        "executor": executor,
        "wall": wall,
        "stages": json.loads((out / "tokmix-state" / "timings.json").read_text()),
        "units": sum(1 for _ in out.glob("streams/*/units/*.json")),  # tokenized, past-budget ones included
        "tokens": index["total"]["tokens"],
        "peak_rss": sampler.peak_rss,
        "peak_pss": sampler.peak_pss,
        "peak_rss_by_role": dict(sampler.peak_rss_by_role),
    }


def executor_costs(executor: str, args: argparse.Namespace) -> tuple[float, float, float, float]:
    """Seconds to start the executor, to run its first task on every worker, to close it, and per task."""
    proc = subprocess.run(
        [sys.executable, "-c", EXECUTOR_COSTS, executor, str(args.workers), args.ray_address or "", str(TRIVIAL_TASKS)],
        capture_output=True,
        text=True,
        check=True,
    )
    start, first, close, per_task = map(float, proc.stdout.split()[-4:])
    return start, first, close, per_task


def same_outputs(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("*.bin"))
    return names == sorted(p.name for p in b.glob("*.bin")) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def report(runs: list[dict], costs: dict[str, tuple[float, float, float, float]]) -> None:
    mib = 2**20
    print(f"\n{'':28}" + "".join(f"{r['executor']:>14}" for r in runs))
    rows = [
        ("wall (s)", lambda r: f"{r['wall']:.1f}"),
        ("  tokenizer stage (s)", lambda r: f"{r['stages'].get('tokenizer', 0):.1f}"),
        ("  holdout stage (s)", lambda r: f"{r['stages'].get('holdout', 0):.1f}"),
        ("  streams stage (s)", lambda r: f"{r['stages']['streams']:.1f}"),
        ("  assemble stage (s)", lambda r: f"{r['stages']['assemble']:.1f}"),
        ("units tokenized", lambda r: f"{r['units']:,}"),
        ("train tokens", lambda r: f"{r['tokens']:,}"),
        ("streams tok/s", lambda r: f"{r['tokens'] / r['stages']['streams']:,.0f}"),
        ("peak RSS, tree (MiB)", lambda r: f"{r['peak_rss'] / mib:,.0f}"),
        ("peak PSS, tree (MiB)", lambda r: f"{r['peak_pss'] / mib:,.0f}"),
        *(
            (f"  peak RSS {name} (MiB)", lambda r, n=name: f"{r['peak_rss_by_role'].get(n, 0) / mib:,.0f}")
            for name in ROLES
        ),
        ("executor start (s)", lambda r: f"{costs[r['executor']][0]:.2f}"),
        ("first task per worker (s)", lambda r: f"{costs[r['executor']][1]:.2f}"),
        ("executor close (s)", lambda r: f"{costs[r['executor']][2]:.2f}"),
        ("trivial task, in window (ms)", lambda r: f"{costs[r['executor']][3] * 1e3:.2f}"),
    ]
    for label, cell in rows:
        print(f"{label:28}" + "".join(f"{cell(r):>14}" for r in runs))
    local, ray = runs
    units = ray["units"]
    diff = ray["wall"] - local["wall"]  # the executor starts outside the stages' timings, before the holdout
    fixed_diff = sum(costs["ray"][:3]) - sum(costs["local"][:3])  # one executor per stage process
    print(f"\nRay - local, wall: {diff:+.1f} s over {units} units = {diff / units * 1e3:+,.0f} ms/unit")
    print(
        f"  of which starting, warming and closing the executor: {fixed_diff:+.1f} s; "
        f"the rest per unit: {(diff - fixed_diff) / units * 1e3:+,.0f} ms/unit"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", type=Path, help="recipe to run [default: the demo corpus at --scale]")
    ap.add_argument("--scale", type=float, default=3.0, help="demo corpus scale, without --recipe")
    ap.add_argument("--workers", type=int, default=psutil.cpu_count() or 1)
    ap.add_argument("--unit-mb", type=float, default=4.0, help="source MB per work unit")
    ap.add_argument("--ray-address", help="a running Ray cluster [default: a local instance per run]")
    ap.add_argument("--repeat", type=int, default=1, help="runs per executor; the fastest is reported")
    args = ap.parse_args()
    if args.recipe is None:
        from tokmix.demo import build_demo_corpus

        args.recipe = build_demo_corpus(WORK / "corpus", scale=args.scale)
    print("--- warm-up (local): trains the recipe's tokenizer, if it trains one, for the measured runs", flush=True)
    run_once(args.recipe, WORK / "warm-up", "local", args, None)
    trained = WORK / "warm-up" / "tokenizer.json"
    runs = []
    for executor in ("local", "ray"):
        tries = []
        for attempt in range(args.repeat):
            print(f"--- {executor} ({attempt + 1} of {args.repeat})", flush=True)
            tries.append(run_once(args.recipe, WORK / executor, executor, args, trained if trained.exists() else None))
        runs.append(min(tries, key=lambda r: r["wall"]))  # the least disturbed run
    costs = {executor: executor_costs(executor, args) for executor in ("local", "ray")}
    report(runs, costs)
    print(
        f"\noutputs identical: {same_outputs(WORK / 'local', WORK / 'ray')}; recipe {args.recipe}, "
        f"{args.workers} workers, {psutil.cpu_count()} CPUs, units of {args.unit_mb:g} MB"
    )


if __name__ == "__main__":
    main()
