"""tokmix.backends: every installed backend gives HF's ids, on real text, adversarial text and a 50 MB document.

The tokenizer is trained here the way tokmix trains one (byte-level BPE, "<|endoftext|>" = id 0) on text from this
machine: Python stdlib sources and /usr/share/doc. HF `tokenizers` itself is the oracle, called directly.
"""

import json
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from tokmix.backends import (
    ADVERSARIAL_TEXTS,
    SERVES,
    choose_backend,
    installed_backends,
    make_encoder,
    saves_model_inputs,
)
from tokmix.errors import TokmixError
from tokmix.recipe import load_recipe
from tokmix.stages import key_base
from tokmix.text import clean_surrogates
from tokmix.tokens import REFERENCE_DELIMITERS

ROOT = Path(__file__).resolve().parents[1]

STDLIB = Path(sysconfig.get_paths()["stdlib"])
BACKENDS = SERVES["hf"]  # the backends that read a tokenizer.json
FAST_BACKENDS = [b for b in BACKENDS if b != "hf"]
EXTRA_ADVERSARIAL = [
    " " * 1_000_000 + "a",  # tiktoken's regex gives up here: the document must go to HF
    ("x = f(a, b)  # " * 20_000)[:300_000],  # one 300k-character line
    "<|endoftext|>" * 1_000,
]


def require(backend: str) -> None:
    if backend not in installed_backends():
        pytest.skip(f"{backend} is not installed")


def real_documents(stdlib_chars: int, doc_chars: int) -> list[str]:
    """Stdlib modules, then /usr/share/doc copyright files, stripped, deterministic order."""
    docs, n = [], 0
    for path in sorted(STDLIB.glob("*.py")):
        docs.append(path.read_text(encoding="utf-8", errors="replace").strip())
        n += len(docs[-1])
        if n >= stdlib_chars:
            break
    n = 0
    for path in sorted(Path("/usr/share/doc").glob("*/copyright")):
        if n < doc_chars and path.is_file():
            docs.append(path.read_text(encoding="utf-8", errors="replace").strip())
            n += len(docs[-1])
    return [d for d in docs if d]


def hf_ids(path: Path, texts: list[str]) -> list[list[int]]:
    """The oracle, exactly as the reference prepare_tokens.py calls it."""
    tok = Tokenizer.from_file(str(path))
    tok.encode_special_tokens = True
    return [e.ids for e in tok.encode_batch_fast(texts)]


def train_tokenizer(texts: list[str], path: Path) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path


def split_docs(ids: np.ndarray, counts: np.ndarray) -> list[list[int]]:
    return [d.tolist() for d in np.split(ids, np.cumsum(counts)[:-1])]


@pytest.fixture(scope="module")
def documents() -> list[str]:
    return real_documents(stdlib_chars=3_000_000, doc_chars=1_000_000)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory, documents) -> Path:
    path = train_tokenizer(documents[:200], tmp_path_factory.mktemp("tok") / "tokenizer.json")
    assert Tokenizer.from_file(str(path)).token_to_id("<|endoftext|>") == 0
    return path


@pytest.fixture(scope="module")
def documents_ids(tokenizer_path, documents) -> list[list[int]]:
    return hf_ids(tokenizer_path, documents)


@pytest.fixture(scope="module")
def adversarial() -> list[str]:
    return [clean_surrogates(t) for t in ADVERSARIAL_TEXTS + EXTRA_ADVERSARIAL]


@pytest.fixture(scope="module")
def adversarial_ids(tokenizer_path, adversarial) -> list[list[int]]:
    return hf_ids(tokenizer_path, adversarial)


def test_real_documents_are_a_few_megabytes(documents):
    assert sum(map(len, documents)) > 3_500_000
    assert len(documents) > 100


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_backend_matches_hf_on_real_documents(backend, tokenizer_path, documents, documents_ids):
    require(backend)
    encoder = make_encoder(tokenizer_path, backend)
    for start in range(0, len(documents), 64):
        got = split_docs(*encoder.encode_batch(documents[start : start + 64]))
        for i, (ids, want) in enumerate(zip(got, documents_ids[start : start + 64])):
            assert ids == want, f"{backend} differs from HF on document {start + i}"


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_backend_matches_hf_on_adversarial_texts(backend, tokenizer_path, adversarial, adversarial_ids):
    require(backend)
    encoder = make_encoder(tokenizer_path, backend)
    ids, counts = encoder.encode_batch(adversarial)
    for i, (got, want) in enumerate(zip(split_docs(ids, counts), adversarial_ids)):
        assert got == want, f"{backend} differs from HF on adversarial text {i}: {adversarial[i][:40]!r}"
    assert 0 not in ids, "a literal <|endoftext|> inside a document must never become the EOT id"
    if backend == "tiktoken":
        assert encoder.hf_fallback_docs == 1  # the 1M-space document, and only it


