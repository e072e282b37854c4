"""The tokenizer: load a tokenizer.json, tiktoken ranks or a SentencePiece model, or train a byte-level BPE on train
files only (never holdout files); what its oracle (the format's own library) says of it: special tokens, the
recipe's document delimiters as its ids, vocabulary size, decoding, and the UTF-8 bytes each token id stands for
(bits per byte)."""

from __future__ import annotations

import atexit
import base64
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tokmix.backends import (
    ADVERSARIAL_TEXTS,
    GPT2_PATTERNS,
    HF_CL100K,
    NO_VIEW,
    ORACLE,
    TIKTOKEN_CL100K,
    TIKTOKEN_GPT2_PATTERN,
    TIKTOKEN_KEY,
    NotApplicable,
    bytes_to_unicode,
    first_line,
    parse_ranks,
    read_tiktoken_file,
    tokenizer_format,
    write_tiktoken_file,
)
from tokmix.errors import TokmixError
from tokmix.recipe import REFERENCE_PREFIX, Recipe, is_tiktoken_file
from tokmix.shards import (
    CHECKSUM,
    TOKENIZER_NAME,
    as_path,
    check_input_file,
    read_bytes_of,
    run_tokenizer_path,
    storage,
    tokenizer_change,
    write_bytes,
)
from tokmix.text import clean_surrogates
from tokmix.tokens import Delimiters, dtype_for_vocab


def tokenizer_checksum(path: str) -> str:
    """The sha256 of the tokenizer file's bytes (what `sha256sum` prints)."""
    check_input_file(path, "tokenizer")
    with fsspec.open(path, "rb") as f:
        return hashlib.new(CHECKSUM, f.read()).hexdigest()


def load_tokenizer(path: str) -> Tokenizer:
    """A tokenizer that treats a literal special token inside a document (e.g. "<|endoftext|>") as plain text."""
    check_input_file(path, "tokenizer")
    try:
        with fsspec.open(path, "r") as f:
            tok = Tokenizer.from_str(f.read())
    except FileNotFoundError:
        raise TokmixError(f"tokenizer {path}: file not found") from None
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise TokmixError(f"tokenizer {path}: not a valid tokenizer.json ({str(e).splitlines()[0]})"
                          + format_hint(path, "path")) from None
    vocab = tok.get_vocab(with_added_tokens=True)
    token, top = max(vocab.items(), key=lambda item: item[1])
    if top >= len(vocab):  # ids must be 0..n-1: the shards' consumers size their tables by the vocabulary
        raise TokmixError(f"tokenizer {path}: token {token!r} has id {top:,}, past its vocabulary of {len(vocab):,} "
                          f"tokens (ids 0-{len(vocab) - 1:,}); renumber its tokens without gaps")
    tok.encode_special_tokens = True
    return tok


_RANK_LINE = re.compile(rb"[A-Za-z0-9+/]+=* [0-9]+\r?\n")


def format_hint(path: str, key: str) -> str:
    """"; it looks like ...: give it as tokenizer.KEY" where the file's first bytes say it is a tokenizer of another
    format than the recipe's `key` reads (a Mistral .model under `path`, a .tiktoken under `sentencepiece`, ...),
    else "". A tokenizer.json starts with "{", a .tiktoken file with a `<base64> <rank>` line, a SentencePiece
    model (a protobuf ModelProto) with its first piece: field 1, length-delimited (byte 0x0a)."""
    try:
        with fsspec.open(path, "rb") as f:
            head = f.read(4096)
    except Exception:  # noqa: BLE001 - unreadable: the message it goes with says so
        return ""
    if head.lstrip().startswith(b"{"):
        other, what = "path", "a tokenizer.json"
    elif _RANK_LINE.match(head):
        other, what = "tiktoken", "tiktoken ranks (a .tiktoken file)"
    elif head[:1] == b"\n":
        other, what = "sentencepiece", "a SentencePiece model"
    else:
        return ""
    return "" if other == key else f"; it looks like {what}: give it as tokenizer.{other}"


def special_tokens(tok: Tokenizer) -> dict[str, int]:
    """The tokenizer's special tokens by name: the only ones text never encodes to (encode_special_tokens)."""
    return {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}


