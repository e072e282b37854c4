"""Where a tokenizer comes from (tiktoken ranks, a Hugging Face Hub name, a URL) and the fast backends' exactness on
real pretrained vocabularies: GPT-2's ranks and Mistral 7B's SentencePiece model (tests/data/vocab), whose ids are
checked against the published ones and against tiktoken and sentencepiece themselves. (tests/test_pretrained.py
runs the larger vocabularies that packages on PyPI ship.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tiktoken

from tests.corpus import _documents
from tests.test_tokenizer_layouts import LLAMA3_PATTERN
from tests.vocab import MISTRAL_IDS, gpt2_tiktoken, mistral_tokenizer_json, tiktoken_cache
from tokmix.backends import (
    ADVERSARIAL_TEXTS,
    TIKTOKEN_GPT2_PATTERN,
    choose_backend,
    make_encoder,
    read_tiktoken_file,
)
from tokmix.errors import TokmixError
from tokmix.recipe import recipe_from_dict
from tokmix.text import clean_surrogates
from tokmix.tokenizer import document_delimiters, load_vocabulary, tokenizer_file
from tokmix.tokens import Delimiters

BASE = {"seed": 1, "layout": {"steps": 1, "seqs_per_step": 1}, "holdout": {"tokens": 1, "eval_windows": 0},
        "streams": {"a": {"domain": "a", "share": 1.0, "files": ["x"]}}}


def recipe(tmp_path: Path, **tokenizer):
    return recipe_from_dict({**BASE, "tokenizer": tokenizer}, tmp_path)


@pytest.fixture(scope="module")
def documents() -> list[str]:
    return [d for texts in _documents().values() for d in texts[:25]]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    """GPT-2's ranks as a run keeps them for `tiktoken = "gpt2.tiktoken"` (tokenizer.tiktoken.json)."""
    root = tmp_path_factory.mktemp("gpt2")
    gpt2_tiktoken(root)
    return Path(tokenizer_file(recipe(root, tiktoken="gpt2.tiktoken"), root / "out" / "tokenizer.tiktoken.json"))


@pytest.fixture(scope="module")
def gpt2_json(gpt2) -> Path:
    """The tokenizer.json view of GPT-2's ranks in the run's file (what fastokens reads)."""
    path = gpt2.with_name("gpt2-view.json")
    path.write_text(read_tiktoken_file(gpt2, "tokenizer_json"))
    return path


@pytest.fixture(scope="module")
def r50k(tmp_path_factory, monkeypatch_module) -> tiktoken.Encoding:
    """tiktoken's own r50k_base (GPT-2), from ranks put in its cache: never fetched."""
    monkeypatch_module.setenv("TIKTOKEN_CACHE_DIR", str(tiktoken_cache(tmp_path_factory.mktemp("cache"))))
    return tiktoken.get_encoding("r50k_base")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as m:
        yield m


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mistral")
    return {"legacy": mistral_tokenizer_json(root / "legacy.json", metaspace=False),
            "metaspace": mistral_tokenizer_json(root / "metaspace.json", metaspace=True)}


def test_gpt2_ranks_give_gpt2s_published_ids(gpt2):
    vocab = load_vocabulary(str(gpt2), "tiktoken")
    assert vocab.size == 50257 and vocab.oracle == "tiktoken"
    assert document_delimiters(vocab, ["<|endoftext|>"], [], str(gpt2)) == Delimiters((50256,), ())
    assert make_encoder(gpt2, "tiktoken").encode_batch(["Hello world"])[0].tolist() == [15496, 995]
    assert vocab.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"


def test_gpt2_conversion_is_tiktokens_own_encoding(gpt2_json, r50k, documents):
    """HF on the tokenizer.json view of the ranks gives exactly tiktoken's ids, on real and adversarial texts."""
    texts = documents + [clean_surrogates(t) for t in ADVERSARIAL_TEXTS]
    ids, counts = make_encoder(gpt2_json, "hf").encode_batch(texts)
    want = [r50k.encode_ordinary(t) for t in texts]
    assert counts.tolist() == [len(w) for w in want]
    assert ids.tolist() == [i for w in want for i in w]


@pytest.mark.parametrize("backend", ["fastokens", "tiktoken"])
def test_fast_backends_are_exact_on_gpt2(gpt2, documents, backend):
    assert choose_backend(gpt2, backend, documents) == (backend, [])


