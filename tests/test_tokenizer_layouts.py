"""Whole runs with tokenizers of the three common layouts, each from another source and with its own document
delimiters, checked by decoding what was written:
- GPT-2's real vocabulary (tests/data/vocab), given as tiktoken ranks (`tiktoken = "gpt2.tiktoken"`): byte-level
  BPE, <|endoftext|> the last id (50,256), before each document;
- Llama-3's layout (GPT-4-style split regex, <|begin_of_text|> before and <|end_of_text|> after each document,
  uint32 tokens), built here from the test corpus and given as an fsspec URL (`path = "file://..."`);
- Mistral 7B's real SentencePiece vocabulary (byte fallback, Metaspace) as a Hugging Face Hub name read from a
  local HF cache with the Hub offline (`hf = "..."`), </s> after each document as Megatron and datatrove write.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

import tokmix
from tests.corpus import make_corpus, write_recipe, write_split
from tests.test_export import read_megatron
from tests.vocab import gpt2_tiktoken, mistral_tokenizer_json
from tokmix.backends import read_tiktoken_file
from tokmix.data import TrainBlocks
from tokmix.export import export_megatron
from tokmix.inspect import DOC_MARKER, read_block
from tokmix.stages.validate import validate_dir
from tokmix.tokens import Delimiters, read_tokens

# Llama-3's (and GPT-4's cl100k) pre-tokenizer split
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _train_texts(files: dict[str, list[Path]]) -> list[str]:
    return [t for paths in files.values() for p in paths[:-1] for t in pq.read_table(p)["text"].to_pylist() if t]


def gpt2_layout(texts: list[str], root: Path) -> tuple[list[str], Path]:
    """GPT-2's own ranks; tokmix converts them (the delimiters become special tokens after the ranks)."""
    return [f'tiktoken = "{gpt2_tiktoken(root).name}"'], root / "tokenizer.tiktoken.json"


