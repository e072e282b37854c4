"""The streams stage's unit function against its backend's bare speed on the same documents, without a 10 GiB
full-layout run: the first units of each stream of bench/fullscale.py's recipe (its corpus and 32k BPE), in the
recipe's proportions, tokenized by `tokenize_unit` on the local executor's threads (as the stage runs them:
provenance on, one encoder shared by the threads), against the same units' documents pre-loaded and encoded
bare by that encoder, in tokmix's batches, on as many threads. Each measure runs in a fresh process (the
encoder's caches start cold in both, and each measure times its second pass over the units: at the full layout
the corpus's files repeat, so the encoder mostly meets text it has seen), the two alternate, and the load
average is printed beside them.

    .venv/bin/python bench/streams_share.py [--units 40] [--rounds 3] [--workers 2]
    .venv/bin/python bench/streams_share.py --full [--rounds 2]
    .venv/bin/python bench/streams_share.py --pieces [--passes 7] [--pieces-files F.parquet ...]
    .venv/bin/python bench/streams_share.py --native [--units 16] [--rounds 6]

`--full` measures the full layout's own texts instead: every stream's train files in the split's order, unit by
unit until the stream's budget, once (the layout's repeated files warm the encoder as they warm the stage's):
the unit function on the threads, against the same units' documents read ahead of the clock a few units at a
time and encoded bare on as many threads. Each measure reads ~13 GB of text, and the stage writes its units (5
GB) to a temporary folder, each unit deleted once it is counted.

`--pieces` times the reading pieces of the unit function instead, each alone by its thread's CPU (the minimum of
`--passes` passes in one process) over one parquet file per stream (`--pieces-files`, default each of web, edu
and code_other's train_00000.parquet): Arrow's iter_batches as the reader runs it, the same with `to_pylist`, the
reader the stage uses (`unit_text_lists`) without places, with places, with places and CRC-32s, and with the
stage's batching (`list_batches`, `take_kept`); and the CRC-32s alone by the crc32 tokmix uses and by zlib's.
Then the reader with tokmix._scan's compiled pass against the reader without it (TOKMIX_NATIVE=0), alternating
in one process: the reading path by thread CPU, and the encoder on each one's fresh strs by process CPU.

`--native` times the unit function itself with that pass and without it, alternating in one process on the
threads (`--units` in the recipe's proportions, `--rounds` pairs after a warm-up round), by process CPU.

Run bench/fullscale.py once first (it builds bench/work/fullscale/). Units are written to a temporary folder
and deleted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/fullscale.py's folder; a worktree without bench/work/ names the main checkout's (--work or TOKMIX_BENCH_WORK)
WORK = Path(os.environ.get("TOKMIX_BENCH_WORK", HERE / "work" / "fullscale"))


def units(per_stream: dict[str, int]):
    """The first units of each stream, in the full-layout run's cut."""
    from glob import glob

    import tomllib

    from tokmix.process import default_unit_bytes
    from tokmix.sources import plan_units

    recipe = tomllib.loads((WORK / "recipe.toml").read_text())
    found = []
    for name, count in per_stream.items():
        files = sorted(glob(recipe["streams"][name]["files"][0]))
        plan = plan_units(name, files, [], default_unit_bytes())
        found += [next(plan) for _ in range(count)]
    return found


def per_stream(total: int) -> dict[str, int]:
    import tomllib

    recipe = tomllib.loads((WORK / "recipe.toml").read_text())
    return {name: max(1, round(total * s["share"])) for name, s in recipe["streams"].items()}


