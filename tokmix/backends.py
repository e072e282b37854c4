"""Tokenizer backends that give exactly the ids of the tokenizer format's own library, and the check that proves it
on every run.

The oracle is the format's implementation: tiktoken for tiktoken ranks (the run's tokenizer.tiktoken.json),
sentencepiece for a SentencePiece .model, HF `tokenizers` for a tokenizer.json. The oracles are slow where a fast
backend is not (HF ~0.3M tokens/s per thread here, fastokens ~50M: bench/backends.py, docs/benchmarks.md), so the
driver picks the fastest installed backend that reproduces the oracle on ADVERSARIAL_TEXTS plus a sample of the
run's own documents (choose_backend); the stage process and Ray workers then build that backend by name, without
re-checking (make_encoder).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

from tokmix.errors import TokmixError
from tokmix.text import HUGE_DOC_CHARS, clean_surrogates
from tokmix.wire import read_varint

BACKENDS: tuple[str, ...] = ("fastokens", "tiktoken", "sentencepiece", "hf")  # fastest first
_MODULE = {"fastokens": "fastokens", "tiktoken": "tiktoken", "sentencepiece": "sentencepiece", "hf": "tokenizers",
           "fastokens-as-written": "fastokens"}
# A backend that reads some files through a faster form of them (fastokens: a Digits step in the split regex), and
# its other name for reading such a file as written: checked next where the faster form's ids differ from the
# oracle's, never chosen otherwise (it is the same encoder there).
AS_WRITTEN = {"fastokens": "fastokens-as-written"}

# A tokenizer file's format, and the backend that is its oracle (the format's own library).
FORMATS: tuple[str, ...] = ("hf", "tiktoken", "sentencepiece")
ORACLE = {"hf": "hf", "tiktoken": "tiktoken", "sentencepiece": "sentencepiece"}
# the backends that may serve a format, fastest first; each is used only where it reproduces the oracle
SERVES = {"hf": ("fastokens", "tiktoken", "hf"), "tiktoken": ("fastokens", "tiktoken"),
          "sentencepiece": ("fastokens", "sentencepiece")}
ORACLE_LIBRARY = {"hf": "tokenizers", "tiktoken": "tiktoken", "sentencepiece": "sentencepiece"}
TIKTOKEN_KEY = "tiktoken"  # the first key of the run's tokenizer.tiktoken.json (tokmix.tokenizer)
NO_VIEW = "no_view"  # its key, beside the ranks' pattern, for why they have no tokenizer.json view (else absent)


def tokenizer_format(path: str | Path) -> str:
    """The format of the run's tokenizer file, from its first bytes: the run's own tiktoken file starts with its
    "tiktoken" key, a tokenizer.json with "{", and anything else is read as a SentencePiece model (a protobuf).
    The driver checks it is the one the recipe names (tokmix.tokenizer.load_vocabulary)."""
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    if head.startswith(b'{"' + TIKTOKEN_KEY.encode() + b'"'):
        return "tiktoken"
    return "hf" if head.startswith(b"{") else "sentencepiece"


def library_versions(backends: Iterable[str]) -> dict[str, str]:
    """The installed version of each backend's library (what decides its ids), by library name."""
    return installed_versions(_MODULE[name] for name in backends)


READING = "tokmix.backends"  # the entry of a run's recorded libraries that stands for this module's reading


