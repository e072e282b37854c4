"""Cases a demanding user tries on real vocabularies that the main tests of #27 do not: a document holding the
literal text of a special token (encoded as the oracle encodes ordinary text, never as the special id), runs of one
character (the split regexes' edge cases), SentencePiece unigram models with and without byte fallback, a tokenizer
file given as a URL, the delimiter given by id, the vocabulary at the 65,536-id boundary. Every id is compared with
the oracle's, called straight from its library (tiktoken, sentencepiece, HF tokenizers), never through tokmix."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
import tiktoken
from tokenizers import Tokenizer

from tests.vocab import DATA, package_file, tiktoken_package_cache
from tokmix.backends import SERVES, installed_backends, make_encoder
from tokmix.recipe import recipe_from_dict
from tokmix.text import clean_surrogates
from tokmix.tokenizer import load_vocabulary, tokenizer_file

BASE = {"seed": 1, "layout": {"steps": 1, "seqs_per_step": 1}, "holdout": {"tokens": 1, "eval_windows": 0},
        "streams": {"a": {"domain": "a", "share": 1.0, "files": ["x"]}}}

# the special tokens of the vocabularies below, and of others a document may quote
SPECIALS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>", "<s>", "</s>",
            "<unk>", "[INST]", "[/INST]", "<|im_start|>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
            "<0x41>", "<0xF0>", "▁", "<|begin_of_text|>", "<|eot_id|>"]


def special_texts() -> list[str]:
    forms = ("{s}", "a{s}b", " {s} ", "{s}{s}{s}", "\n{s}\n", "x {s}y", "{s}.", "  {s}", "é{s}中")
    return [form.format(s=s) for s in SPECIALS for form in forms]


def run_texts(n: int) -> list[str]:
    """Runs of one character (or pair) alone, after a letter and before one."""
    out = []
    for c in (" ", "a", "1", "\n", "\t", "🙂", "é", "中", "!", "\u3000", "\r\n", " a", "'s", "0 ", "=", "\u00a0",
              "\x00", "▁", " \n", "a1", "\u0301"):
        out += [c * k for k in (1, 2, 3, 4, 17, 1000)] + [c * n, c * n + "x", "x" + c * n]
    return out


def recipe(root: Path, **tokenizer):
    return recipe_from_dict({**BASE, "tokenizer": tokenizer}, root)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as m:
        yield m


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory, monkeypatch_module) -> dict[str, Path]:
    """The run's own file (or the file a run reads in place) of each real vocabulary: GPT-2's ranks as a
    .tiktoken file, cl100k_base and o200k_base by name (litellm's rank files in TIKTOKEN_CACHE_DIR), Mistral 7B's
    SentencePiece BPE, DeepSeek-V3's tokenizer.json, and SentencePiece unigram models trained here on real text,
    one with byte fallback (and sentencepiece's default nmt_nfkc rule) and one without (identity rule)."""
    root = tmp_path_factory.mktemp("vocabularies")
    monkeypatch_module.setenv("TIKTOKEN_CACHE_DIR", str(tiktoken_package_cache(root / "tiktoken-cache")))
    found = {}
    (root / "gpt2.tiktoken").write_bytes(gzip.decompress((DATA / "gpt2.tiktoken.gz").read_bytes()))
    for name in ("gpt2.tiktoken", "cl100k_base", "o200k_base"):
        found[name] = Path(tokenizer_file(recipe(root, tiktoken=name), root / "own" / f"{name}.tiktoken.json"))
    found["mistral"] = root / "mistral.model"
    found["mistral"].write_bytes(gzip.decompress((DATA / "mistral-v1.model.gz").read_bytes()))
    found["deepseek_v3"] = package_file("deepseek_v3")
    found.update(unigram_models(root))
    return found


def unigram_models(root: Path) -> dict[str, Path]:
    import io

    from tests.corpus import _documents

    texts = [t for ts in _documents().values() for t in ts[:300]]
    models = {}
    for name, options in {"unigram-byte-fallback": {"byte_fallback": True},
                          "unigram-identity": {"normalization_rule_name": "identity",
                                               "remove_extra_whitespaces": False}}.items():
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, vocab_size=2000,
                                                 model_type="unigram", minloglevel=2, **options)
        models[name] = root / f"{name}.model"
        models[name].write_bytes(model.getvalue())
    return models


def oracle_encode(name: str, path: Path):
    """The oracle's encoding of ordinary text, straight from its library."""
    if name.endswith("_base") or name.endswith(".tiktoken"):
        enc = tiktoken.get_encoding("r50k_base" if name == "gpt2.tiktoken" else name)
        return enc.encode_ordinary  # GPT-2's ranks are r50k_base's (tests/data/vocab/README.md)
    if path.suffix == ".model":
        sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        return sp.encode  # sentencepiece parses no control symbol in text
    tok = Tokenizer.from_file(str(path))
    tok.encode_special_tokens = True
    return lambda text: tok.encode(text, add_special_tokens=False).ids


NAMES = ["gpt2.tiktoken", "cl100k_base", "o200k_base", "mistral", "deepseek_v3", "unigram-byte-fallback",
         "unigram-identity"]


@pytest.mark.parametrize("name", NAMES)
def test_literal_special_tokens_and_runs_of_one_character_are_the_oracles_ordinary_text(vocabularies, name):
    """Every backend that serves the format (and can load it) gives the oracle's ids for ordinary text: a literal
    "<|endoftext|>", "</s>", "[INST]" or "<0x41>" in a document is text, never the special id; runs of one
    character of 20,000 (the split regexes' edge cases: whitespace before a letter, digits, CJK, emoji)."""
    path = vocabularies[name]
    vocab = load_vocabulary(str(path))
    encode = oracle_encode(name, path)
    texts = special_texts() + run_texts(20_000) + [clean_surrogates("lone \ud800 and \udfff"), ""]
    want = [list(encode(t)) for t in texts]
    special_ids = set(vocab.specials.values())
    assert not any(special_ids & set(w) for w in want)  # (the oracle itself never gives a special id for text)
    served = 0
    for backend in SERVES[vocab.format]:
        if backend not in installed_backends():
            continue
        try:
            encoder = make_encoder(path, backend, 1)
        except Exception:  # noqa: BLE001 - it cannot serve this tokenizer (auto passes it over, as the check says)
            continue
        served += 1
        ids, counts = encoder.encode_batch(texts)
        got, at = [], 0
        for n in counts.tolist():
            got.append(ids[at : at + n].tolist())
            at += n
        for text, g, w in zip(texts, got, want):
            assert g == w, f"{name} {backend}: {text[:40]!r}"
    assert served >= 1


@pytest.mark.parametrize("given", ["1", "[1]", '["<s>", 2]'])
def test_a_delimiter_given_by_id_is_refused_in_one_line(tmp_path, given):
    """doc_prefix = 1 means <s> in Mistral's model and '"' in GPT-2's: delimiters are named, and a number says so
    (it was pydantic's "Input should be a valid list, got 1")."""
    from tokmix.errors import TokmixError

    with pytest.raises(TokmixError, match=r"tokenizer.doc_prefix: name the special tokens, not their ids \(got "
                                          r"[12]\): e.g. \"<\|endoftext\|>\" or \"<s>\"") as e:
        recipe_from_dict({**BASE, "tokenizer": {"sentencepiece": "m.model", "doc_prefix": __import__("json").loads(
            given)}}, tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value", [b"bad \xff\xfe bytes", "a lone \ud800 surrogate".encode("utf-8", "surrogatepass")])
def test_invalid_utf8_in_a_parquet_text_is_named_with_its_row(tmp_path, value):
    """A parquet string column whose value is not UTF-8 (a writer that did not check; pyarrow reads it unchecked):
    one line naming the stream, file and row. A real run ended with "internal error: UnicodeDecodeError: 'utf-8'
    codec can't decode byte 0xff in position 4" (the backend check's sample, or the streams stage), no file named.
    (A document past 4 MiB is named already, by its byte: tokmix.text.utf8_pieces.)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokmix.errors import TokmixError
    from tokmix.sources import iter_file_texts

    path = tmp_path / "code.parquet"
    values = [b"fine", b"also fine", value, b"after"]
    pq.write_table(pa.table({"text": pa.array(values, pa.binary()).view(pa.string())}), path)
    with pytest.raises(TokmixError, match=r"^stream code: file \S+code.parquet: row 2: invalid UTF-8"):
        list(iter_file_texts([str(path)], "text", "code", [], 4 << 20))


# ---------------------------------------------------------------------------- a resume under a real other version
OLD_SENTENCEPIECE = "sentencepiece==0.2.0"  # tokmix's own is newer (0.2.3 here): the library that gives the ids


def old_library(requirement: str) -> Path:
    """A folder holding `requirement`'s wheel unpacked, to put first on PYTHONPATH: the same interpreter then
    imports that version (and importlib.metadata reports it). Fetched once into the test cache with `pip download
    --no-deps` (under a lock: xdist's workers share the cache)."""
    import fcntl
    import subprocess
    import sys
    import zipfile

    from tests.vocab import _pip, test_cache

    folder = test_cache() / requirement.replace("==", "-")
    folder.mkdir(parents=True, exist_ok=True)
    unpacked = folder / "site"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (unpacked / ".done").exists():
            wheels = folder / "wheel"
            if not list(wheels.glob("*.whl")):
                version = f"{sys.version_info.major}{sys.version_info.minor}"
                subprocess.run([*_pip(), "download", "--no-deps", "--only-binary", ":all:", "--python-version",
                                version, "-q", "-d", str(wheels), requirement], check=True)
            with zipfile.ZipFile(next(wheels.glob("*.whl"))) as wheel:
                wheel.extractall(unpacked)
            (unpacked / ".done").touch()
    return unpacked


def tokmix_cli(*args: str, pythonpath: Path | None = None, fault: str | None = None):
    import os
    import subprocess
    import sys

    env = {**os.environ, "TOKMIX_CACHE": "off"}
    env.pop("TOKMIX_FAULT", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), str(Path(__file__).parents[1])])
    if fault is not None:
        env["TOKMIX_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tokmix", *args], capture_output=True, text=True, env=env,
                          start_new_session=True, timeout=600)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Two streams of real text (tests/test_pretrained.py's, hard texts among them) in parquet files of 4-row groups,
    a split file, and Mistral 7B's model."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.test_pretrained import _texts

    root = tmp_path_factory.mktemp("corpus")
    split = {}
    for name, texts in _texts().items():
        (root / name).mkdir()
        part = -(-len(texts) // 3)
        paths = []
        for k in range(3):
            path = root / name / f"part-{k}.parquet"
            pq.write_table(pa.table({"text": texts[k * part : (k + 1) * part]}), path, row_group_size=4)
            paths.append(str(path.relative_to(root)))
        split[name] = {"holdout": paths[-1:], "train": paths[:-1]}
    (root / "splits.json").write_text(json.dumps(split))
    (root / "mistral.model").write_bytes(gzip.decompress((DATA / "mistral-v1.model.gz").read_bytes()))
    return root


def killed_run(corpus: Path, out: Path) -> Path:
    """A run of Mistral 7B's model given as a file:// URL (the run keeps its own copy, tokenizer.model), started
    under this sentencepiece and killed after its first committed unit; its recipe."""
    from tests.test_pretrained import write_recipe

    recipe = write_recipe(corpus, "mistral", [f'sentencepiece = "{(corpus / "mistral.model").as_uri()}"',
                                              'doc_prefix = "<s>"'])
    done = tokmix_cli("run", str(recipe), "--out", str(out), "--workers", "1", fault="streams:after-unit:1")
    assert done.returncode == -9 and not (out / "train_000.bin").exists(), done.stdout + done.stderr
    assert (out / "tokenizer.model").is_file()
    return recipe


def resume_under_old_sentencepiece(recipe: Path, out: Path) -> str:
    """The run resumed under OLD_SENTENCEPIECE; what it printed. Its first shard holds the oracle's ids."""
    import sentencepiece as now

    from tests.test_pretrained import assert_first_shard_is_the_oracles, oracle_of

    assert now.__version__ != OLD_SENTENCEPIECE.split("==")[1]
    done = tokmix_cli("run", str(recipe), "--out", str(out), "--workers", "1",
                      pythonpath=old_library(OLD_SENTENCEPIECE))
    assert done.returncode == 0, done.stdout + done.stderr
    assert assert_first_shard_is_the_oracles(out, oracle_of("mistral", recipe.parent)) > 10
    return done.stdout


RECHECKED = (f"tokenizer libraries changed since this run started (sentencepiece {sentencepiece.__version__} -> "
             f"{OLD_SENTENCEPIECE.split('==')[1]}): ids re-checked on the check's texts")


def test_a_resume_under_a_real_older_sentencepiece_rechecks_the_ids_and_says_so(corpus, tmp_path):
    """Killed under this sentencepiece, resumed in place under 0.2.0 (its real wheel first on PYTHONPATH): the
    oracle's ids on the first check's texts are encoded again by 0.2.0, found identical, and the resume says so;
    the state keeps the versions the run started with."""
    import json

    out = tmp_path / "out"
    recipe = killed_run(corpus, out)
    assert RECHECKED in resume_under_old_sentencepiece(recipe, out)
    record = json.loads((out / "tokmix-state" / "tokenizer.libraries.json").read_text())
    assert record["libraries_at_start"]["sentencepiece"] == sentencepiece.__version__
    # index.json names the versions the run started under, and the resume's beside them; validate under the
    # first ones has nothing to re-check
    index = json.loads((out / "index.json").read_text())
    assert index["tokenizer_libraries"] == {"sentencepiece": sentencepiece.__version__}
    assert index["tokenizer_libraries_resumed"] == {"sentencepiece": OLD_SENTENCEPIECE.split("==")[1]}
    checked = tokmix_cli("validate", str(out))
    assert checked.returncode == 0 and "tokenizer libraries differ" not in checked.stdout + checked.stderr, \
        checked.stdout + checked.stderr


def test_a_moved_run_resumed_under_a_real_older_sentencepiece_says_so_too(corpus, tmp_path):
    """The same, with the killed run's directory moved before the resume (to another disk, say): the backend's record
    names the run's own tokenizer.model by its old path, so the backend is checked again; that check re-checked the
    oracle's ids against the first ones, but recorded the new versions unsaid, the versions the run started with
    lost."""
    import json

    recipe = killed_run(corpus, tmp_path / "first")
    out = (tmp_path / "first").rename(tmp_path / "moved")
    assert RECHECKED in resume_under_old_sentencepiece(recipe, out)
    record = json.loads((out / "tokmix-state" / "tokenizer.libraries.json").read_text())
    assert record["libraries_at_start"]["sentencepiece"] == sentencepiece.__version__


# ---------------------------------------------------------------------------- whole runs
def run_of(corpus: Path, out: Path, name: str, lines: list[str]) -> dict:
    import json

    import tokmix
    from tests.test_pretrained import write_recipe
    from tokmix.stages.validate import validate_dir

    tokmix.run(tokmix.load_recipe(write_recipe(corpus, name, lines)), out, workers=2)
    assert validate_dir(out) == []
    return json.loads((out / "index.json").read_text())


def test_sentencepiece_unigram_models_with_and_without_byte_fallback_run_with_their_ids(vocabularies, corpus,
                                                                                         tmp_path):
    """A unigram model with byte fallback, read from a Hugging Face cache's snapshot (a symlink into blobs/), with
    <s> before each document; one without byte fallback (its <unk> for what it lacks) with </s> after each and none
    before: sentencepiece tokenizes both (fastokens has no unigram model, said in one line), every document of the
    first shard has sentencepiece's ids, and inspect decodes through sentencepiece."""
    from tests.test_pretrained import assert_first_shard_is_the_oracles
    from tokmix.inspect import read_block

    snapshot = tmp_path / "hub" / "models--org--unigram" / "snapshots" / "abc123"
    blob = tmp_path / "hub" / "models--org--unigram" / "blobs" / "5eed"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(vocabularies["unigram-byte-fallback"].read_bytes())
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.model").symlink_to("../../blobs/5eed")
    cases = {"unigram-byte-fallback": ([f'sentencepiece = "{snapshot / "tokenizer.model"}"', 'doc_prefix = "<s>"'],
                                       [1], []),
             "unigram-identity": ([f'sentencepiece = "{vocabularies["unigram-identity"]}"', "doc_prefix = []",
                                   'doc_suffix = "</s>"'], [], [2])}
    for name, (lines, prefix, suffix) in cases.items():
        out = tmp_path / name
        index = run_of(corpus, out, name, lines)
        assert (index["tokenizer_oracle"], index["vocab_size"], index["dtype"]) == ("sentencepiece", 2000, "uint16")
        assert index["delimiters"] == {"prefix": prefix, "suffix": suffix}
        assert index["throughput"]["backend"] == "sentencepiece"
        sp = sentencepiece.SentencePieceProcessor(model_file=str(vocabularies[name]))
        assert assert_first_shard_is_the_oracles(out, sp.encode) > 20
        view = read_block(out, 0, 0)
        assert view.text.strip() and view.documents_started >= 1


def test_the_vocabulary_at_the_uint16_boundary(corpus, tmp_path):
    """cl100k's first 65,535 and 65,536 ranks as .tiktoken files (its own rank file cut), split by cl100k's pattern,
    <|endoftext|> after them: 65,536 ids are uint16 (the delimiter 65,535, the largest uint16), 65,537 uint32
    (65,536); each through the shards, the training loader and both exports (Megatron's int32 from 65,500 ids, llm.c's
    gpt-2 header for uint16 and llama-3's for uint32), every document of the first shard tiktoken's ids."""
    from tests.test_export import read_llmc, read_megatron
    from tests.test_pretrained import assert_first_shard_is_the_oracles
    from tokmix.data import TrainBlocks
    from tokmix.export import export_llmc, export_megatron

    cl100k = tiktoken.get_encoding("cl100k_base")
    lines = package_file("cl100k_base").read_bytes().splitlines(keepends=True)
    for n, dtype, header in ((65_535, "uint16", 20240520), (65_536, "uint32", 20240801)):
        source = tmp_path / f"cl100k-{n}.tiktoken"
        source.write_bytes(b"".join(lines[:n]))
        mine = tiktoken.Encoding(f"cl100k-{n}", pat_str=cl100k._pat_str, special_tokens={"<|endoftext|>": n},
                                 mergeable_ranks={t: r for t, r in cl100k._mergeable_ranks.items() if r < n})
        out = tmp_path / f"run-{n}"
        index = run_of(corpus, out, f"cut{n}", [f'tiktoken = "{source}"',
                                                f"tiktoken_pattern = '''{cl100k._pat_str}'''"])
        assert (index["vocab_size"], index["dtype"], index["delimiters"]["prefix"]) == (n + 1, dtype, [n])
        assert assert_first_shard_is_the_oracles(out, mine.encode_ordinary) > 20
        blocks = TrainBlocks(out)
        assert blocks.dtype == np.dtype(dtype) and int(blocks.block(0)[0]) == n
        export_megatron(out, tmp_path / f"m{n}")
        code, _, docs = read_megatron(tmp_path / f"m{n}")
        assert code == 4 and max(int(d.max()) for d in docs if d.size) == n  # int32: 65,500 ids or more
        export_llmc(out, tmp_path / f"l{n}")
        magic, _, tokens = read_llmc(tmp_path / f"l{n}" / "tokmix_train_000.bin")
        assert magic == header and int(tokens[0]) == n and tokens.dtype.itemsize == np.dtype(dtype).itemsize


def test_a_whitespace_run_tiktoken_cannot_split_is_encoded_as_its_pieces(vocabularies):
    """A run of 1.1M spaces before a letter: tiktoken's regex gives up on it (a panic; it splits 999,000), so the
    oracle has no ids for it. The tiktoken backend says so in one line; fastokens (auto's choice) gives the ids
    tiktoken gives the two pieces its pattern makes of it, the spaces but the last and " a"."""
    from tokmix.errors import TokmixError

    path = vocabularies["cl100k_base"]
    enc = tiktoken.get_encoding("cl100k_base")
    text = " " * 1_100_000 + "a"
    with pytest.raises(TokmixError, match=r"^tiktoken cannot encode a document of 1,100,001 characters \("):
        make_encoder(path, "tiktoken", 1).encode_batch([text])
    ids = make_encoder(path, "fastokens", 1).encode_batch([text])[0].tolist()
    assert ids == enc.encode_ordinary(" " * 1_099_999) + enc.encode_ordinary(" a")


def test_report_on_a_run_with_a_document_over_several_shards(tmp_path, monkeypatch):
    """A document longer than two shards (24 kB of a module among short documents; shards of 1,024 tokens): the
    report's documents in order count it once with all its tokens (report.documents_in_order ended with
    "IndexError: index -1 is out of bounds for axis 0 with size 0", a bare traceback from `tokmix report`, at the
    third shard it reached), and `tokmix report` writes its page."""
    import json
    import sysconfig

    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    import tokmix
    from tokmix.cli import app
    from tokmix.report import documents_in_order
    from tokmix.shards import read_index

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    long = (stdlib / "argparse.py").read_text(encoding="utf-8")[:24_000]
    short = [d for d in (stdlib / "textwrap.py").read_text(encoding="utf-8").split("\n\n") if d.strip()]
    (tmp_path / "web").mkdir()
    pq.write_table(pa.table({"text": short[:20] + [long] + short[20:] + short[20:]}), tmp_path / "web" / "a.parquet")
    other = [d for d in (stdlib / "shlex.py").read_text(encoding="utf-8").split("\n\n") if d.strip()]
    pq.write_table(pa.table({"text": other}), tmp_path / "web" / "h.parquet")  # (a copy in train would be dropped)
    (tmp_path / "splits.json").write_text(json.dumps({"web": {"holdout": ["web/h.parquet"],
                                                              "train": ["web/a.parquet"]}}))
    (tmp_path / "gpt2.tiktoken").write_bytes(gzip.decompress((DATA / "gpt2.tiktoken.gz").read_bytes()))
    (tmp_path / "r.toml").write_text('seed = 1\n[tokenizer]\ntiktoken = "gpt2.tiktoken"\n[layout]'
                                     '\nseq_len = 64\nsteps = 40\nseqs_per_step = 8\n'
                                     'shard_tokens = 1024\n[holdout]\ntokens = 500\neval_windows = 2\n'
                                     'splits = "splits.json"\n[streams.web]\ndomain = "web"\nshare = 1.0\n'
                                     'files = ["web/*.parquet"]\n')
    out = tmp_path / "out"
    tokmix.run(tokmix.load_recipe(tmp_path / "r.toml"), out, workers=1)
    index = read_index(out)
    labels, tokens = documents_in_order(out, index)
    from tests.vocab import tiktoken_cache

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tiktoken_cache(tmp_path / "cache")))  # GPT-2's ranks: r50k_base
    want = len(tiktoken.get_encoding("r50k_base").encode_ordinary(long)) + 1  # with its <|endoftext|>
    assert want > 3 * 1024 and tokens[20] == want
    assert int(tokens.sum()) == index.total.tokens and len(labels) == len(tokens)
    done = CliRunner().invoke(app, ["report", str(out)])
    assert done.exit_code == 0, done.output
    assert (out / "report.html").stat().st_size > 10_000


