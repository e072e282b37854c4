"""Crash soak: N runs of `tokmix run`, each SIGKILLed (whole process group) once, half of them at a random
fault point and hit count (TOKMIX_FAULT), half after a random delay; then resumed until done and compared
byte for byte with a clean run. Prints how many of N ended identical (all must).

    python bench/soak.py [--runs 200] [--seed 0] [--work bench/work/soak]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.corpus import make_corpus, write_recipe, write_split  # noqa: E402
from tests.test_faults import UNIT_BYTES, outputs  # noqa: E402
from tokmix.faults import POINTS  # noqa: E402

# measured without the token cache (a second run would take its units from it): bench/cache.py measures it
os.environ.setdefault("TOKMIX_CACHE", "off")

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": str(UNIT_BYTES)}


def command(recipe: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--workers", "2"]


def corpus(work: Path) -> Path:
    files = make_corpus(work, doc_limit=400, rows_per_group=16)
    write_split(work, files)
    recipe = write_recipe(work, "unused", decontaminate=True)
    recipe.write_text(recipe.read_text().replace('[tokenizer]\npath = "unused"', "[tokenizer.train]\nvocab_size = 600"))
    return recipe


def killed_run(recipe: Path, out: Path, rng: random.Random, clean_seconds: float) -> str:
    if rng.random() < 0.5:
        point = rng.choice([p for p in POINTS if p != "runner:before-restart"])
        fault = f"{point}:{rng.randint(1, 3)}"
        proc = subprocess.run(command(recipe, out), env={**ENV, "TOKMIX_FAULT": fault}, capture_output=True,
                              start_new_session=True)
        return f"{fault} (exit {proc.returncode})"
    delay = rng.uniform(0.2, clean_seconds)
    proc = subprocess.Popen(command(recipe, out), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=delay)
        return f"finished before {delay:.2f}s"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return f"killed at {delay:.2f}s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "soak")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    recipe = corpus(args.work / "corpus")
    t0 = time.perf_counter()
    subprocess.run(command(recipe, args.work / "clean"), env=ENV, check=True, capture_output=True)
    clean_seconds = time.perf_counter() - t0
    clean = outputs(args.work / "clean")
    rng = random.Random(args.seed)
    identical, failures = 0, []
    for i in range(args.runs):
        out = args.work / "run"
        shutil.rmtree(out, ignore_errors=True)
        how = killed_run(recipe, out, rng, clean_seconds)
        for _ in range(3):
            if subprocess.run(command(recipe, out), env=ENV, capture_output=True).returncode == 0:
                break
        ok = (out / "index.json").exists() and outputs(out) == clean
        identical += ok
        if not ok:
            failures.append(how)
        print(f"{i + 1:>4}/{args.runs}  {'identical' if ok else 'DIFFERENT'}  {how}", flush=True)
    print(f"\n{identical} of {args.runs} killed-and-resumed runs ended byte-identical to the clean run "
          f"(clean run {clean_seconds:.1f}s)")
    if failures:
        print("failures:", json.dumps(failures, indent=1))
        sys.exit(1)


if __name__ == "__main__":
    main()
