"""tokmix.status after a finished run and after a run killed mid-stream (from files alone), and tokmix.inspect's
tables and decoded blocks against the tokenizer's own decoding of the shard slice."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
from rich.console import Console
from tokenizers import Tokenizer

from tests.conftest import demo_copy
from tests.pausing import wait_for_pause
from tests.test_plan import TRAINED, recipe_variant
from tokmix.errors import TokmixError
from tokmix.inspect import DOC_MARKER, read_block, read_window, render_block, summary
from tokmix.recipe import load_recipe
from tokmix.runner import run
from tokmix.shards import EOT_TOKEN, read_index
from tokmix.status import render_status, status
from tokmix.tokens import read_tokens

PAUSE_SECONDS = 120  # how long the run may take to reach code_py on a loaded machine


@pytest.fixture(scope="module")
def demo(tmp_path_factory, demo_inputs) -> tuple[Path, Path]:
    """(the demo recipe with a tokenizer trained beforehand (tests/conftest.py's demo_inputs), its finished run)"""
    root = tmp_path_factory.mktemp("inspect")
    trained, tokenizer = demo_copy(demo_inputs, root)
    recipe = recipe_variant(trained, "given.toml", {TRAINED: f'[tokenizer]\npath = "{tokenizer}"\n'})
    out = root / "run"
    run(load_recipe(recipe), out, workers=2)
    return recipe, out


def _text(renderable) -> str:
    console = Console(record=True, width=160)
    console.print(renderable)
    return console.export_text()


def test_status_of_a_finished_run(demo):
    recipe, out = demo
    st = status(out)
    assert st.complete and st.validated and not st.running and st.lock is None
    assert all(s.done and s.tokens >= s.budget for s in st.streams.values())
    assert st.holdouts == {"prose": 20_001, "code": 20_001}
    assert len(st.shards_written) == len(st.shards_planned) == 4
    assert st.remaining() == []
    assert "complete and validated" in _text(render_status(st))


def test_status_of_a_run_killed_mid_stream(demo, tmp_path):
    """kill -9 of the whole run while code_py is being tokenized: the stage process stands paused just after
    code_py's first unit is committed (tokmix.faults, `streams:after-unit@code_py:1:pause`) and says so through
    a FIFO, so status is read and the kill lands at that moment, whatever the machine's speed."""
    recipe, _ = demo
    out, fifo = tmp_path / "killed", tmp_path / "paused"
    os.mkfifo(fifo)
    env = {**os.environ, "TOKMIX_FAULT": "streams:after-unit@code_py:1:pause", "TOKMIX_PAUSE_FIFO": str(fifo)}
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out),
                                 "--workers", "1"], env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=err)
    try:
        paused = wait_for_pause(fifo, lambda: proc.poll() is None, PAUSE_SECONDS)
        assert paused, stderr.read_text() if proc.poll() is not None else f"no pause within {PAUSE_SECONDS} s"
        live = status(out)
        assert live.running and live.lock[1] == proc.pid
        assert "running: pid" in _text(render_status(live))
    finally:
        stage = psutil.Process(proc.pid).children(recursive=True)  # the stage process holds the lock too
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        psutil.wait_procs(stage, timeout=60)

    st = status(out)
    assert not st.running and st.lock is not None  # the killed run's lock is left behind, stale
    assert not st.validated and not st.complete
    assert st.holdouts["prose"] == st.holdouts["code"] == 20_001
    code_py = st.streams["code_py"]
    assert not code_py.done and code_py.units >= 1 and 0 < code_py.tokens < code_py.budget
    assert st.shards_written == []
    remaining = st.remaining()
    assert "stream code_py (" in "; ".join(remaining) and remaining[-2:] == ["4 shard(s)", "validate"]
    shown = _text(render_status(st))
    assert "stale lock" in shown and "in progress" in shown and "remaining: stream " in shown


def test_status_of_a_directory_without_a_run(tmp_path):
    with pytest.raises(TokmixError, match="no tokmix run here"):
        status(tmp_path)


def test_summary_shows_the_mix_holdouts_and_checksums(demo):
    _, out = demo
    shown = _text(summary(out))
    index = read_index(out)
    assert "requested" in shown and "realized" in shown and "val_prose.bin" in shown
    for shard in index.shards:
        assert shard.checksum in shown


@pytest.mark.parametrize("shard, block", [(0, 0), (1, 5), (3, 624)])
def test_a_decoded_block_is_the_tokenizers_decoding_of_the_shard_slice(demo, shard, block):
    _, out = demo
    index = read_index(out)
    seq_len = index.seq_len
    tokens = read_tokens(out / index.shards[shard].file, index.dtype)
    want = np.array(tokens[block * seq_len : block * seq_len + seq_len + 1])
    view = read_block(out, shard, block)
    assert np.array_equal(view.tokens, want)
    tok = Tokenizer.from_file(index.tokenizer)
    assert view.text.replace(DOC_MARKER, EOT_TOKEN) == tok.decode(want.tolist(), skip_special_tokens=False)
    assert view.text.count(DOC_MARKER) == int((want == 0).sum()) == view.documents_started
    assert DOC_MARKER in _text(render_block(view)) or view.documents_started == 0


def test_the_first_block_starts_with_a_document(demo):
    view = read_block(demo[1], 0, 0)
    assert view.pieces[0] is None and view.text.startswith(DOC_MARKER)


def test_a_holdout_window_decodes(demo):
    _, out = demo
    view = read_window(out, "prose", 1)
    index = read_index(out)
    seq_len = index.seq_len
    tokens = read_tokens(out / "val_prose.bin", index.dtype)
    assert np.array_equal(view.tokens, tokens[seq_len : 2 * seq_len + 1])


def test_out_of_range_blocks_are_clear_errors(demo):
    _, out = demo
    with pytest.raises(TokmixError, match=r"shard 4: the run has shards 0\.\.3"):
        read_block(out, 4, 0)
    with pytest.raises(TokmixError, match=r"block 625: train_003.bin has blocks 0\.\.624"):
        read_block(out, 3, 625)
    with pytest.raises(TokmixError, match="holdout 'web'"):
        read_window(out, "web", 0)


def test_status_judges_the_lock_by_the_kernel_not_by_the_pids_it_names(finished_run, tmp_path):
    """The lock file names a live process that holds no lock (a pid reused after a kill -9): not running. A
    process holds the kernel's lock while the file names one that is gone: running, naming the holder."""
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    lock, host = out / "tokmix-state/lock", socket.gethostname()
    lock.write_text(f"{host} {os.getpid()}\n")
    st = status(out)
    assert not st.running and st.lock == (host, os.getpid())
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lock.write_text(f"{host} {gone.pid}\n")
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        st = status(out)
        assert st.running and st.lock == (host, os.getpid())
    finally:
        os.close(fd)