def reading_digest() -> str:
    """What of tokmix itself decides a backend's ids: this module's source (the forms a backend is given a file
    through: fastokens' Split for a Digits step, Metaspace as a normalizer, tiktoken's ranks), as the first 16 hex
    digits of its sha256. A run records it beside the libraries' versions, so that a resume under other code
    checks the ids again as it does under other libraries (tokmix.tokenizer_stage)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def installed_versions(libraries: Iterable[str]) -> dict[str, str]:
    versions = {}
    for library in sorted(libraries):
        try:
            versions[library] = importlib.metadata.version(library)
        except importlib.metadata.PackageNotFoundError:
            versions[library] = "not installed"
    return versions


# The split HF's ByteLevel pre-tokenizer does with use_regex=True (GPT-2's pattern), and the same as tiktoken's
# gpt2 / r50k_base / p50k_base encodings write it.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TIKTOKEN_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# tiktoken 0.14's r50k_base and p50k_base: the same pieces, spelled possessively (a run of letters, digits or
# punctuation is taken whole either way; whitespace to the end of the text is `\s+(?!\S)`'s match too; a last
# lone whitespace character is one piece either way)
TIKTOKEN_GPT2_POSSESSIVE = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
GPT2_PATTERNS = (GPT2_PATTERN, TIKTOKEN_GPT2_PATTERN, TIKTOKEN_GPT2_POSSESSIVE)
# cl100k_base's split as tiktoken 0.14 spells it, and as HF's converted cl100k tokenizer.json does (the spelling
# fastokens runs its own scanner for, ~3x its regex): the pieces differ only where a whitespace run that ends the
# text holds a newline and more whitespace after it (one piece for tiktoken, cut after the last newline for the
# other), which gives the same ids where no token joins a newline to the whitespace after it (cl100k has none:
# tokmix.tokenizer.ranks_tokenizer_json checks the ranks)
TIKTOKEN_CL100K = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                   r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
HF_CL100K = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
             r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# o200k_base's split as tiktoken 0.14 spells it
TIKTOKEN_O200K = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
                  r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
                  r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
                  r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
                  r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# the splits where a space after a non-space and before a letter always starts a pre-token (tokmix.text._cut)
CUTTABLE_PATTERNS = (*GPT2_PATTERNS, TIKTOKEN_CL100K, HF_CL100K, TIKTOKEN_O200K)
# DeepSeek-V3's tokenizer.json: Splits isolating runs of up to three digits, then runs of CJK ideographs and kana,
# then words, punctuation and whitespace much as cl100k's, before a byte-level step without a regex. At a space
# after a non-space and before a letter each of them keeps a pre-token boundary before the space: digits and CJK
# never match a space; of the third's alternatives only whitespace runs take a space after their first character
# (and never a non-space before it), and a space before a letter starts `[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+`.
# Its one lookahead, `\s+(?!\S)`, sees the text's end as it sees that space.
DEEPSEEK_V3_SPLITS = (
    "\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
# GPT-2's regex after a Digits step, as the rest of one regex (_digits_in_split): its alternatives less numbers, a
# whitespace run ending before a number as at a text's end
GPT2_AFTER_DIGITS = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""


_SHARED_PREFIX = "".join(f"row {i}: total = add(x{i}, 'y')  # ok\n" for i in range(150))  # ~5 KB

# Small enough that checking all of them takes well under a second, even with HF.
ADVERSARIAL_TEXTS: list[str] = [
    "",
    "<|endoftext|>",
    "a literal <|endoftext|> inside text,<|endoftext|><|endoftext|>twice, a broken <|endoftext| and <|endoftext",
    " " * 100_000 + "a",
    "x" + "\n" * 5_000 + "y" + " \t" * 2_000 + "z",
    "Windows lines\r\nend\r\n\r\nlike this\r\n \r\n",
    "\tdef f():\n\t\treturn 1\t\t\n \t't \t's\n  're 've 'm 'll 'd 'S 'T 'Re don't",
    "form\ffeed\f\f page\x0bvertical tab\f",
    "emoji 👨‍👩‍👧‍👦 flags 🇩🇪🇯🇵 skin 👍🏽 keycap 1️⃣ astronaut 🧑🏿‍🚀 heart ❤️",
    "combining e\u0301 a\u0308\u0304 Z\u0351\u0354\u0300 jamo \u1100\u1161\u11a8 h\u0336e\u0337",
    "中文句子，带有标点。日本語のテキスト、カタカナ。한국어 문장입니다.",
    "العربية: نص مع أرقام ١٢٣ وعلامات، وتشكيل مُتَحَرِّك",
    "हिन्दी देवनागरी लिपि में पाठ। संयुक्ताक्षर क्ष त्र ज्ञ",
    "unicode spaces:\u00a0nbsp\u2009thin\u3000ideographic\u2028ls\u2029ps\x85nel\u200bzwsp\ufeffbom",
    "numbers 3.14159 1,000,000 ½ ² ① ١٢٣ ๑๒๓ 0x1F 1e-9",
    "controls \x00\x01\x1b[31mred\x1b[0m \x1c\x1d\x1e\x1f \x7f",
    "rare \ue000 private, \ufffe\uffff noncharacters, \U0010fffd, \U0001d400 math, \U00020000 ext B",
    "lone surrogates \ud800 high, \udfff low, and a split pair \ud83d\ude00",
    "trailing whitespace   ",
    "   \n\n   ",
    "a long line: " + "word, 123 and more; " * 5_000,
    _SHARED_PREFIX + "x" * 700,  # two documents sharing 5 KB: whatever a backend caches must not leak across
    _SHARED_PREFIX + " " * 700 + "y",
]


class Encoder(Protocol):
    name: str
    vocab_size: int

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Flat ids of all documents concatenated (np.uint32) and per-document token counts (np.int64).

        No EOT inserted; the caller inserts it. The ids may be a read-only view of the backend's buffer.
        """
        ...


def _size_thread_pools(threads: int | None) -> None:
    """Size the Rust thread pools (HF and fastokens use rayon; fastokens has a second pool for BPE).

    These libraries read the variables once, when a process first encodes, so `threads` holds for the first encoder
    a process builds; the stages pass threads=1 (tokmix.stages.ENCODER_THREADS). None keeps each library's default,
    every core.
    TOKENIZERS_PARALLELISM stays unset then, so HF still turns its threads off in a child forked after it ran.
    """
    if threads is None:
        return
    if threads < 1:
        raise TokmixError(f"tokenizer threads must be at least 1, got {threads}")
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["FASTOKENS_BPE_THREADS"] = str(threads)
    if threads == 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"


class HFEncoder:
    """HF `tokenizers` (the oracle of a tokenizer.json), with a literal special token ("<|endoftext|>") inside a
    document encoded as plain text, and no post-processor tokens (a template's BOS): the recipe's delimiters are
    the only tokens added. A file's truncation and padding (a model's input length, saved with it) are not
    applied either: a document is never cut nor padded."""

    name = "hf"

    def __init__(self, tokenizer_path: str | Path, threads: int | None = None):
        _size_thread_pools(threads)
        from tokenizers import Tokenizer

        if tokenizer_format(tokenizer_path) != "hf":
            raise NotApplicable("it is not a tokenizer.json")
        self._tok = Tokenizer.from_file(str(tokenizer_path))
        self._tok.encode_special_tokens = True
        self._tok.no_truncation()
        self._tok.no_padding()
        self.vocab_size = self._tok.get_vocab_size()

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        docs = [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]
        counts = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        ids = np.fromiter(itertools.chain.from_iterable(docs), dtype=np.uint32, count=int(counts.sum()))
        return ids, counts

    def encode(self, text: str) -> np.ndarray:
        return np.array(self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids, dtype=np.uint32)


