"""Recipe validation and the tokenizer checks: each mistake is one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from tests.corpus import make_corpus, write_recipe, write_split
from tokmix import tokenizer_stage
from tokmix.errors import TokmixError
from tokmix.recipe import load_recipe
from tokmix.sources import iter_file_texts, load_or_create_split, stream_files
from tokmix.tokenizer import (
    DistinctWords,
    HFVocabulary,
    document_delimiters,
    load_tokenizer,
    token_byte_lengths,
    token_dtype,
    train_tokenizer,
)
from tokmix.tokenizer_stage import sample_sizes, training_pieces
from tokmix.tokens import Delimiters, dtype_for_vocab

RECIPE = """
seed = 1
[tokenizer]
path = "tok.json"
[layout]
seq_len = 128
steps = 10
seqs_per_step = 4
margin_steps = 2
shard_tokens = 1000
[holdout]
tokens = 100
eval_windows = 0
[streams.web]
domain = "web"
share = 0.6
files = ["web/*.parquet"]
[streams.code]
domain = "code"
share = 0.4
files = ["code/*.jsonl"]
"""


def recipe_with(tmp_path: Path, old: str = "", new: str = ""):
    path = tmp_path / "r.toml"
    path.write_text(RECIPE.replace(old, new))
    return load_recipe(path)


def test_derived_numbers(tmp_path):
    r = recipe_with(tmp_path)
    assert r.blocks == (10 + 2) * 4 and r.train_tokens == 48 * 128 + 1
    assert r.budget("web") == int(0.6 * r.train_tokens * 1.002) + 1
    assert r.blocks_per_shard == 7 and r.domains == ["web", "code"]
    assert r.tokenizer_path == str(tmp_path / "tok.json")
    assert r.with_blocks(5).blocks == 5


@pytest.mark.parametrize("old, new, message", [
    ("share = 0.4", "share = 0.3", r"stream shares sum to 0.9, not 1"),
    ("share = 0.4", "share = -0.4", r"streams.code.share: share must be a positive number"),
    ("share = 0.4", "share = 0", r"streams.code.share: share must be a positive number"),
    ("steps = 10", "", r"layout.steps: Field required"),
    ("seq_len = 128", "seq_len = 128\nsequence = 3", r"layout.sequence: unknown key; did you mean 'seq_len'\? "
                                                      r"\(layout takes seq_len, steps, "),
    ("seq_len = 128", "seq_len = 128\nstpes = 3", r"layout.stpes: unknown key; did you mean 'steps'\?"),
    ("seed = ", "sede = 1\nseed = ", r"sede: unknown key; did you mean 'seed'\? \(the recipe's top level takes seed, "),
    ('domain = "web"', 'domain = "web"\ntxt_field = "body"', r"streams.web.txt_field: unknown key; did you mean "
                                                          r"'text_field'\?"),
    ('path = "tok.json"', 'path = "tok.json"\nbakend = "hf"', r"tokenizer.bakend: unknown key; did you mean 'backend'"),
    ("eval_windows", "zzz = 1\neval_windows", r"holdout.zzz: unknown key \(holdout takes tokens, eval_windows, "),
    ('path = "tok.json"', "", r"give exactly one of tokenizer.path, tokenizer.hf, tokenizer.tiktoken, "
                              r"tokenizer.sentencepiece and \[tokenizer.train\]"),
    ('path = "tok.json"', 'path = "tok.json"\nhf = "org/name"', r"give exactly one of tokenizer.path, tokenizer.hf"),
    ('path = "tok.json"', 'tiktoken = "cl100k_base"\ntiktoken_pattern = "x"',
     r"tokenizer.tiktoken_pattern goes with a .tiktoken file \(an encoding has its own\)"),
    ('domain = "web"', 'domain = "we b"', r"domain name 'we b'"),
    ("[streams.code]", "[streams.web]", r"not valid TOML"),
    ('path = "tok.json"', 'path = "tok.json"\ndoc_prefix = []', r"give at least one token in tokenizer.doc_prefix or"),
    ('path = "tok.json"', 'path = "tok.json"\ndoc_suffix = "<|endoftext|>"',
     r"tokenizer.doc_prefix\[0\] '<\|endoftext\|>' marks where documents meet, so it cannot also be"),
    ('path = "tok.json"', 'path = "tok.json"\ndoc_prefix = []\ndoc_suffix = ["</s>", "</s>"]',
     r"tokenizer.doc_suffix\[-1\] '</s>' marks where documents meet"),
    ('path = "tok.json"', 'path = "tok.json"\ndoc_prefix = [""]', r"an empty token name"),
])
def test_recipe_mistakes_are_one_clear_line(tmp_path, old, new, message):
    with pytest.raises(TokmixError, match=message) as e:
        recipe_with(tmp_path, old, new)
    assert "\n" not in str(e.value)


def test_fingerprint_ignores_what_cannot_change_the_bytes(tmp_path):
    a = recipe_with(tmp_path)
    assert a.fingerprint() == a.with_backend("hf").fingerprint()
    assert a.fingerprint() != a.with_blocks(7).fingerprint()
    assert a.fingerprint() != recipe_with(tmp_path, "seed = 1", "seed = 2").fingerprint()
    # the delimiters change the bytes; spelled as the default, they are the recipe written before they existed
    same = recipe_with(tmp_path, 'path = "tok.json"', 'path = "tok.json"\ndoc_prefix = "<|endoftext|>"')
    assert same.tokenizer.doc_prefix == ["<|endoftext|>"] and same.fingerprint() == a.fingerprint()
    assert not {"doc_prefix", "hf", "tiktoken", "tiktoken_pattern"} & set(a.output_fields()["tokenizer"])
    ranks = recipe_with(tmp_path, 'path = "tok.json"', 'tiktoken = "vocab/gpt2.tiktoken"')
    assert ranks.output_fields()["tokenizer"]["tiktoken"] == str(tmp_path / "vocab" / "gpt2.tiktoken")
    assert ranks.tokenizer.fetched and not a.tokenizer.fetched
    other = recipe_with(tmp_path, 'path = "tok.json"', 'path = "tok.json"\ndoc_suffix = ["<|end|>"]')
    assert other.fingerprint() != a.fingerprint() and other.tokenizer.doc_suffix == ["<|end|>"]


def test_delimiters_are_special_tokens_named_at_any_id(tmp_path):
    """GPT-2's layout puts <|endoftext|> last, Llama's BOS/EOS elsewhere: any id serves, by name; a name that is
    not one of the tokenizer's special tokens (text could produce a plain token) is one clear line."""
    late = HFVocabulary(str(make_tokenizer(tmp_path / "late.json", ["<pad>", "<s>", "</s>", "<|endoftext|>"])))
    assert document_delimiters(late, ["<|endoftext|>"], [], "late.json") == Delimiters((3,), ())
    assert document_delimiters(late, ["<s>"], ["</s>", "<pad>"], "late.json") == Delimiters((1,), (2, 0))
    with pytest.raises(TokmixError, match=r"late.json: tokenizer.doc_suffix names '<\|end\|>', which is not one of "
                                          r"its special tokens \(<pad>, <s>, </s>, <\|endoftext\|>\)"):
        document_delimiters(late, ["<s>"], ["<|end|>"], "late.json")
    with pytest.raises(TokmixError, match=r"doc_prefix names 'hello'"):  # in the vocabulary, but not special
        document_delimiters(late, ["hello"], [], "late.json")
    assert late.token_bytes()[[0, 1, 2, 3]].tolist() == [0, 0, 0, 0]


