"""A 256k-id vocabulary from a package on PyPI: Cohere Command-R's (256,000 ids, byte-level BPE), the vocab-only
GGUF that llama.cpp keeps for its tokenizer tests (vendor/llama.cpp/models/ggml-vocab-command-r.gguf in the
llama-cpp-python sdist; llama.cpp is MIT). The GGUF is rebuilt as the tokenizer.json Cohere ships on the Hub:
its tokens at their ids, its merges in order, NFC, the Digits(individual) + ByteLevel pre-tokenizer (llama.cpp's
pre-tokenizer type "command-r": one digit at a time, then GPT-2's regex), its control tokens as special added
tokens and its user-defined ones (<|START_OF_TURN_TOKEN|>, ...) as plain added tokens. The [PADn] entries
llama.cpp's converter fills the model's 256,000 rows with stay in the vocabulary only, as ids no text reaches.
The rebuild is checked against every .inp/.out pair beside the GGUF (the ids its authors' tokenizer gives, which
llama.cpp's test-tokenizer-0 must reproduce); a difference stops it.

    .venv/bin/python bench/vocab256k.py [--sdist llama_cpp_python-*.tar.gz] [--out DIR]

needs the `gguf` package (only for this bench: `uv pip install gguf`); without --sdist the sdist is fetched with
`pip download --no-deps --no-binary :all: llama-cpp-python`. Prints the pairs matched and the tokenizer.json's
path; bench/vocabularies.py --only command_r runs tokmix with it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "work" / "vocab256k"
MODELS = "vendor/llama.cpp/models/"
NAME = "ggml-vocab-command-r.gguf"
TEST_SEPARATOR = "\n__ggml_vocab_test__\n"  # test-tokenizer-0's split of a .inp file
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # gguf TokenType


def sdist_members(sdist: Path, out: Path) -> Path:
    """The GGUF, its .inp/.out and llama.cpp's LICENSE, extracted into out. Returns the GGUF's path."""
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            tail = member.name.split("/", 1)[-1]
            if tail in (MODELS + NAME, MODELS + NAME + ".inp", MODELS + NAME + ".out", "vendor/llama.cpp/LICENSE"):
                (out / Path(tail).name).write_bytes(tar.extractfile(member).read())
    return out / NAME


def fetch_sdist(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", str(folder), "llama-cpp-python"], check=True)
        found = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
    return found[-1]


def tokenizer_spec(gguf_path: Path) -> dict:
    """The GGUF's vocabulary as Cohere's tokenizer.json lays it out."""
    import gguf

    fields = gguf.GGUFReader(str(gguf_path)).fields
    model, pre = fields["tokenizer.ggml.model"].contents(), fields["tokenizer.ggml.pre"].contents()
    if (model, pre) != ("gpt2", "command-r"):
        raise SystemExit(f"{gguf_path}: tokenizer {model}/{pre}, this rebuild knows gpt2/command-r only")
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    merges = fields["tokenizer.ggml.merges"].contents()
    bos = tokens[fields["tokenizer.ggml.bos_token_id"].contents()]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": types[i] != CONTROL, "special": types[i] == CONTROL}
             for i, t in enumerate(tokens)
             if types[i] == CONTROL or (types[i] == USER_DEFINED and t != f"[PAD{i}]")]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {bos: {"id": bos, "ids": [tokens.index(bos)], "tokens": [bos]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


def test_pairs(gguf_path: Path) -> list[tuple[str, list[int]]]:
    """(text, ids) of the .inp/.out files, split as llama.cpp's test-tokenizer-0 splits them."""
    texts = Path(f"{gguf_path}.inp").read_text(encoding="utf-8").split(TEST_SEPARATOR)
    if texts and texts[-1] == "":  # every test ends with the separator
        texts.pop()
    ids = [[int(x) for x in line.split()] for line in Path(f"{gguf_path}.out").read_text().splitlines()]
    if len(texts) != len(ids):
        raise SystemExit(f"{gguf_path}: {len(texts)} tests in .inp, {len(ids)} in .out")
    return list(zip(texts, ids))


def check(tokenizer_json: Path, gguf_path: Path) -> tuple[int, int]:
    """Every test pair encoded by HF tokenizers on the rebuild (without the BOS the template adds, as the .out
    was written); a difference stops it. (matched, total)"""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    pairs = test_pairs(gguf_path)
    matched = 0
    for text, want in pairs:
        got = tok.encode(text, add_special_tokens=False).ids
        if got != want:
            raise SystemExit(f"{tokenizer_json}: {text!r} gives {got}, the authors' ids are {want}")
        matched += 1
    return matched, len(pairs)


def command_r_tokenizer(out: Path, sdist: Path | None = None) -> Path:
    """Command-R's tokenizer.json in out, built from the sdist's GGUF and checked against its test pairs."""
    path = out / "command-r.tokenizer.json"
    if not path.exists():
        gguf_path = sdist_members(sdist or fetch_sdist(WORK / "sdist"), out)
        path.with_suffix(".tmp").write_text(json.dumps(tokenizer_spec(gguf_path), ensure_ascii=False))
        matched, total = check(path.with_suffix(".tmp"), gguf_path)
        print(f"{NAME}: {matched} of {total} llama.cpp test pairs give the authors' ids", flush=True)
        path.with_suffix(".tmp").rename(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, help="llama-cpp-python's sdist (default: pip download it)")
    ap.add_argument("--out", type=Path, default=WORK)
    args = ap.parse_args()
    path = args.out / "command-r.tokenizer.json"
    path.unlink(missing_ok=True)
    print(command_r_tokenizer(args.out, args.sdist))


if __name__ == "__main__":
    main()
