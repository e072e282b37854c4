"""Issue 3's benchmark: tokmix against the reference script (../shared/reference/prepare_tokens.py) on the
bench corpus, stage by stage, with both outputs checked byte for byte, and the tokenizer backend's bare
throughput as the ceiling the streams stage is measured against.

    .venv/bin/python bench/compare_reference.py [--repeat 3] [--corpus bench/work/corpus] [--workers 2]

Build the corpus first (python bench/corpus.py bench/work/corpus). Everything else goes to bench/work/compare/:
  recipe.toml, file_splits.json  the corpus's recipe and split with stream web renamed dclm (domain dclm): the
                                 reference hard-codes DOMAINS = (dclm, edu, code) and reads by_stream["code_py"];
                                 decontaminate = false, so both programs do the same work on the same files
  tokenizer/tokenizer.json       a 32k byte-level BPE trained once on the train files only (--tokenizer-mb of
                                 text, each stream its share), then reused
  runs/reference, runs/tokmix    the last round's outputs (each round starts them afresh; runs/tokmix-again
                                 holds the last of tokmix's further runs)
  results.json                   every round's figures

Each round runs the reference, then `tokmix run --workers N`, then the ceiling and two more tokmix runs. The
reference runs for real as its run_prepare.sh would: a copy of the script in ROOT/scripts/ beside a `sources`
module of ours (the same parquet files in the split file's order, a row group at a time) and a main.py that
patches the recipe's numbers into the module's constants, started again on every exit 75 (holdout and the first
stream in the first process, each further stream in its own, assemble and validate in the last); a process
still running after REFERENCE_PROCESS_SECONDS is killed with its process group and the round's reference run
again from the start. NUM_PROC stays the reference's own max(1, cores - 2). main.py also wraps the four stage
functions to time them; a process's time outside them (interpreter start, imports, loading the tokenizer, the
exit) is "setup". For tokmix the stage seconds are its own tokmix-state/timings.json, and setup is the rest of
the wall time (tokmix's tokenizer stage, which loads the tokenizer and checks the fast backend against HF, the
supervisor and the stage process starting and exiting).

Peak RSS: a thread samples every 50 ms the program's process and all its descendants and sums their RSS (what
both memory guards count: a page shared by two processes counts twice); the peak is kept per stage (the stage
running when sampled) and for the whole run. The ceiling is the chosen backend's (tokmix.backends.choose_backend)
encode_batch on the same text as tokmix's streams stage (each stream's first documents, as many as the round's
index.json says it tokenized), pre-loaded, in tokmix's batches, on every core, as issue 3 measured it: on the
backend's own threads, one call per batch (fastokens' "2 cores: 115M (its own threads)"; larger batches, or all
the text in one call, are no faster). It is the best of three passes, each in a fresh process (a warm fastokens
cache would inflate it up to ~2.5x). Between those passes tokmix runs twice more (outputs checked byte for byte
against its first run), so its streams stage has three samples taken in the same minutes as the ceiling's three:
the target is judged like for like, the best of its three runs against the best pass (and, printed beside it,
the median run against the median pass, and the first run alone against the best pass). A second way is run
as often and printed beside it, not the issue's ceiling but a stricter bar: one thread per core each encoding
whole batches on one backend thread, which is how tokmix's workers call it and on this machine often faster
than the backend's own threads; runs J-U judged the target against the best of both ways' six passes. Peak
RSS targets take every tokmix run. Beside the ceiling, and not
part of it, three passes read the same documents from their parquet files inside the timed pass (Arrow batches of ~1 MiB
decoded to str, then the backend, one thread per core taking row groups in turn): what reading this input costs
any program on top of the bare backend, so tokmix's stage can be told apart from the input's decoding.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pyarrow.parquet as pq

# measured without the token cache (a second run would take its units from it): bench/cache.py measures it
os.environ.setdefault("TOKMIX_CACHE", "off")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "compare"
REFERENCE = HERE.parents[1] / "shared" / "reference" / "prepare_tokens.py"
RENAME = {"web": "dclm"}  # corpus stream or domain name -> the name the reference hard-codes
REFERENCE_STREAMS = {"dclm": "dclm", "edu": "edu", "code_py": "code", "code_other": "code"}
STAGES = ("setup", "holdout", "streams", "assemble", "validate")
TOKMIX_STAGES = ("tokenizer", "holdout", "streams", "assemble", "validate")  # timings.json; tokenizer -> setup
SAMPLE_SECONDS = 0.05
CEILING_PASSES = 3  # cold passes of each way over the stage's text, each in a new process; the ceiling is the best
CEILING_WAYS = {"own threads": "the backend's own threads", "thread per core": "one backend thread per core"}
CEILING_WAY = "own threads"  # issue 3's ceiling; the other way is printed beside it as a stricter bar
# Not part of the ceiling: the same text read from its parquet files inside the timed pass (Arrow batches of
# ~1 MiB decoded to str, then the backend, one thread per core), what any program reading this input must pay
READ_WAY = "read and encode"
RESTART_EXIT_CODE = 75
MAX_REFERENCE_PROCESSES = 20
# One of the reference's processes takes at most ~1.5 minutes here. CPython's Pool.terminate(), which it calls when a
# stream reaches its budget, can block for good (the pool's task thread writing into a full pipe; seen once in
# tests/test_conformance.py): a process still running after this long is killed and the round's reference rerun.
REFERENCE_PROCESS_SECONDS = 900
REFERENCE_ATTEMPTS = 3
MIB = 2**20
TARGETS = {  # issue 3
    "streams_speedup": 30.0,  # tokmix streams tokens/s over the reference's
    "streams_of_ceiling": 0.60,
    "run_speedup": 10.0,
    "assemble_speedup": 3.0,
    "peak_rss": 1 << 30,
    "peak_rss_of_reference": 0.5,
}


# ---------------------------------------------------------------------------- the shared inputs
@dataclass
class Setup:
    """The derived recipe's numbers, as both programs get them."""

    seed: int
    layout: dict
    holdout: dict
    streams: dict[str, tuple[str, float, str]]  # name: (domain, share, folder of its files)
    split: dict[str, dict[str, list[str]]]  # domain: {"holdout": [...], "train": [...]}, absolute paths

    def train_files(self, stream: str) -> list[str]:
        folder = self.streams[stream][2]
        return [f for f in self.split[self.streams[stream][0]]["train"] if str(Path(f).parent) == folder]