def _metaspace_as_normalizer(spec: dict) -> bool:
    """Rewrite, in place, a SentencePiece-style tokenizer whose Metaspace pre-tokenizer keeps the text whole
    (split false, as Mistral's and Llama's newer tokenizer.json have it) into one without a pre-tokenizer, whose
    normalizer turns spaces into "▁"; the encoder then prepends the "▁" Metaspace would (to a text that does not
    start with one or with a space). fastokens has no Metaspace; it has the rest. False when there is nothing
    to rewrite (the exactness check judges the result either way)."""
    pre = spec.get("pre_tokenizer") or {}
    if (pre.get("type") != "Metaspace" or pre.get("split", True) or spec.get("normalizer")
            or pre.get("prepend_scheme", "always") not in ("first", "always")):
        return False
    replacement = pre.get("replacement", "\u2581")
    spec["pre_tokenizer"] = None
    spec["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": replacement}
    return True


def _digits_in_split(spec: dict) -> bool:
    """Rewrite, in place, a pre-tokenizer that isolates numbers (Digits) and then splits by GPT-2's regex (a
    ByteLevel with it, as Cohere's Command-R and SmolLM have it) into one Split (numbers, then GPT2_AFTER_DIGITS) and a
    ByteLevel without a regex: the same pieces (Digits cuts the text before and after every number character, or
    run of them; GPT-2's regex then splits each part alone, where a whitespace run ends before a number as it
    ends at a text's end). fastokens runs the Digits step several times slower than a Split
    (docs/benchmarks.md). False when there is nothing to rewrite (the exactness check judges the result)."""
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") or []
    if pre.get("type") != "Sequence" or len(steps) != 2:
        return False
    digits, byte_level = steps
    if (digits.get("type") != "Digits" or byte_level.get("type") != "ByteLevel"
            or not byte_level.get("use_regex", True) or byte_level.get("add_prefix_space")):
        return False
    number = r"\p{N}" if digits.get("individual_digits") else r"\p{N}+"
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": f"{number}|{GPT2_AFTER_DIGITS}"}, "behavior": "Isolated",
         "invert": False},
        {**byte_level, "use_regex": False}]}
    return True


class FastokensEncoder:
    """fastokens on the tokenizer.json, or on the form of it that fastokens runs fastest (a Metaspace
    pre-tokenizer as a normalizer, see _metaspace_as_normalizer; a Digits step in the split regex, see
    _digits_in_split), through its flat batch API (no per-token Python objects)."""

    name = "fastokens"
    folds_digits = True

    def __init__(self, tokenizer_path: str | Path, threads: int | None = None):
        _size_thread_pools(threads)
        import fastokens

        # Built from the JSON text alone, exactly what HF reads; nothing beside the file is consulted.
        fmt = tokenizer_format(tokenizer_path)
        if fmt == "tiktoken":  # its tokenizer.json view of the ranks
            text, spec = read_tiktoken_file(tokenizer_path, "tokenizer_json"), {}
            if not text:
                why = read_tiktoken_file(tokenizer_path)[TIKTOKEN_KEY][NO_VIEW]
                raise NotApplicable(f"its ranks have no tokenizer.json view ({why})")
        elif fmt == "sentencepiece":  # the view of the model sentencepiece itself gives
            text, spec = sentencepiece_tokenizer_json(tokenizer_path), {}
        else:
            text = Path(tokenizer_path).read_text(encoding="utf-8")
            spec = json.loads(text)
        self._prepend = None
        self.rewritten: list[str] = []  # the rewrites this encoder reads the file through
        if spec and _metaspace_as_normalizer(spec):
            self._prepend = spec["normalizer"]["content"]
            self.rewritten.append("Metaspace")
        if self.folds_digits and spec and _digits_in_split(spec):
            self.rewritten.append("Digits")
        if not self.folds_digits and not (spec and _digits_in_split(dict(spec))):  # a copy: only asked
            raise NotApplicable("it has no Digits step for fastokens to read otherwise")
        if self.rewritten:
            text = json.dumps(spec)
        spec = None  # the parsed file freed before fastokens builds its tables (docs/benchmarks.md: a peak lower)
        self._tok = fastokens.Tokenizer.from_json_str(text)
        self._tok.no_truncation()  # as HFEncoder: a file's settings for a model's inputs
        self._tok.no_padding()
        self.vocab_size = self._tok.vocab_size

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        # split_special_tokens: a literal "<|endoftext|>" is text, as with HF's encode_special_tokens (else id 0)
        if self._prepend is not None:
            mark = self._prepend
            texts = [mark + t if t and t[0] != " " and t[0] != mark else t for t in texts]
        ids, offsets = self._tok.encode_batch_flat(texts, add_special_tokens=False, split_special_tokens=True)
        counts = np.diff(np.frombuffer(offsets, dtype=np.uint64)).astype(np.int64)
        return np.frombuffer(ids, dtype=np.uint32), counts


class FastokensAsWritten(FastokensEncoder):
    """fastokens on a tokenizer.json's Digits step as written (several times slower than fastokens' own form of
    it): tried where that form's ids differ from the oracle's; not applicable to a file without the step."""

    name = "fastokens-as-written"
    folds_digits = False