def document_delimiters(vocab: Vocabulary, prefix: list[str], suffix: list[str], path: str) -> Delimiters:
    """The recipe's doc_prefix and doc_suffix token names as the oracle's ids."""
    specials = vocab.specials

    def ids(names: list[str], key: str) -> tuple[int, ...]:
        missing = [n for n in names if n not in specials]
        if missing:
            known = ", ".join(sorted(specials, key=specials.get)[:8]) or "none"
            more = f" and {len(specials) - 8} more" if len(specials) > 8 else ""
            raise TokmixError(f"tokenizer {path}: tokenizer.{key} names {missing[0]!r}, which is not one of its "
                              f"special tokens ({known}{more})")
        return tuple(specials[n] for n in names)

    return Delimiters(ids(prefix, "doc_prefix"), ids(suffix, "doc_suffix"))


class Vocabulary:
    """A tokenizer as its oracle defines it: the format ("hf", "tiktoken", "sentencepiece"), the ids it can give
    (`size`: tiktoken's n_vocab, sentencepiece's piece count, HF's largest id + 1), its special tokens by name (the
    ids text never encodes to), and decoding."""

    def __init__(self, path: str, fmt: str, size: int, specials: dict[str, int]):
        self.path, self.format, self.size, self.specials = path, fmt, size, specials

    @property
    def oracle(self) -> str:
        return ORACLE[self.format]

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes per token id; special tokens stand for none."""
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        """The text of these ids, special tokens by name (invalid UTF-8 as U+FFFD)."""
        raise NotImplementedError

    def no_token_ids(self) -> np.ndarray:
        """The ids below `size` that are no token (neither a piece nor a special token): tiktoken's gaps before
        its special tokens (cl100k's 100256 and 100261-100275), a tokenizer.json's missing ids. None here."""
        return np.empty(0, np.int64)


class HFVocabulary(Vocabulary):
    def __init__(self, path: str):
        self.tokenizer = load_tokenizer(path)
        super().__init__(path, "hf", vocab_size(self.tokenizer), special_tokens(self.tokenizer))

    def token_bytes(self) -> np.ndarray:
        return token_byte_lengths(self.tokenizer)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def no_token_ids(self) -> np.ndarray:
        return _missing(self.tokenizer.get_vocab(with_added_tokens=True).values(), self.size)


class TiktokenVocabulary(Vocabulary):
    """The run's tokenizer.tiktoken.json: tiktoken's ranks, split pattern and special tokens."""

    def __init__(self, path: str):
        self.ranks = parse_ranks(read_tiktoken_file(path, "ranks"))
        specials = dict(read_tiktoken_file(path)[TIKTOKEN_KEY]["special_tokens"])
        size = max([*self.ranks.values(), *specials.values()], default=-1) + 1  # tiktoken's n_vocab
        super().__init__(path, "tiktoken", size, specials)

    def _by_id(self) -> dict[int, bytes]:
        return {**{i: t for t, i in self.ranks.items()}, **{i: n.encode() for n, i in self.specials.items()}}

    def token_bytes(self) -> np.ndarray:
        lengths = np.zeros(self.size, dtype=np.int64)
        for token, idx in self.ranks.items():
            lengths[idx] = len(token)
        return lengths

    def no_token_ids(self) -> np.ndarray:
        return _missing([*self.ranks.values(), *self.specials.values()], self.size)

    def decode(self, ids: list[int]) -> str:
        by_id = self._by_id()
        return b"".join(by_id.get(i, b"\xef\xbf\xbd") for i in ids).decode("utf-8", "replace")


class SentencePieceVocabulary(Vocabulary):
    """A SentencePiece model: its control pieces (<s>, </s>, ...) are its special tokens."""

    def __init__(self, path: str):
        try:
            import sentencepiece
        except ImportError:
            raise TokmixError(f"tokenizer {path}: a SentencePiece model needs the sentencepiece package "
                              "(pip install sentencepiece)") from None
        if not os.path.exists(path):  # (sentencepiece would say NOT_FOUND inside "could not load")
            raise TokmixError(f"tokenizer {path}: file not found")
        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as e:
            raise TokmixError(f"tokenizer {path}: not a valid SentencePiece model ({first_line(e)})"
                              + format_hint(path, "sentencepiece")) from None
        n = self.sp.get_piece_size()
        specials = {self.sp.id_to_piece(i): i for i in range(n) if self.sp.is_control(i)}
        super().__init__(path, "sentencepiece", n, specials)

    def token_bytes(self) -> np.ndarray:
        sp = self.sp
        lengths = np.zeros(self.size, dtype=np.int64)
        for i in range(self.size):
            if sp.is_byte(i):
                lengths[i] = 1
            elif not (sp.is_control(i) or sp.is_unknown(i)):
                lengths[i] = len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
        return lengths

    def decode(self, ids: list[int]) -> str:
        out, run = [], []
        for i in ids:
            if self.sp.is_control(i):
                out += [self.sp.decode(run), self.sp.id_to_piece(i)]
                run = []
            else:
                run.append(i)
        return "".join([*out, self.sp.decode(run)])


def _missing(ids, size: int) -> np.ndarray:
    """The ids below `size` not among `ids`."""
    present = np.zeros(size, dtype=bool)
    present[np.fromiter(ids, np.int64)] = True
    return np.flatnonzero(~present)


def id_ranges(ids: np.ndarray) -> list[list[int]]:
    """Sorted ids as [first, end) ranges of consecutive ones."""
    if not len(ids):
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts, ends = np.r_[0, breaks], np.r_[breaks, len(ids)]
    return [[int(ids[a]), int(ids[b - 1]) + 1] for a, b in zip(starts, ends)]


_KINDS = {"hf": HFVocabulary, "tiktoken": TiktokenVocabulary, "sentencepiece": SentencePieceVocabulary}
_FORMAT_NAMES = {"hf": "a tokenizer.json", "tiktoken": "tiktoken ranks", "sentencepiece": "a SentencePiece model"}


def load_vocabulary(path: str, expected: str | None = None) -> Vocabulary:
    """The tokenizer file's Vocabulary: read as the format `expected` (the recipe's key says it), or as the one
    its bytes say (tokmix.backends.tokenizer_format, what the workers go by), which must then be the same."""
    vocab = _KINDS[expected or tokenizer_format(path)](path)
    if expected is not None and tokenizer_format(path) != expected:  # loaded, but the workers would read it else
        raise TokmixError(f"tokenizer {path}: not {_FORMAT_NAMES[expected]}")
    return vocab


def run_vocabulary(out_dir: str | Path, index) -> Vocabulary:
    """A finished run's tokenizer as its oracle reads it: the file shards.run_tokenizer_path finds (the path
    index.json records, or the run's own beside its index, also on a store), refused when it is not the one the
    shards were made with (shards.tokenizer_change). A store's file is read through read_bytes_of into a local
    copy (the libraries read files), removed when the process ends."""
    path = run_tokenizer_path(out_dir, index)
    if path is None:
        raise TokmixError(f"tokenizer {index.tokenizer} not found (nor {as_path(out_dir) / TOKENIZER_NAME}); it "
                          "decodes the tokens")
    if (changed := tokenizer_change(out_dir, index)) is not None:
        raise TokmixError(changed)  # another file's ids would decode the shards wrongly
    if not storage(path).remote:
        stat = os.stat(path)
        return _file_vocabulary(str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    folder = tempfile.mkdtemp(prefix="tokmix-tokenizer-")
    atexit.register(shutil.rmtree, folder, True)
    local = Path(folder) / path.name
    local.write_bytes(read_bytes_of(path))
    return load_vocabulary(str(local))


@functools.lru_cache(maxsize=4)
def _file_vocabulary(path: str, size: int, mtime_ns: int, inode: int) -> Vocabulary:
    """load_vocabulary once per version of a file (its size, time and inode in the key): a caller reading block
    after block of a run (inspect, trace, a loop over read_block) loads its tokenizer once, not per block."""
    return load_vocabulary(path)


TOKENIZER_FILE = "tokenizer.json"  # the file a Hub repository holds its tokenizer in (a run's own: Layout.tokenizer)


def vocab_size(tok: Tokenizer) -> int:
    """Ids the tokenizer can give: its largest id + 1 (tiktoken encodings leave gaps before their special tokens,
    so counting tokens would fall short)."""
    return max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1


def token_dtype(vocab: Vocabulary, forced: str, path: str) -> np.dtype:
    try:
        return dtype_for_vocab(vocab.size, forced)
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


# The trainer's Rust thread pool: its parallel counts hold a partial table per thread, so its memory grows with
# the threads; two bound it on any machine (the trained tokenizer is the same with any number)
TRAINER_THREADS = 2
# The longest text the trainer is given at once: each thread splitting a text holds several copies of it with 16
# bytes of offsets per byte, and keeps that memory once freed (a multi-MB document's cost: docs/benchmarks.md)
TRAINER_PIECE_CHARS = 1 << 16


# byte-level BPE's pre-tokens, near enough for counting them (tokmix.backends.GPT2_PATTERN is the exact one):
# letters, digits, other non-space characters; and runs of two or more whitespace characters
_PIECE = re.compile(r"[^\W\d_]+|\d+|(?:[^\s\w]|_)+")
_SPACE_RUN = re.compile(r"\s\s+")


WORDS_SEEN = 1 << 18  # whitespace-separated words DistinctWords remembers (~30 MiB), not to split them again


class DistinctWords:
    """The words a tokenizer trainer has been given, as its tables hold them: HF's BPE trainer keeps every distinct
    pre-tokenized word of its sample, with a 32-byte symbol per byte and its pair tables and merge queue per
    symbol, so its memory grows with the bytes of the distinct words, not with the length of the text. `mass`
    counts them, once each, their UTF-8 bytes plus one: the pieces (letters, digits, the rest) of each new
    whitespace-separated word, its first piece also after a space, and each run of whitespace. Deterministic;
    the regex runs on words it has not seen lately (WORDS_SEEN), the rest at C speed."""

    def __init__(self) -> None:
        self.words: set[str] = set()
        self.pieces: set[str] = set()
        self.mass = 0

    def new_mass(self, text: str) -> tuple[tuple[set[str], set[str]], int]:
        """The words and pieces of `text` not seen yet, and the bytes they would add."""
        words = set(text.split())
        words.difference_update(self.words)
        pieces = set(_SPACE_RUN.findall(text))
        for word in words:
            found = _PIECE.findall(word)
            if found:
                pieces.update(found)
                pieces.add(" " + found[0])
        pieces.difference_update(self.pieces)
        return (words, pieces), sum(len(p.encode("utf-8", "surrogatepass")) for p in pieces) + len(pieces)

    def take(self, new: tuple[set[str], set[str]], mass: int) -> None:
        if len(self.words) > WORDS_SEEN:  # they only spare the regex; the pieces decide the mass
            self.words = set()
        self.words |= new[0]
        self.pieces |= new[1]
        self.mass += mass

    def clear(self) -> None:
        self.words, self.pieces = set(), set()


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
    write_bytes(out_path, tok.to_str(pretty=False).encode("utf-8"))


# ---------------------------------------------------------------------------- where the tokenizer comes from
def tokenizer_file(recipe: Recipe, own: Path) -> str | None:
    """The local tokenizer file a run reads: the recipe's `path` or `sentencepiece` itself, a Hub repository's
    tokenizer.json in huggingface_hub's cache, or `own` (the run's own file, written once: Layout.own_tokenizer)
    holding a copy of a URL's file or tiktoken's ranks; None for one still to be trained."""
    spec = recipe.tokenizer
    if spec.hf is not None:
        return fetch_hf_tokenizer(spec.hf)
    if not spec.fetched:
        check_input_file(recipe.tokenizer_path, "tokenizer")
        return recipe.tokenizer_path
    if own.exists():
        return str(own)
    if spec.train is not None:
        return None
    if spec.tiktoken is not None:
        data = tiktoken_run_file(recipe)
    else:
        try:
            with fsspec.open(recipe.tokenizer_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise TokmixError(f"tokenizer {recipe.tokenizer_path}: file not found") from None
    own.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(own, data)  # never over a file of the user's put there meanwhile
    return str(own)


def fetch_hf_tokenizer(repo: str) -> str:
    """The local path of a Hub repository's tokenizer.json, through huggingface_hub's cache: offline when the
    cache has it (the Hub is not asked then), downloaded into the cache otherwise."""
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo, TOKENIZER_FILE, local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the cache (LocalEntryNotFoundError): ask the Hub
        pass
    try:
        return hf_hub_download(repo, TOKENIZER_FILE)
    except Exception as e:  # noqa: BLE001 - offline, unknown or gated repository, no tokenizer.json, ...
        raise TokmixError(f"tokenizer hf = {repo!r}: not in the Hugging Face cache and not downloadable "
                          f"({first_line(e)})") from None


def _read_tiktoken_file(path: str) -> dict[bytes, int]:
    """A .tiktoken file's ranks: one `<base64 token> <rank>` a line."""
    check_input_file(path, "tokenizer")
    try:
        with fsspec.open(path, "r", encoding="ascii") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise TokmixError(f"tokenizer tiktoken = {path}: file not found") from None
    except UnicodeDecodeError:
        raise TokmixError(f"tokenizer tiktoken = {path}: not a .tiktoken file (not ASCII)"
                          + format_hint(path, "tiktoken")) from None
    ranks, line_of = {}, {}
    for n, line in enumerate(lines, 1):
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:  # binascii.Error is a ValueError
            raise TokmixError(f"tokenizer tiktoken = {path}: line {n} is not '<base64 token> <rank>'"
                              + format_hint(path, "tiktoken")) from None
        if line_of.setdefault(int(rank), n) != n:  # two tokens of one id: tiktoken panics building its table
            raise TokmixError(f"tokenizer tiktoken = {path}: line {n} gives rank {rank} again (line "
                              f"{line_of[int(rank)]} has it)")
    return ranks


