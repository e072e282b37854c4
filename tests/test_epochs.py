"""Epochs (`[streams.X] max_epochs`): a stream whose train documents hold fewer tokens than its budget repeats
them, pass 1 in canonical order and each later pass in a seeded order of its own, cut at the document that
crosses the budget. Checked on a real corpus against an oracle built here from the parquet files and the
tokenizer alone: the stream's documents pass by pass, how often each document appears in the train shards,
the shares, the OLMo-core #316 shape (a budget of exactly m passes, and one token either side), plan's
passes, a kill -9 in the middle of a pass, and decontamination of repeated documents."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

import tokmix
from tests.corpus import _documents, train_test_tokenizer
from tokmix import TokmixError
from tokmix.plan import make_plan
from tokmix.report import write_report
from tokmix.stages import drop_cached
from tokmix.stages.passes import RepeatTask, RepeatUnit, repeat_unit

ROOT = Path(__file__).resolve().parents[1]
SEQ_LEN = 64
EOT = 0
CODE_FILES = 3  # the last one is held out, as PROSE_FILES
PROSE_FILES = 3


def _texts() -> tuple[list[str], list[str]]:
    """Docstrings (prose) and functions (code) of the standard library (tests.corpus's), each text once, none
    holding the literal EOT text (the oracle splits shards at id 0); code few enough to run short."""
    docs = _documents()
    unique = lambda texts: [t for t in dict.fromkeys(texts) if t.strip() and "<|endoftext|>" not in t]  # noqa: E731
    return unique(docs["dclm"]), unique(docs["code_py"])[:120]


def _write(folder: Path, texts: list[str], n_files: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(texts) // n_files)
    paths = []
    for k in range(n_files):
        path = folder / f"part-{k}.parquet"
        pq.write_table(pa.table({"text": texts[k * per_file : (k + 1) * per_file]}), path, row_group_size=8)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("epochs")
    prose, code = _texts()
    code_files = _write(root / "corpus" / "code", code, CODE_FILES)
    held = pq.read_table(code_files[-1])["text"].to_pylist()
    # a copy of a held-out code document in a train file: decontamination drops it from every pass
    table = pq.read_table(code_files[0])
    planted = table["text"].to_pylist()
    planted.insert(3, held[1])
    pq.write_table(pa.table({"text": planted}), code_files[0], row_group_size=8)
    files = {"prose": _write(root / "corpus" / "prose", prose, PROSE_FILES), "code": code_files}
    split = {name: {"holdout": [str(p.relative_to(root)) for p in paths[-1:]],
                    "train": [str(p.relative_to(root)) for p in paths[:-1]]} for name, paths in files.items()}
    (root / "file_splits.json").write_text(json.dumps(split))
    tok_path = train_test_tokenizer(files, root / "tokenizer.json", vocab=600)
    tok = Tokenizer.from_file(str(tok_path))
    holdout_texts = {t for paths in files.values() for t in pq.read_table(paths[-1])["text"].to_pylist()}

    def docs(name: str) -> list[bytes]:
        """The stream's train documents in canonical order, EOT-prefixed uint16 bytes, holdout copies dropped."""
        texts = [t for p in files[name][:-1] for t in pq.read_table(p)["text"].to_pylist()]
        kept = [t for t in texts if t and t not in holdout_texts]
        return [np.array([EOT, *tok.encode(t).ids], dtype=np.uint16).tobytes() for t in kept]

    oracle = {name: docs(name) for name in files}
    assert len(oracle["code"]) == len(set(oracle["code"])), "every code document is distinct"
    return {"root": root, "docs": oracle, "held_copy": np.array([EOT, *tok.encode(held[1]).ids], np.uint16).tobytes()}


def supply(corpus: dict, name: str, decontaminate: bool = True) -> int:
    """Tokens of the stream's train documents; without decontamination the planted copy is one of them."""
    return sum(len(d) // 2 for d in corpus["docs"][name]) + (0 if decontaminate else len(corpus["held_copy"]) // 2)


def write_recipe(corpus: dict, code_share: float, blocks: int, max_epochs: int, name: str = "recipe.toml",
                 slack: float = 1.0, prose: bool = True, decontaminate: bool = True) -> Path:
    """A recipe with code at `code_share` of `blocks` blocks. slack 1.0: the code budget is
    int(code_share * T) + 1 for T = blocks * SEQ_LEN + 1, so a test can ask for an exact budget."""
    lines = ["seed = 1234", "", "[tokenizer]", 'path = "tokenizer.json"', "", "[layout]", f"seq_len = {SEQ_LEN}",
             "steps = 1", "seqs_per_step = 1", f"blocks = {blocks}", f"shard_tokens = {SEQ_LEN * 150}",
             f"stream_slack = {slack}", "", "[holdout]", "tokens = 300", "eval_windows = 2",
             'splits = "file_splits.json"', f"decontaminate = {str(decontaminate).lower()}"]
    streams = {"code": code_share, **({"prose": 1 - code_share} if prose else {})}
    for stream, share in streams.items():
        lines += ["", f"[streams.{stream}]", f'domain = "{stream}"', f"share = {share!r}",
                  f'files = ["corpus/{stream}/*.parquet"]', f"max_epochs = {max_epochs}"]
    path = corpus["root"] / name
    path.write_text("\n".join(lines) + "\n")
    return path


def share_for_budget(budget: int, blocks: int) -> float:
    """The code share whose budget (slack 1.0) is exactly `budget` tokens."""
    share = (budget - 0.5) / (blocks * SEQ_LEN + 1)
    assert int(share * (blocks * SEQ_LEN + 1)) + 1 == budget
    return share


def stream_content(out: Path, name: str) -> list[bytes]:
    """The stream's documents as the streams stage committed them (units kept), cut as its record says."""
    meta = json.loads((out / "streams" / name / "stream.json").read_text())
    units = out / "streams" / name / "units"
    tokens = np.concatenate([np.fromfile(units / f"{u['name']}.tok", dtype=np.uint16) for u in meta["units"]])
    lengths = np.concatenate([np.fromfile(units / f"{u['name']}.len", dtype=np.uint32) for u in meta["units"]])
    lengths = lengths[: meta["docs"]]
    ends = np.cumsum(lengths.astype(np.int64))
    return [tokens[e - n : e].tobytes() for e, n in zip(ends, lengths)]


def shard_documents(out: Path) -> list[bytes]:
    """The train shards' documents in order (the shards' overlap token counted once), split at EOT; the last
    one may be cut."""
    index = json.loads((out / "index.json").read_text())
    parts = [np.fromfile(out / s["file"], dtype=np.uint16)[(k > 0):] for k, s in enumerate(index["shards"])]
    tokens = np.concatenate(parts)
    starts = np.flatnonzero(tokens == EOT)
    assert starts[0] == 0
    return [tokens[a:b].tobytes() for a, b in zip(starts, [*starts[1:], len(tokens)])]


def run(recipe: Path, out: Path, **options) -> dict:
    return tokmix.run(tokmix.load_recipe(recipe), out, workers=2, keep_streams=True, **options)


@pytest.fixture(scope="module")
def repeated(corpus, tmp_path_factory) -> dict:
    """Code's budget at ~2.4 times its supply: two whole passes and part of a third."""
    s = supply(corpus, "code")
    blocks = math.ceil(s * 2.4 / 0.2 / SEQ_LEN)
    recipe = write_recipe(corpus, 0.2, blocks, max_epochs=3)
    out = tmp_path_factory.mktemp("repeated")
    return {"recipe": recipe, "out": out, "index": run(recipe, out)}


def test_passes_are_the_documents_in_canonical_then_seeded_orders_cut_at_the_budget(corpus, repeated):
    docs, meta = corpus["docs"]["code"], repeated["index"]["mix"]["streams"]["code"]
    content = stream_content(repeated["out"], "code")
    d = len(docs)
    assert meta["passes"] == 3 and meta["pass_docs"] == d and meta["pass_tokens"] == supply(corpus, "code")
    assert content[:d] == docs  # pass 1: canonical order
    second, third = content[d : 2 * d], content[2 * d :]
    assert sorted(second) == sorted(docs) and second != docs  # pass 2: every document once, another order
    assert 0 < len(third) < d and len(set(third)) == len(third) and set(third) <= set(docs)
    assert third != second[: len(third)]  # pass 3 has an order of its own
    # the budget is met to the document: the last one crosses it
    sizes = [len(x) // 2 for x in content]
    assert sum(sizes) == meta["tokens"] and sum(sizes) - sizes[-1] < meta["budget"] <= sum(sizes)
    # each document appears floor(k) or ceil(k) times for a budget of k passes
    k = meta["budget"] / meta["pass_tokens"]
    assert set(Counter(content).values()) <= {math.floor(k), math.ceil(k)}
    assert len(content) == 2 * d + len(third)


def test_shards_repeat_each_document_floor_or_ceil_times_at_exact_shares(corpus, repeated):
    index, out = repeated["index"], repeated["out"]
    oracle = {doc: name for name, docs in corpus["docs"].items() for doc in docs}
    shard_docs = shard_documents(out)
    *whole, cut = shard_docs
    names = [oracle[doc] for doc in whole]  # every whole document is one of the corpus's
    cut_name = next(name for doc, name in oracle.items() if doc.startswith(cut))
    code = [doc for doc, name in zip(whole, names) if name == "code"]
    used = index["mix"]["documents_used"]["code"]
    content = stream_content(out, "code")[:used]  # the shards hold these, in this order, the last maybe cut
    assert code + ([cut] if cut_name == "code" else []) == [
        doc[: len(cut)] if i == used - 1 and cut_name == "code" else doc for i, doc in enumerate(content)]
    # repetition in the shards: the documents the shards use make `used / D` passes
    d = len(corpus["docs"]["code"])
    k = used / d
    counts = Counter(content)
    assert set(counts.values()) <= {math.floor(k), math.ceil(k)} and len(counts) == d
    # shares: index.json's token counts are the tokens of each stream's documents found in the shards
    tokens = Counter()
    for doc, name in zip(whole, names):
        tokens[name] += len(doc) // 2
    tokens[cut_name] += len(cut) // 2
    assert index["total"]["tokens_by_stream"] == dict(tokens)
    # epochs in the shards: code's tokens there over one pass's tokens
    pass_tokens = index["mix"]["streams"]["code"]["pass_tokens"]
    assert index["mix"]["passes_by_stream"] == {"code": round(tokens["code"] / pass_tokens, 4), "prose": 1.0}
    assert abs(index["total"]["share_by_stream"]["code"] - 0.2) < 0.01


def test_repeated_documents_are_decontaminated(corpus, repeated):
    index = repeated["index"]
    assert corpus["held_copy"] not in shard_documents(repeated["out"])
    assert corpus["held_copy"] not in stream_content(repeated["out"], "code")
    assert index["mix"]["streams"]["code"]["dropped_holdout_duplicates"] == 1  # one document, dropped once


def test_summary_and_report_show_the_passes(corpus, repeated):
    from rich.console import Console

    from tokmix.format.records import Index
    from tokmix.summary import mix_table

    console = Console(width=200, record=True)
    console.print(mix_table(Index.from_json(repeated["index"])))
    row = next(line for line in console.export_text().splitlines() if line.startswith("│ code"))
    realized = f"{repeated['index']['mix']['passes_by_stream']['code']:.2f}"
    assert realized in row
    html = write_report(repeated["out"], repeated["out"] / "report.html").read_text()
    header = html.index("<th>passes</th>")
    assert f"<td>{realized}</td>" in html[header:]


@pytest.mark.parametrize("extra, passes", [(-1, 2), (0, 2), (1, 3)])
def test_a_budget_of_exactly_m_passes_plus_or_minus_one_token(corpus, tmp_path, extra, passes):
    """OLMo-core #316: a budget an exact multiple of the supply needs exactly that many passes; one token
    more starts the next pass with one document, one token less still ends the last pass. Without
    decontamination, so the planted holdout copy is one more train document and plan's count (which does not
    know what the holdout stage will read) is exact."""
    s, d = supply(corpus, "code", decontaminate=False), len(corpus["docs"]["code"]) + 1
    blocks = math.ceil(2 * s / 0.2 / SEQ_LEN)
    recipe = write_recipe(corpus, share_for_budget(2 * s + extra, blocks), blocks, max_epochs=3,
                          decontaminate=False)
    assert make_plan(tokmix.load_recipe(recipe), out=tmp_path).streams["code"].passes == passes
    meta = run(recipe, tmp_path)["mix"]["streams"]["code"]
    assert meta["budget"] == 2 * s + extra and meta["passes"] == passes
    assert meta["docs"] == (2 * d if passes == 2 else 2 * d + 1)
    assert meta["tokens"] == (2 * s if passes == 2 else 2 * s + len(stream_content(tmp_path, "code")[-1]) // 2)


def test_plan_and_run_refuse_too_few_epochs_naming_the_stream_and_what_it_needs(corpus, tmp_path):
    s = supply(corpus, "code", decontaminate=False)
    blocks = math.ceil(2 * s / 0.2 / SEQ_LEN)
    recipe = write_recipe(corpus, share_for_budget(2 * s + 1, blocks), blocks, max_epochs=2, name="two.toml",
                          decontaminate=False)
    plan = make_plan(tokmix.load_recipe(recipe), out=tmp_path)
    assert plan.problems == [p for p in plan.problems if "stream code needs max_epochs = 3 (it is 2)" in p]
    assert len(plan.problems) == 1
    with pytest.raises(TokmixError, match=r"stream code: its train documents hold [\d,]+ tokens, its budget of "
                                          r"[\d,]+ needs 3 passes over them and max_epochs is 2"):
        run(recipe, tmp_path / "out")
    one = write_recipe(corpus, share_for_budget(2 * s + 1, blocks), blocks, max_epochs=1, name="one.toml",
                       decontaminate=False)
    with pytest.raises(TokmixError, match=r"stream code: source files ran out .* or let its documents repeat "
                                          r"\(max_epochs = 3\)"):
        run(one, tmp_path / "out")
    # raising max_epochs resumes the run that ran out (what is tokenized is kept), not a changed recipe
    recipe.write_text(recipe.read_text().replace("max_epochs = 2", "max_epochs = 3"))
    assert run(recipe, tmp_path / "out")["mix"]["streams"]["code"]["passes"] == 3


def _cli_run(recipe: Path, out: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": "3000"}
    if fault:
        env["TOKMIX_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--workers",
                           "2", "--keep-streams"], capture_output=True, text=True, env=env, start_new_session=True)


def _outputs(out: Path) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in sorted([*out.glob("*.bin"), *out.glob("*.docs")])}
    index = json.loads((out / "index.json").read_text())
    for meta in index["mix"]["streams"].values():
        for key in ("seconds_last_run", "tok_s_end_to_end", "tok_s_tokenizer_capacity"):
            meta.pop(key)
    files["index.json"] = json.dumps({k: v for k, v in index.items() if k != "throughput"}, sort_keys=True).encode()
    return files


@pytest.mark.parametrize("point", ["streams:after-unit", "streams:unit-before-rename"])
def test_kill_9_in_the_middle_of_a_pass_then_resume_is_byte_identical(corpus, tmp_path, point):
    """Code alone, so the streams stage's units are code's: the first n are pass 1, the next are pass 2's.
    The kill lands at pass 2's second unit (both points are counted in the stage process: by the
    coordinator, and by the worker threads that share it)."""
    s = supply(corpus, "code")
    recipe = write_recipe(corpus, 1.0, math.ceil(2.5 * s / SEQ_LEN), max_epochs=3, name="alone.toml", prose=False)
    clean = tmp_path / "clean"
    assert _cli_run(recipe, clean).returncode == 0
    units = clean / "streams" / "code" / "units"
    records = [json.loads(p.read_text()) for p in units.glob("*.json")]
    first = sum(1 for r in records if r.get("pass", 1) == 1)
    assert sum(1 for r in records if r.get("pass") == 2) == first >= 3  # pass 2 has as many units as pass 1

    out = tmp_path / "killed"
    killed = _cli_run(recipe, out, fault=f"{point}:{first + 2}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    units = out / "streams/code/units"
    passes = [json.loads(p.read_text()).get("pass", 1) for p in units.glob("*.json")]
    # killed in pass 2: pass 1 whole, pass 2 begun (a unit of it committed, or written under its temporary name)
    begun = passes.count(2) + len([p for p in units.glob("*.tok.tmp-*") if int(p.name[:6]) >= first])
    assert passes.count(1) == first and passes.count(2) < first and begun >= 1, passes
    assert not (out / "streams/code/stream.json").exists()
    resumed = _cli_run(recipe, out)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _outputs(out) == _outputs(clean)


@pytest.mark.parametrize("part", ["tok", "len"])
def test_a_repeat_unit_never_copies_from_a_damaged_pass_one_unit(repeated, tmp_path, part):
    """A repeat unit checks the pass-1 units it copies from as the coordinator checks a unit (one helper,
    tokmix.stages.passes.unit_damage): a unit damaged after the coordinator's check (a worker process, hours
    later) is named, and nothing is committed. The same task on the undamaged units remakes the run's own repeat
    unit."""
    units = tmp_path / "units"
    shutil.copytree(repeated["out"] / "streams/code/units", units)
    records = [json.loads(p.read_text()) for p in sorted(units.glob("*.json"))]
    first = sum(1 for r in records if r.get("pass", 1) == 1)
    again = next(r for r in records if r.get("pass") == 2 and r["source_unit"] == 0)
    want = (units / f"{again['name']}.tok").read_bytes()
    task = RepeatTask(RepeatUnit("code", again["index"], 2, 0, again["size"]), str(units), "<u2", 1234, first,
                      again["limit"], provenance=(units / f"{again['name']}.src").exists())
    for path in units.glob(f"{again['name']}.*"):
        path.unlink()
    drop_cached()  # a fresh worker process
    repeat_unit(task)
    assert (units / f"{again['name']}.tok").read_bytes() == want
    for path in units.glob(f"{again['name']}.*"):
        path.unlink()

    victim = units / f"000001.{part}"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x10
    victim.write_bytes(bytes(data))
    drop_cached()
    with pytest.raises(TokmixError, match=rf"units/000001: damaged \(sha256 of 000001.{part} differs from its "
                                          r"record\); run the same command again"):
        repeat_unit(task)
    assert not list(units.glob(f"{again['name']}.*"))