def proto_fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message, by its wire format alone: ints for varints, bytes for the rest."""
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        wire = key & 7
        if wire == 0:
            value, i = read_varint(buf, i)
        elif wire == 2:
            n, i = read_varint(buf, i)
            value, i = buf[i : i + n], i + n
        elif wire in (1, 5):  # fixed 64 or 32 bits
            size = 8 if wire == 1 else 4
            value, i = buf[i : i + size], i + size
        else:
            raise NotApplicable(f"its model is not a protobuf message this reader knows (wire type {wire})")
        yield key >> 3, value


# SentencePiece's ModelProto: pieces (1) {piece (1), score (2), type (3): 4 user-defined}, trainer_spec (2)
# {model_type (3): 1 unigram, 2 BPE; treat_whitespace_as_suffix (24); byte_fallback (35)}, normalizer_spec (3)
# {name (1), precompiled_charsmap (2), add_dummy_prefix (3), remove_extra_whitespaces (4), escape_whitespaces (5);
# the last three true unless set}
_UNIGRAM, _BPE = 1, 2
_USER_DEFINED = 4


def sentencepiece_tokenizer_json(model_path: str | Path) -> str:
    """The tokenizer.json that reads text as a SentencePiece model does, for a fast backend: its pieces at their
    ids with their scores and kinds from sentencepiece itself, BPE merges in order of the merged piece's score
    (or its unigram lattice), byte fallback, its normalization table, "▁" for each space and before the text as
    the model's normalizer spec says. NotApplicable for what it cannot say (extra whitespace removed, suffix
    whitespace): the exactness check judges the rest."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_path))
    trainer, normalizer, user = {}, {}, []
    for number, value in proto_fields(sp.serialized_model_proto()):
        if number in (2, 3):
            (trainer if number == 2 else normalizer).update(proto_fields(value))
        elif number == 1 and (piece := dict(proto_fields(value))).get(3) == _USER_DEFINED:
            user.append(piece[1].decode())
    if user:  # sentencepiece matches them before BPE: a piece of the view's BPE would be split like any other
        raise NotApplicable(f"it has user-defined pieces ({', '.join(user[:3])}{', ...' if len(user) > 3 else ''}), "
                            "which sentencepiece takes whole wherever they occur in a text")
    model_type = trainer.get(3, _UNIGRAM)
    if model_type not in (_UNIGRAM, _BPE):
        raise NotApplicable("it is neither a BPE nor a unigram SentencePiece model")
    if normalizer.get(4, 1) or trainer.get(24, 0):
        raise NotApplicable("it removes extra whitespace or puts it after words")
    pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    special = [i for i in range(len(pieces)) if sp.is_control(i) or sp.is_unknown(i)]
    normal = [i for i in range(len(pieces)) if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i)
                                                     or sp.is_unused(i))]
    unk = next((i for i in range(len(pieces)) if sp.is_unknown(i)), None)
    byte_fallback = bool(trainer.get(35, 0))
    if model_type == _BPE:
        vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
        ranked = []
        for merged in normal:
            piece, score = pieces[merged]
            splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                      if piece[:k] in vocab and piece[k:] in vocab]
            splits.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
            ranked += [(-score, merged, n, left, right) for n, (left, right) in enumerate(splits)]
        model = {"type": "BPE", "dropout": None, "unk_token": None if unk is None else pieces[unk][0],
                 "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                 "byte_fallback": byte_fallback, "ignore_merges": False, "vocab": vocab,
                 "merges": [[left, right] for *_, left, right in sorted(ranked)]}
    else:
        model = {"type": "Unigram", "unk_id": unk, "vocab": [[p, s] for p, s in pieces],
                 "byte_fallback": byte_fallback}
    steps = []
    if normalizer.get(2):  # its normalization rule (nmt_nfkc, ...) compiled to a table
        steps.append({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(normalizer[2]).decode()})
    if normalizer.get(3, 1):
        steps.append({"type": "Prepend", "prepend": "\u2581"})
    if normalizer.get(5, 1):
        steps.append({"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})
    added = [{"id": i, "content": pieces[i][0], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in special]
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": steps} if steps else None,
            "pre_tokenizer": None, "post_processor": None, "decoder": None, "model": model}
    return json.dumps(spec, ensure_ascii=False)


class SentencePieceEncoder:
    """sentencepiece itself on a .model file: the oracle of that format (BPE or unigram, its normalizer, dummy
    prefix and byte fallback as the model defines them). No BOS/EOS: the recipe's delimiters are the only tokens
    added."""

    name = "sentencepiece"

    def __init__(self, tokenizer_path: str | Path, threads: int | None = None):
        import sentencepiece

        if tokenizer_format(tokenizer_path) != "sentencepiece":
            raise NotApplicable("it is not a SentencePiece model")
        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_path))
        self.vocab_size = self._sp.get_piece_size()
        self._threads = threads or os.cpu_count() or 1

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        docs = self._sp.encode(texts, out_type=int, num_threads=self._threads) if texts else []
        counts = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        ids = np.fromiter(itertools.chain.from_iterable(docs), dtype=np.uint32, count=int(counts.sum()))
        return ids, counts


