"""Cases of #29 (benchmark decontamination) an adversarial review tried through the CLI on a small real run:
HumanEval problems planted verbatim into two streams' first train files, one run, then what the readers of its
record (inspect, report, trace) make of it."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.corpus import make_inputs
from tests.test_decontam import ENV, HUMANEVAL, decontaminate_section
from tokmix.shards import read_json, write_record


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("review")
    recipe = make_inputs(root, doc_limit=300, rows_per_group=16)
    with gzip.open(HUMANEVAL, "rt") as f:
        problems = [json.loads(line) for line in f][:5]
    for stream, rows in (("dclm", {2: 3, 10: 4}), ("edu", {1: 3})):
        path = root / "corpus" / stream / "part-0.parquet"
        table = pq.read_table(path)
        texts = table["text"].to_pylist()
        for row, k in rows.items():
            texts[row] = problems[k]["prompt"] + problems[k]["canonical_solution"]
        pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts)), path,
                       row_group_size=16)
    recipe.write_text(recipe.read_text() + decontaminate_section())
    out = root / "out"
    done = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--cache",
                           str(root / "cache")],
                          capture_output=True, text=True, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(read_json(out / "contamination.json", sealed=True)["items"]) == 2
    return {"root": root, "recipe": recipe, "out": out, "cache": root / "cache"}


def cli(*args: str):
    from typer.testing import CliRunner

    from tokmix.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})


def test_a_resealed_contamination_json_that_is_not_index_jsons_is_not_shown(planted, tmp_path):
    """contamination.json edited (a place moved) with its seal made again to match is whole, but not the file
    index.json names by its sha256: inspect --contamination and the report refuse to show its places, as trace
    and validate do, rather than list documents the run never dropped."""
    out = tmp_path / "out"
    shutil.copytree(planted["out"], out)
    path = out / "contamination.json"
    record = read_json(path, sealed=True)
    record["items"][0]["places"][0]["place"] = 77
    write_record(path, record)
    shown = cli("inspect", str(out), "--contamination")
    assert shown.exit_code != 0 and ":row 77" not in shown.output
    assert "sha256 differs from index.json's benchmark_decontamination" in " ".join(shown.output.split())
    html = cli("report", str(out), "--html", str(tmp_path / "r.html"))
    assert html.exit_code == 0, html.output[-2000:]
    page = (tmp_path / "r.html").read_text()
    assert "items found in it" not in page and "sha256 differs from index.json" in page


def test_cache_verify_checks_the_cache_named_before_the_subcommand(planted, tmp_path):
    """`tokmix cache --cache DIR verify` (the group's option, as `tokmix cache --help` shows it) checks DIR, not
    the default cache: the run's built benchmark set damaged there is found and removed, exit 1; a prune option
    before `verify` is refused, not silently dropped."""
    cache = tmp_path / "cache"
    shutil.copytree(planted["cache"], cache)
    [record] = [p for p in cache.glob("entries/*/*/entry.json") if '"kind": "benchmark-set"' in p.read_text()]
    [grams] = record.parent.glob("*.grams")
    data = bytearray(grams.read_bytes())
    data[-5] ^= 1
    grams.write_bytes(bytes(data))
    env = {**ENV, "TOKMIX_CACHE": str(tmp_path / "default")}

    def tokmix_cache(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tokmix.cli", "cache", *args], capture_output=True, text=True,
                              env=env)

    refused = tokmix_cache("--cache", str(cache), "--max-size", "1GiB", "verify")
    assert refused.returncode == 2 and "--max-size" in refused.stderr and grams.exists()
    checked = tokmix_cache("--cache", str(cache), "verify")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"sha256 of {grams.name} differs from its record; removed" in " ".join(checked.stderr.split())
    assert not record.exists() and not (tmp_path / "default").exists()


def test_a_benchmark_url_on_a_server_that_does_not_answer_is_unreachable_not_missing(planted, tmp_path):
    """A benchmark file over HTTP whose server refuses the connection (nothing listens on port 9): fsspec raises
    FileNotFoundError for it, which is not what the user must fix; the one line says the URL (or the glob of URLs)
    is unreachable, with the benchmark, before any stage writes."""
    recipe = planted["root"] / "unreachable.toml"  # beside the run's: its relative paths hold
    urls = ("http://127.0.0.1:9/HumanEval.jsonl.gz", "http://127.0.0.1:9/Human*.gz")  # a file, a glob
    for url, command in [(u, c) for k, u in enumerate(urls) for c in (["plan"], ["run", "--out", f"{tmp_path}/o{k}"])]:
        recipe.write_text(planted["recipe"].read_text().replace(f'"{HUMANEVAL}"', f'"{url}"'))
        done = subprocess.run([sys.executable, "-m", "tokmix.cli", command[0], str(recipe), *command[1:],
                               "--no-cache"], capture_output=True, text=True, env=ENV)
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and lines[-1].startswith(f"error: benchmark humaneval: {url}: unreachable ("), \
            done.stderr[-2000:]
        assert not (tmp_path / "o0" / "index.json").exists() and not (tmp_path / "o1" / "index.json").exists()


def test_text_without_spaces_is_one_word_between_separators(tmp_path):
    """docs/recipe.md's normalization: words are not segmented, so an item in Chinese or Thai is found where a
    document holds it between separators (CJK and ASCII punctuation, spaces), not inside a longer run."""
    from tests.test_edge_cases_27_29 import built_set

    _, bench = built_set(tmp_path, ["中华人民共和国成立于1949年，首都是北京。", "ประเทศไทยมีเมืองหลวงคือกรุงเทพมหานคร"])
    docs = ["据记载中华人民共和国成立于1949年，首都是北京。", "中华人民共和国成立于1949年, 首都是北京",
            "เราทราบว่าประเทศไทยมีเมืองหลวงคือกรุงเทพมหานคร", "(ประเทศไทยมีเมืองหลวงคือกรุงเทพมหานคร)"]
    assert bench.contaminating(docs) == [[], [0], [], [1]]


def test_trace_source_of_a_file_of_many_documents_asks_for_one(planted):
    """`trace --source FILE` of a parquet file (no row) took every document of it at once and said of the first
    row that decontamination dropped it, when another row was the dropped one; `FILE:line N` of a parquet file
    was row N-1. Both are refused, naming the form that finds one document; `FILE:row N` says what it said."""
    path = planted["root"] / "corpus" / "dclm" / "part-0.parquet"
    for where in (str(path), f"{path}:line 3"):
        said = cli("trace", str(planted["out"]), "--source", where)
        assert said.exit_code == 2 and "dropped" not in said.output, said.output
        assert f"{where}: a parquet file holds many documents, one a row: name one as {path}:row N" in " ".join(
            said.output.split()), said.output
    dropped = cli("trace", str(planted["out"]), "--source", f"{path}:row 2")
    assert dropped.exit_code == 0 and "row 2: dropped by benchmark decontamination" in dropped.output


def test_a_benchmark_file_that_is_a_loop_of_links_is_named_with_its_benchmark(tmp_path):
    """A benchmark path that is a loop of symbolic links fails its stat with ELOOP, which passed as a bare OSError
    (the CLI printed the path and strerror, no benchmark); it is named as an unreadable file is."""
    from tests.test_edge_cases_27_29 import read_items

    (tmp_path / "a.jsonl").symlink_to(tmp_path / "b.jsonl")
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")
    assert read_items(tmp_path / "a.jsonl", ["text"]) == (
        f"benchmark b: file {tmp_path / 'a.jsonl'}: cannot read: Too many levels of symbolic links")


def test_a_set_of_other_rules_in_the_state_folder_is_built_again(planted, tmp_path):
    """A run's state folder holding a whole set built by another recipe (3-grams of the same benchmark file: its
    files' sha256 are the pinned ones) was taken, and the resume dropped by 3-grams under a recipe of 13; it is
    built again, and the run ends as the uninterrupted one did."""
    three = planted["root"] / "ngram3.toml"
    three.write_text(planted["recipe"].read_text().replace("ngram = 13", "ngram = 3"))
    env = {**ENV, "TOKMIX_FAULT": "holdout:after-write:1"}  # killed once the set is built and pinned
    for recipe, out in ((planted["recipe"], tmp_path / "out"), (three, tmp_path / "three")):
        subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), "--no-cache"],
                       capture_output=True, env=env, start_new_session=True)
    state = tmp_path / "out" / "tokmix-state" / "benchmarks"
    shutil.rmtree(state)
    shutil.copytree(tmp_path / "three" / "tokmix-state" / "benchmarks", state)
    done = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(planted["recipe"]), "--out",
                           str(tmp_path / "out"), "--no-cache"], capture_output=True, text=True,
                          env={**ENV, "COLUMNS": "400"})  # its log lines unwrapped
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout + done.stderr
    assert "a set of ngram 3, not 13; built again" in said and " 3-grams" not in said, said[-2000:]
    record = "contamination.json"
    assert (tmp_path / "out" / record).read_bytes() == (planted["out"] / record).read_bytes()


def test_a_plain_text_benchmark_line_that_is_not_utf8_is_named_by_its_line(tmp_path):
    """A plain-text benchmark (one item a line) with a Latin-1 byte in its third line: the one line names that
    line (the item), as a JSONL file's bad line is, not only the byte offset."""
    from tests.test_edge_cases_27_29 import read_items

    path = tmp_path / "items.txt"
    path.write_bytes(b"first item\r\nsecond item\ncaf\xe9 third\n")
    assert read_items(path, ["text"]) == f"benchmark b: file {path}: line 3: byte 27 is not UTF-8 text"


def test_a_benchmark_in_a_folder_with_brackets_in_its_name_is_told_how_to_write_it(tmp_path):
    """`evals [v2]/items.jsonl`: "[v2]" is a glob's set of characters, so the path matched nothing and the one
    line said "no file matches" of a file that is there; it says how to write it, as a stream's files are told,
    and the path so written reads it."""
    from tests.test_edge_cases_27_29 import read_items

    folder = tmp_path / "evals [v2]"
    folder.mkdir()
    (folder / "items.jsonl").write_text('{"text": "one two"}\n')
    path = str(folder / "items.jsonl")
    written = path.replace("[", "[[]")
    assert read_items(path, ["text"]) == (f"benchmark b: {path!r} matches no file: in a pattern [...] is a set of "
                                          "characters, but the path with a literal [ exists; write [[] for each [ "
                                          f"(files = [{written!r}])")
    assert read_items(written, ["text"]) == [("0", "one two")]