def full_units():
    """Every stream's units in the full layout's order, each with its stream's budget: (stream, budget, plan)."""
    from tokmix.process import default_unit_bytes
    from tokmix.recipe import load_recipe
    from tokmix.sources import plan_units

    recipe = load_recipe(WORK / "recipe.toml")
    split = json.loads((WORK / "file_splits.json").read_text())
    return [(name, recipe.budget(name), plan_units(name, split[spec.domain]["train"], [], default_unit_bytes()))
            for name, spec in recipe.streams.items()]


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _user_sys() -> tuple[float, float, int]:
    import resource

    t = os.times()
    return t.user, t.system, resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _thread_stats() -> dict[int, tuple[float, float]]:
    """Each thread of this process: (seconds on a CPU, seconds waiting for one), from Linux's schedstat."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, delay, _ = f.read().split()
            found[int(tid)] = (int(run) / 1e9, int(delay) / 1e9)
        except (OSError, ValueError):
            continue
    return found


def _worker_tids() -> list[int]:
    import threading

    return [t.native_id for t in threading.enumerate() if t.name.startswith("tokmix-worker")]


def _blocked(before: dict, after: dict, tids: list[int], seconds: float) -> dict:
    """The workers' thread-seconds of the timed pass: on a CPU, waiting for one (the machine's load), and neither
    (blocked: the GIL, the disk, an empty queue)."""
    run = sum(after[t][0] - before.get(t, (0, 0))[0] for t in tids if t in after)
    delay = sum(after[t][1] - before.get(t, (0, 0))[1] for t in tids if t in after)
    return {"on_cpu": run, "runqueue": delay, "blocked": max(0.0, len(tids) * seconds - run - delay)}


def measure_full(kind: str, workers: int) -> dict:
    """The full layout's texts, once: each stream's units until its budget (see --full)."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from tokmix.backends import huge_doc_chars
    from tokmix.sources import batches, read_texts
    from tokmix.stages import shared_encoder
    from tokmix.stages.streams import UnitTask, tokenize_unit

    tokenizer = str(WORK / "tokenizer" / "tokenizer.json")
    huge = huge_doc_chars(tokenizer)
    encoder = shared_encoder(tokenizer, "fastokens")
    out = Path(tempfile.mkdtemp(prefix="streams-share-full-"))
    tokens = seconds = cpu = 0.0
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="tokmix-worker") as pool:
            for stream, budget, plan in full_units():
                got = 0
                if kind == "bare":  # a few units read ahead of the clock, then encoded
                    while got < budget and (chosen := [u for _, u in zip(range(workers), plan)]):
                        work = [b for u in chosen for b in batches(read_texts(u, "text", stream, [], huge), huge)]
                        t0, c0 = time.perf_counter(), _cpu()
                        got += sum(pool.map(lambda b: int(encoder.encode_batch(b)[0].size) + len(b), work))
                        seconds, cpu = seconds + time.perf_counter() - t0, cpu + _cpu() - c0
                        del work
                else:  # as the stage runs them: two units per worker in flight
                    t0, c0 = time.perf_counter(), _cpu()
                    pending: set = set()
                    while pending or got < budget:
                        while got < budget and len(pending) < 2 * workers and (unit := next(plan, None)):
                            pending.add(pool.submit(tokenize_unit, UnitTask(
                                unit, "text", tokenizer, "fastokens", "<u2", str(out), None, (), huge,
                                provenance=True)))
                        if not pending:
                            break
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        for future in done:
                            record = future.result()
                            got += record["tokens"]
                            for f in out.glob(f"{record['name']}.*"):
                                f.unlink()
                    seconds, cpu = seconds + time.perf_counter() - t0, cpu + _cpu() - c0
                tokens += got
        return {"kind": kind, "tokens": int(tokens), "seconds": seconds, "cpu": cpu}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def measure(kind: str, total: int, workers: int) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from tokmix.backends import huge_doc_chars
    from tokmix.sources import batches, read_texts
    from tokmix.stages import shared_encoder
    from tokmix.stages.streams import UnitTask, tokenize_unit

    tokenizer = str(WORK / "tokenizer" / "tokenizer.json")
    chosen = units(per_stream(total))
    huge = huge_doc_chars(tokenizer)
    encoder = shared_encoder(tokenizer, "fastokens")
    if kind == "bare":
        with ThreadPoolExecutor(workers, thread_name_prefix="tokmix-worker") as pool:
            for _ in range(2):  # the first pass warms the encoder's caches, as the stage's below
                # read again for the timed pass: fresh str objects, as the stage makes (an encoder that has
                # read a str keeps its UTF-8 in it, which a second encode of the same object skips)
                work = [b for u in chosen for b in batches(read_texts(u, "text", u.stream, [], huge), huge)]
                threads, (u0, s0, f0) = _thread_stats(), _user_sys()
                t0, cpu = time.perf_counter(), _cpu()
                tokens = sum(pool.map(lambda b: int(encoder.encode_batch(b)[0].size) + len(b), work))
                seconds, cpu = time.perf_counter() - t0, _cpu() - cpu
                u1, s1, f1 = _user_sys()
                stats = _blocked(threads, _thread_stats(), _worker_tids(), seconds)
                del work
        return {"kind": kind, "tokens": tokens, "seconds": seconds, "cpu": cpu, "user": u1 - u0, "sys": s1 - s0,
                "page_faults": f1 - f0, **stats}
    out = Path(tempfile.mkdtemp(prefix="streams-share-"))
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="tokmix-worker") as pool:
            for timed in (False, True):
                tasks = []
                for u in chosen:
                    folder = out / str(timed) / u.stream
                    folder.mkdir(parents=True, exist_ok=True)
                    tasks.append(UnitTask(u, "text", tokenizer, "fastokens", "<u2", str(folder), None, (), huge,
                                          provenance=True))
                threads, (u0, s0, f0) = _thread_stats(), _user_sys()
                t0, cpu = time.perf_counter(), _cpu()
                tokens = sum(r["tokens"] for r in pool.map(tokenize_unit, tasks))
                seconds, cpu = time.perf_counter() - t0, _cpu() - cpu
                u1, s1, f1 = _user_sys()
                stats = _blocked(threads, _thread_stats(), _worker_tids(), seconds)
                shutil.rmtree(out / str(timed))
        return {"kind": kind, "tokens": tokens, "seconds": seconds, "cpu": cpu, "user": u1 - u0, "sys": s1 - s0,
                "page_faults": f1 - f0, **stats}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def measure_pieces(files: list[str], passes: int) -> None:
    """The reading pieces of a unit, each by its thread's CPU (see --pieces)."""
    import zlib

    import pyarrow.parquet as pq

    from tokmix.provenance import crc32
    from tokmix.sources import Places, plan_units
    from tokmix.sources.parquet import _batch_rows, _crc32s, _offsets, unit_text_lists
    from tokmix.stages.streams import list_batches

    chosen = [u for f in files for u in plan_units("s", [f], [], 1 << 40)]

    def arrow(pylist: bool) -> None:
        for f in files:
            with open(f, "rb") as fh:
                pf = pq.ParquetFile(fh)
                for g in range(pf.metadata.num_row_groups):
                    rows = _batch_rows(pf.metadata.row_group(g), 0)
                    for b in pf.iter_batches(batch_size=rows, row_groups=[g], columns=["text"], use_threads=False):
                        b.column(0).to_pylist() if pylist else b.column(0)

    def reader(places: bool | None, batched: bool = False) -> None:
        for u in chosen:
            where = None if places is None else Places(checksums=places, kept=True)
            lists = unit_text_lists(u.pieces, "text", "s", [], 1 << 40, where)
            if not batched:
                for _ in lists:
                    pass
                continue
            for batch in list_batches(lists, 1 << 40):
                where.take_kept(len(batch))

    columns = []
    for f in files:
        with open(f, "rb") as fh:
            columns += [b.column(0) for b in pq.ParquetFile(fh).iter_batches(batch_size=100, columns=["text"],
                                                                              use_threads=False)]
    print(f"{len(files)} files, {sum(c.nbytes for c in columns) / 1e6:,.1f} MB of text in Arrow; load "
          f"{os.getloadavg()[0]:.2f}; thread CPU-s, the minimum of {passes} passes (all passes sorted)")
    pieces = [("Arrow's iter_batches", lambda: arrow(False)), ("+ to_pylist", lambda: arrow(True)),
              ("unit_text_lists, no places", lambda: reader(None)),
              ("unit_text_lists, places", lambda: reader(False)),
              ("unit_text_lists, places and CRC-32s", lambda: reader(True)),
              ("+ list_batches, take_kept", lambda: reader(True, True)),
              (f"CRC-32s alone, {crc32.__module__}'s", lambda: [_crc32s(*_offsets(c)) for c in columns])]
    if crc32 is not zlib.crc32:
        view = [(memoryview(_offsets(c)[1]), _offsets(c)[0].tolist()) for c in columns]
        pieces.append(("CRC-32s alone, zlib's", lambda: [[zlib.crc32(v[a:b]) for a, b in zip(o, o[1:])]
                                                        for v, o in view]))
    for name, run in pieces:
        times = []
        for _ in range(passes):
            t0 = time.thread_time()
            run()
            times.append(time.thread_time() - t0)
        print(f"  {name:38s} {min(times):6.3f}  ({', '.join(f'{t:.3f}' for t in sorted(times))})", flush=True)
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    measure_native(chosen, passes)