def _local_encoding(name: str):
    """tiktoken's encoding `name` from ranks already on this machine (tiktoken's cache, TIKTOKEN_CACHE_DIR): the
    fetch tiktoken would make otherwise is refused, so a run never depends on the network for them."""
    import tiktoken
    import tiktoken.load

    fetch = tiktoken.load.read_file

    def local_only(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise FileNotFoundError(f"{blobpath} is not in tiktoken's cache")
        return fetch(blobpath)

    tiktoken.load.read_file = local_only
    try:
        return tiktoken.get_encoding(name)
    except ValueError as e:
        if "Unknown encoding" not in str(e):
            raise TokmixError(f"tokenizer tiktoken = {name!r}: {first_line(e)}") from None
        known = ", ".join(tiktoken.list_encoding_names())
        raise TokmixError(f"tokenizer tiktoken = {name!r}: no such encoding ({known}), and not a file (a file's "
                          "name has a dot or a folder)") from None
    except FileNotFoundError:
        raise TokmixError(f"tokenizer tiktoken = {name!r}: its ranks are not in tiktoken's cache "
                          "(TIKTOKEN_CACHE_DIR); put them there or give the .tiktoken file") from None
    finally:
        tiktoken.load.read_file = fetch


def _bpe_parts(ranks: dict[bytes, int], token: bytes, below: int) -> list[bytes]:
    """tiktoken's BPE on `token`'s bytes with merges of rank below `below` only: for a token of the ranks, the two
    parts whose merge makes it. Each step merges the leftmost pair of lowest rank, as tiktoken does; only the two
    pairs beside a merge are looked up again (o200k's 119k tokens that need this: ~3x faster than rescanning)."""
    parts = [token[i : i + 1] for i in range(len(token))]
    pairs = [ranks.get(token[i : i + 2], below) for i in range(len(token) - 1)]
    while pairs:
        best = min(pairs)
        if best >= below:
            break
        at = pairs.index(best)
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
        del pairs[at]
        if at > 0:
            pairs[at - 1] = ranks.get(parts[at - 1] + parts[at], below)
        if at < len(pairs):
            pairs[at] = ranks.get(parts[at] + parts[at + 1], below)
    return parts


# Texts a split pattern must match whole: tiktoken encodes only what its pattern matches and drops the rest
_PATTERN_TEXTS = ["Hello, world 123!  ok\n\t\r\n 'S don't é中🙂\u00a0\u3000\x00 x\u2028y\x85 \u0301.",
                  *(text for text in ADVERSARIAL_TEXTS if len(text) < 20_000)]


def _check_pattern(ranks: dict[bytes, int], pattern: str) -> None:
    """A recipe's tiktoken_pattern: a regex tiktoken compiles, whose matches cover every character of a text (a
    pattern without a whitespace or punctuation alternative would lose those from every document, unsaid)."""
    import tiktoken

    try:
        enc = tiktoken.Encoding("tokmix:pattern-check", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    except Exception as e:  # noqa: BLE001 - tiktoken's regex error (a ValueError)
        raise TokmixError(f"tokenizer.tiktoken_pattern {pattern!r}: not a regex tiktoken reads ({first_line(e)})"
                          ) from None
    for text in map(clean_surrogates, _PATTERN_TEXTS):
        data, got = text.encode("utf-8"), enc.decode_bytes(enc.encode_ordinary(text))
        if got != data:
            at = next((i for i, (a, b) in enumerate(zip(got, data)) if a != b), min(len(got), len(data)))
            left = data[at:].decode("utf-8", "replace")[:1]
            raise TokmixError(f"tokenizer.tiktoken_pattern {pattern!r}: it does not match all of a text ({left!r} at "
                              f"byte {at:,} of {text[:30]!r} is matched by no alternative), and tiktoken drops what "
                              "its pattern does not match; add alternatives for it (GPT-2's ends with "
                              r"'\s+(?!\S)|\s+')")


def tiktoken_source(recipe: Recipe) -> tuple[dict[bytes, int], str, dict[str, int], str]:
    """The recipe's tiktoken ranks, split pattern, special tokens and source. An encoding brings its own pattern
    and special tokens (tiktoken's); a .tiktoken file takes tiktoken_pattern (GPT-2's by default) and gets the
    recipe's delimiters as special tokens after its ranks (so GPT-2's ranks give <|endoftext|> its id, 50256)."""
    spec = recipe.tokenizer
    source = spec.tiktoken
    if is_tiktoken_file(source):
        source = recipe.resolve(source)
        ranks, pattern = _read_tiktoken_file(source), spec.tiktoken_pattern or TIKTOKEN_GPT2_PATTERN
        if spec.tiktoken_pattern is not None:
            _check_pattern(ranks, pattern)
        first = max(ranks.values(), default=-1) + 1
        specials = {name: first + i for i, name in enumerate(dict.fromkeys(spec.doc_prefix + spec.doc_suffix))}
    else:
        enc = _local_encoding(source)
        ranks, pattern, specials = enc._mergeable_ranks, enc._pat_str, dict(enc._special_tokens)
    return ranks, pattern, specials, source


def tiktoken_run_file(recipe: Recipe) -> bytes:
    """The run's tokenizer.tiktoken.json (backends.read_tiktoken_file): the ranks as tiktoken reads them, with
    their split pattern and special tokens, for tiktoken, the oracle; and the same vocabulary as a tokenizer.json
    (ranks_tokenizer_json) for the backends that read that format, used only where they give tiktoken's ids;
    ranks it cannot say (a token that is no merge of two of lower rank, which tiktoken still reaches) get none,
    and the reason (NO_VIEW): tiktoken alone reads them."""
    ranks, pattern, specials, source = tiktoken_source(recipe)
    lines = "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in sorted(ranks.items(), key=lambda kv: kv[1]))
    meta = {"source": source, "pat_str": pattern, "special_tokens": specials}
    try:
        view = ranks_tokenizer_json(ranks, pattern, specials, source)
    except NotApplicable as e:
        meta[NO_VIEW], view = str(e), ""
    return write_tiktoken_file(meta, lines, view)


def ranks_tokenizer_json(ranks: dict[bytes, int], pattern: str, specials: dict[str, int], source: str) -> str:
    """An HF tokenizer.json that gives tiktoken's ids for these ranks: byte-level BPE, id = rank, each token's merge
    the two parts tiktoken joins last, ignore_merges (tiktoken takes a piece that is a whole token as it is), the
    split pattern (GPT-2's, however tiktoken spells it, as HF's own ByteLevel split: it keeps long documents
    cuttable, and fastokens runs it several times faster than the same split as a regex), and the special tokens
    as added special tokens; one between the ranks (p50k's <|endoftext|>, 50256) also in the vocabulary, as HF's
    GPT-2 has it (fastokens refuses a vocabulary with a gap in its ids; no text's piece is it, the split keeps
    "<|" apart)."""
    table = str.maketrans({b: c for b, c in bytes_to_unicode().items()})

    def text(b: bytes) -> str:
        return b.decode("latin-1").translate(table)  # byte b is code point b in latin-1

    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TokmixError(f"tokenizer tiktoken = {source}: byte {missing[0]:#04x} has no rank (byte-level BPE "
                          "needs all 256)")
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        # the last merge of tiktoken's BPE joins two tokens of lower rank: where only one split of the token
        # gives two such, it is that one (most tokens; running the BPE on each token of a 200k vocabulary takes
        # seconds), else the BPE says which
        splits = [(token[:i], token[i:]) for i in range(1, len(token))
                  if ranks.get(token[:i], rank) < rank and ranks.get(token[i:], rank) < rank]
        parts = list(splits[0]) if len(splits) == 1 else _bpe_parts(ranks, token, rank)
        if len(parts) != 2:  # tiktoken joins any two adjacent parts a rank has; HF's BPE only its merges
            raise NotApplicable(f"rank {rank} ({token!r}) is not the merge of two tokens of lower rank")
        merges.append([text(parts[0]), text(parts[1])])
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pattern in GPT2_PATTERNS:
        pre = byte_level
    else:
        if pattern == TIKTOKEN_CL100K and not _joins_newline_to_whitespace(ranks):
            pattern = HF_CL100K
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {**byte_level, "use_regex": False}]}
    added = [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for name, i in sorted(specials.items(), key=lambda kv: kv[1])]
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": pre, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {**{text(t): r for t, r in ranks.items()}, **{
                      name: i for name, i in specials.items() if i < max(ranks.values())}}, "merges": merges},
    }, ensure_ascii=False)