def test_an_encoding_name_is_read_from_tiktokens_cache_only(tmp_path, gpt2, r50k, monkeypatch):
    """r50k_base's ranks in TIKTOKEN_CACHE_DIR: the same tokenizer as the file gives; an empty cache is one line
    (tiktoken is not let to fetch them)."""
    path = tokenizer_file(recipe(tmp_path, tiktoken="r50k_base"), tmp_path / "own" / "tokenizer.tiktoken.json")
    assert make_encoder(path, "tiktoken").encode_batch(["Hello world"])[0].tolist() == [15496, 995]
    assert load_vocabulary(path).specials == {"<|endoftext|>": 50256}
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # what this process loaded before is not asked
    with pytest.raises(TokmixError, match=r"tiktoken = 'p50k_base': its ranks are not in tiktoken's cache"):
        tokenizer_file(recipe(tmp_path, tiktoken="p50k_base"), tmp_path / "own2" / "tokenizer.json")
    with pytest.raises(TokmixError, match=r"tiktoken = 'nope_base': no such encoding \(.*r50k_base"):
        tokenizer_file(recipe(tmp_path, tiktoken="nope_base"), tmp_path / "own3" / "tokenizer.json")


def test_a_rank_file_beside_the_recipe_under_any_name_is_read_as_a_file(tmp_path):
    """Llama 3 keeps its tiktoken ranks as `tokenizer.model`, Kimi K2 as `tiktoken.model`: a name with a dot is a
    file, beside the recipe (an encoding's name has no dot), as `sentencepiece = "tokenizer.model"`'s message
    for such a file says to give it (tokenizer.tiktoken)."""
    gpt2_tiktoken(tmp_path).rename(tmp_path / "tokenizer.model")
    path = tokenizer_file(recipe(tmp_path, tiktoken="tokenizer.model"), tmp_path / "out" / "tokenizer.tiktoken.json")
    assert make_encoder(path, "tiktoken").encode_batch(["Hello world"])[0].tolist() == [15496, 995]
    with pytest.raises(TokmixError, match=r"give it as tokenizer.tiktoken"):
        load_vocabulary(str(tmp_path / "tokenizer.model"), "sentencepiece")
    with pytest.raises(TokmixError, match=r"tokenizer \S*/absent.model: file not found$"):  # not 'not a valid model'
        load_vocabulary(str(tmp_path / "absent.model"), "sentencepiece")
    with pytest.raises(TokmixError, match=r"tiktoken.model: file not found"):
        tokenizer_file(recipe(tmp_path, tiktoken="tiktoken.model"), tmp_path / "o" / "tokenizer.json")


def test_ranks_that_no_tokenizer_json_can_say_run_on_tiktoken(tmp_path, documents):
    """GPT-2's ranks less " the" (a vocabulary pruned by hand): tiktoken, the oracle, encodes with them (it joins
    any two adjacent parts whose concatenation has a rank), but " they" is no longer the merge of two tokens of
    lower rank, so there is no tokenizer.json view of them for fastokens. The run reads them with tiktoken, and
    auto says why in one line."""
    import base64

    lines = gpt2_tiktoken(tmp_path).read_text().splitlines()
    kept = [line for line in lines if base64.b64decode(line.split()[0]) != b" the"]
    (tmp_path / "pruned.tiktoken").write_text("\n".join(kept) + "\n")
    ranks = {base64.b64decode(t): int(r) for t, r in map(str.split, kept)}
    oracle = tiktoken.Encoding("pruned", pat_str=TIKTOKEN_GPT2_PATTERN, mergeable_ranks=ranks,
                               special_tokens={"<|endoftext|>": 50256})
    path = tokenizer_file(recipe(tmp_path, tiktoken="pruned.tiktoken"), tmp_path / "out" / "tokenizer.tiktoken.json")
    backend, notices = choose_backend(path, "auto", documents)
    assert backend == "tiktoken" and notices == [
        "fastokens: not applicable: its ranks have no tokenizer.json view (rank 484 (b' they') is not the merge of "
        "two tokens of lower rank) — falling back to tiktoken"]
    ids, counts = make_encoder(path, backend).encode_batch(documents)
    assert ids.tolist() == [i for text in documents for i in oracle.encode_ordinary(text)]