def derive(corpus: Path) -> Setup:
    """The corpus's recipe and split with web renamed dclm, as bench/work/compare/{recipe.toml,file_splits.json}."""
    recipe = tomllib.loads((corpus / "bench.toml").read_text())
    split = json.loads((corpus / recipe["holdout"].get("splits", "file_splits.json")).read_text())
    streams = {}
    for name, spec in recipe["streams"].items():
        if spec["files"] != [f"{name}/*.parquet"]:
            sys.exit(f"{corpus}: stream {name}: expected files = [\"{name}/*.parquet\"] (bench/corpus.py's layout)")
        streams[RENAME.get(name, name)] = (RENAME.get(spec["domain"], spec["domain"]), spec["share"],
                                           str((corpus / name).resolve()))
    if {n: d for n, (d, _, _) in streams.items()} != REFERENCE_STREAMS or list(streams) != list(REFERENCE_STREAMS):
        sys.exit(f"{corpus}: the reference needs streams {REFERENCE_STREAMS} in this order, "
                 f"got {list(recipe['streams'])}")
    absolute = {RENAME.get(d, d): {part: [str((corpus / f).resolve()) for f in files] for part, files in v.items()}
                for d, v in split.items()}
    setup = Setup(recipe["seed"], recipe["layout"], recipe["holdout"], streams, absolute)
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "file_splits.json").write_text(json.dumps(absolute, indent=2) + "\n")
    lines = [f"# {corpus / 'bench.toml'} with stream web renamed dclm; written by bench/compare_reference.py",
             f"seed = {setup.seed}", "", "[tokenizer]", 'path = "tokenizer/tokenizer.json"', "", "[layout]"]
    lines += [f"{k} = {v}" for k, v in setup.layout.items()]
    lines += ["", "[holdout]", f"tokens = {setup.holdout['tokens']}", f"eval_windows = {setup.holdout['eval_windows']}",
              'splits = "file_splits.json"', "decontaminate = false"]
    for name, (domain, share, folder) in streams.items():
        lines += ["", f"[streams.{name}]", f'domain = "{domain}"', f"share = {share}",
                  f'files = ["{folder}/*.parquet"]']
    (WORK / "recipe.toml").write_text("\n".join(lines) + "\n")
    return setup


def file_texts(paths: list[str]):
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(columns=["text"]):
            yield from batch.column(0).to_pylist()


def tokenizer_once(setup: Setup, max_mb: float) -> Path:
    """A 32k byte-level BPE (tokmix's trainer: GPT-2 style, <|endoftext|> = 0) on the first max_mb MB of the
    train files, each stream its share; trained once, then reused."""
    from tokmix.tokenizer import train_tokenizer

    path = WORK / "tokenizer" / "tokenizer.json"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)

    def texts():
        for name, (_, share, _) in setup.streams.items():
            left = max_mb * 1e6 * share
            for text in file_texts(setup.train_files(name)):
                if left <= 0:
                    break
                if text:
                    left -= len(text.encode())
                    yield text

    t0 = time.perf_counter()
    train_tokenizer(texts(), 32_000, 2, path)
    print(f"trained a 32k BPE on {max_mb:g} MB of train text in {time.perf_counter() - t0:.0f}s -> {path}", flush=True)
    return path