# every byte of a Unicode White_Space character's UTF-8 (and some others: a superset errs towards "joins")
_WHITESPACE_BYTES = frozenset(b"\t\x0b\x0c \r\n\xc2\x85\xa0\xe1\x9a\xe2\x80\x81\x82\x83\x84\x86\x87\x88\x89\x8a"
                              b"\xa8\xa9\xaf\x9f\xe3")


def _joins_newline_to_whitespace(ranks: dict[bytes, int]) -> bool:
    """Whether some token is whitespace with more of it after its last newline: BPE could then join a text's
    closing whitespace across the last newline, which is where HF_CL100K cuts a piece TIKTOKEN_CL100K keeps."""
    for token in ranks:
        last = max(token.rfind(b"\n"), token.rfind(b"\r"))
        if 0 <= last < len(token) - 1 and _WHITESPACE_BYTES.issuperset(token):
            return True
    return False


def tokenizer_recheck(out_dir: str | Path, index) -> tuple[str | None, str | None]:
    """Under tokenizer library versions other than the run's (index.json's tokenizer_libraries): the oracle's
    ids on tokmix's adversarial texts encoded again and compared with the run's digest of them. (a problem, a
    note): both None when the versions are the run's, or the run recorded none."""
    from tokmix.backends import ADVERSARIAL_TEXTS, installed_versions, oracle_digests

    recorded = index.tokenizer_libraries
    if not recorded or not index.tokenizer_ids_sha256:
        return None, None
    now = installed_versions(recorded)
    if now == recorded:
        return None, None
    changed = ", ".join(f"{lib} {recorded[lib]} -> {now[lib]}" for lib in recorded if now[lib] != recorded[lib])
    try:
        digest = oracle_digests(run_vocabulary(out_dir, index).path)["adversarial"]
    except Exception as e:  # noqa: BLE001 - no tokenizer file here, or its library cannot load it
        return None, (f"note: tokenizer libraries differ from the run's ({changed}); the ids could not be "
                      f"re-checked ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    if digest != index.tokenizer_ids_sha256:
        return (f"index.json: the tokenizer's ids changed with its libraries ({changed}): the oracle "
                f"({index.tokenizer_oracle}) gives other ids on tokmix's check texts than it gave the run"), None
    return None, (f"note: tokenizer libraries differ from the run's ({changed}): the oracle's ids re-checked on "
                  f"{len(ADVERSARIAL_TEXTS)} check texts: identical")