def measure_native(chosen: list, passes: int) -> None:
    """The reader with tokmix._scan's compiled pass (its strs, their CRC-32s and each non-ASCII str's UTF-8 kept)
    against the reader without it (TOKMIX_NATIVE=0), alternating in one process, by thread CPU: the reading
    path as the stage runs it (places, checksums, batching); and the encoder on a pass's fresh strs from each (its
    first pass warms it), by process CPU (its pool thread's too), with the strs made before the clock starts."""
    from tokmix.sources import Places
    from tokmix.sources.parquet import _native_texts, unit_text_lists
    from tokmix.stages import shared_encoder
    from tokmix.stages.streams import list_batches

    def lists(native: bool) -> list[list]:
        os.environ["TOKMIX_NATIVE"] = "1" if native else "0"
        found = []
        for u in chosen:
            where = Places(checksums=True, kept=True)
            for batch in list_batches(unit_text_lists(u.pieces, "text", "s", [], 1 << 40, where), 1 << 40):
                where.take_kept(len(batch))
                found.append(batch)
        return found

    os.environ.pop("TOKMIX_NATIVE", None)
    if _native_texts() is None:
        print("tokmix._scan's arrow_texts is not built: no compiled pass to compare")
        return
    encoder = shared_encoder(str(WORK / "tokenizer" / "tokenizer.json"), "fastokens")
    for batch in lists(False):  # the warm-up pass
        encoder.encode_batch(batch)
    read: dict[bool, list[float]] = {True: [], False: []}
    encode: dict[bool, list[float]] = {True: [], False: []}
    for p in range(passes):
        for native in (True, False) if p % 2 == 0 else (False, True):
            t0 = time.thread_time()
            work = lists(native)
            read[native].append(time.thread_time() - t0)
            t0 = time.process_time()
            for batch in work:
                encoder.encode_batch(batch)
            encode[native].append(time.process_time() - t0)
            del work
    os.environ.pop("TOKMIX_NATIVE", None)
    for name, got in (("reading path (thread CPU)", read), ("encoder on its strs (process CPU)", encode)):
        new, old = min(got[True]), min(got[False])
        print(f"  {name:38s} compiled {new:6.3f} / without {old:6.3f} s: {100 * (new - old) / old:+.1f}%  "
              f"(compiled {', '.join(f'{t:.3f}' for t in got[True])}; without "
              f"{', '.join(f'{t:.3f}' for t in got[False])})", flush=True)
    print(f"load {os.getloadavg()[0]:.2f} at the end")