class NotApplicable(Exception):
    """This backend cannot mirror this tokenizer; auto skips it."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: the character byte-level BPE writes for each byte in its vocabulary strings."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return table


def _split_pattern(pre: dict) -> str:
    """The regex tiktoken must split text by to match this pre-tokenizer: GPT-2's for HF's ByteLevel with its
    regex, or the pattern of a Split isolating matches followed by a ByteLevel without one (Llama-3's layout, and
    what tokmix writes for tiktoken ranks); NotApplicable for anything else."""
    byte_level = pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space")
    if byte_level and pre.get("use_regex", True):
        return GPT2_PATTERN
    steps = pre.get("pretokenizers") or []
    if pre.get("type") == "Sequence" and len(steps) == 2:
        split, last = steps
        if (split.get("type") == "Split" and "Regex" in (split.get("pattern") or {})
                and split.get("behavior") == "Isolated" and not split.get("invert")
                and last.get("type") == "ByteLevel" and not last.get("use_regex", True)
                and not last.get("add_prefix_space")):
            return split["pattern"]["Regex"]
    raise NotApplicable("the pre-tokenizer is neither byte-level with the GPT-2 regex nor a regex split then "
                        "byte-level")


def _tiktoken_vocab(spec: dict) -> tuple[dict[bytes, int], dict[str, int], str]:
    """Mergeable ranks, special tokens and split pattern for tiktoken from a parsed tokenizer.json; NotApplicable
    if tiktoken's rank-ordered BPE cannot give HF's ids for it."""
    pre, model = spec.get("pre_tokenizer") or {}, spec["model"]
    pattern = _split_pattern(pre)
    if spec.get("normalizer"):
        raise NotApplicable(f"tiktoken has no {spec['normalizer'].get('type')} normalizer")
    if model.get("type") != "BPE" or any(
        model.get(k) for k in ("dropout", "continuing_subword_prefix", "end_of_word_suffix")
    ):
        raise NotApplicable("the model is not plain BPE")
    added = spec.get("added_tokens") or []
    if any(not t["special"] for t in added):  # HF still matches these with encode_special_tokens
        raise NotApplicable("it has added tokens that are not special")

    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    specials = {t["content"]: t["id"] for t in added}
    vocab = {s: i for s, i in model["vocab"].items() if s not in specials}
    try:
        ranks = {bytes(to_byte[c] for c in s): i for s, i in vocab.items()}
    except KeyError:
        raise NotApplicable("its vocabulary is not byte-level") from None
    if len(ranks) != len(vocab) or any(bytes([b]) not in ranks for b in range(256)):
        raise NotApplicable("its vocabulary is not the 256 bytes plus merges")
    # tiktoken merges the adjacent pair whose result has the lowest rank, HF the pair whose merge comes first:
    # the same only if merge results have ranks increasing in merge order, above their parts, and every non-byte
    # token is some merge's result.
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model.get("merges", [])]
    previous = -1
    for i, (a, b) in enumerate(merges):
        rank = vocab.get(a + b, -1)
        if rank <= max(vocab.get(a, rank), vocab.get(b, rank), previous):
            raise NotApplicable(f"merge {i} ({a!r} + {b!r}) breaks tiktoken's rank order")
        previous = rank
    if len(merges) != len(ranks) - 256:
        raise NotApplicable("some vocabulary tokens are not produced by any merge")
    return ranks, specials, pattern


def read_tiktoken_file(path: str | Path, part: str | None = None):
    """The run's tokenizer.tiktoken.json: a first line of JSON, {"tiktoken": {"source", "pat_str",
    "special_tokens"}, "parts": {"ranks": bytes, "tokenizer_json": bytes}}, then those parts in that order: the
    ranks as a .tiktoken file holds them (one `<base64 token> <rank>` a line, what tiktoken reads), and the same
    vocabulary as a tokenizer.json for the backends that read that format. The header, or one part's text: a
    backend reads only the part it needs (parsing a 200k vocabulary's JSON in Python costs seconds)."""
    with open(path, "rb") as f:
        header = json.loads(f.readline())
        if part is None:
            return header
        for name, size in header["parts"].items():
            data = f.read(size)
            if name == part:
                return data.decode("utf-8")
    raise KeyError(part)


def write_tiktoken_file(meta: dict, ranks: str, tokenizer_json: str) -> bytes:
    """The bytes of a tokenizer.tiktoken.json (read_tiktoken_file)."""
    parts = {"ranks": ranks.encode("utf-8"), "tokenizer_json": tokenizer_json.encode("utf-8")}
    header = json.dumps({TIKTOKEN_KEY: meta, "parts": {n: len(b) for n, b in parts.items()}}, ensure_ascii=True)
    return b"".join([header.encode("ascii"), b"\n", *parts.values()])


def parse_ranks(text: str) -> dict[bytes, int]:
    """A .tiktoken file's ranks (ValueError on a line that is not `<base64 token> <rank>`)."""
    ranks = {}
    decode = binascii.a2b_base64
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[decode(token)] = int(rank)
    return ranks


def tiktoken_encoding(path: str | Path):
    """tiktoken's Encoding from the run's tokenizer.tiktoken.json: the oracle itself, built from the encoding's own
    ranks, split pattern and special tokens."""
    import tiktoken

    meta = read_tiktoken_file(path)[TIKTOKEN_KEY]
    return tiktoken.Encoding(f"tokmix:{meta['source']}", pat_str=meta["pat_str"],
                             mergeable_ranks=parse_ranks(read_tiktoken_file(path, "ranks")),
                             special_tokens=meta["special_tokens"])


class TiktokenEncoder:
    """tiktoken: the oracle of the run's tiktoken ranks; for a byte-level BPE tokenizer.json, tiktoken on its
    vocabulary, with a document tiktoken fails on encoded by HF."""

    name = "tiktoken"

    def __init__(self, tokenizer_path: str | Path, threads: int | None = None):
        _size_thread_pools(threads)  # for the HF fallback
        import tiktoken

        self._path = Path(tokenizer_path)
        self._own = tokenizer_format(self._path) == "tiktoken"
        if self._own:
            self._enc = tiktoken_encoding(self._path)
        else:
            ranks, specials, pattern = _tiktoken_vocab(json.loads(self._path.read_text(encoding="utf-8")))
            self._enc = tiktoken.Encoding(
                f"tokmix:{self._path}", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
            )
        self.vocab_size = self._enc.n_vocab
        threads = threads or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tiktoken") if threads > 1 else None
        self._hf: HFEncoder | None = None  # built on the first document tiktoken cannot encode
        self._lock = threading.Lock()
        self.hf_fallback_docs = 0

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        docs = list(self._pool.map(self._encode, texts)) if self._pool else [self._encode(t) for t in texts]
        counts = np.fromiter((d.size for d in docs), dtype=np.int64, count=len(docs))
        return (np.concatenate(docs) if docs else np.empty(0, dtype=np.uint32)), counts

    def _encode(self, text: str) -> np.ndarray:
        # tiktoken's regex gives up on a whitespace run of ~1M characters before a non-space (999,523 spaces pass):
        # encode_to_numpy raises ValueError at once, encode_ordinary panics. Either way HF takes the document.
        try:
            return self._enc.encode_to_numpy(text, disallowed_special=())  # "<|endoftext|>" is plain text
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a Rust panic is a BaseException (pyo3_runtime.PanicException)
            if self._own:  # tiktoken is the oracle: there are no ids of its to give
                raise TokmixError(f"tiktoken cannot encode a document of {len(text):,} characters "
                                  f"({first_line(e)})") from None
            return self._oracle().encode(text)

    def _oracle(self) -> HFEncoder:
        with self._lock:
            if self._hf is None:
                self._hf = HFEncoder(self._path)
            self.hf_fallback_docs += 1
            return self._hf


_ENCODERS = {"fastokens": FastokensEncoder, "tiktoken": TiktokenEncoder, "sentencepiece": SentencePieceEncoder,
             "hf": HFEncoder, "fastokens-as-written": FastokensAsWritten}


def installed_backends() -> list[str]:
    return [name for name in BACKENDS if importlib.util.find_spec(_MODULE[name]) is not None]


def make_encoder(tokenizer_path: str | Path, backend: str, threads: int | None = None) -> Encoder:
    """Build the named backend with no exactness check (workers, after the driver's choose_backend)."""
    _require(tokenizer_path, backend)
    try:
        return _build(backend, tokenizer_path, threads)
    except NotApplicable as e:
        raise TokmixError(f"tokenizer backend {backend!r} cannot serve {tokenizer_path}: {e}") from None


def _require(tokenizer_path: str | Path, backend: str) -> None:
    if backend != "auto" and backend not in _ENCODERS:
        raise TokmixError(f"unknown tokenizer backend {backend!r}; choose one of auto, {', '.join(BACKENDS)}")
    if backend != "auto" and importlib.util.find_spec(_MODULE[backend]) is None:
        raise TokmixError(f"tokenizer backend {backend!r} is not installed (pip install {_MODULE[backend]})")
    if not Path(tokenizer_path).is_file():
        raise TokmixError(f"tokenizer file not found: {tokenizer_path}")


def _build(backend: str, tokenizer_path: str | Path, threads: int | None) -> Encoder:
    try:
        return _ENCODERS[backend](tokenizer_path, threads)
    except (NotApplicable, TokmixError):
        raise
    except Exception as e:  # e.g. fastokens: "unsupported normalizer type: NFKC"
        raise NotApplicable(f"it cannot load the tokenizer ({first_line(e)})") from e


def first_line(e: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _preview(text: str) -> str:
    return repr(text[:30]) + (f"... ({len(text):,} chars)" if len(text) > 30 else "")


def _first_difference(
    name: str, got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray], labels: Sequence[str],
    oracle: str = "HF",
) -> str | None:
    """None when the ids are identical, else where they first differ, as one line."""
    (ids, counts), (want_ids, want_counts) = got, want
    if len(counts) != len(want_counts):
        return f"returned {len(counts)} documents for {len(want_counts)}"
    if np.array_equal(counts, want_counts) and np.array_equal(ids, want_ids):
        return None
    ends, want_ends = np.cumsum(counts), np.cumsum(want_counts)
    for i, label in enumerate(labels):
        doc = ids[ends[i] - counts[i] : ends[i]]
        want_doc = want_ids[want_ends[i] - want_counts[i] : want_ends[i]]
        if np.array_equal(doc, want_doc):
            continue
        n = min(doc.size, want_doc.size)
        differ = np.flatnonzero(doc[:n] != want_doc[:n])
        k = int(differ[0]) if differ.size else n
        at = (f"{oracle} {want_doc[k]}, {name} {doc[k]}" if k < n
              else f"{oracle} has {want_doc.size} tokens, {name} {doc.size}")
        return f"ids differ from {oracle} on {label} at token {k} ({at})"
    return f"ids differ from {oracle}"


def oracle_label(backend: str) -> str:
    return "HF" if backend == "hf" else backend


def _check(
    name: str,
    tokenizer_path: str | Path,
    threads: int | None,
    texts: list[str],
    want: tuple[np.ndarray, np.ndarray],
    oracle: tuple[str, int],
    labels: list[str],
) -> str | None:
    """None when `name` reproduces the oracle (its name and vocabulary size) on `texts`, else why not, as one
    line."""
    try:
        encoder = _build(name, tokenizer_path, threads)
    except NotApplicable as e:
        return f"not applicable: {e}"
    # a tokenizer.json's backends count its ids alike; tiktoken's n_vocab counts the gap before its specials
    if oracle[0] == "hf" and encoder.vocab_size != oracle[1]:
        return f"vocab size {encoder.vocab_size:,} differs from HF's {oracle[1]:,}"
    try:
        got = encoder.encode_batch(texts)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # Rust panics included
        return f"failed on the check texts ({first_line(e)})"
    return _first_difference(name, got, want, labels, oracle_label(oracle[0]))


def check_texts(sample_texts: Iterable[str]) -> tuple[list[str], list[str]]:
    """ADVERSARIAL_TEXTS and the sample, cleaned as every document is, with a label each."""
    samples = [clean_surrogates(t) for t in sample_texts]
    texts = [clean_surrogates(t) for t in ADVERSARIAL_TEXTS] + samples
    labels = [f"adversarial text {i} {_preview(t)}" for i, t in enumerate(ADVERSARIAL_TEXTS)]
    labels += [f"sample document {i}" for i in range(len(samples))]
    return texts, labels


def choose_backend(
    tokenizer_path: str | Path, requested: str = "auto", sample_texts: Iterable[str] = (), threads: int | None = None
) -> tuple[str, list[str]]:
    """The backend to tokenize with, and one-line notices about the faster ones that were passed over.

    "auto" picks the fastest installed backend that serves the tokenizer's format and whose ids equal the
    oracle's (the format's own library) on ADVERSARIAL_TEXTS plus `sample_texts`; a named backend must pass the
    same check or this raises TokmixError.
    """
    backend, notices, _ = choose_backend_with_digest(tokenizer_path, requested, sample_texts, threads)
    return backend, notices


def _digest(ids: tuple[np.ndarray, np.ndarray], docs: int | None = None) -> str:
    """sha256 of the first `docs` texts' token counts, then their ids."""
    counts = ids[1][:docs]
    h = hashlib.sha256(np.ascontiguousarray(counts, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(ids[0][: int(counts.sum())], dtype="<u4").tobytes())
    return h.hexdigest()


def _digests(want: tuple[np.ndarray, np.ndarray]) -> dict[str, str]:
    return {"adversarial": _digest(want, len(ADVERSARIAL_TEXTS)), "all": _digest(want)}


def oracle_digests(tokenizer_path: str | Path, sample_texts: Iterable[str] = ()) -> dict[str, str]:
    """The sha256 of the oracle's ids (per-text counts, then the ids) on ADVERSARIAL_TEXTS ("adversarial") and on
    them and the sample ("all"): recorded by a run (the first in its state, the second in index.json too) and
    compared again under other library versions."""
    oracle = _build(ORACLE[tokenizer_format(tokenizer_path)], tokenizer_path, None)
    return _digests(oracle.encode_batch(check_texts(sample_texts)[0]))


def choose_backend_with_digest(
    tokenizer_path: str | Path, requested: str = "auto", sample_texts: Iterable[str] = (), threads: int | None = None
) -> tuple[str, list[str], dict[str, str]]:
    """choose_backend, and oracle_digests of the same texts (encoded by the oracle once for both)."""
    _require(tokenizer_path, requested)
    fmt = tokenizer_format(tokenizer_path)
    oracle_name = ORACLE[fmt]
    if oracle_name not in installed_backends():
        raise TokmixError(f"{tokenizer_path}: its oracle {_MODULE[oracle_name]} is not installed "
                          f"(pip install {_MODULE[oracle_name]})")
    if requested not in ("auto", *SERVES[fmt]):
        raise TokmixError(f"tokenizer backend {requested!r} cannot be used for {tokenizer_path}: it does not "
                          f"read {fmt} tokenizers (these do: {', '.join(SERVES[fmt])})")
    try:
        oracle = _build(oracle_name, tokenizer_path, threads)
    except NotApplicable as e:
        raise TokmixError(f"{_MODULE[oracle_name]} cannot load {tokenizer_path}: {e}") from None
    texts, labels = check_texts(sample_texts)
    want = oracle.encode_batch(texts)
    if requested == oracle_name:
        return oracle_name, [], _digests(want)
    vocab_size, oracle = oracle.vocab_size, None  # freed before the candidates: one large vocabulary held at once
    problems = []
    installed = installed_backends()
    tried = [requested] if requested != "auto" else [n for n in SERVES[fmt] if n != oracle_name and n in installed]
    for name in [form for n in tried for form in backend_forms(n, tokenizer_path)]:
        problem = _check(name, tokenizer_path, threads, texts, want, (oracle_name, vocab_size), labels)
        if problem is None:
            return name, _fallback_notices(problems, name, requested, fmt), _digests(want)
        problems.append((name, problem))
    if requested != "auto":
        raise TokmixError(f"tokenizer backend {requested!r} cannot be used for {tokenizer_path}: "
                          + "; ".join(f"{n}: {p}" if n != requested else p for n, p in problems))
    return oracle_name, _fallback_notices(problems, oracle_name, requested, fmt), _digests(want)


def backend_forms(backend: str, tokenizer_path: str | Path) -> list[str]:
    """The backend, then its name for reading the file as written where it reads it through another form
    (AS_WRITTEN)."""
    if backend not in AS_WRITTEN or tokenizer_format(tokenizer_path) != "hf":
        return [backend]
    text = Path(tokenizer_path).read_text(encoding="utf-8")
    folds = '"Digits"' in text and _digits_in_split(json.loads(text))  # parsed only where it may apply
    return [backend, AS_WRITTEN[backend]] if folds else [backend]


def _fallback_notices(problems: list[tuple[str, str]], chosen: str, requested: str, fmt: str = "hf") -> list[str]:
    """One line per faster backend passed over; the ones not installed (a platform without their wheels,
    where pip leaves them out) share one line, so that a slow default never goes unannounced."""
    installed = installed_backends()
    serves = SERVES[fmt]
    missing = ([n for n in serves[: serves.index(chosen)] if n not in installed]
               if requested == "auto" and chosen in serves else [])
    notices = [f"{n}: {p} — falling back to {chosen}" for n, p in problems]
    if requested == "auto" and serves == (chosen,):  # sentencepiece: no faster backend reads the format
        notices.append(f"no faster backend reads {fmt} tokenizers: tokenizing with {chosen}, the oracle")
    if missing:
        notices.insert(0, f"{', '.join(missing)}: not installed (no wheel for this platform) — falling back to "
                          f"{chosen}")
    return notices


# ---------------------------------------------------------------------------- documents too large to encode whole
def huge_doc_chars(tokenizer_path: str | Path) -> int:
    """Characters past which a run encodes a document piece by piece (HUGE_DOC_CHARS) where the tokenizer allows
    cutting (can_cut_documents), else a bound no document reaches: part of every unit's cache key."""
    return HUGE_DOC_CHARS if can_cut_documents(tokenizer_path) else 1 << 62


def saves_model_inputs(tokenizer_path: str | Path) -> bool:
    """Whether a tokenizer.json holds a model's input settings, truncation or padding, which no encoder here applies
    (HFEncoder): a tokmix before c612b6c cut its documents, so its units' cache key says so (stages.key_base)."""
    if tokenizer_format(tokenizer_path) != "hf":
        return False
    spec = json.loads(Path(tokenizer_path).read_text(encoding="utf-8"))
    return spec.get("truncation") is not None or spec.get("padding") is not None


def can_cut_documents(tokenizer_path: str | Path) -> bool:
    """Whether cutting a document at an ASCII space after a non-space and before a letter (tokmix.text) leaves its
    ids unchanged.

    - tiktoken ranks split by GPT-2's, cl100k's or o200k's pattern (CUTTABLE_PATTERNS): a pre-token never spans
      such a place, and one starts with that space.
    - a tokenizer.json splitting that way before its byte-level BPE (GPT-2's ByteLevel regex, Llama-3's layout,
      DeepSeek-V3's three Splits), with no normalizer, and added tokens that are special (encoded as text here;
      post-processor tokens are never added) or matched without stripping and hold no space.
    - a SentencePiece BPE model that keeps the text as it is (_sentencepiece_cuttable); the piece after a cut is
      encoded without the space, which the "▁" the model puts before every text stands for (cut_drops_space).
    Not a unigram model, whose best path is scored over the whole text."""
    fmt = tokenizer_format(tokenizer_path)
    if fmt == "tiktoken":
        return read_tiktoken_file(tokenizer_path)[TIKTOKEN_KEY]["pat_str"] in CUTTABLE_PATTERNS
    if fmt == "sentencepiece":
        return _sentencepiece_cuttable(Path(tokenizer_path).read_bytes())
    spec = json.loads(Path(tokenizer_path).read_text(encoding="utf-8"))
    splits = _splits_before_byte_level(spec.get("pre_tokenizer") or {})
    normalizer = spec.get("normalizer") or {}
    return (
        (splits is not None and len(splits) == 1 and splits[0] in CUTTABLE_PATTERNS or splits == DEEPSEEK_V3_SPLITS)
        and (not normalizer or normalizer == {"type": "Sequence", "normalizers": []})
        and all(t["special"] or not (t.get("lstrip") or t.get("rstrip") or " " in t["content"])
                for t in spec.get("added_tokens") or [])
    )


def _splits_before_byte_level(pre: dict) -> tuple[str, ...] | None:
    """The regexes a pre-tokenizer splits text by before its byte-level step (GPT-2's for HF's ByteLevel with its
    regex; the patterns of Splits isolating their matches, then a ByteLevel without one), or None."""
    try:
        return (_split_pattern(pre),)
    except NotApplicable:
        pass
    *splits, last = pre.get("pretokenizers") or [{}]
    if not (pre.get("type") == "Sequence" and splits and last.get("type") == "ByteLevel"
            and not last.get("use_regex", True) and not last.get("add_prefix_space")):
        return None
    if not all(s.get("type") == "Split" and "Regex" in (s.get("pattern") or {}) and s.get("behavior") == "Isolated"
               and not s.get("invert") for s in splits):
        return None
    return tuple(s["pattern"]["Regex"] for s in splits)


_NORMAL, _UNUSED = 1, 5


def _sentencepiece_cuttable(model: bytes) -> bool:
    """A SentencePiece model whose ids are the same for a text cut at a space after a non-space (the piece after
    it given without the space, where the model adds a dummy prefix): a BPE model (merges are local, and run in
    the same order on each side of a place no piece spans), no normalization table, spaces written as "▁" and
    put before words, a dummy prefix or whitespace kept as it is (else the piece after the cut would lose its
    "▁"), and no piece, user-defined or unused included, holding a "▁" after another character: so no piece
    spans the "c▁" such a space becomes."""
    trainer, normalizer, pieces = {}, {}, []
    for number, value in proto_fields(model):
        if number in (2, 3):
            (trainer if number == 2 else normalizer).update(proto_fields(value))
        elif number == 1:
            piece = dict(proto_fields(value))
            if piece.get(3, _NORMAL) in (_NORMAL, _USER_DEFINED, _UNUSED):
                pieces.append(piece.get(1, b"").decode("utf-8", "replace"))
    layout = (trainer.get(3, _UNIGRAM) == _BPE and not normalizer.get(2) and normalizer.get(5, 1)
              and not trainer.get(24, 0) and (normalizer.get(3, 1) or not normalizer.get(4, 1)))
    return bool(layout) and not any("\u2581" in p.lstrip("\u2581") for p in pieces)


def cut_drops_space(tokenizer_path: str | Path) -> bool:
    """Whether the piece after a cut is encoded without the space it was cut at: a SentencePiece model that puts
    "▁" before every text it encodes (add_dummy_prefix), which then stands for that space."""
    if tokenizer_format(tokenizer_path) != "sentencepiece":
        return False
    normalizer = next((dict(proto_fields(v)) for n, v in proto_fields(Path(tokenizer_path).read_bytes()) if n == 3),
                      {})
    return bool(normalizer.get(3, 1))