def llama3_layout(texts: list[str], root: Path) -> tuple[list[str], Path]:
    """Llama-3's pipeline: split by its regex, then byte-level without GPT-2's regex; BOS and EOS after the
    vocabulary, and its template that prepends BOS (which tokmix must not add: the recipe says where BOS goes)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    spec = json.loads(tok.to_str())
    bos = tok.token_to_id("<|begin_of_text|>")
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                 "tokens": ["<|begin_of_text|>"]}}}
    path = root / "llama3.json"
    path.write_text(json.dumps(spec))
    return [f'path = "{path.as_uri()}"'], path


HUB_REPO = "mistralai/tokmix-test"  # a name the Hub does not have: only the local cache can answer


def sentencepiece_layout(texts: list[str], root: Path) -> tuple[list[str], Path]:
    """Mistral 7B's vocabulary in the Metaspace layout, laid out as huggingface_hub's cache keeps a download."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / "hf-cache" / f"models--{HUB_REPO.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    path = mistral_tokenizer_json(repo / "snapshots" / commit / "tokenizer.json", metaspace=True)
    return [f'hf = "{HUB_REPO}"'], path


LAYOUTS = {  # name: (builder, more [tokenizer] lines, prefix tokens, suffix tokens)
    "gpt2": (gpt2_layout, [], ["<|endoftext|>"], []),
    "llama3": (llama3_layout, ['doc_prefix = ["<|begin_of_text|>"]', 'doc_suffix = ["<|end_of_text|>"]',
                               'dtype = "uint32"'], ["<|begin_of_text|>"], ["<|end_of_text|>"]),
    "sentencepiece": (sentencepiece_layout, ["doc_prefix = []", 'doc_suffix = "</s>"'], [], ["</s>"]),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("layouts")
    files = make_corpus(root, doc_limit=300)
    write_split(root, files)
    return root, _train_texts(files)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout_run(request, corpus, tmp_path_factory):
    root, texts = corpus
    build, lines, prefix, suffix = LAYOUTS[request.param]
    source, tok_path = build(texts, root)
    recipe = root / f"{request.param}.toml"
    recipe.write_text(write_recipe(root, "x").read_text().replace('path = "x"', "\n".join(source + lines)))
    out = tmp_path_factory.mktemp(request.param)
    with pytest.MonkeyPatch.context() as env:  # the stage process inherits these
        env.setenv("HF_HUB_CACHE", str(root / "hf-cache"))
        env.setenv("HF_HUB_OFFLINE", "1")
        tokmix.run(tokmix.load_recipe(recipe), out, workers=2)
    if request.param == "gpt2":  # the tokenizer.json view of the ranks the run keeps (tiktoken is their oracle)
        tok = Tokenizer.from_str(read_tiktoken_file(out / "tokenizer.tiktoken.json", "tokenizer_json"))
    else:
        tok = Tokenizer.from_file(str(tok_path))
    return request.param, out, tok, [tok.token_to_id(t) for t in prefix], [tok.token_to_id(t) for t in suffix]


def train_stream(out: Path, index: dict) -> np.ndarray:
    parts = [read_tokens(out / s["file"], index["dtype"]) for s in index["shards"]]
    return np.concatenate([parts[0]] + [p[1:] for p in parts[1:]])


def documents(tokens: np.ndarray, delimiters: Delimiters) -> list[np.ndarray]:
    return np.split(tokens, delimiters.starts(tokens, None)[1:])


def test_every_document_is_framed_by_the_recipes_delimiters_at_their_ids(layout_run, corpus):
    name, out, tok, prefix, suffix = layout_run
    index = json.loads((out / "index.json").read_text())
    assert index["delimiters"] == {"prefix": prefix, "suffix": suffix}
    assert validate_dir(out) == []
    # the fast backend passed its exactness check against HF on this tokenizer: nothing fell back
    assert index["throughput"]["backend"] == "fastokens"
    assert json.loads((out / "tokmix-state" / "backend.json").read_text())["notices"] == []
    if name == "gpt2":  # GPT-2's published ids
        assert prefix == [50256] and index["vocab_size"] == 50257 and index["dtype"] == "uint16"
        assert tok.encode("Hello world").ids == [15496, 995]
    if name == "sentencepiece":  # Mistral 7B's
        assert suffix == [2] and index["vocab_size"] == 32000
        assert tok.encode("Hello world", add_special_tokens=False).ids == [22557, 1526]
    if name == "llama3":
        assert index["dtype"] == "uint32" and prefix[0] == tok.get_vocab_size() - 2
    sources = set(corpus[1])
    docs = documents(train_stream(out, index), Delimiters(tuple(prefix), tuple(suffix)))
    assert len(docs) > 50
    for doc in docs[:-1]:  # the last is cut where the run ends
        assert doc[: len(prefix)].tolist() == prefix and doc[len(doc) - len(suffix):].tolist() == suffix
        text_ids = doc[len(prefix) : len(doc) - len(suffix)]
        assert not np.isin(text_ids, prefix + suffix).any(), "a delimiter inside a document's text"
        text = tok.decode(text_ids.tolist(), skip_special_tokens=False)
        # a SentencePiece decoder strips the space its metaspace prepended, and so one the text began with
        assert text in sources or (name == "sentencepiece" and " " + text in sources)
    for domain, entry in index["val"].items():
        val = read_tokens(out / entry["file"], index["dtype"])
        assert val[: len(prefix)].tolist() == prefix, domain


def test_inspect_marks_where_documents_meet(layout_run):
    name, out, tok, prefix, suffix = layout_run
    marker = (prefix or suffix[-1:])[0]
    views = [read_block(out, 0, b) for b in range(20)]
    for view in views:
        assert view.text.count(DOC_MARKER) == int((view.tokens == marker).sum()) == view.documents_started
    view = next(v for v in views if (v.tokens[2:-2] == marker).any())  # documents meet inside this block
    if prefix and suffix:  # the other delimiter is shown by name, marked apart from text
        special = f"⟦{tok.id_to_token(suffix[0])}⟧"
        assert special in view.text
        for view in views:
            assert view.text.count(special) == int((view.tokens == suffix[0]).sum())
    if name == "llama3":  # the suffix's name written in a document's text (its bytes' ids) stays text
        from tokmix.format.records import Index
        from tokmix.inspect import Special, decode_pieces, delimiter_names, run_tokenizer

        index = Index.from_json(json.loads((out / "index.json").read_text()))
        literal = [tok.token_to_id(c) for c in "<|end_of_text|>"]  # byte-level: printable ASCII is its own token
        tokens = np.array([prefix[0], *literal, suffix[0], prefix[0]], dtype=np.uint32)
        delimiters = Delimiters(tuple(prefix), tuple(suffix))
        pieces = decode_pieces(run_tokenizer(out, index), tokens, delimiters, delimiter_names(index, delimiters))
        assert pieces == [None, "<|end_of_text|>", Special("<|end_of_text|>"), None]


def test_megatron_export_cuts_documents_at_the_delimiters(layout_run, tmp_path):
    name, out, tok, prefix, suffix = layout_run
    index = json.loads((out / "index.json").read_text())
    export_megatron(out, tmp_path / "m")
    code, _, docs = read_megatron(tmp_path / "m")
    assert code == 8 if index["vocab_size"] < 65_500 else 4
    want = documents(train_stream(out, index), Delimiters(tuple(prefix), tuple(suffix)))
    assert [d.tolist() for d in docs] == [d.tolist() for d in want]


def test_document_segments_from_the_index_are_where_the_delimiters_say(layout_run):
    """Segments come from the provenance index, whatever the delimiters: prefix, suffix or both."""
    name, out, tok, prefix, suffix = layout_run
    loader = TrainBlocks(out)
    delimiters = Delimiters(tuple(prefix), tuple(suffix))
    for step in range(0, loader.physical_steps, 3):
        x, _ = loader.batch(step)
        for row, starts in zip(x, loader.segments(step).starts):
            assert starts.tolist() == sorted({0, *delimiters.starts(row, None).tolist()}), (name, step)