def measure_native_stage(total: int, rounds: int, workers: int) -> None:
    """The unit function with tokmix._scan's compiled reading pass and without it (TOKMIX_NATIVE=0), alternating
    in one process (one encoder, warmed by round 0, which is not counted): process CPU per pass (see --native)."""
    from concurrent.futures import ThreadPoolExecutor

    from tokmix.backends import huge_doc_chars
    from tokmix.stages import shared_encoder
    from tokmix.stages.streams import UnitTask, tokenize_unit

    tokenizer = str(WORK / "tokenizer" / "tokenizer.json")
    chosen = units(per_stream(total))
    huge = huge_doc_chars(tokenizer)
    shared_encoder(tokenizer, "fastokens")
    out = Path(tempfile.mkdtemp(prefix="streams-share-native-"))
    cpu: dict[str, list[float]] = {"1": [], "0": []}
    tokens = 0
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="tokmix-worker") as pool:
            for r in range(rounds + 1):
                for mode in ("1", "0") if r % 2 == 0 else ("0", "1"):
                    os.environ["TOKMIX_NATIVE"] = mode
                    tasks = []
                    for u in chosen:
                        folder = out / mode / u.stream
                        folder.mkdir(parents=True, exist_ok=True)
                        tasks.append(UnitTask(u, "text", tokenizer, "fastokens", "<u2", str(folder), None, (), huge,
                                              provenance=True))
                    load, (u0, s0, _), t0 = os.getloadavg()[0], _user_sys(), time.perf_counter()
                    tokens = sum(record["tokens"] for record in pool.map(tokenize_unit, tasks))
                    seconds, (u1, s1, _) = time.perf_counter() - t0, _user_sys()
                    if r:
                        cpu[mode].append(u1 - u0 + s1 - s0)
                    print(f"round {r}{' (warm-up)' if not r else ''}: {'compiled' if mode == '1' else 'without':8s} "
                          f"{tokens / 1e6:.1f}M tokens, CPU {u1 - u0 + s1 - s0:.2f} s (user {u1 - u0:.2f}, sys "
                          f"{s1 - s0:.2f}), {seconds:.2f} s (load {load:.2f} -> {os.getloadavg()[0]:.2f})", flush=True)
                    shutil.rmtree(out / mode)
    finally:
        os.environ.pop("TOKMIX_NATIVE", None)
        shutil.rmtree(out, ignore_errors=True)
    new, old = statistics.median(cpu["1"]), statistics.median(cpu["0"])
    print(f"median CPU compiled {new:.2f} / without {old:.2f} s: {100 * (new - old) / old:+.1f}% "
          f"({1e9 * new / tokens:.1f} / {1e9 * old / tokens:.1f} ns a token); pairs lower with it: "
          f"{sum(a < b for a, b in zip(cpu['1'], cpu['0']))} of {len(cpu['1'])}")