def test_fifty_megabyte_document(tokenizer_path, documents, documents_ids):
    """One ~50 MB document of real text: every backend, against HF.

    HF takes ~40 s on 50 MB here, so its ids come from the pieces: documents joined by "\\n" (each starts and ends
    with non-whitespace) split exactly at the joins under the GPT-2 regex, so HF(a + "\\n" + b) = HF(a) + HF("\\n")
    + HF(b). The identity is checked against HF itself on a 1 MB prefix of the same construction.
    """
    newline = hf_ids(tokenizer_path, ["\n"])[0]
    assert len(newline) == 1
    one_round = np.concatenate([np.array(ids + newline, dtype=np.uint32) for ids in documents_ids])
    rounds = -(-50_000_000 // (sum(map(len, documents)) + len(documents)))
    document = "\n".join(documents * rounds)
    want = np.tile(one_round, rounds)[:-1]
    assert len(document) >= 50_000_000

    prefix = "\n".join(documents[:40])
    prefix_ids = np.concatenate([np.array(ids + newline, dtype=np.uint32) for ids in documents_ids[:40]])[:-1]
    assert len(prefix) > 1_000_000 and hf_ids(tokenizer_path, [prefix])[0] == prefix_ids.tolist()

    for backend in [b for b in installed_backends() if b in BACKENDS]:
        if backend == "hf":
            continue
        start = time.perf_counter()
        ids, counts = make_encoder(tokenizer_path, backend).encode_batch([document])
        assert counts.tolist() == [want.size], backend
        assert np.array_equal(ids, want), f"{backend} differs at token {np.argmax(ids[: want.size] != want)}"
        print(f"{backend}: {want.size / 1e6:.1f}M tokens in {time.perf_counter() - start:.1f}s")


@pytest.mark.parametrize("backend", BACKENDS)
def test_encoder_shapes_and_dtypes(backend, tokenizer_path):
    require(backend)
    encoder = make_encoder(tokenizer_path, backend, threads=1)
    assert encoder.name == backend and encoder.vocab_size == 2000
    texts = ["hello world", "", "def f(x):\n    return x\n", "<|endoftext|>"]
    ids, counts = encoder.encode_batch(texts)
    assert ids.dtype == np.uint32 and ids.ndim == 1
    assert counts.dtype == np.int64 and counts.shape == (len(texts),)
    assert counts[1] == 0 and int(counts.sum()) == ids.size
    assert [d for d in split_docs(ids, counts)] == hf_ids(tokenizer_path, texts)
    ids, counts = encoder.encode_batch([])
    assert ids.shape == (0,) and counts.shape == (0,)
    assert ids.dtype == np.uint32 and counts.dtype == np.int64


def test_clean_surrogates():
    ascii_text, valid = "plain ascii", "naïve café 👍"
    assert clean_surrogates(ascii_text) is ascii_text
    assert clean_surrogates(valid) is valid
    assert clean_surrogates("a\ud800b\udfffc") == "a\ufffdb\ufffdc"
    assert clean_surrogates("split pair \ud83d\ude00") == "split pair 😀"
    for text in ADVERSARIAL_TEXTS:
        clean_surrogates(text).encode("utf-8")  # raises on a surrogate left behind


def test_auto_picks_fastokens(tokenizer_path, documents):
    require("fastokens")
    assert choose_backend(tokenizer_path, "auto", documents[:50]) == ("fastokens", [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_named_backend_passes_the_check(backend, tokenizer_path, documents):
    require(backend)
    assert choose_backend(tokenizer_path, backend, documents[:20], threads=1) == (backend, [])


def test_backends_that_cannot_serve_a_tokenizer_fall_back_with_notices(tmp_path, tokenizer_path):
    """An NFKC normalizer: fastokens 0.3.5 cannot load it and tiktoken has none, so auto falls back to HF."""
    spec = json.loads(tokenizer_path.read_text())
    spec["normalizer"] = {"type": "NFKC"}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    name, notices = choose_backend(path, "auto", ["ﬁne ½ ① text"])
    assert name == "hf"
    fast = [b for b in FAST_BACKENDS if b in installed_backends()]
    assert [n.split(":")[0] for n in notices] == fast
    assert all(n.endswith("— falling back to hf") and "\n" not in n for n in notices)
    for backend in fast:
        with pytest.raises(TokmixError, match=f"'{backend}'"):
            choose_backend(path, backend)


def test_post_processor_tokens_are_never_added(tmp_path, tokenizer_path, documents):
    """A template that prepends <s> (as Llama's and Mistral's tokenizer.json do): no backend adds it, since the
    recipe's doc_prefix and doc_suffix are the only tokens around a document; every backend still serves."""
    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.add_special_tokens(["<s>"])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    assert tok.encode("hi").ids[0] == bos  # HF's own default adds it
    want = tok.encode("hi", add_special_tokens=False).ids
    for backend in [b for b in installed_backends() if b in BACKENDS]:
        assert choose_backend(path, backend, documents[:20])[0] == backend
        ids, counts = make_encoder(path, backend).encode_batch(["hi", ""])
        assert ids.tolist() == want and counts.tolist() == [len(want), 0]


def test_a_tokenizer_json_saved_with_truncation_and_padding_is_neither(tmp_path, tokenizer_path, documents):
    """A tokenizer.json saved after enable_truncation / enable_padding (many on the Hub are: max_length 512) holds
    settings for a model's inputs, not its tokenization: no backend cuts a document or pads one (HF, the oracle,
    did both, and auto then chose a backend that cut too); every backend still serves."""
    tok = Tokenizer.from_file(str(tokenizer_path))
    want = [e.ids for e in tok.encode_batch_fast(documents[:20] + [""], add_special_tokens=False)]
    tok.enable_truncation(max_length=8)
    tok.enable_padding(length=16, pad_id=0, pad_token="<|endoftext|>")
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    assert len(Tokenizer.from_file(str(path)).encode_batch_fast([documents[0], ""])[1].ids) == 16  # as saved
    for backend in [b for b in installed_backends() if b in BACKENDS]:
        assert choose_backend(path, backend, documents[:20])[0] == backend
        ids, counts = make_encoder(path, backend).encode_batch(documents[:20] + [""])
        assert split_docs(ids, counts) == want, backend
    assert choose_backend(path, "auto", documents[:20]) == choose_backend(tokenizer_path, "auto", documents[:20])
    # a tokmix that applied them made other units of it: the token cache's key of its units is not theirs
    assert saves_model_inputs(path) and not saves_model_inputs(tokenizer_path)
    recipe = load_recipe(ROOT / "recipes" / "gpt-u-20m.toml")
    bases = [key_base(recipe, "0" * 64, REFERENCE_DELIMITERS, np.dtype(np.uint16), 1 << 22, None, saves)
             for saves in (False, True)]
    assert bases[0].holdout_key("text", ["a"], [[1]]) != bases[1].holdout_key("text", ["a"], [[1]])
    assert bases[0] == key_base(recipe, "0" * 64, REFERENCE_DELIMITERS, np.dtype(np.uint16), 1 << 22, None)


def merge_order_tokenizer(path: Path) -> Path:
    """Byte-level BPE whose merges are b+c, a+b, ab+c. HF encodes "abc" as [a, bc] (no merge joins a and bc);
    tiktoken, which merges any adjacent pair whose concatenation is in the vocabulary, gives [abc]."""
    vocab = {"<|endoftext|>": 0}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    merges = [["b", "c"], ["a", "b"], ["ab", "c"]]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path))
    return path


def test_tiktoken_disagreement_is_caught(tmp_path, monkeypatch):
    path = merge_order_tokenizer(tmp_path / "tokenizer.json")
    require("tiktoken")
    a, bc = hf_ids(path, ["a", "bc"])
    assert hf_ids(path, ["abc"]) == [a + bc]

    with pytest.raises(TokmixError, match="ids differ from HF on sample document 1 at token 1"):
        choose_backend(path, "tiktoken", ["xyz", "xabc"])
    if "fastokens" in installed_backends():  # fastokens follows HF's merge list, so auto still runs fast
        assert choose_backend(path, "auto", ["xyz", "xabc"]) == ("fastokens", [])

    monkeypatch.setitem(sys.modules, "fastokens", None)  # how Python spells "not installed"
    name, notices = choose_backend(path, "auto", ["xyz", "xabc"])
    assert name == "hf"
    abc = Tokenizer.from_file(str(path)).token_to_id("abc")
    assert notices == [
        "fastokens: not installed (no wheel for this platform) — falling back to hf",
        f"tiktoken: ids differ from HF on sample document 1 at token 1 (HF {a[0]}, tiktoken {abc}) — falling back to hf"
    ]


def test_unknown_or_missing_backend_is_a_tokmix_error(tokenizer_path, tmp_path, monkeypatch):
    with pytest.raises(TokmixError, match="unknown tokenizer backend 'spm'"):
        make_encoder(tokenizer_path, "spm")
    with pytest.raises(TokmixError, match="'sentencepiece' cannot serve .*: it is not a SentencePiece model"):
        make_encoder(tokenizer_path, "sentencepiece")
    with pytest.raises(TokmixError, match="'sentencepiece' cannot be used for .*: it does not read hf tokenizers"):
        choose_backend(tokenizer_path, "sentencepiece")
    with pytest.raises(TokmixError, match="unknown tokenizer backend"):
        choose_backend(tokenizer_path, "fast")
    with pytest.raises(TokmixError, match="tokenizer file not found"):
        make_encoder(tmp_path / "missing.json", "hf")
    with pytest.raises(TokmixError, match="threads must be at least 1"):
        make_encoder(tokenizer_path, "hf", threads=0)

    monkeypatch.setitem(sys.modules, "fastokens", None)
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    assert [b for b in installed_backends() if b in BACKENDS] == ["hf"]
    for backend in FAST_BACKENDS:
        with pytest.raises(TokmixError, match=f"'{backend}' is not installed"):
            make_encoder(tokenizer_path, backend)
        with pytest.raises(TokmixError, match=f"'{backend}' is not installed"):
            choose_backend(tokenizer_path, backend)
    # a platform where pip left the fast backends out (no wheels): auto falls back to HF and says so in one line
    assert choose_backend(tokenizer_path, "auto") == (
        "hf", ["fastokens, tiktoken: not installed (no wheel for this platform) — falling back to hf"])


def test_a_sentencepiece_model_runs_on_fastokens_where_its_ids_are_sentencepieces(tmp_path):
    """A SentencePiece BPE model with no normalization table (Mistral 7B's) is read by fastokens through the
    tokenizer.json view sentencepiece's own pieces and scores give: id for id sentencepiece's on real and
    adversarial text, so auto picks it. A unigram model (trained here by sentencepiece) stays on sentencepiece,
    said in one line."""
    import gzip
    import io

    import sentencepiece

    from tests.vocab import DATA, MISTRAL_IDS

    require("fastokens")
    texts = real_documents(400_000, 200_000) + list(MISTRAL_IDS)  # and the check's adversarial texts
    mistral = tmp_path / "mistral.model"
    mistral.write_bytes(gzip.decompress((DATA / "mistral-v1.model.gz").read_bytes()))
    assert choose_backend(mistral, "auto", texts) == ("fastokens", [])  # id for id sentencepiece's on all of them
    ids = make_encoder(mistral, "fastokens", 1).encode_batch(list(MISTRAL_IDS))[0]
    assert ids.tolist() == [i for published in MISTRAL_IDS.values() for i in published]

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, vocab_size=400,
                                             model_type="unigram", normalization_rule_name="identity",
                                             remove_extra_whitespaces=False, minloglevel=2)
    unigram = tmp_path / "unigram.model"
    unigram.write_bytes(model.getvalue())
    name, notices = choose_backend(unigram, "auto", texts)
    assert name == "sentencepiece" and len(notices) == 1, notices
    assert notices == ["fastokens: not applicable: it cannot load the tokenizer (ValueError: model error: "
                       "unsupported model type: Unigram) — falling back to sentencepiece"]