# ---------------------------------------------------------------------------- peak RSS of a process tree
class TreeSampler(threading.Thread):
    """Every SAMPLE_SECONDS: the summed RSS of `pid` and all its descendants; peaks per stage and overall."""

    def __init__(self, pid: int, stage, peaks: dict[str, int]):
        super().__init__(daemon=True)
        self.proc, self.stage, self.peaks = psutil.Process(pid), stage, peaks
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                tree = [self.proc, *self.proc.children(recursive=True)]
            except psutil.Error:  # the root exited
                return
            rss = 0
            for p in tree:
                try:
                    rss += p.memory_info().rss
                except psutil.Error:  # exited between listing and reading
                    pass
            stage = self.stage()
            self.peaks[stage] = max(self.peaks.get(stage, 0), rss)
            self.done.wait(SAMPLE_SECONDS)

    def stop(self) -> None:
        self.done.set()
        self.join()


def run_sampled(cmd: list[str], cwd: Path, log: Path, stage, peaks: dict[str, int],
                timeout: float | None = None) -> tuple[int | None, float]:
    """Run cmd to the end with its tree sampled; returns (exit code, wall seconds), the code None if it ran past
    `timeout` seconds and was killed with its process group. Output goes to `log`."""
    with open(log, "a") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        sampler = TreeSampler(proc.pid, stage, peaks)
        sampler.start()
        try:
            code = proc.wait(timeout)
        except BaseException as e:  # past the timeout, or Ctrl-C, which its own session does not receive
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            code = None
        wall = time.perf_counter() - t0
        sampler.stop()
    return code, wall


# ---------------------------------------------------------------------------- the reference, for real
REFERENCE_SOURCES = '''
import copy
import json
from pathlib import Path

import pyarrow.parquet as pq


def file_splits(path):
    return json.loads(Path(path).read_text())


class _Stream:
    """The stream's files of a split list in the list's order, a row group at a time; state (file, row)."""

    def __init__(self, name, files):
        self.files = [f for f in files if str(Path(f).parent) == STREAM_DIR[name]]
        self.state = {"file": 0, "row": 0}

    def state_dict(self):
        return copy.deepcopy(self.state)

    def load_state_dict(self, state):
        self.state = copy.deepcopy(state)

    def __iter__(self):
        while self.state["file"] < len(self.files):
            parquet = pq.ParquetFile(self.files[self.state["file"]])
            first = 0
            for g in range(parquet.metadata.num_row_groups):
                rows = parquet.metadata.row_group(g).num_rows
                if first + rows > self.state["row"]:
                    texts = parquet.read_row_group(g, columns=["text"])["text"].to_pylist()
                    for text in texts[self.state["row"] - first:]:
                        self.state["row"] += 1
                        yield {"text": text}
                first += rows
            self.state = {"file": self.state["file"] + 1, "row": 0}


def open_stream(name, files):
    return _Stream(name, files)
'''

REFERENCE_MAIN = '''
import json, os, sys, time
sys.path.insert(0, {scripts!r})
import prepare_tokens as p

p.SEQ, p.STEPS, p.SEQS_PER_STEP, p.MARGIN_STEPS = {seq}, {steps}, {seqs}, {margin}
p.FULL_BLOCKS = (p.STEPS + p.MARGIN_STEPS) * p.SEQS_PER_STEP
p.STREAM_SLACK, p.HOLDOUT_TOKENS, p.EVAL_WINDOWS = {slack}, {holdout}, {windows}
p.NUM_PROC = max(1, (os.cpu_count() or 3) - 2)  # the reference's own default
MARK, TIMES = {mark!r}, {times!r}


def timed(stage, fn):
    """The stage function, with the stage marked for the RSS sampler and its seconds appended to TIMES."""
    def wrapper(*args, **kwargs):
        with open(MARK, "w") as f:
            f.write(stage)
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        with open(TIMES, "a") as f:
            f.write(json.dumps({{"stage": stage, "seconds": time.perf_counter() - t0}}) + "\\n")
        with open(MARK, "w") as f:
            f.write("setup")
        return result
    return wrapper


p.build_holdout = timed("holdout", p.build_holdout)
p.tokenize_stream = timed("streams", p.tokenize_stream)
p.assemble = timed("assemble", p.assemble)
p.validate = timed("validate", p.validate)
if __name__ == "__main__":
    sys.argv = ["prepare_tokens.py", "--shard-tokens", "{shard_tokens}"]
    p.main()
'''


