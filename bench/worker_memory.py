"""What `--executor processes` holds, process by process: the bench corpus's recipe (bench/corpus.py) run once per
tokenizer with `--executor processes --workers W`, the tree sampled every 20 ms: its peak, and each process's own
peak (VmHWM: supervisor, resource tracker, stage process, workers, the short-lived trainer and backend check), with
what local_workers counted each worker for and how many it started.
"trained" is the recipe's own 32k BPE (trained in the run); the other names are bench/vocabularies.py's.

    .venv/bin/python bench/worker_memory.py [--only trained,cl100k_base,o200k_base] [--workers 3] [--steps N]
        [--max-memory 1GiB]

Writes bench/work/worker-memory/<name>/ (deleted after each unless --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.vocabularies import recipe_for  # noqa: E402
from tests.vocab import tiktoken_package_cache  # noqa: E402
from tokmix.executors import encoder_process_bytes  # noqa: E402


def role(p: psutil.Process) -> str:
    line = " ".join(p.cmdline())
    if "resource_tracker import" in line:
        return "resource tracker"
    if "spawn_main" in line:
        return "worker or short-lived process"
    if "tokmix.pipeline" in line:
        return "stage process"
    return "supervisor"


def high_water(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    return 0


def measure(cmd: list[str], log: Path) -> dict:
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    root, peak, own = psutil.Process(proc.pid), 0, {}
    while proc.poll() is None:
        total = 0
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            break
        for p in tree:
            try:
                rss, name, hwm = p.memory_info().rss, role(p), high_water(p.pid)
            except (psutil.Error, OSError):
                continue
            total += rss
            own[p.pid] = (name, max(own.get(p.pid, ("", 0))[1], hwm))
        peak = max(peak, total)
        time.sleep(0.02)
    return {"rc": proc.returncode, "peak": peak, "own": sorted(own.values())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", type=Path, default=ROOT / "bench" / "work" / "corpus")
    ap.add_argument("--only", default="trained,cl100k_base,o200k_base")
    ap.add_argument("--workers", default="3")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--max-memory", default="1GiB")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    cache = ROOT / "bench" / "work" / "tiktoken-cache"
    if not cache.exists():
        tiktoken_package_cache(cache)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    for name in args.only.split(","):
        work = ROOT / "bench" / "work" / "worker-memory" / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        recipe = recipe_for(args.corpus, None if name == "trained" else name, work, args.steps)
        got = measure([sys.executable, "-m", "tokmix", "run", str(recipe), "--out", str(work / "out"), "--no-cache",
                       "--executor", "processes", "--workers", args.workers, "--max-memory", args.max_memory],
                      work / "log")
        said = (work / "log").read_text()
        index = json.loads((work / "out" / "index.json").read_text()) if got["rc"] == 0 else {}
        vocab = index.get("vocab_size", 0)
        started = re.search(r"(\d+) worker process(?:es fit| fits) in", said)
        print(f"{name}: rc {got['rc']}, vocab {vocab:,}, worker processes {started[1] if started else args.workers} "
              f"(counted {encoder_process_bytes(vocab) >> 20} MiB each), tree peak {got['peak'] >> 20} MiB; "
              f"memory guard restarts: {said.count('memory guard:')}")
        for what, hwm in got["own"]:
            print(f"    {what}: own peak {hwm >> 20} MiB")
        if not args.keep:
            shutil.rmtree(work)


if __name__ == "__main__":
    main()