ODD_DOCUMENTS = [
    "a document that names <|endoftext|> in its text, and <|fim_prefix|>x<|fim_middle|>y<|fim_suffix|>z",
    "<|endoftext|>", "<s>", "</s>", "</s></s></s><s>", "<s> hello </s> world <unk> [INST] do it [/INST]",
    "<|endofprompt|> <|im_start|>user<|im_end|> <|begin_of_text|><|eot_id|>", "byte pieces <0x41><0xF0> ▁▁ literal",
    "   ", "\n", "x", "é", "🧪", " " * 3000 + "a", "a" * 3000, "1" * 3000, "=" * 2000 + "\n" + "-" * 2000,
    "\t" * 1000 + "\n" * 1000, "🙂" * 1000, "中" * 2000, "ÿ\x00ctrl \x01\x1f\x7f", "\u00a0" * 500 + "nbsp",
    "\ufeffbom first", "héllo 中文 🧪 ḁ̸̢ Z\u0351\u0354",
]


@pytest.mark.parametrize("name", ["cl100k_base", "mistral"])
def test_a_jsonl_stream_of_odd_documents_has_the_oracles_ids_in_every_shard(vocabularies, tmp_path, name):
    """A JSONL stream opening with literal special tokens, empty texts and blank lines between them, lone surrogate
    escapes (\\ud800, a reversed pair), a NUL escape, whitespace-only and one-character documents and runs of one
    character, then real prose; a parquet stream of the same documents reversed: every document of every shard,
    read again from its line or row, is the oracle's ids of its text between the delimiters (Mistral: <s> before,
    </s> after)."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    import tokmix
    from tests.corpus import _documents
    from tokmix.provenance import RunDocuments
    from tokmix.shards import read_index
    from tokmix.tokens import read_tokens

    prose = _documents()["dclm"]
    lines = [line for text in ODD_DOCUMENTS for line in (json.dumps({"text": text}), '{"text": ""}', "")]
    lines += ['{"text": "lone \\ud800 high, \\udfff low, pair \\ud83d\\ude00, reversed \\ude00\\ud83d"}',
              '{"text": "\\u0000 NUL and \\"quotes\\" and \\\\ backslash"}']
    lines += [json.dumps({"text": t}, ensure_ascii=False) for t in prose[:60]]
    for stream in ("web", "code"):
        (tmp_path / stream).mkdir()
    (tmp_path / "web" / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "web" / "h.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in prose[100:160]))
    pq.write_table(pa.table({"text": ODD_DOCUMENTS[::-1] + [""] + prose[60:100]}), tmp_path / "code" / "a.parquet",
                   row_group_size=5)
    pq.write_table(pa.table({"text": prose[160:200]}), tmp_path / "code" / "h.parquet")
    (tmp_path / "splits.json").write_text(json.dumps({
        "web": {"holdout": ["web/h.jsonl"], "train": ["web/a.jsonl"]},
        "code": {"holdout": ["code/h.parquet"], "train": ["code/a.parquet"]}}))
    tokenizer = ([f'sentencepiece = "{vocabularies["mistral"]}"', 'doc_prefix = "<s>"', 'doc_suffix = "</s>"']
                 if name == "mistral" else [f'tiktoken = "{name}"'])
    recipe = tmp_path / "r.toml"
    recipe.write_text("\n".join(["seed = 3", "[tokenizer]", *tokenizer, "[layout]", "seq_len = 64", "steps = 24",
                                 "seqs_per_step = 8", "shard_tokens = 4096", "[holdout]", "tokens = 500",
                                 "eval_windows = 2", 'splits = "splits.json"', "[streams.web]", 'domain = "web"',
                                 "share = 0.6", 'files = ["web/*.jsonl"]', "[streams.code]", 'domain = "code"',
                                 "share = 0.4", 'files = ["code/*.parquet"]']) + "\n")
    out = tmp_path / "out"
    tokmix.run(tokmix.load_recipe(recipe), out, workers=2)
    index = json.loads((out / "index.json").read_text())
    encode = oracle_encode(name, vocabularies[name])
    prefix, suffix = index["delimiters"]["prefix"], index["delimiters"]["suffix"]
    texts = {str(tmp_path / "web" / "a.jsonl"): [json.loads(line)["text"] if line else None for line in lines],
             str(tmp_path / "code" / "a.parquet"): pq.read_table(tmp_path / "code" / "a.parquet")["text"].to_pylist()}
    run, checked = RunDocuments(out, read_index(out)), set()
    for k, shard in enumerate(index["shards"]):
        docs = run.shard(k)
        tokens = read_tokens(out / shard["file"], index["dtype"]).astype(np.int64)
        for i, (record, start, end) in enumerate(zip(docs.records, docs.starts, docs.ends)):
            source = docs.sources[record["source"]]
            text = clean_surrogates(texts[source.file][int(record["place"])])
            want = prefix + list(encode(text)) + suffix
            if i == 0 and docs.skip:
                want = want[docs.skip :]
            if i == len(docs.records) - 1:
                want = want[: end - start]
            assert tokens[start:end].tolist() == want, f"shard {k}: {source.where(int(record['place']))} {text[:30]!r}"
            checked.add(text)
    assert set(ODD_DOCUMENTS) <= checked  # (each odd document reached the shards, from one stream or both)


def test_a_tokenizer_file_under_another_formats_key_says_which_key_it_goes_under(tmp_path):
    """Mistral's .model given as `path`, GPT-2's .tiktoken as `sentencepiece`, a tokenizer.json as `tiktoken`, ...:
    the one line that refuses it says what the file looks like and the key it goes under."""
    from tokmix.backends import read_tiktoken_file
    from tokmix.errors import TokmixError

    files = {"sentencepiece": tmp_path / "tokenizer.model", "tiktoken": tmp_path / "gpt2.tiktoken",
             "path": tmp_path / "tokenizer.json"}
    files["sentencepiece"].write_bytes(gzip.decompress((DATA / "mistral-v1.model.gz").read_bytes()))
    files["tiktoken"].write_bytes(gzip.decompress((DATA / "gpt2.tiktoken.gz").read_bytes()))
    own = Path(tokenizer_file(recipe(tmp_path, tiktoken="gpt2.tiktoken"), tmp_path / "own" / "t.tiktoken.json"))
    files["path"].write_text(read_tiktoken_file(own, "tokenizer_json"), encoding="utf-8")
    what = {"sentencepiece": "a SentencePiece model", "tiktoken": r"tiktoken ranks \(a .tiktoken file\)",
            "path": "a tokenizer.json"}
    for key, given in [(k, f) for k in files for f in files if k != f]:
        with pytest.raises(TokmixError, match=rf"; it looks like {what[given]}: give it as tokenizer.{given}$") as e:
            r = recipe(tmp_path, **{key: str(files[given])})
            path = tokenizer_file(r, tmp_path / "own" / f"{key}-{given}")
            load_vocabulary(path, r.tokenizer.format)
        assert "\n" not in str(e.value)
    load_vocabulary(str(files["sentencepiece"]), "sentencepiece")  # each under its own key: loaded
    load_vocabulary(str(files["path"]), "hf")


FUZZ_ALPHABET = [*"aeiounrstlhdAEIOTSXÉÜ", " ", " ", "  ", "\n", "\t", ".", ",", "'", "'s", "'LL", "-", "(", "1", "2",
                 "0", "٣", "é", "ǅ", "ß", "中", "文", "🙂", "\u0301", "\u3000", "\u00a0", "\r\n", "\r", "==", "\x00",
                 "ʼ", "Ⅻ", "½", "𝐀", "▁", "<", ">", "/", "|", "the", "ing", " of", "http://"]


@pytest.mark.parametrize("name", ["gpt2.tiktoken", "cl100k_base", "o200k_base", "mistral", "deepseek_v3"])
def test_the_fast_backend_auto_picks_is_the_oracle_on_random_short_texts(vocabularies, name):
    """The backend auto chooses from a check of the adversarial texts and a sample of the run's documents, each
    against the oracle on 20,000 random short texts it never saw (letters of both cases and of several scripts,
    digits, contractions, every kind of whitespace, marks, pieces of tokens)."""
    import random

    from tokmix.backends import choose_backend

    path = vocabularies[name]
    backend, _ = choose_backend(path, "auto", [])
    assert backend == "fastokens"
    rng = random.Random(name)
    texts = ["".join(rng.choice(FUZZ_ALPHABET) for _ in range(rng.randint(1, 30))) for _ in range(20_000)]
    ids, counts = make_encoder(path, backend, 1).encode_batch(texts)
    encode = oracle_encode(name, path)
    at = 0
    for text, n in zip(texts, counts.tolist()):
        assert ids[at : at + n].tolist() == list(encode(text)), f"{name}: {text!r}"
        at += n


def test_a_tiktoken_pattern_that_leaves_text_unmatched_is_refused(tmp_path):
    """tiktoken encodes only what its split pattern matches and drops the rest, unsaid ("Hello, world 123!" through
    GPT-2's ranks and ` ?\\p{L}+| ?\\p{N}+` is "Hello world 123"): a recipe's tiktoken_pattern must match every
    character of tokmix's check texts, and one tiktoken cannot compile is named as the pattern; cl100k's pattern on
    GPT-2's ranks is taken, and gives tiktoken's ids for it."""
    from tokmix.errors import TokmixError

    (tmp_path / "gpt2.tiktoken").write_bytes(gzip.decompress((DATA / "gpt2.tiktoken.gz").read_bytes()))
    lossy = r"'s|'t| ?\p{L}+| ?\p{N}+"
    with pytest.raises(TokmixError, match=r"^tokenizer.tiktoken_pattern .*: it does not match all of a text \(',' at "
                                          r"byte 5 of \"Hello, world 123!"):
        tokenizer_file(recipe(tmp_path, tiktoken="gpt2.tiktoken", tiktoken_pattern=lossy), tmp_path / "a" / "t.json")
    with pytest.raises(TokmixError, match=r"tokenizer.tiktoken_pattern is empty: leave it out for GPT-2's pattern$"):
        recipe(tmp_path, tiktoken="gpt2.tiktoken", tiktoken_pattern="")
    with pytest.raises(TokmixError, match=r"^tokenizer.tiktoken_pattern '\(': not a regex tiktoken reads \("):
        tokenizer_file(recipe(tmp_path, tiktoken="gpt2.tiktoken", tiktoken_pattern="("), tmp_path / "b" / "t.json")
    pattern = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
               r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")  # cl100k_base's, on GPT-2's ranks
    cl100k = tiktoken.Encoding("x", pat_str=pattern,
                               mergeable_ranks=load_vocabulary(str(tokenizer_file(
                                   recipe(tmp_path, tiktoken="gpt2.tiktoken"), tmp_path / "c" / "t.json"))).ranks,
                               special_tokens={})
    path = tokenizer_file(recipe(tmp_path, tiktoken="gpt2.tiktoken", tiktoken_pattern=cl100k._pat_str),
                          tmp_path / "d" / "t.json")
    text = "Hello, world 12345!  ok\n\n"
    assert make_encoder(path, "tiktoken", 1).encode_batch([text])[0].tolist() == cl100k.encode_ordinary(text)
