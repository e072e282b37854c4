"""Guarantee 1: from the same files, split, tokenizer, recipe numbers and seed, tokmix writes val_*.bin and
train_*.bin byte-identical to the reference script (../shared/reference/prepare_tokens.py), run here for
real on a small corpus through a `sources` module of the test's own."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.corpus import HOLDOUT, LAYOUT, STREAMS, make_corpus, train_test_tokenizer, write_recipe, write_split

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "prepare_tokens.py"
REFERENCE_PROCESS_SECONDS = 120  # a process of the reference takes seconds on the test corpus

# The reference imports SEED, STREAM_DOMAIN, STREAM_SHARE, STREAMS, file_splits and open_stream from a
# module named `sources`; this one reads the same parquet files in the split file's order.
REFERENCE_SOURCES = textwrap.dedent('''
    import copy, fnmatch, json
    from pathlib import Path
    import pyarrow.parquet as pq

    ROOT = Path(__file__).resolve().parents[1]
    SEED = 1234
    STREAMS = {streams!r}
    STREAM_DOMAIN = {domains!r}
    STREAM_SHARE = {shares!r}

    def file_splits(path):
        return json.loads(Path(path).read_text())

    class _Stream:
        def __init__(self, name, files):
            self.files = [f for f in files if fnmatch.fnmatch(f, f"corpus/{{name}}/*.parquet")]
            self.state = {{"file": 0, "row": 0}}

        def state_dict(self):
            return copy.deepcopy(self.state)

        def load_state_dict(self, state):
            self.state = copy.deepcopy(state)

        def __iter__(self):
            while self.state["file"] < len(self.files):
                texts = pq.read_table(ROOT / self.files[self.state["file"]], columns=["text"])["text"].to_pylist()
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
    if __name__ == "__main__":
        sys.argv = ["prepare_tokens.py", "--shard-tokens", "{shard_tokens}", "--keep-streams"]
        p.main()
''')


def run_reference(root: Path) -> Path:
    """The reference script, restarted on exit 75 as its run_prepare.sh does; returns its output dir."""
    scripts = root / "scripts"
    scripts.mkdir()
    shutil.copy(REFERENCE, scripts / "prepare_tokens.py")
    (scripts / "sources.py").write_text(REFERENCE_SOURCES.format(
        streams=tuple(STREAMS), domains={n: d for n, (d, _) in STREAMS.items()},
        shares={n: s for n, (_, s) in STREAMS.items()}))
    (scripts / "main.py").write_text(REFERENCE_MAIN.format(
        scripts=str(scripts), seq=LAYOUT["seq_len"], steps=LAYOUT["steps"], seqs=LAYOUT["seqs_per_step"],
        margin=LAYOUT["margin_steps"], slack=LAYOUT["stream_slack"], holdout=HOLDOUT["tokens"],
        windows=HOLDOUT["eval_windows"], shard_tokens=LAYOUT["shard_tokens"]))
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


@pytest.fixture(scope="module")
def twin_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("conformance")
    files = make_corpus(root)
    write_split(root, files)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    reference_out = run_reference(root)
    recipe = write_recipe(root, "tokenizer/tokenizer.json", decontaminate=False)
    out = root / "tokmix-out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out),
                           "--workers", "2"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return reference_out, out


def test_every_output_file_is_byte_identical_to_the_reference(twin_runs):
    reference_out, out = twin_runs
    names = sorted(p.name for p in reference_out.glob("*.bin"))
    assert [n for n in names if n.startswith("train_")] == ["train_000.bin", "train_001.bin", "train_002.bin",
                                                            "train_003.bin"]
    assert {"val_dclm.bin", "val_edu.bin", "val_code.bin"} <= set(names)
    assert sorted(p.name for p in out.glob("*.bin")) == names
    for name in names:
        assert (out / name).read_bytes() == (reference_out / name).read_bytes(), name


def test_index_records_the_same_numbers_as_the_reference(twin_runs):
    import json

    reference, ours = (json.loads((d / "index.json").read_text()) for d in twin_runs)
    for key in ("dtype", "seq_len", "block", "stride", "eot_id", "seed", "blocks", "train_steps", "seqs_per_step",
                "margin_steps"):
        assert ours[key] == reference[key], key
    for a, b in zip(ours["shards"], reference["shards"]):
        assert {k: a[k] for k in ("file", "tokens", "blocks", "tokens_by_stream")} == \
               {k: b[k] for k in ("file", "tokens", "blocks", "tokens_by_stream")}
    for domain, v in reference["val"].items():
        assert {k: ours["val"][domain][k] for k in v} == v, domain
    for key in ("tokens", "tokens_by_stream", "tokens_by_domain", "share_by_stream", "share_by_domain"):
        assert ours["total"][key] == reference["total"][key], key
    for name, meta in reference["mix"]["streams"].items():
        assert (ours["mix"]["streams"][name]["tokens"], ours["mix"]["streams"][name]["docs"]) == \
               (meta["tokens"], meta["docs"])
