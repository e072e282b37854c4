"""The assemble stage's memory at any scale, measured on synthetic units: the driver's plan (the labels, one pass
over them and the units' lengths, every shard's task) and one shard task, each in a fresh process, peak RSS
read from the kernel (VmHWM: what top shows at its peak, file-backed mapped pages included).

    .venv/bin/python bench/driver_memory.py [--tokens 26.8e9] [--interleave global|chunked|balanced] [--mean-doc 700]

The units are what the streams stage would commit for a run of --tokens train tokens in the GPT-U-20M mix
(0.45 / 0.35 / 0.054 / 0.146): real .len files, documents of random lengths averaging --mean-doc tokens
(EOT included), --unit-tokens a unit (4M, ~16 MiB of text, by default), and .tok files of the right size
left sparse (all zeros, no disk used), so a shard task reads and writes every byte of a real 500M-token
shard without any tokenizing. Written once per setting to bench/work/driver-memory/, reused after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# measured without the token cache (a second run would take its units from it): bench/cache.py measures it
os.environ.setdefault("TOKMIX_CACHE", "off")

HERE = Path(__file__).resolve().parent
SHARES = {"dclm": 0.45, "edu": 0.35, "code_py": 0.054, "code_other": 0.146}
SEQ_LEN, SHARD_TOKENS, SLACK = 1024, 500_000_000, 1.002
MIB = 2**20


def build_units(work: Path, tokens: float, mean_doc: int, unit_tokens: int, seed: int = 0) -> dict:
    """Per stream: unit records (name, docs, tokens) over real .len files and sparse .tok files."""
    meta_path = work / "streams.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    rng = np.random.default_rng(seed)
    metas = {}
    for name, share in SHARES.items():
        directory = work / name
        directory.mkdir(parents=True, exist_ok=True)
        budget, held, units = int(share * tokens * SLACK) + 1, 0, []
        while held < budget:
            n = max(1, unit_tokens // mean_doc)
            lengths = (rng.geometric(1 / (mean_doc - 1), n) + 1).astype("<u4")  # >= 2: EOT and a token
            unit = f"{len(units):06d}"
            lengths.tofile(directory / f"{unit}.len")
            with open(directory / f"{unit}.tok", "wb") as f:
                f.truncate(int(lengths.sum()) * 2)  # sparse: read back as zeros
            units.append({"name": unit, "docs": int(n), "tokens": int(lengths.sum())})
            held += units[-1]["tokens"]
        metas[name] = {"units": units, "docs": sum(u["docs"] for u in units), "tokens": held}
    meta_path.write_text(json.dumps(metas))
    return metas


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


def _plan(work: Path, tokens: float, interleave: str):
    from tokmix.interleave import Labels, interleave_order
    from tokmix.shards import shard_blocks
    from tokmix.stages.assemble import StreamUnits, plan_tasks
    from tokmix.tokens import write_tokens

    metas = json.loads((work / "streams.json").read_text())
    blocks = int((tokens - 1) // SEQ_LEN)
    plan = shard_blocks(blocks, SHARD_TOKENS // SEQ_LEN)
    streams = {n: StreamUnits(work / n, m["units"]) for n, m in metas.items()}
    docs = [m["docs"] for m in metas.values()]
    if interleave == "chunked":
        labels = Labels("chunked", tuple(docs), 1234)
    elif interleave == "balanced":  # as assemble's write_labels: one streaming pass over the .len files
        from tokmix.interleave import Mix, balanced_chunks
        from tokmix.stages.assemble import INTERLEAVE_CHUNK, LengthReader
        from tokmix.tokens import TokenFileWriter

        path = work / "interleave.labels"
        readers = [LengthReader(u.paths(0, len(u.names) - 1), 0) for u in streams.values()]
        mix = Mix.fixed(list(SHARES.values()))
        writer, counts = TokenFileWriter(path, np.uint8, checksum=False), np.zeros(len(docs), dtype=np.int64)
        for chunk, _ in balanced_chunks([r.take for r in readers], docs, mix, 1234, blocks * SEQ_LEN + 1,
                                        INTERLEAVE_CHUNK):
            if len(chunk):
                writer.write(chunk)
                counts += np.bincount(chunk, minlength=len(docs))
        writer.close()
        labels = Labels("balanced", tuple(counts.tolist()), 1234, str(path))
    else:  # as assemble's write_labels: the reference's shuffle, written, freed
        path = work / "interleave.labels"
        write_tokens(path, interleave_order(docs, 1234))
        labels = Labels("global", tuple(docs), 1234, str(path))
    out = work / "out"
    out.mkdir(exist_ok=True)
    tasks, used = plan_tasks([out / f"train_{k:03d}.bin" for k in range(len(plan))], np.dtype(np.uint16), SEQ_LEN,
                             plan, streams, labels)
    return tasks, used, sum(docs)


def measure(work: Path, tokens: float, interleave: str, what: str) -> None:
    """In a fresh process: the driver's plan, or (worker) the plan then one shard task, its peak alone."""
    import tokmix.stages.assemble  # noqa: F401  (the imports are the stage process's anyway: not counted)

    t0 = time.perf_counter()
    base = peak_rss()
    tasks, used, docs = _plan(work, tokens, interleave)
    result = {"docs": docs, "shards": len(tasks), "plan_seconds": time.perf_counter() - t0,
              "driver_peak": peak_rss(), "driver_base": base}
    if what == "worker":
        from tokmix.stages.assemble import write_shard

        task = tasks[len(tasks) // 2]  # a shard in the middle of the run
        Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from the RSS now
        del tasks
        base = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        t0 = time.perf_counter()
        write_shard(task)
        result.update(shard_seconds=time.perf_counter() - t0, shard_tokens=task.n_tokens,
                      worker_peak=peak_rss(), worker_base=base, shard=Path(task.path).name)
        Path(task.path).unlink()
    print(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=float, default=26.8e9, help="train tokens (default: 10x GPT-U-20M's 2.68B)")
    ap.add_argument("--mean-doc", type=int, default=700, help="mean tokens per document, EOT included")
    ap.add_argument("--interleave", choices=("global", "chunked", "balanced"), default="global")
    ap.add_argument("--unit-tokens", type=int, default=4 << 20, help="tokens per unit (~16 MiB of text: 4M)")
    ap.add_argument("--measure", choices=("driver", "worker"), help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    work = args.work or HERE / "work" / "driver-memory" / f"{args.tokens:.3g}-{args.mean_doc}-{args.unit_tokens}"
    if args.measure:
        measure(work, args.tokens, args.interleave, args.measure)
        return
    t0 = time.perf_counter()
    metas = build_units(work, args.tokens, args.mean_doc, args.unit_tokens)
    units = sum(len(m["units"]) for m in metas.values())
    docs = sum(m["docs"] for m in metas.values())
    print(f"{args.tokens / 1e9:,.1f}B train tokens: {units:,} units, {docs:,} documents "
          f"(built or reused in {time.perf_counter() - t0:.0f}s)", flush=True)
    for what in ("driver", "worker"):
        cmd = [sys.executable, __file__, "--tokens", str(args.tokens), "--mean-doc", str(args.mean_doc),
               "--interleave", args.interleave, "--measure", what, "--work", str(work)]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        if what == "driver":
            print(f"driver ({args.interleave}): plan of {r['shards']:,} shards over {r['docs']:,} documents in "
                  f"{r['plan_seconds']:.1f}s; peak RSS {r['driver_peak'] / MIB:,.0f} MiB (the process after its "
                  f"imports: {r['driver_base'] / MIB:,.0f} MiB; "
                  f"{(r['driver_peak'] - r['driver_base']) / r['docs']:.2f} bytes per document above it)")
        else:
            print(f"worker: {r['shard']} ({r['shard_tokens']:,} tokens) in {r['shard_seconds']:.1f}s; peak RSS "
                  f"{r['worker_peak'] / MIB:,.0f} MiB, {(r['worker_peak'] - r['worker_base']) / MIB:,.0f} MiB above "
                  f"the process before the task")
    shutil.rmtree(work / "out", ignore_errors=True)


if __name__ == "__main__":
    main()