def make_tokenizer(path: Path, specials: list[str], vocab: int = 300) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, a tokenizer for tests"] * 10, trainer)
    tok.save(str(path))
    return path


def test_tokenizer_checks(tmp_path):
    good = HFVocabulary(str(make_tokenizer(tmp_path / "good.json", ["<|endoftext|>"])))
    assert good.tokenizer.encode("a <|endoftext|> b").ids.count(0) == 0  # a literal marker is plain text
    lengths = token_byte_lengths(good.tokenizer)
    assert lengths[0] == 0 and lengths[good.tokenizer.token_to_id("h")] == 1
    assert document_delimiters(good, ["<|endoftext|>"], [], "x") == Delimiters((0,), ())
    (tmp_path / "corrupt.json").write_text(json.dumps({"model": 3})[:-3])
    with pytest.raises(TokmixError, match=r"corrupt.json: not a valid tokenizer.json"):
        load_tokenizer(str(tmp_path / "corrupt.json"))
    with pytest.raises(TokmixError, match=r"file not found"):
        load_tokenizer(str(tmp_path / "missing.json"))
    assert token_dtype(good, "auto", "x") == np.uint16


def test_dtype_follows_the_vocabulary():
    assert dtype_for_vocab(65536) == np.uint16
    assert dtype_for_vocab(65537) == np.uint32
    assert dtype_for_vocab(100, "uint32") == np.uint32
    with pytest.raises(ValueError, match="does not fit uint16"):
        dtype_for_vocab(70000, "uint16")