def main() -> None:
    global WORK
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="the full layout's texts, once (see above)")
    ap.add_argument("--work", type=Path, default=WORK, help="bench/fullscale.py's folder (default: %(default)s)")
    ap.add_argument("--pieces", action="store_true", help="the reading pieces by thread CPU (see above)")
    ap.add_argument("--pieces-files", nargs="+", help="parquet files for --pieces")
    ap.add_argument("--passes", type=int, default=7, help="passes of each piece with --pieces (default: %(default)s)")
    ap.add_argument("--native", action="store_true",
                    help="the unit function with and without tokmix._scan's reading pass, alternating (see above)")
    ap.add_argument("--only", choices=("stage", "bare"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ["TOKMIX_BENCH_WORK"] = str(args.work.resolve())  # for the measures' processes
    WORK = args.work.resolve()
    if args.pieces:
        measure_pieces(args.pieces_files or [str(WORK / "corpus" / d / "train_00000.parquet")
                                             for d in ("web", "edu", "code_other")], args.passes)
        return
    if args.native:
        measure_native_stage(args.units, args.rounds, args.workers)
        return
    if args.only:
        done = measure_full(args.only, args.workers) if args.full else measure(args.only, args.units, args.workers)
        print(json.dumps(done))
        return
    rates: dict[str, list[float]] = {"stage": [], "bare": []}
    cpu_per_token: dict[str, list[float]] = {"stage": [], "bare": []}  # the share by CPU: less moved by others' load
    for r in range(args.rounds):
        for kind in ("stage", "bare") if r % 2 == 0 else ("bare", "stage"):
            load = os.getloadavg()[0]
            done = subprocess.run([sys.executable, __file__, "--only", kind, "--units", str(args.units),
                                   "--workers", str(args.workers), *(["--full"] if args.full else [])],
                                  capture_output=True, text=True, check=True)
            m = json.loads(done.stdout)
            rates[kind].append(m["tokens"] / m["seconds"])
            cpu_per_token[kind].append(m["cpu"] / m["tokens"])
            threads = (f"; workers' thread-s on a CPU {m['on_cpu']:.2f}, waiting for one {m['runqueue']:.2f}, "
                       f"blocked {m['blocked']:.2f}" if "on_cpu" in m else "")
            split = (f" (user {m['user']:.2f}, sys {m['sys']:.2f}, {m['page_faults'] / 1e3:,.0f}k page faults)"
                     if "user" in m else "")
            print(f"round {r}: {kind:5s} {m['tokens'] / 1e6:8.1f}M tokens {m['seconds']:6.2f} s "
                  f"{rates[kind][-1] / 1e6:6.2f}M tok/s, CPU {m['cpu']:.2f} s{split}, "
                  f"{m['cpu'] / m['seconds']:.2f} cores{threads} (load {load:.2f} -> {os.getloadavg()[0]:.2f})",
                  flush=True)
    pairs = [s / b for s, b in zip(rates["stage"], rates["bare"])]
    print(f"stage / bare: median {100 * statistics.median(pairs):.1f}% (pairs: "
          f"{', '.join(f'{100 * p:.1f}' for p in pairs)}); medians {statistics.median(rates['stage']) / 1e6:.2f}M / "
          f"{statistics.median(rates['bare']) / 1e6:.2f}M tok/s")
    by_cpu = [b / s for s, b in zip(cpu_per_token["stage"], cpu_per_token["bare"])]
    print(f"by CPU seconds per token, bare / stage: median {100 * statistics.median(by_cpu):.1f}% (pairs: "
          f"{', '.join(f'{100 * p:.1f}' for p in by_cpu)})")


if __name__ == "__main__":
    main()
