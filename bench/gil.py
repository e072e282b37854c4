"""How much of a worker's time a GIL shared with the other workers is held: `--executor processes` (a worker
process each) against `--executor local` (threads of the stage process), the same recipe in one run,
alternating, under py-spy.

    .venv/bin/python bench/gil.py --recipe R.toml [--workers 2] [--repeat 2] [--unit-mb 4] [--rate 100]

Each run is `tokmix run` under `py-spy record --gil --subprocesses --format raw`: a sample is kept only
when its thread holds its process's GIL. The GIL the workers share is the stage process's: with
`--executor local` the workers are its threads, with `--executor processes` it runs only the coordinator
(handing out units, taking records back) while each worker process has a GIL of its own. So:

  shared GIL held = stage-process samples with the GIL in the streams stage (STREAMS_FRAMES) / rate /
                    (workers x streams seconds)

is the share of a worker's time that every other worker may have to wait for; 1 / that share is roughly
how many workers the executor can keep busy. Printed beside it: the same for each worker process's own GIL
(nobody else waits for it), and the streams stage's tokens/s per worker (timings from tokmix-state). py-spy
slows what it samples a little; both executors pay it alike. Outputs of the two are compared byte for byte.
Per unit (committed units counted under --keep-streams): a worker's seconds and the shared GIL's, the costs
from which docs/scaling.md projects the core count at which the coordinator would saturate.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# measured without the token cache (a second run would take its units from it): bench/cache.py measures it
os.environ.setdefault("TOKMIX_CACHE", "off")

STAGE_MARK = "from tokmix.pipeline import"  # the stage process's command line (tokmix.runner.STAGE_BOOT)
# the streams stage in the stage process: the coordinator, the threads executor's workers, and the process
# pool's own threads (its manager and queue feeder); the holdout stage's reader threads are not counted, nor the
# pool's start and stop (once a run: ProcessExecutor.__init__ and .close)
STREAMS_FRAMES = ("run_streams", "tokenize_unit", "concurrent/futures/process.py", "multiprocessing/queues.py")
ONCE_FRAMES = ("ProcessExecutor.__init__", "ProcessExecutor.close")


def parse_raw(path: Path) -> list[tuple[int, str, str, int]]:
    """py-spy's raw output -> (pid, command line, frames, samples). A child's stacks start with its parents'
    `process PID:"CMDLINE";` in turn, the sampled process last; a command line may span lines."""
    out = []
    for record in filter(None, re.split(r"^(?=process \d+:\")", path.read_text(), flags=re.M)):
        head, count = record.rstrip().rsplit(None, 1)
        last = list(re.finditer(r'process (\d+):"', head))[-1]
        cmdline, _, frames = head[last.end():].partition('";')
        out.append((int(last.group(1)), cmdline, frames, int(count)))
    return out


def measure(recipe: Path, out: Path, executor: str, workers: int, rate: int, unit_bytes: int) -> dict:
    raw = out.with_suffix(".raw")
    env = {**os.environ, "TOKMIX_UNIT_BYTES": str(unit_bytes)}
    cmd = [str(Path(sys.executable).with_name("py-spy")), "record", "--gil", "--subprocesses", "--format", "raw",
           "-r", str(rate), "-o", str(raw), "--", sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out",
           str(out), "--workers", str(workers), "--executor", executor, "--max-memory", "8GiB", "--keep-streams"]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stage = worker_own = 0
    for _, cmdline, frames, n in parse_raw(raw):
        if STAGE_MARK in cmdline and any(f in frames for f in STREAMS_FRAMES) \
                and not any(f in frames for f in ONCE_FRAMES):
            stage += n
        elif "spawn_main" in cmdline or "multiprocessing" in cmdline:
            worker_own += n if "tokenize_unit" in frames else 0
    seconds = json.loads((out / "tokmix-state/timings.json").read_text())["streams"]
    index = json.loads((out / "index.json").read_text())
    tokens = sum(s["tokens"] for s in index["mix"]["streams"].values())
    busy = workers * seconds
    units = sum(1 for _ in out.glob("streams/*/units/*.json"))
    return {"executor": executor, "streams_s": seconds, "tok_s_per_worker": tokens / seconds / workers,
            "shared_gil": stage / rate / busy, "own_gil": worker_own / rate / busy, "units": units,
            "worker_s_per_unit": busy / units, "shared_gil_s_per_unit": stage / rate / units}


def shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--unit-mb", type=float, default=4)
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second and process")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tokmix-gil-"))
    try:
        first: dict[str, bytes] | None = None
        for round_ in range(args.repeat):
            rows = {}
            for executor in ("local", "processes") if round_ % 2 == 0 else ("processes", "local"):
                out = work / f"{executor}-{round_}"
                rows[executor] = measure(args.recipe, out, executor, args.workers, args.rate,
                                         int(args.unit_mb * 2**20))
                first = first or shards(out)
                assert shards(out) == first, f"{out}: shards differ from the first run's"
                shutil.rmtree(out)
            for row in rows.values():
                print(f"round {round_ + 1} {row['executor']:>9}: streams {row['streams_s']:6.2f} s, "
                      f"{row['tok_s_per_worker'] / 1e6:5.2f}M tok/s per worker, shared GIL held "
                      f"{100 * row['shared_gil']:5.2f}% of a worker's time, a worker's own GIL "
                      f"{100 * row['own_gil']:5.2f}%; {row['units']} units, a unit {row['worker_s_per_unit']:.3f} s "
                  f"of a worker, {1e3 * row['shared_gil_s_per_unit']:.1f} ms of the shared GIL")
            print(f"round {round_ + 1} processes/local: tok/s per worker x"
                  f"{rows['processes']['tok_s_per_worker'] / rows['local']['tok_s_per_worker']:.2f}, shared GIL x"
                  f"{rows['processes']['shared_gil'] / max(rows['local']['shared_gil'], 1e-9):.3f}", flush=True)
        print("outputs byte-identical across executors and rounds")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