def test_bad_tiktoken_files_are_one_line(tmp_path):
    (tmp_path / "bad.tiktoken").write_text("IQ== 0\nnot base64!! 1\n")
    with pytest.raises(TokmixError, match=r"bad.tiktoken: line 2 is not '<base64 token> <rank>'"):
        tokenizer_file(recipe(tmp_path, tiktoken="bad.tiktoken"), tmp_path / "o" / "tokenizer.json")
    (tmp_path / "short.tiktoken").write_text("IQ== 0\n")
    with pytest.raises(TokmixError, match=r"short.tiktoken: byte 0x00 has no rank"):
        tokenizer_file(recipe(tmp_path, tiktoken="short.tiktoken"), tmp_path / "o" / "tokenizer.json")
    (tmp_path / "twice.tiktoken").write_text("IQ== 0\nIg== 1\nIw== 1\n")  # tiktoken panics on it
    with pytest.raises(TokmixError, match=r"twice.tiktoken: line 3 gives rank 1 again \(line 2 has it\)"):
        tokenizer_file(recipe(tmp_path, tiktoken="twice.tiktoken"), tmp_path / "o" / "tokenizer.json")
    with pytest.raises(TokmixError, match=r"missing.tiktoken: file not found"):
        tokenizer_file(recipe(tmp_path, tiktoken="missing.tiktoken"), tmp_path / "o" / "tokenizer.json")


def test_a_hub_name_not_in_the_cache_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TokmixError, match=r"tokenizer hf = 'org/absent': not in the Hugging Face cache and not "
                                          r"downloadable \("):
        tokenizer_file(recipe(tmp_path, hf="org/absent"), tmp_path / "o" / "tokenizer.json")


def test_a_url_is_copied_once_into_the_run(tmp_path, gpt2_json):
    own = tmp_path / "out" / "tokenizer.json"
    assert tokenizer_file(recipe(tmp_path, path=gpt2_json.as_uri()), own) == str(own)
    assert own.read_bytes() == gpt2_json.read_bytes()
    with pytest.raises(TokmixError, match=r"tokenizer \S*/absent.json: file not found"):
        tokenizer_file(recipe(tmp_path, path=(tmp_path / "absent.json").as_uri()), tmp_path / "o" / "tokenizer.json")


@pytest.mark.parametrize("layout", ["legacy", "metaspace"])
def test_mistral_gives_sentencepieces_ids(mistral, layout):
    """Both layouts transformers writes for a SentencePiece model give sentencepiece's own ids ("Hello world" ->
    22557, 1526 as published), except that the Metaspace one prepends no "▁" to a text starting with a space."""
    hf = make_encoder(mistral[layout], "hf")
    for text, want in MISTRAL_IDS.items():
        if layout == "legacy" or not text.startswith(" "):
            assert hf.encode(text).tolist() == want, text


@pytest.mark.parametrize("layout", ["legacy", "metaspace"])
def test_fastokens_is_exact_on_sentencepiece_layouts(mistral, documents, layout):
    """fastokens has no Metaspace pre-tokenizer: tokmix gives it the equivalent normalizer and prepends the "▁"
    itself; the exactness check against HF passes, on texts that start with a space or a "▁" too."""
    texts = documents + list(MISTRAL_IDS) + [" ", "▁x", "  two", "▁▁ a", "\n lead"]
    assert choose_backend(mistral[layout], "auto", texts) == ("fastokens", [])
    with pytest.raises(TokmixError, match=r"'tiktoken' cannot be used .*: not applicable: the pre-tokenizer is "
                                          r"neither byte-level"):
        choose_backend(mistral[layout], "tiktoken", texts)


def test_a_layout_fastokens_cannot_serve_falls_back_in_one_line(tmp_path, mistral, documents):
    """Metaspace splitting at every word (split = true) is not rewritten: fastokens cannot load it, HF serves, and
    the notice says why in one line."""
    spec = json.loads(mistral["metaspace"].read_text())
    spec["pre_tokenizer"]["split"] = True
    path = tmp_path / "split.json"
    path.write_text(json.dumps(spec))
    backend, notices = choose_backend(path, "auto", documents[:5])
    assert backend == "hf"
    assert notices[0].startswith("fastokens: not applicable: it cannot load the tokenizer (")
    assert notices[0].endswith("— falling back to hf") and all("\n" not in n for n in notices)


def test_tiktoken_serves_a_regex_split_then_byte_level_layout(tmp_path, gpt2_json, documents):
    """Llama-3's pre-tokenizer (a regex split, then byte-level without GPT-2's regex) on GPT-2's vocabulary: the
    tiktoken backend takes the split's pattern and stays exact."""
    spec = json.loads(gpt2_json.read_text())
    pattern = LLAMA3_PATTERN
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    path = tmp_path / "llama3-split.json"
    path.write_text(json.dumps(spec))
    assert choose_backend(path, "tiktoken", documents) == ("tiktoken", [])
    split = make_encoder(path, "tiktoken").encode_batch(["1234 don't"])[0].tolist()
    assert split == make_encoder(path, "hf").encode("1234 don't").tolist()
    assert split != make_encoder(gpt2_json, "hf").encode("1234 don't").tolist()  # "123" "4", not "1234"
