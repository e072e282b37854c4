"""Reading sources: every format, work units that cut files into pieces without losing or repeating a
document, fsspec URLs (memory://, file://) and the hf:// mirror remapping, and bad input named precisely."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tokmix.errors import TokmixError
from tokmix.sources import expand, file_kind, parse_mirrors, plan_units, read_texts, remap

TEXTS = [f"document {i}: " + "word " * (i % 17) + ("ünïcødé ✓" if i % 5 == 0 else "") for i in range(500)]
TEXTS[7] = ""
TEXTS[8] = "line one\nline two\r\nwith <|endoftext|> inside"


def stream_of(files: list[str], unit_bytes: int, mirrors=()) -> list[str]:
    return [t for unit in plan_units("s", files, list(mirrors), unit_bytes)
            for t in read_texts(unit, "text", "s", list(mirrors))]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    data = "".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(texts)).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    elif path.suffix == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("unit_bytes", [1 << 30, 997, 64])
def test_parquet_and_jsonl_units_give_every_document_once_in_order(tmp_path, unit_bytes):
    pq.write_table(pa.table({"text": TEXTS[:200]}), tmp_path / "a.parquet", row_group_size=16)
    write_jsonl(tmp_path / "b.jsonl", TEXTS[200:300])
    write_jsonl(tmp_path / "c.jsonl.gz", TEXTS[300:400])
    write_jsonl(tmp_path / "d.jsonl.zst", TEXTS[400:])
    files = [str(tmp_path / n) for n in ("a.parquet", "b.jsonl", "c.jsonl.gz", "d.jsonl.zst")]
    assert stream_of(files, unit_bytes) == TEXTS
    units = list(plan_units("s", files, [], unit_bytes))
    # one unit a file when the units are large, but the three whole JSONL files share one (plan_units groups them)
    assert len(units) == (2 if unit_bytes > 1e6 else len(units)) and len(units) >= 2
    assert [u.index for u in units] == list(range(len(units)))


def test_text_files_are_one_document_each_and_small_ones_share_a_unit(tmp_path):
    for i in range(30):
        (tmp_path / f"f{i:02d}.h").write_text(f"/* header {i} */\nint x{i};\n")
    files = [str(p) for p in sorted(tmp_path.glob("*.h"))]
    units = list(plan_units("s", files, [], unit_bytes=200))
    assert 1 < len(units) < 30
    assert stream_of(files, 200) == [Path(f).read_text() for f in files]
    assert file_kind("x/y.H") == "text" and file_kind("a.jsonl.zst") == "jsonl"


def test_many_empty_jsonl_files_are_one_unit_and_plan_and_run_agree(tmp_path):
    """2,000 empty JSONL files beside 3 real ones (issue 31; 50,000 in docs/benchmarks.md): small whole files
    share units (each was a unit of its own: minutes of records for nothing), and plan's sample is spread over
    the files that hold bytes (it sampled only empty files and said the stream would run short, which the run
    then was not)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    import tokmix
    from tokmix.plan import make_plan

    data = tmp_path / "data"
    data.mkdir()
    for k in range(3):
        write_jsonl(data / f"real-{k}.jsonl", TEXTS[k::3])
    for k in range(2_000):
        (data / f"empty-{k:05d}.jsonl").touch()
    files = [str(p) for p in sorted(data.glob("*.jsonl"))]
    assert len(list(plan_units("s", files, [], unit_bytes=1 << 20))) == 1
    assert stream_of(files, 1 << 20) == TEXTS[0::3] + TEXTS[1::3] + TEXTS[2::3]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tokenizer = tmp_path / "tokenizer.json"
    tok.save(str(tokenizer))
    (tmp_path / "recipe.toml").write_text(f"""seed = 1
[tokenizer]
path = "{tokenizer}"
[layout]
seq_len = 32
steps = 10
seqs_per_step = 4
[holdout]
tokens = 200
eval_windows = 1
[streams.s]
domain = "s"
share = 1.0
files = ["data/*.jsonl"]
""")
    recipe = tokmix.load_recipe(tmp_path / "recipe.toml")
    plan = make_plan(recipe, out=tmp_path / "run")
    assert plan.ok, plan.problems
    index = tokmix.run(recipe, tmp_path / "run", workers=1)
    assert index["mix"]["streams"]["s"]["tokens"] > 0


