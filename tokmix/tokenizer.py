"""The tokenizer: load a tokenizer.json and check it can write shards, or train a byte-level BPE on train
files only (never holdout files), and the UTF-8 bytes each token id stands for (bits per byte)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tokmix.errors import TokmixError
from tokmix.shards import CHECKSUM, EOT_ID, EOT_TOKEN, dtype_for_vocab


def tokenizer_checksum(path: str) -> str:
    """The sha256 of the tokenizer file's bytes (what `sha256sum` prints)."""
    with fsspec.open(path, "rb") as f:
        return hashlib.new(CHECKSUM, f.read()).hexdigest()


def load_tokenizer(path: str) -> Tokenizer:
    """A tokenizer that treats a literal <|endoftext|> inside a document as plain text."""
    try:
        with fsspec.open(path, "r") as f:
            tok = Tokenizer.from_str(f.read())
    except FileNotFoundError:
        raise TokmixError(f"tokenizer {path}: file not found") from None
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise TokmixError(f"tokenizer {path}: not a valid tokenizer.json ({str(e).splitlines()[0]})") from None
    eot = tok.token_to_id(EOT_TOKEN)
    if eot is None:
        raise TokmixError(f"tokenizer {path}: has no {EOT_TOKEN} token (tokmix needs it as id {EOT_ID})")
    if eot != EOT_ID:
        raise TokmixError(f"tokenizer {path}: {EOT_TOKEN} is id {eot}; tokmix needs it at id {EOT_ID}")
    tok.encode_special_tokens = True
    return tok


def vocab_size(tok: Tokenizer) -> int:
    return tok.get_vocab_size(with_added_tokens=True)


def token_dtype(tok: Tokenizer, forced: str, path: str) -> np.dtype:
    try:
        return dtype_for_vocab(vocab_size(tok), forced)
    except ValueError as e:
        raise TokmixError(f"tokenizer {path}: {e}; use dtype = \"auto\" or \"uint32\"") from None


def token_byte_lengths(tok: Tokenizer) -> np.ndarray:
    """UTF-8 bytes per token id: in a byte-level BPE every character of a token stands for one byte;
    <|endoftext|> stands for none."""
    lengths = np.zeros(vocab_size(tok), dtype=np.int64)
    for token, idx in tok.get_vocab(with_added_tokens=True).items():
        if idx != EOT_ID:
            lengths[idx] = len(token)
    return lengths


def train_tokenizer(texts: Iterator[str], vocab: int, min_frequency: int, out_path: Path) -> None:
    """A GPT-2 style byte-level BPE: the full 256-byte initial alphabet, <|endoftext|> as id 0."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=min_frequency,
        special_tokens=[EOT_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    if tok.token_to_id(EOT_TOKEN) != EOT_ID:  # the trainer puts special tokens first; make sure
        raise TokmixError(f"trained tokenizer put {EOT_TOKEN} at id {tok.token_to_id(EOT_TOKEN)}")
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(tok.to_str(pretty=False))
    tmp.replace(out_path)
