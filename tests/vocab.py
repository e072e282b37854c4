"""Real pretrained vocabularies for the tests (tests/data/vocab, copied from PyPI packages; see its README): GPT-2's
ranks in tiktoken's format, and Mistral 7B's SentencePiece model turned into the tokenizer.json that HF's
converters write for Llama-2 / Mistral (byte fallback, metaspace pre-tokenizer)."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

DATA = Path(__file__).parent / "data" / "vocab"
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"  # tiktoken's r50k_base


def gpt2_tiktoken(folder: Path) -> Path:
    """GPT-2's ranks as a .tiktoken file."""
    path = folder / "gpt2.tiktoken"
    path.write_bytes(gzip.decompress((DATA / "gpt2.tiktoken.gz").read_bytes()))
    return path


def tiktoken_cache(folder: Path) -> Path:
    """A TIKTOKEN_CACHE_DIR holding r50k_base's ranks, where tiktoken looks before fetching them (the file named by
    the sha1 of its URL; tiktoken checks its sha256, which GPT-2's file has)."""
    folder.mkdir(parents=True, exist_ok=True)
    gpt2_tiktoken(folder).rename(folder / hashlib.sha1(R50K_URL.encode()).hexdigest())
    return folder


def mistral_tokenizer_json(path: Path, metaspace: bool) -> Path:
    """Mistral 7B's SentencePiece BPE as HF's converters lay it out: every piece at its id, a merge for each way to
    split a piece into two pieces, in order of the merged piece's score; byte fallback; <unk> <s> </s> as special
    tokens; and "▁" for spaces and before the text either by a Metaspace pre-tokenizer (`metaspace`, the newer
    layout, as in Mistral 7B v0.3's tokenizer.json: it prepends none to a text that starts with a space) or by
    a Prepend + Replace normalizer (the "legacy" layout of Llama-2's and Mistral 7B v0.1's, as sentencepiece)."""
    from tokmix.backends import sentencepiece_tokenizer_json

    model = path.with_suffix(".model")
    model.write_bytes(gzip.decompress((DATA / "mistral-v1.model.gz").read_bytes()))
    view = json.loads(sentencepiece_tokenizer_json(model))  # its pieces, and merges in order of their scores
    special = view["added_tokens"]  # <unk>, <s>, </s>
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": None if metaspace else {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": ({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
                          if metaspace else None),
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": view["model"]["vocab"], "merges": view["model"]["merges"]},
    }
    path.write_text(json.dumps(spec, ensure_ascii=False))
    return path


# The ids the sentencepiece package itself gives with Mistral 7B's model (published: "Hello world" -> 22557, 1526)
MISTRAL_IDS = {
    "Hello world": [22557, 1526],
    " world": [28705, 1526],
    "héllo 中文 🧪": [295, 28797, 584, 28709, 28705, 28991, 29019, 28705, 243, 162, 170, 173],
    "def f(x):\n    return x  # ok\n": [801, 285, 28732, 28744, 1329, 13, 2287, 604, 1318, 28705, 422, 3614, 13],
    "  two leading spaces": [259, 989, 5374, 10599],
    "tab\there": [7683, 12, 7750],
    "a\u00a0nbsp": [264, 29000, 14089],
    "ÿ\x00ctrl": [28705, 30281, 3, 8022],
}


# ---------------------------------------------------------------------------- vocabularies from packages on PyPI
# Too large to vendor (1.6-4.4 MB each): read from the package's wheel, fetched once with `pip download --no-deps`
# into the test cache (TOKMIX_TEST_CACHE, default ~/.cache/tokmix-tests), each file checked by its sha256.
# litellm (MIT) ships tiktoken's rank files in tiktoken's own cache layout (named by the sha1 of their URL, with
# the sha256 tiktoken checks) and DeepSeek-V3's tokenizer.json (MIT, its LICENSE beside it in the wheel).
LITELLM = "litellm==1.110.2"
LITELLM_DIR = "litellm/litellm_core_utils/tokenizers/"
PACKAGE_FILES = {  # name: (requirement, member of its wheel, sha256)
    "cl100k_base": (LITELLM, LITELLM_DIR + "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
                    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"),
    "o200k_base": (LITELLM, LITELLM_DIR + "fb374d419588a4632f3f557e76b4b70aebbca790",
                   "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"),
    "p50k_base": (LITELLM, LITELLM_DIR + "ec7223a39ce59f226a68acc30dc1af2788490e15",
                  "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069"),
    "deepseek_v3": (LITELLM, LITELLM_DIR + "deepseek_tokenizer.json",
                    "4607b3d1929c5ca263a81d7153c6d6ecdbc71c9e933c0fb2df2abf181bf6df61"),
}


def test_cache() -> Path:
    import os

    return Path(os.environ.get("TOKMIX_TEST_CACHE") or Path.home() / ".cache" / "tokmix-tests")


def _pip() -> list[str]:
    import importlib.util
    import shutil
    import sys

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    found = shutil.which("pip3") or shutil.which("pip")  # a venv made by uv has no pip of its own
    if found is None:
        raise RuntimeError("no pip to fetch the test vocabularies with (pip download --no-deps)")
    return [found]


def package_file(name: str) -> Path:
    """PACKAGE_FILES[name] in the test cache, fetched from PyPI the first time (under a lock: xdist's workers
    share the cache) and checked by its sha256 every time."""
    import fcntl
    import subprocess
    import zipfile

    requirement, member, sha256 = PACKAGE_FILES[name]
    folder = test_cache() / requirement.replace("==", "-")
    path = folder / member
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            wheels = folder / "wheel"
            if not list(wheels.glob("*.whl")):
                subprocess.run([*_pip(), "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(wheels),
                                requirement], check=True)
            with zipfile.ZipFile(next(wheels.glob("*.whl"))) as wheel:
                data = wheel.read(member)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    assert got == sha256, f"{path}: sha256 {got}, not the {sha256} of {requirement}'s {member}"
    return path


def tiktoken_package_cache(folder: Path) -> Path:
    """A TIKTOKEN_CACHE_DIR with r50k_base (GPT-2's ranks, vendored) and p50k_base, cl100k_base and o200k_base
    (from litellm's wheel), under the names tiktoken looks for: it never fetches them."""
    tiktoken_cache(folder)
    for name in ("p50k_base", "cl100k_base", "o200k_base"):
        source = package_file(name)
        (folder / source.name).write_bytes(source.read_bytes())
    return folder
