"""fastokens on a tokenizer whose pre-tokenizer isolates numbers (HF's Digits step, then GPT-2's regex, as Cohere's
Command-R and SmolLM have it): it reads the file through one split regex (backends._digits_in_split), several times
faster, and gives HF's ids, checked like every backend; the file as written stays a backend of its own.

The tokenizers are trained here, byte-level BPE as HF trains them, on real text from this machine (this Python's
docstrings, comments, functions and C headers: digit runs, hex, version numbers) with mixed scripts, emoji and
whitespace before numbers spread through it. HF `tokenizers` itself is the oracle, called directly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import tokmix
from tests.corpus import _documents
from tests.test_pretrained import (
    HARD_TEXTS,
    assert_first_shard_is_the_oracles,
    corpus,  # noqa: F401  (the fixture of the tests' two streams, asked for by name)
    write_recipe,
)
from tokmix.backends import ADVERSARIAL_TEXTS, choose_backend, installed_backends, make_encoder
from tokmix.errors import TokmixError
from tokmix.text import clean_surrogates

pytestmark = pytest.mark.skipif("fastokens" not in installed_backends(), reason="fastokens is not installed")

# whitespace of every kind before and after numbers (where the split regex has to end a run as Digits does),
# numbers of other scripts (\p{N}: Arabic-Indic, fullwidth, superscripts, fractions, circled, Roman numerals)
NUMBER_TEXTS = [
    "a  1", "x 12 ", " \n 3\t4  5", "  12  ab  34\n\n56", "end 7", "7", " 7", "\t\t8\n", "9   ", "1 2  3   4\n\n\n5",
    "R3000 in 2026: 1234567890, v2.0.1-rc3, 0x1F4A9, 1e-9, -42, +49 (0)221 123456-78, 3.14159265358979",
    "١٢٣ ٤٥ ۱۲۳ ４５６７ ² ³ ½ ¾ ① ⑩ Ⅻ ⅷ 𝟘𝟙 ๑๒๓ ১২৩ 五六七",
    "mixed 東京2026年 Köln1 Привет42мир ٱلسَّلَامُ3 हिन्दी९ 한국어10 👍🏽7 🇩🇪 9👨‍👩‍👧‍👦",
    "tab\t1 nbsp\u00a02 ideographic\u30003 thin\u20094 line\u20285 nel\x856 zwsp\u200b7",
]


def texts(adversarial: bool = True) -> list[str]:
    """Real documents of the four kinds, with the hard, number and (unless not `adversarial`: a trainer makes a
    token of their 100,000 spaces, which fastokens cannot load) adversarial texts spread through them."""
    docs = _documents()
    real = [t for name in ("dclm", "edu", "code_py", "code_other") for t in docs[name][:120]]
    extra = NUMBER_TEXTS + HARD_TEXTS + (ADVERSARIAL_TEXTS if adversarial else [])
    for i, text in enumerate(extra):
        real.insert(i * len(real) // len(extra), text)
    return [clean_surrogates(t) for t in real]


def train(path: Path, individual: bool, vocab_size: int = 3000) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=individual),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts(adversarial=False), trainer)
    tok.save(str(path))
    return path


def hf_ids(path: Path, batch: list[str]) -> list[list[int]]:
    tok = Tokenizer.from_file(str(path))
    tok.encode_special_tokens = True
    return [e.ids for e in tok.encode_batch_fast(batch, add_special_tokens=False)]


def per_document(ids: np.ndarray, counts: np.ndarray) -> list[list[int]]:
    return [d.tolist() for d in np.split(ids, np.cumsum(counts)[:-1])]


@pytest.fixture(scope="module", params=[True, False], ids=["individual digits", "digit runs"])
def digits_tokenizer(request, tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("digits") / "tokenizer.json", individual=request.param)


def test_fastokens_reads_the_digits_step_as_one_split_and_gives_hfs_ids(digits_tokenizer):
    batch = texts()
    assert sum(map(len, batch)) > 300_000 and sum(c.isdigit() for t in batch for c in t) > 5_000
    want = hf_ids(digits_tokenizer, batch)
    fast = make_encoder(digits_tokenizer, "fastokens", 1)
    assert fast.rewritten == ["Digits"]
    as_written = make_encoder(digits_tokenizer, "fastokens-as-written", 1)
    assert as_written.rewritten == []
    for encoder in (fast, as_written):
        got = per_document(*encoder.encode_batch(batch))
        for i, (ids, w) in enumerate(zip(got, want)):
            assert ids == w, f"{encoder.name} differs from HF on text {i} {batch[i][:40]!r}"
    # the split is the Digits step's: each number character its own piece, or each run of them
    individual = json.loads(digits_tokenizer.read_text())["pre_tokenizer"]["pretokenizers"][0]["individual_digits"]
    tok = Tokenizer.from_file(str(digits_tokenizer))
    pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("R3000 in 2026")]
    assert pieces == (["R", "3", "0", "0", "0", "Ġin", "Ġ", "2", "0", "2", "6"] if individual
                      else ["R", "3000", "Ġin", "Ġ", "2026"])


def test_auto_picks_fastokens_in_its_fast_form(digits_tokenizer):
    backend, notices = choose_backend(digits_tokenizer, "auto", texts()[:64])
    assert (backend, notices) == ("fastokens", [])
    assert choose_backend(digits_tokenizer, "fastokens", texts()[:64]) == ("fastokens", [])


def test_a_run_with_a_digits_tokenizer_has_hfs_ids_in_its_first_shard(digits_tokenizer, request, tmp_path):
    """Default flags, the tests' two-stream corpus (hard texts and tokmix's adversarial ones among its documents):
    every document of train_000.bin is HF's ids, through fastokens in its fast form."""
    out = tmp_path / "out"
    recipe = write_recipe(request.getfixturevalue("corpus"), "digits", [f'path = "{digits_tokenizer}"'])
    tokmix.run(tokmix.load_recipe(recipe), out, workers=2)
    index = json.loads((out / "index.json").read_text())
    assert index["throughput"]["backend"] == "fastokens"
    tok = Tokenizer.from_file(str(digits_tokenizer))
    tok.encode_special_tokens = True
    assert assert_first_shard_is_the_oracles(out, lambda t: tok.encode(t, add_special_tokens=False).ids) > 20


def test_as_written_is_no_backend_of_a_file_without_a_digits_step(tmp_path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["plain text 123"], trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    assert make_encoder(tmp_path / "tokenizer.json", "fastokens").rewritten == []
    with pytest.raises(TokmixError, match="fastokens-as-written' cannot serve .*: it has no Digits step"):
        make_encoder(tmp_path / "tokenizer.json", "fastokens-as-written")