def prepare_reference(setup: Setup, tokenizer: Path, root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    scripts = root / "scripts"
    scripts.mkdir(parents=True)
    shutil.copy(REFERENCE, scripts / "prepare_tokens.py")
    header = (f"SEED = {setup.seed!r}\nSTREAMS = {tuple(setup.streams)!r}\n"
              f"STREAM_DOMAIN = {({n: d for n, (d, _, _) in setup.streams.items()})!r}\n"
              f"STREAM_SHARE = {({n: s for n, (_, s, _) in setup.streams.items()})!r}\n"
              f"STREAM_DIR = {({n: f for n, (_, _, f) in setup.streams.items()})!r}\n")
    (scripts / "sources.py").write_text(header + REFERENCE_SOURCES)
    lay, hold = setup.layout, setup.holdout
    (scripts / "main.py").write_text(REFERENCE_MAIN.format(
        scripts=str(scripts), seq=lay["seq_len"], steps=lay["steps"], seqs=lay["seqs_per_step"],
        margin=lay["margin_steps"], slack=lay["stream_slack"], holdout=hold["tokens"], windows=hold["eval_windows"],
        shard_tokens=lay["shard_tokens"], mark=str(root / "bench-stage.txt"), times=str(root / "bench-times.jsonl")))
    (root / "tokenizer").mkdir()
    shutil.copy(tokenizer, root / "tokenizer" / "tokenizer.json")
    (root / "data").mkdir()
    shutil.copy(WORK / "file_splits.json", root / "data" / "file_splits.json")


class ReferenceHung(Exception):
    """A process of the reference ran past REFERENCE_PROCESS_SECONDS and was killed."""


def run_reference(root: Path) -> dict:
    """Processes started again on exit 75 until one exits 0; seconds per stage, peaks, output dir."""
    mark, peaks = root / "bench-stage.txt", {}
    log = root / "reference.log"
    walls = []
    while True:
        if len(walls) == MAX_REFERENCE_PROCESSES:
            sys.exit(f"the reference did not finish in {MAX_REFERENCE_PROCESSES} processes; see {log}")
        mark.write_text("setup")
        code, wall = run_sampled([sys.executable, str(root / "scripts" / "main.py")], root, log,
                                 lambda: _read_mark(mark), peaks, REFERENCE_PROCESS_SECONDS)
        if code is None:
            raise ReferenceHung(f"a reference process was still running after {REFERENCE_PROCESS_SECONDS}s "
                                f"(stage {_read_mark(mark)}) and was killed")
        walls.append(wall)
        if code == 0:
            break
        if code != RESTART_EXIT_CODE:
            sys.exit(f"the reference exited with {code}; see {log}:\n" + log.read_text()[-3000:])
    seconds = dict.fromkeys(STAGES, 0.0)
    for line in (root / "bench-times.jsonl").read_text().splitlines():
        entry = json.loads(line)
        seconds[entry["stage"]] += entry["seconds"]
    seconds["setup"] = sum(walls) - sum(seconds.values())
    return {"seconds": seconds, "wall": sum(walls), "processes": len(walls), "peaks": peaks,
            "out": str(root / "data" / "tokens")}


def _read_mark(path: Path) -> str:
    try:
        return path.read_text() or "setup"
    except OSError:
        return "setup"


# ---------------------------------------------------------------------------- tokmix
def _tokmix_stage(timings: Path):
    """The stage tokmix is in: the first one timings.json has no entry for yet (it records each as it ends)."""

    def stage() -> str:
        try:
            done = json.loads(timings.read_text())
        except (OSError, ValueError):
            done = {}
        current = next((s for s in TOKMIX_STAGES if s not in done), "setup")
        return "setup" if current == "tokenizer" else current

    return stage


def run_tokmix(out: Path, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    log, peaks = out.parent / "tokmix.log", {}
    log.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "tokmix.cli", "run", str(WORK / "recipe.toml"), "--out", str(out),
           "--workers", str(workers)]
    timings = out / "tokmix-state" / "timings.json"
    code, wall = run_sampled(cmd, HERE.parent, log, _tokmix_stage(timings), peaks)
    if code != 0:
        sys.exit(f"tokmix exited with {code}; see {log}:\n" + log.read_text()[-3000:])
    recorded = json.loads(timings.read_text())
    seconds = {s: recorded.get(s, 0.0) for s in STAGES}
    seconds["setup"] = wall - sum(recorded.get(s, 0.0) for s in STAGES[1:])
    restarts = log.read_text().count("restarting the stage process")
    return {"seconds": seconds, "wall": wall, "tokenizer_stage": recorded.get("tokenizer", 0.0),
            "restarts": restarts, "peaks": peaks, "out": str(out)}


def run_tokmix_again(first_out: Path, workers: int, peaks: list[int]) -> float:
    """One more tokmix run of the round, its outputs checked byte for byte against the round's first run's;
    appends its peak RSS to `peaks` and returns its streams stage's seconds."""
    again = run_tokmix(WORK / "runs" / "tokmix-again", workers)
    same, detail = same_outputs(first_out, Path(again["out"]))
    if not same:
        sys.exit(f"two tokmix runs of one round wrote different outputs: {detail}")
    peaks.append(max(again["peaks"].values()))
    return again["seconds"]["streams"]


# ---------------------------------------------------------------------------- the ceiling
def ceiling_pass(tokenizer: Path, backend: str, docs: dict[str, list], way: str) -> dict:
    """In this fresh process: one pass of the backend, on every core, over the pre-loaded documents (`docs`:
    stream -> [its train files, how many of their documents]), one of CEILING_WAYS (or READ_WAY, which reads
    them inside the pass). One pass per process because fastokens caches what it encoded (on this corpus a
    second pass over the same text runs ~1.7x faster, a third ~2.5x) and the streams stage never sees a
    document twice."""
    from tokmix.backends import make_encoder
    from tokmix.sources import batches

    cores = os.cpu_count() or 1
    if way == READ_WAY:
        return _read_and_encode_pass(tokenizer, backend, docs, cores)
    texts = [t for files, n in docs.values() for t in itertools.islice(filter(None, file_texts(files)), n)]
    # the first encoder of the process sizes the thread pools
    encoder = make_encoder(tokenizer, backend, cores if way == "own threads" else 1)
    encoder.encode_batch(["warm up the thread pools"])
    todo = batches(iter(texts))
    if way == "own threads":
        t0 = time.perf_counter()
        tokens = sum(encoder.encode_batch(batch)[0].size for batch in todo)
        return {"tokens": tokens, "seconds": time.perf_counter() - t0}
    return _run_lanes(list(todo), lambda batch: encoder.encode_batch(batch)[0].size, cores)


def _run_lanes(items: list, work, cores: int) -> dict:
    """`cores` threads taking `items` in order, each adding up the tokens `work(item)` returns; timed."""
    todo, lock, counts = items[::-1], threading.Lock(), []  # pop() from the end: items in order

    def lane() -> None:
        n = 0
        while True:
            with lock:
                item = todo.pop() if todo else None
            if item is None:
                counts.append(n)
                return
            n += work(item)

    lanes = [threading.Thread(target=lane) for _ in range(cores)]
    t0 = time.perf_counter()
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()
    return {"tokens": sum(counts), "seconds": time.perf_counter() - t0}


def _row_group_tasks(docs: dict[str, list]) -> list[tuple[str, int, int, int]]:
    """(file, row group, Arrow batch rows for ~1 MiB of text, non-empty documents to take) for each stream's
    first documents, counted here, outside the timed pass."""
    import pyarrow.compute as pc

    tasks = []
    for files, n in docs.values():
        for path in files:
            pf = pq.ParquetFile(path)
            for group in range(pf.num_row_groups):
                if n <= 0:
                    break
                column = pf.read_row_group(group, columns=["text"]).column(0)
                take = min(n, pc.sum(pc.greater(pc.binary_length(column), 0)).as_py() or 0)
                size = max(1, pf.metadata.row_group(group).column(0).total_uncompressed_size)
                tasks.append((path, group, max(1, len(column) * (1 << 20) // size), take))
                n -= take
    return tasks


def _read_and_encode_pass(tokenizer: Path, backend: str, docs: dict[str, list], cores: int) -> dict:
    """READ_WAY: one thread per core, each taking the next row group, decoding it to str in ~1 MiB Arrow
    batches and encoding them in tokmix's batches on one backend thread."""
    from tokmix.backends import make_encoder
    from tokmix.sources import batches

    encoder = make_encoder(tokenizer, backend, 1)
    encoder.encode_batch(["warm up the thread pools"])

    def texts(path: str, group: int, rows: int, take: int):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=rows, row_groups=[group], columns=["text"],
                                                       use_threads=False):
            for text in filter(None, batch.column(0).to_pylist()):
                if take == 0:
                    return
                take -= 1
                yield text

    def encode(task: tuple[str, int, int, int]) -> int:
        return sum(encoder.encode_batch(batch)[0].size for batch in batches(texts(*task)))

    return _run_lanes(_row_group_tasks(docs), encode, cores)


def run_ceiling(setup: Setup, tokenizer: Path, backend: str, index: dict, tokmix_again) -> dict:
    """The best of CEILING_PASSES cold passes of each of CEILING_WAYS, alternating, each in its own process,
    over the documents the streams stage tokenized (`index`: tokmix's index.json of the round). Between them,
    `tokmix_again()` runs tokmix CEILING_PASSES - 1 more times and returns its streams stage's seconds, so the
    stage has as many samples, taken in the same minutes, as each way of the ceiling."""
    docs = {name: [setup.train_files(name), meta["docs"]] for name, meta in index["mix"]["streams"].items()}
    passes: dict[str, list[float]] = {way: [] for way in (*CEILING_WAYS, READ_WAY)}
    tokens, stage_seconds = set(), []
    for k in range(CEILING_PASSES):
        for way in passes:
            cmd = [sys.executable, __file__, "--ceiling", str(tokenizer), backend, json.dumps(docs), way]
            one = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            passes[way].append(one["tokens"] / one["seconds"])
            tokens.add(one["tokens"])
        if k < CEILING_PASSES - 1:
            stage_seconds.append(tokmix_again())
    if len(tokens) != 1:
        sys.exit(f"the ceiling's passes encoded different token counts: {sorted(tokens)}")
    read = passes.pop(READ_WAY)
    every = [p for way in passes.values() for p in way]
    return {"backend": backend, "threads": os.cpu_count() or 1, "tokens": tokens.pop(), "passes": passes,
            "tok_s": max(passes[CEILING_WAY]), "median_tok_s": statistics.median(passes[CEILING_WAY]),
            "either_tok_s": max(every), "read_passes": read, "read_tok_s": max(read),
            "more_stage_seconds": stage_seconds}


def chosen_backend(setup: Setup, tokenizer: Path) -> str:
    """What tokmix's auto choice picks for this tokenizer and the first documents of each stream (here, not in
    the ceiling's process: the check's encoders would size that process's thread pools first)."""
    from tokmix.backends import choose_backend

    sample = [t for name in setup.streams for t, _ in zip(file_texts(setup.train_files(name)), range(64))]
    backend, notices = choose_backend(tokenizer, "auto", sample)
    for notice in notices:
        print(f"  {notice}")
    return backend


# ---------------------------------------------------------------------------- checking and reporting
def same_outputs(a: Path, b: Path) -> tuple[bool, str]:
    """val_*.bin and train_*.bin of two output directories compared byte for byte."""
    names = sorted(p.name for p in a.glob("*.bin"))
    if names != sorted(p.name for p in b.glob("*.bin")):
        return False, f"different files: {names} vs {sorted(p.name for p in b.glob('*.bin'))}"
    differ = [n for n in names if (a / n).read_bytes() != (b / n).read_bytes()]
    vals, trains = sum(n.startswith("val_") for n in names), sum(n.startswith("train_") for n in names)
    if differ:
        return False, f"{len(differ)} of {len(names)} files differ: {', '.join(differ)}"
    return True, f"{vals} val + {trains} train files, {sum((a / n).stat().st_size for n in names) / MIB:,.0f} MiB"


def stage_tokens(index: dict) -> dict[str, int]:
    """Tokens each stage delivers (the same for both programs: their outputs are identical)."""
    train = index["total"]["tokens"]
    return {"setup": 0, "holdout": sum(v["tokens"] for v in index["val"].values()),
            "streams": sum(m["tokens"] for m in index["mix"]["streams"].values()),
            "assemble": train, "validate": train, "whole run": train}


def round_figures(ref: dict, tok: dict, ceil: dict, tokens: dict[str, int]) -> dict:
    rows = {}
    for stage in (*STAGES, "whole run"):
        r_s = ref["wall"] if stage == "whole run" else ref["seconds"][stage]
        t_s = tok["wall"] if stage == "whole run" else tok["seconds"][stage]
        r_m = max(ref["peaks"].values()) if stage == "whole run" else ref["peaks"].get(stage, 0)
        t_m = max(tok["peaks"].values()) if stage == "whole run" else tok["peaks"].get(stage, 0)
        rows[stage] = {"tokens": tokens[stage], "ref_s": r_s, "tok_s": t_s, "ref_rss": r_m, "tok_rss": t_m,
                       "speedup": r_s / t_s if t_s > 0 else float("inf"),
                       "rss_ratio": t_m / r_m if r_m else float("nan")}
    streams = tokens["streams"] / tok["seconds"]["streams"]
    samples = [tokens["streams"] / s for s in (tok["seconds"]["streams"], *ceil["more_stage_seconds"])]
    return {"rows": rows, "ceiling": ceil, "stage_samples": samples,
            "streams_of_ceiling": max(samples) / ceil["tok_s"],
            "streams_of_median_ceiling": statistics.median(samples) / ceil["median_tok_s"],
            "first_run_of_ceiling": streams / ceil["tok_s"],
            "streams_of_either_way": max(samples) / ceil["either_tok_s"],
            "streams_of_read": max(samples) / ceil["read_tok_s"]}


def _rate(tokens: float, seconds: float) -> str:
    if not tokens or seconds <= 0:
        return "-"
    rate = tokens / seconds
    return f"{rate / 1e6:,.2f}M" if rate >= 1e6 else f"{rate / 1e3:,.0f}k"


def print_table(title: str, rows: dict) -> None:
    """Seconds, tokens/s and peak RSS of the process tree per stage for both programs, and their ratios."""
    print(f"\n{title}")
    print(f"{'':18}| {'reference':^26} | {'tokmix':^26} | {'tokmix vs reference':^19}")
    head = (f"{'stage':<10} {'tokens':>6} | {'s':>7} {'tok/s':>8} {'peak MiB':>9} | {'s':>7} {'tok/s':>8} "
            f"{'peak MiB':>9} | {'speedup':>8} {'RSS':>9}")
    print(head)
    print("-" * len(head))
    for stage, r in rows.items():
        if stage == "whole run":
            print("-" * len(head))
        tokens = f"{r['tokens'] / 1e6:.1f}M" if r["tokens"] else "-"
        print(f"{stage:<10} {tokens:>6} | {r['ref_s']:>7.2f} {_rate(r['tokens'], r['ref_s']):>8} "
              f"{r['ref_rss'] / MIB:>9,.0f} | {r['tok_s']:>7.2f} {_rate(r['tokens'], r['tok_s']):>8} "
              f"{r['tok_rss'] / MIB:>9,.0f} | {r['speedup']:>7.1f}x {r['rss_ratio']:>8.2f}x")


def median_rows(rounds: list[dict]) -> dict:
    """Every cell the median over rounds; ratios are the medians of each round's own ratio."""
    rows = {}
    for stage in rounds[0]["rows"]:
        cells = [r["rows"][stage] for r in rounds]
        rows[stage] = {k: statistics.median(c[k] for c in cells) for k in cells[0]}
    return rows


def print_targets(rounds: list[dict]) -> None:
    """Issue 3's targets against the medians of the per-round ratios (each round's runs were back to back); peak
    RSS over every tokmix run. The streams stage against the ceiling is judged like for like: the best of the
    round's tokmix runs against the best of the ceiling's passes (as many)."""
    med = median_rows(rounds)
    of_ceiling = statistics.median(r["streams_of_ceiling"] for r in rounds)
    run = med["whole run"]
    peak = max(r["tokmix_peak_all_runs"] for r in rounds)  # every tokmix run of every round
    rss_ratio = statistics.median(r["tokmix_peak_all_runs"] / r["rows"]["whole run"]["ref_rss"] for r in rounds)
    checks = [
        ("streams tokens/s vs reference", f"{med['streams']['speedup']:.1f}x",
         f">= {TARGETS['streams_speedup']:g}x", med["streams"]["speedup"] >= TARGETS["streams_speedup"]),
        ("streams tokens/s vs ceiling", f"{100 * of_ceiling:.0f}%", f">= {100 * TARGETS['streams_of_ceiling']:.0f}%",
         of_ceiling >= TARGETS["streams_of_ceiling"]),
        ("whole run vs reference", f"{run['speedup']:.1f}x", f">= {TARGETS['run_speedup']:g}x",
         run["speedup"] >= TARGETS["run_speedup"]),
        ("assemble vs reference", f"{med['assemble']['speedup']:.1f}x", f">= {TARGETS['assemble_speedup']:g}x",
         med["assemble"]["speedup"] >= TARGETS["assemble_speedup"]),
        ("tokmix peak RSS (any run)", f"{peak / MIB:,.0f} MiB", f"<= {TARGETS['peak_rss'] / MIB:,.0f} MiB",
         peak <= TARGETS["peak_rss"]),
        ("tokmix / reference peak RSS", f"{rss_ratio:.2f}x", f"<= {TARGETS['peak_rss_of_reference']:.2f}x",
         rss_ratio <= TARGETS["peak_rss_of_reference"]),
    ]
    print("\nissue 3 targets (medians over the rounds)")
    for label, value, target, ok in checks:
        print(f"  {label:<30} {value:>9}   target {target:<13} {'met' if ok else 'MISSED'}")
    lowest = min(r["streams_of_ceiling"] for r in rounds)
    typical = statistics.median(r["streams_of_median_ceiling"] for r in rounds)
    first = statistics.median(r["first_run_of_ceiling"] for r in rounds)
    print(f"  (streams vs ceiling: the best of tokmix's runs against the best of the ceiling's passes, lowest "
          f"round {100 * lowest:.0f}%; median run vs median pass {100 * typical:.0f}%; the round's first run alone "
          f"vs the best pass {100 * first:.0f}%)")
    either = [r["streams_of_either_way"] for r in rounds]
    print(f"  (streams vs the stricter bar, the best pass of either way, {CEILING_WAYS['thread per core']} "
          f"included: {100 * statistics.median(either):.0f}%, lowest round {100 * min(either):.0f}%)")
    read = statistics.median(r["streams_of_read"] for r in rounds)
    print(f"  (streams vs reading the parquet and encoding, bare, best against best: {100 * read:.0f}%)")


# ---------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds of reference, tokmix, ceiling (default 3)")
    ap.add_argument("--corpus", type=Path, default=HERE / "work" / "corpus", help="bench/corpus.py's output")
    ap.add_argument("--workers", type=int, default=2, help="tokmix run --workers (default 2)")
    ap.add_argument("--tokenizer-mb", type=float, default=40.0, help="MB of train text the tokenizer learns from")
    ap.add_argument("--ceiling", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ceiling:
        tokenizer, backend, docs, way = args.ceiling
        print(json.dumps(ceiling_pass(Path(tokenizer), backend, json.loads(docs), way)))
        return
    if not (args.corpus / "bench.toml").exists():
        sys.exit(f"{args.corpus}: no bench.toml; build the corpus first: python bench/corpus.py {args.corpus}")

    t_start = time.perf_counter()
    setup = derive(args.corpus)
    tokenizer = tokenizer_once(setup, args.tokenizer_mb)
    backend = chosen_backend(setup, tokenizer)
    cores, mem = os.cpu_count(), psutil.virtual_memory().total / 2**30
    print(f"{cores} cores, {mem:.0f} GiB; reference NUM_PROC {max(1, (cores or 3) - 2)}, tokmix --workers "
          f"{args.workers}, backend {backend}; corpus {args.corpus}", flush=True)

    rounds = []
    for k in range(1, args.repeat + 1):
        load = os.getloadavg()
        print(f"\n--- round {k} of {args.repeat}: reference (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})",
              flush=True)
        ref = None
        for attempt in range(1, REFERENCE_ATTEMPTS + 1):
            prepare_reference(setup, tokenizer, WORK / "runs" / "reference")
            try:
                ref = run_reference(WORK / "runs" / "reference")
                break
            except ReferenceHung as e:
                print(f"--- round {k}: {e} (attempt {attempt} of {REFERENCE_ATTEMPTS})", flush=True)
        if ref is None:
            sys.exit(f"the reference hung in every attempt of round {k}; see {WORK / 'runs' / 'reference'}")
        print(f"--- round {k}: tokmix ({ref['wall']:.0f}s for the reference, {ref['processes']} processes)", flush=True)
        tok = run_tokmix(WORK / "runs" / "tokmix", args.workers)
        print(f"--- round {k}: ceiling, and tokmix {CEILING_PASSES - 1} more times ({tok['wall']:.1f}s for tokmix)",
              flush=True)
        index = json.loads((Path(tok["out"]) / "index.json").read_text())
        more_peaks: list[int] = []
        ceil = run_ceiling(setup, tokenizer, backend, index,
                           functools.partial(run_tokmix_again, Path(tok["out"]), args.workers, more_peaks))
        identical, detail = same_outputs(Path(ref["out"]), Path(tok["out"]))
        figures = round_figures(ref, tok, ceil, stage_tokens(index))
        figures.update(identical=identical, detail=detail, load_before=load, reference=ref, tokmix=tok,
                       tokmix_peak_all_runs=max(max(tok["peaks"].values()), *more_peaks))
        rounds.append(figures)
        print_table(f"round {k}: reference (NUM_PROC {max(1, (cores or 3) - 2)}) vs tokmix (--workers {args.workers})",
                    figures["rows"])
        print(f"outputs byte-identical: {'yes' if identical else 'NO'} ({detail})")
        print(f"tokmix setup {tok['seconds']['setup']:.2f}s, of which its tokenizer stage (load, backend check) "
              f"{tok['tokenizer_stage']:.2f}s; memory-guard restarts {tok['restarts']}")
        ways = "; ".join(f"{CEILING_WAYS[way]} {', '.join(f'{p / 1e6:.1f}M' for p in passes)}"
                         for way, passes in ceil["passes"].items())
        stage = ", ".join(f"{p / 1e6:.1f}M" for p in figures["stage_samples"])
        print(f"ceiling: {ceil['backend']} on {ceil['threads']} cores {ceil['tok_s'] / 1e6:,.2f}M tok/s, the best cold "
              f"pass on {CEILING_WAYS[CEILING_WAY]} ({ways}); tokmix's streams stage in its "
              f"{len(figures['stage_samples'])} runs {stage}: the best at {100 * figures['streams_of_ceiling']:.0f}% "
              f"of the best pass, the median at {100 * figures['streams_of_median_ceiling']:.0f}% of the median pass "
              f"({ceil['median_tok_s'] / 1e6:,.2f}M); the first run at {100 * figures['first_run_of_ceiling']:.0f}% "
              f"of the best pass; the best at {100 * figures['streams_of_either_way']:.0f}% of the best pass of "
              f"either way ({ceil['either_tok_s'] / 1e6:,.2f}M)")
        read = ", ".join(f"{p / 1e6:.1f}M" for p in ceil["read_passes"])
        print(f"reading the parquet and encoding, bare (one thread per core): {ceil['read_tok_s'] / 1e6:,.2f}M "
              f"tok/s, the best of {read}; tokmix's best run at {100 * figures['streams_of_read']:.0f}% of it; "
              f"tokmix peak RSS over its runs {figures['tokmix_peak_all_runs'] / MIB:,.0f} MiB")
        (WORK / "results.json").write_text(json.dumps(rounds, indent=2))

    print_table(f"median of {len(rounds)} rounds (each cell and each ratio the median over the rounds)",
                median_rows(rounds))
    ceilings = [r["ceiling"]["tok_s"] for r in rounds]
    print(f"ceiling ({backend} on {CEILING_WAYS[CEILING_WAY]}, {cores} cores): median "
          f"{statistics.median(ceilings) / 1e6:,.2f}M tok/s "
          f"(rounds: {', '.join(f'{c / 1e6:.2f}M' for c in ceilings)})")
    print(f"outputs byte-identical in every round: {'yes' if all(r['identical'] for r in rounds) else 'NO'}")
    print_targets(rounds)
    print(f"\nbenchmark wall time {time.perf_counter() - t_start:,.0f}s; figures in {WORK / 'results.json'}")
    if not all(r["identical"] for r in rounds):
        sys.exit(1)


if __name__ == "__main__":
    main()
