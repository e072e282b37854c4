"""The reference script (shared/reference/prepare_tokens.py) run for real on a tokmix recipe's inputs, and the
digests of what it writes: what tests/test_conformance.py compares tokmix with and scripts/record_goldens.py
records into tests/golden/reference/."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tokmix.recipe import Recipe

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"
REFERENCE_PROCESS_SECONDS = 120  # a process of the reference takes seconds on the test corpora
# what the reference records that depends on the machine and the clock, not on its inputs
VOLATILE_KEYS = frozenset({"throughput", "seconds_last_run", "tok_s_end_to_end", "tok_s_tokenizer_capacity"})
# the index.json numbers tokmix must record as the reference does
INDEX_KEYS = ("dtype", "seq_len", "block", "stride", "eot_id", "seed", "blocks", "train_steps", "seqs_per_step",
              "margin_steps")
SHARD_KEYS = ("file", "tokens", "blocks", "tokens_by_stream")
TOTAL_KEYS = ("tokens", "tokens_by_stream", "tokens_by_domain", "share_by_stream", "share_by_domain")


def find_reference() -> Path | None:
    """$TOKMIX_REFERENCE, else shared/reference/prepare_tokens.py beside the repository (where CI lays it) or
    beside one of its parent directories (a git worktree nested deeper); None on a bare clone."""
    if os.environ.get("TOKMIX_REFERENCE"):
        return Path(os.environ["TOKMIX_REFERENCE"])
    for parent in REPO.parents:
        if (parent / "shared" / "reference" / "prepare_tokens.py").is_file():
            return parent / "shared" / "reference" / "prepare_tokens.py"
    return None


REFERENCE = find_reference()

# The reference imports SEED, STREAM_DOMAIN, STREAM_SHARE, STREAMS, file_splits and open_stream from a module
# named `sources`; this one reads the recipe's parquet and JSONL files in the split file's order.
REFERENCE_SOURCES = textwrap.dedent('''
    import copy, fnmatch, json
    from pathlib import Path
    import pyarrow.parquet as pq

    ROOT = Path(__file__).resolve().parents[1]
    SEED = {seed}
    STREAMS = {streams!r}
    STREAM_DOMAIN = {domains!r}
    STREAM_SHARE = {shares!r}
    PATTERNS = {patterns!r}

    def file_splits(path):
        return json.loads(Path(path).read_text())

    def read_texts(path):
        if path.suffix == ".parquet":
            return pq.read_table(path, columns=["text"])["text"].to_pylist()
        lines = path.read_bytes().split(b"\\n")  # only a newline ends a JSON line (U+2028 does not)
        return [json.loads(line)["text"] for line in lines if line.strip()]

    class _Stream:
        def __init__(self, name, files):
            self.files = [f for f in files if any(fnmatch.fnmatch(f, p) for p in PATTERNS[name])]
            self.state = {{"file": 0, "row": 0}}

        def state_dict(self):
            return copy.deepcopy(self.state)

        def load_state_dict(self, state):
            self.state = copy.deepcopy(state)

        def __iter__(self):
            while self.state["file"] < len(self.files):
                texts = read_texts(ROOT / self.files[self.state["file"]])
                while self.state["row"] < len(texts):
                    text = texts[self.state["row"]]
                    self.state["row"] += 1
                    yield {{"text": text}}
                self.state = {{"file": self.state["file"] + 1, "row": 0}}

    def open_stream(name, files):
        return _Stream(name, files)
''')

REFERENCE_MAIN = textwrap.dedent('''
    import sys
    sys.path.insert(0, {scripts!r})
    import prepare_tokens as p

    p.SEQ, p.STEPS, p.SEQS_PER_STEP, p.MARGIN_STEPS = {seq}, {steps}, {seqs}, {margin}
    p.FULL_BLOCKS = (p.STEPS + p.MARGIN_STEPS) * p.SEQS_PER_STEP
    p.STREAM_SLACK, p.HOLDOUT_TOKENS, p.EVAL_WINDOWS = {slack}, {holdout}, {windows}
    p.NUM_PROC = 1
    # the reference tokenizes whole batches only (a stream's last partial batch is never sent), which small
    # test streams would not fill; the batch size changes nothing else in its output
    p.BATCH_DOCS = 1
    if __name__ == "__main__":
        sys.argv = ["prepare_tokens.py", "--shard-tokens", "{shard_tokens}", "--keep-streams"]
        p.main()
''')


def run_reference(root: Path, recipe: Recipe) -> Path:
    """The reference on `recipe`'s inputs, laid out under root as it expects them (root/data/file_splits.json,
    root/tokenizer/tokenizer.json, source paths relative to root), restarted on exit 75 as its run_prepare.sh
    does; returns its output directory, root/data/tokens."""
    scripts = root / "scripts"
    scripts.mkdir()
    shutil.copy(REFERENCE, scripts / "prepare_tokens.py")
    (scripts / "sources.py").write_text(REFERENCE_SOURCES.format(
        seed=recipe.seed, streams=tuple(recipe.streams),
        domains={n: s.domain for n, s in recipe.streams.items()},
        shares={n: s.share for n, s in recipe.streams.items()},
        patterns={n: s.files for n, s in recipe.streams.items()}))
    layout, holdout = recipe.layout, recipe.holdout
    (scripts / "main.py").write_text(REFERENCE_MAIN.format(
        scripts=str(scripts), seq=layout.seq_len, steps=layout.steps, seqs=layout.seqs_per_step,
        margin=layout.margin_steps, slack=layout.stream_slack, holdout=holdout.tokens,
        windows=holdout.eval_windows, shard_tokens=layout.shard_tokens))
    for _ in range(10):
        proc = _reference_process([sys.executable, str(scripts / "main.py")], root)
        if proc is None:  # it hung: started again, it resumes as after an exit 75
            continue
        if proc.returncode == 0:
            return root / "data" / "tokens"
        assert proc.returncode == 75, proc.stdout[-2000:] + proc.stderr[-3000:]
    raise AssertionError("the reference script did not finish in 10 restarts")


def _reference_process(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess | None:
    """One process of the reference, or None if it hung: CPython's Pool.terminate(), which the reference calls
    when a stream reaches its budget, can block for good while the pool's task thread is writing into a full
    pipe (seen once in CI, the process idle in Pool._terminate_pool). It is then killed with its workers."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=REFERENCE_PROCESS_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stable_json(value):
    """A JSON value without what the reference measured about the machine (speeds, seconds)."""
    if isinstance(value, dict):
        return {k: stable_json(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [stable_json(v) for v in value]
    return value


def digests(out: Path) -> dict[str, str]:
    """sha256 of every file under an output directory, by relative path: the bytes of a .bin file; of a JSON
    file, its content less the machine-dependent figures, canonically serialised."""
    result = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".json":
            data = json.dumps(stable_json(json.loads(data)), sort_keys=True).encode()
        result[path.relative_to(out).as_posix()] = hashlib.sha256(data).hexdigest()
    return result


def assert_same_index_numbers(ours: dict, reference: dict) -> None:
    """tokmix's index.json records the reference's numbers: layout, shards, holdouts, totals, streams."""
    for key in INDEX_KEYS:
        assert ours[key] == reference[key], key
    assert len(ours["shards"]) == len(reference["shards"])
    for a, b in zip(ours["shards"], reference["shards"]):
        assert {k: a[k] for k in SHARD_KEYS} == {k: b[k] for k in SHARD_KEYS}
    assert sorted(ours["val"]) == sorted(reference["val"])
    for domain, v in reference["val"].items():
        assert {k: ours["val"][domain][k] for k in v} == v, domain
    for key in TOTAL_KEYS:
        assert ours["total"][key] == reference["total"][key], key
    for name, meta in reference["mix"]["streams"].items():
        assert (ours["mix"]["streams"][name]["tokens"], ours["mix"]["streams"][name]["docs"]) == \
               (meta["tokens"], meta["docs"]), name
