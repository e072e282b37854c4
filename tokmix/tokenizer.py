"""The tokenizer: load a tokenizer.json, or train a byte-level BPE on train files only (never holdout files); the
recipe's document delimiters as its ids; and the UTF-8 bytes each token id stands for (bits per byte)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tokmix.errors import TokmixError
from tokmix.recipe import REFERENCE_PREFIX
from tokmix.shards import CHECKSUM, Delimiters, dtype_for_vocab


def tokenizer_checksum(path: str) -> str:
    """The sha256 of the tokenizer file's bytes (what `sha256sum` prints)."""
    with fsspec.open(path, "rb") as f:
        return hashlib.new(CHECKSUM, f.read()).hexdigest()


def load_tokenizer(path: str) -> Tokenizer:
    """A tokenizer that treats a literal special token inside a document (e.g. "<|endoftext|>") as plain text."""
    try:
        with fsspec.open(path, "r") as f:
            tok = Tokenizer.from_str(f.read())
    except FileNotFoundError:
        raise TokmixError(f"tokenizer {path}: file not found") from None
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise TokmixError(f"tokenizer {path}: not a valid tokenizer.json ({str(e).splitlines()[0]})") from None
    vocab = tok.get_vocab(with_added_tokens=True)
    token, top = max(vocab.items(), key=lambda item: item[1])
    if top >= len(vocab):  # ids must be 0..n-1: the shards' consumers size their tables by the vocabulary
        raise TokmixError(f"tokenizer {path}: token {token!r} has id {top:,}, past its vocabulary of {len(vocab):,} "
                          f"tokens (ids 0-{len(vocab) - 1:,}); renumber its tokens without gaps")
    tok.encode_special_tokens = True
    return tok


def special_tokens(tok: Tokenizer) -> dict[str, int]:
    """The tokenizer's special tokens by name: the only ones text never encodes to (encode_special_tokens)."""
    return {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}


def document_delimiters(tok: Tokenizer, prefix: list[str], suffix: list[str], path: str) -> Delimiters:
    """The recipe's doc_prefix and doc_suffix token names as the tokenizer's ids."""
    specials = special_tokens(tok)

    def ids(names: list[str], key: str) -> tuple[int, ...]:
        missing = [n for n in names if n not in specials]
        if missing:
            known = ", ".join(sorted(specials, key=specials.get)[:8]) or "none"
            more = f" and {len(specials) - 8} more" if len(specials) > 8 else ""
            raise TokmixError(f"tokenizer {path}: tokenizer.{key} names {missing[0]!r}, which is not one of its "
                              f"special tokens ({known}{more})")
        return tuple(specials[n] for n in names)

    return Delimiters(ids(prefix, "doc_prefix"), ids(suffix, "doc_suffix"))


def vocab_size(tok: Tokenizer) -> int:
    return tok.get_vocab_size(with_added_tokens=True)


def token_dtype(tok: Tokenizer, forced: str, path: str) -> np.dtype:
    try:
        return dtype_for_vocab(vocab_size(tok), forced)
    except ValueError as e:
        raise TokmixError(f"tokenizer {path}: {e}; use dtype = \"auto\" or \"uint32\"") from None


_BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _is_byte_level(spec: dict) -> bool:
    """Whether the tokenizer's vocabulary is written in GPT-2's byte-to-character table (a ByteLevel decoder)."""
    parts = [spec.get("decoder") or {}]
    while parts:
        part = parts.pop()
        if part.get("type") == "ByteLevel":
            return True
        parts += part.get("decoders") or []
    return False


def token_byte_lengths(tok: Tokenizer) -> np.ndarray:
    """UTF-8 bytes per token id. Byte-level BPE: each character of a token stands for one byte. SentencePiece-style:
    the token's text with "▁" for a space, a byte-fallback token <0xNN> one byte. Special tokens stand for none."""
    spec = json.loads(tok.to_str())
    byte_level = _is_byte_level(spec)
    byte_fallback = bool((spec.get("model") or {}).get("byte_fallback"))
    specials = set(special_tokens(tok).values())
    lengths = np.zeros(vocab_size(tok), dtype=np.int64)
    for token, idx in tok.get_vocab(with_added_tokens=True).items():
        if idx in specials:
            continue
        if byte_level:
            lengths[idx] = len(token)
        elif byte_fallback and _BYTE_FALLBACK.fullmatch(token):
            lengths[idx] = 1
        else:
            lengths[idx] = len(token.replace("\u2581", " ").encode("utf-8"))
    return lengths


def train_tokenizer(texts: Iterator[str], vocab: int, min_frequency: int, out_path: Path,
                    specials: list[str] = REFERENCE_PREFIX) -> None:
    """A GPT-2 style byte-level BPE with the full 256-byte initial alphabet; its special tokens (the recipe's
    delimiters) come first, so the reference's <|endoftext|> is id 0."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = list(dict.fromkeys(specials))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    placed = [tok.token_to_id(name) for name in specials]
    if placed != list(range(len(specials))):  # the trainer puts special tokens first; make sure
        raise TokmixError(f"trained tokenizer put its special tokens {specials} at ids {placed}")
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(tok.to_str(pretty=False))
    tmp.replace(out_path)