def test_the_training_sample_is_bounded_by_its_distinct_words(tmp_path, monkeypatch):
    """The trainer's tables grow with the distinct words it is given, so the sample ends before the text that
    would take its distinct words past max_word_bytes; the streams are read side by side, each a prefix of its
    train documents in order, in characters by their shares. With room for everything the sample is every
    train document, and the tokenizer learnt from it in pieces and in that order is the one learnt from the
    documents whole, stream after stream (the trainer counts words)."""
    write_split(tmp_path, make_corpus(tmp_path, doc_limit=120, rows_per_group=16))
    base = write_recipe(tmp_path, "unused").read_text()

    def sample_of(train: str) -> tuple[list[tuple[str, str]], object, object]:
        path = tmp_path / "trained.toml"
        path.write_text(base.replace('[tokenizer]\npath = "unused"', f"[tokenizer.train]\nvocab_size = 600\n{train}"))
        recipe = load_recipe(path)
        split = load_or_create_split(recipe, [])
        return list(training_pieces(recipe, split, [])), recipe, split

    sample, recipe, split = sample_of("max_word_bytes = 20000")
    assert list(training_pieces(recipe, split, [], taken=sample_sizes(recipe, split, []))) == sample  # the trainer's
    documents = {name: [t for t in iter_file_texts(stream_files(recipe, split, name, "train"), "text", name, [])
                        if t] for name in recipe.streams}
    words = DistinctWords()
    for _, piece in sample:
        words.take(*words.new_mass(piece))
    assert 15000 < words.mass <= 20000
    ratios = []
    for name, texts in documents.items():
        read = "".join(piece for stream, piece in sample if stream == name)
        assert read and "".join(texts).startswith(read) and len(read) < len("".join(texts)), name
        ratios.append(len(read) / recipe.share(name))
    assert max(ratios) - min(ratios) <= max(len(p) for _, p in sample) / min(map(recipe.share, documents))

    monkeypatch.setattr(tokenizer_stage, "TRAINER_PIECE_CHARS", 2000)
    everything = sample_of("")[0]
    assert max(len(p) for _, p in everything) < 4000
    for name, texts in documents.items():
        assert "".join(piece for stream, piece in everything if stream == name) == "".join(texts)
    trained = [tmp_path / "pieces.json", tmp_path / "whole.json"]
    train_tokenizer((p for _, p in everything), 600, 2, trained[0])
    train_tokenizer((t for texts in documents.values() for t in texts), 600, 2, trained[1])
    assert trained[0].read_bytes() == trained[1].read_bytes()