def test_fsspec_urls_and_the_hf_mirror(tmp_path):
    memory = fsspec.filesystem("memory")
    with memory.open("/bucket/data/part-0.parquet", "wb") as f:
        pq.write_table(pa.table({"text": TEXTS[:50]}), f)
    with memory.open("/bucket/data/part-1.jsonl", "wb") as f:
        f.write("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[50:80]).encode())
    found = expand("memory://bucket/data/*", [])
    assert found == ["memory:///bucket/data/part-0.parquet", "memory:///bucket/data/part-1.jsonl"]
    assert stream_of(found, 100) == TEXTS[:80]
    # an air-gapped copy of a Hub dataset: hf:// names, local bytes
    local = tmp_path / "copy" / "data"
    local.mkdir(parents=True)
    pq.write_table(pa.table({"text": TEXTS[:20]}), local / "train-0.parquet")
    mirrors = parse_mirrors([f"hf://datasets/org/name={tmp_path / 'copy'}"])
    assert remap("hf://datasets/org/name/data/train-0.parquet", mirrors) == str(local / "train-0.parquet")
    assert expand("hf://datasets/org/name/data/*.parquet", mirrors) == ["hf://datasets/org/name/data/train-0.parquet"]
    assert stream_of(["hf://datasets/org/name/data/train-0.parquet"], 1 << 20, mirrors) == TEXTS[:20]
    assert stream_of([f"file://{local / 'train-0.parquet'}"], 1 << 20) == TEXTS[:20]


def bad(tmp_path: Path, name: str, data: bytes) -> str:
    (tmp_path / name).write_bytes(data)
    return str(tmp_path / name)


@pytest.mark.parametrize("case, message", [
    ("json", r"stream s: file .*bad\.jsonl: line 3: invalid JSON"),
    ("field", r"stream s: file .*bad\.jsonl: line 2: no field 'text' \(fields: \['id', 'body'\]\)$"),
    ("array", r"stream s: file .*bad\.jsonl: line 2: no field 'text': the line is a JSON list, not an object$"),
    ("null", r"stream s: file .*bad\.jsonl: line 2: 'text' is null"),
    ("number", r"stream s: file .*bad\.jsonl: line 2: 'text' is a int, not a string"),
    ("gz", r"stream s: file .*bad\.jsonl\.gz: line \d+: truncated or corrupt file"),
    ("zst", r"stream s: file .*bad\.jsonl\.zst: line \d+: truncated or corrupt file"),
    ("utf8", r"stream s: file .*bad\.txt: byte 3: invalid UTF-8"),
    ("parquet", r"stream s: file .*bad\.parquet: cannot read"),
    ("column", r"stream s: file .*bad2\.parquet: schema: no column 'text'"),
    ("null_row", r"stream s: file .*bad3\.parquet: row 2: 'text' is null"),
    ("missing", r"stream s: file .*nope\.jsonl: not found"),
])
def test_bad_input_names_stream_file_and_row(tmp_path, case, message):
    good = b'{"text": "a"}\n'
    lines = {"json": good * 2 + b"{oops\n", "field": good + b'{"id": 7, "body": "x"}\n',
             "array": good + b'["x"]\n', "null": good + b'{"text": null}\n',
             "number": good + b'{"text": 5}\n'}
    if case in lines:
        path = bad(tmp_path, "bad.jsonl", lines[case])
    elif case == "gz":
        data = gzip.compress(write_jsonl(tmp_path / "x.jsonl", TEXTS).read_bytes())
        path = bad(tmp_path, "bad.jsonl.gz", data[: len(data) // 2])
    elif case == "zst":
        data = zstandard.ZstdCompressor().compress(write_jsonl(tmp_path / "x.jsonl", TEXTS).read_bytes())
        path = bad(tmp_path, "bad.jsonl.zst", data[: len(data) // 2])
    elif case == "utf8":
        path = bad(tmp_path, "bad.txt", b"abc\xff\xfe")
    elif case == "parquet":
        pq.write_table(pa.table({"text": TEXTS}), tmp_path / "bad.parquet")
        path = bad(tmp_path, "bad.parquet", (tmp_path / "bad.parquet").read_bytes()[:-100])
    elif case == "column":
        pq.write_table(pa.table({"body": ["x"]}), tmp_path / "bad2.parquet")
        path = str(tmp_path / "bad2.parquet")
    elif case == "null_row":
        pq.write_table(pa.table({"text": ["a", "b", None]}), tmp_path / "bad3.parquet")
        path = str(tmp_path / "bad3.parquet")
    else:
        path = str(tmp_path / "nope.jsonl")
    with pytest.raises(TokmixError, match=message):
        stream_of([path], 1 << 20)


def test_zstd_files_of_several_frames_read_whole(tmp_path):
    compressor = zstandard.ZstdCompressor()
    lines = ["".join(json.dumps({"text": t}) + "\n" for t in part) for part in (TEXTS[:100], TEXTS[100:])]
    (tmp_path / "multi.jsonl.zst").write_bytes(b"".join(compressor.compress(x.encode()) for x in lines))
    assert stream_of([str(tmp_path / "multi.jsonl.zst")], 1 << 20) == TEXTS


# Lines json accepts that orjson, tried first, rejects or could read otherwise: each must be read as json reads
# it (lone surrogates then replaced); and lines json rejects must fail with json's message.
JSON_EDGE_LINES = [
    b'{"text": "a", "text": "last key wins"}',
    b'{"text": "lone \\ud800 and \\uDFFF escapes, a pair \\ud83d\\ude00"}',
    b'{"text": "surrogate bytes \xed\xa0\x80"}',
    b'{"text": "NaN elsewhere", "score": NaN, "inf": Infinity, "big": 1e400}',
    b'{"text": "a big int elsewhere", "n": 123456789012345678901234567890}',
    b'\xef\xbb\xbf{"text": "after a BOM"}',
    b'{"te\\u0078t": "an escaped key"}',
    b'{"text": "\\u00e9\\u6771 \\u2028 \\u0000 \\/ \xf0\x9f\x98\x80 \xc3\xa9"}',
    b'{"text": "x", "nested": {"text": "inner"}, "list": [1, 2.5, null, true]}',
    b'  {"text": "spaces around"}  \r',
]


def test_jsonl_lines_are_read_as_json_reads_them(tmp_path):
    from tokmix.text import clean_surrogates

    path = tmp_path / "edge.jsonl"
    path.write_bytes(b"\n".join(JSON_EDGE_LINES) + b"\n")
    assert stream_of([str(path)], 1 << 20) == [clean_surrogates(json.loads(line)["text"]) for line in JSON_EDGE_LINES]
    for line, kind in [(b'{"text": 123456789012345678901234567890}', "a int, not a string"),
                       (b'{"text": NaN}', "a float, not a string"), (b'{"text": ["a"]}', "a list, not a string")]:
        path.write_bytes(b'{"text": "ok"}\n' + line + b"\n")
        with pytest.raises(TokmixError, match=rf"stream s: file .*edge\.jsonl: line 2: 'text' is {kind}"):
            stream_of([str(path)], 1 << 20)
    for line in [b'{"text": "a\x01b"}', b'{"text": "x",}', b'{"text": "x"} trailing', b'{"text": "\xff"}']:
        path.write_bytes(b'{"text": "ok"}\n' + line + b"\n")
        try:
            json.loads(line)
        except ValueError as e:
            message = f"invalid JSON ({e})"
        with pytest.raises(TokmixError) as failure:
            stream_of([str(path)], 1 << 20)
        assert str(failure.value).endswith(f"edge.jsonl: line 2: {message}")


HUGE_TEXTS = [
    "plain ascii " * 40,
    'quotes " and backslashes \\ and escapes \n\t\r\f\b ' * 20,
    "ünïcødé 東京 emoji 😀 ZWJ 👨‍👩‍👧 " * 20,
    "lone surrogates \ud800 and \udfff, a pair \ud83d\ude00, NUL \x00, separators \u2028\u2029 " * 20,
    "\\" * 700,  # nothing but escapes: decoded whole
    "short",
]


@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_huge_jsonl_text_is_read_as_utf8_pieces_equal_to_the_parsed_text(tmp_path, ascii_only):
    """A JSONL text longer than `huge` bytes never becomes one Python string: its escapes are decoded a piece
    at a time (pieces never cut an escape or a UTF-8 character) into UTF-8 bytes, equal to what json.loads
    gives, with lone surrogates replaced as everywhere else; other fields, huge too, are parsed and checked."""
    from tokmix.sources import HugeText
    from tokmix.text import clean_surrogates

    path = tmp_path / "huge.jsonl"
    lines = [json.dumps({"id": i, "meta": {"note": "m" * 300}, "text": t}, ensure_ascii=ascii_only)
             for i, t in enumerate(HUGE_TEXTS)]
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n")
    unit = next(plan_units("s", [str(path)], [], 1 << 30))
    read = list(read_texts(unit, "text", "s", [], huge=64))
    assert [bytes(t.data).decode("utf-8") if isinstance(t, HugeText) else t for t in read] == \
        [clean_surrogates(t) for t in HUGE_TEXTS]
    assert [isinstance(t, HugeText) for t in read] == [True] * 5 + [False]


def test_a_huge_line_streamed_from_its_file_reads_as_the_line_held_whole():
    """A long line of a file that can seek is read through in chunks, never held (streamed_json_text); it gives
    what the line held whole gives (huge_json_text), errors named alike, wherever a chunk cuts it: inside a literal,
    an escape, a run of backslashes or a character, at every `huge`."""
    import io
    import random

    from tokmix.sources import HugeText
    from tokmix.sources.jsonl import huge_json_text, streamed_json_text

    def read(function, *args):
        try:
            text = function(*args, "text", "s", "p", lambda: "line 1", huge)
        except TokmixError as e:  # the same message, but json's detail of an unterminated literal longer than `huge`
            return str(e).split(" (")[0]
        text = text[0] if isinstance(text, tuple) else text
        return bytes(text.utf8()) if isinstance(text, HugeText) else text

    rng = random.Random(1)
    alphabet = ["a", "\\", '"', "é", "😀", "\n", " ", "x" * 30, "\\\\", '\\"', "\ud83d"]
    lines = []
    for _ in range(60):
        text, other = ("".join(rng.choice(alphabet) for _ in range(rng.randint(0, n))) for n in (80, 40))
        record = rng.choice([{"text": text, "n": 1}, {"a": other, "text": text}, {"x": text, "text": other},
                             {"text": text, "b": [other, {"c": other}]}])
        lines.append(json.dumps(record, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass"))
    lines += [json.dumps({"id": 3, "text": 'ab\\"c' * 300_000 + "é😀" * 1000, "z": "q" * 100}).encode(),
              json.dumps({"text": "\\" * 1_048_570 + '"end'}).encode(), b'{"text": "abc' + b"x" * 100]
    compared = 0
    for line, huge in itertools.product(lines, (5, 9, 13, 31, 64)):
        f = io.BufferedReader(io.BytesIO(line + b"\n"))
        first = f.readline(huge + 1)
        if len(first) <= huge:
            continue
        assert read(streamed_json_text, f, first) == read(huge_json_text, line + b"\n")
        assert f.read() == b""  # left after the line
        compared += 1
    assert compared > 250


def test_a_huge_jsonl_line_that_is_not_json_names_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n" + '{"text": "' + "x" * 500 + '", "n": tru}\n')
    unit = next(plan_units("s", [str(path)], [], 1 << 30))
    with pytest.raises(TokmixError, match=r"stream s: file .*bad.jsonl: line 2: invalid JSON"):
        list(read_texts(unit, "text", "s", [], huge=64))


def _heavy_parquet(path: Path, texts: list[str | None]) -> Path:
    """Row group 0: `texts` (one of them past HEAVY_ROW_GROUP_BYTES), read a row at a time; row group 1: small."""
    from tokmix.sources import HEAVY_ROW_GROUP_BYTES

    assert max(len(t or "") for t in texts) > HEAVY_ROW_GROUP_BYTES
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as w:
        w.write_table(pa.table({"text": pa.array(texts, pa.string())}))
        w.write_table(pa.table({"text": TEXTS[:5]}))
    return path


def test_a_row_group_of_huge_documents_is_read_a_row_at_a_time_in_order(tmp_path):
    from tokmix.sources import HugeText

    huge = "ünï " + "word " * (13 << 20) + "😀"
    path = _heavy_parquet(tmp_path / "heavy.parquet", TEXTS[:3] + [huge] + TEXTS[3:6])
    unit = next(plan_units("s", [str(path)], [], 1 << 30))
    read = list(read_texts(unit, "text", "s", [], huge=1 << 20))
    assert [type(t) for t in read] == [str] * 3 + [HugeText] + [str] * 8
    assert bytes(read[3].utf8()) == huge.encode()
    assert read[:3] + read[4:] == TEXTS[:6] + TEXTS[:5]


def test_a_null_after_a_huge_document_names_its_row(tmp_path):
    path = _heavy_parquet(tmp_path / "heavy.parquet", ["a", "word " * (13 << 20), "b", None, "c"])
    unit = next(plan_units("s", [str(path)], [], 1 << 30))
    with pytest.raises(TokmixError, match=r"stream s: file .*heavy.parquet: row 3: 'text' is null"):
        list(read_texts(unit, "text", "s", [], huge=1 << 20))


def test_what_a_unit_holds_at_once_is_known_from_metadata(tmp_path):
    """Unit.held, which schedules a unit alone (tokmix.stages.alone_share): a text file's size; a heavy parquet
    row group's bytes (over 64 MiB in at most 1,024 rows, read whole), not an ordinary one's; 0 for JSONL, whose
    pieces are byte ranges."""
    heavy = _heavy_parquet(tmp_path / "heavy.parquet", ["a", "word " * (13 << 20), "b"])
    light = tmp_path / "light.parquet"
    pq.write_table(pa.table({"text": TEXTS}), light)
    text = tmp_path / "doc.txt"
    text.write_text("x" * 5000)
    jsonl = write_jsonl(tmp_path / "a.jsonl", ["y" * 5000])
    held = {Path(u.pieces[0].path).name: u.held for f in (heavy, light, text, jsonl)
            for u in plan_units("s", [str(f)], [], 1 << 30)}
    assert held["heavy.parquet"] > 13 * 5 << 20
    assert held == {"heavy.parquet": held["heavy.parquet"], "light.parquet": 0, "doc.txt": 5000, "a.jsonl": 0}
