"""Pretrained vocabularies end to end: the bench corpus's recipe (bench/corpus.py) run with default flags once per
tokenizer (r50k, p50k, cl100k, o200k from tiktoken's ranks, Mistral 7B's SentencePiece model, DeepSeek-V3's
tokenizer.json: tests/vocab.py fetches them; Cohere Command-R's 256k byte-level BPE rebuilt from llama.cpp's GGUF in
the llama-cpp-python sdist: bench/vocab256k.py, which needs the gguf package), the peak RSS of the whole process
tree, the backend auto chose and the streams stage's tokens/s; then every document of the first shard read again from
its source and encoded by the oracle (the format's own library), compared id for id; and the chosen backend's bare
speed on the streams stage's own texts, the ceiling the stage is judged against, like for like: every stream's
documents up to the ones the run took (index.json's docs), pre-loaded, in the stage's batches (sources.batches), on
as many threads as the stage's workers sharing one encoder of ENCODER_THREADS, that encoder first warmed by the
holdout stage's reads (each stream's holdout documents up to its holdout tokens, untimed), as the stage process's
one encoder is; each of 3 passes with a new encoder and new str objects (the stage meets each document once): the
best pass.

    .venv/bin/python bench/vocabularies.py [--corpus bench/work/corpus] [--only cl100k_base,o200k_base] [--steps N]

Writes bench/work/vocab/<name>/ (deleted after each unless --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.memory import peak_tree_rss  # noqa: E402
from tests.test_pretrained import assert_first_shard_is_the_oracles  # noqa: E402
from tests.vocab import DATA, package_file, tiktoken_package_cache  # noqa: E402

NAMES = ["r50k_base", "p50k_base", "cl100k_base", "o200k_base", "mistral", "deepseek_v3", "command_r"]
HF_JSON = {"deepseek_v3": "<｜begin▁of▁sentence｜>", "command_r": "<BOS_TOKEN>"}  # tokenizer.json: its BOS


def tokenizer_lines(name: str, work: Path) -> list[str]:
    import gzip

    if name == "mistral":
        model = work / "mistral-v1.model"
        model.write_bytes(gzip.decompress((DATA / "mistral-v1.model.gz").read_bytes()))
        return [f'sentencepiece = "{model}"', 'doc_prefix = "<s>"', 'doc_suffix = "</s>"']
    if name in HF_JSON:
        return [f'path = "{hf_json(name)}"', f'doc_prefix = "{HF_JSON[name]}"']
    return [f'tiktoken = "{name}"']


def hf_json(name: str) -> Path:
    if name == "command_r":
        from bench.vocab256k import WORK, command_r_tokenizer

        return command_r_tokenizer(WORK)
    return package_file(name)


def recipe_for(corpus: Path, name: str | None, work: Path, steps: int | None) -> Path:
    """The bench recipe with this tokenizer (None: its own, trained in the run), its paths made absolute (nothing
    is written into the corpus)."""
    text = (corpus / "bench.toml").read_text()
    text = text if name is None else re.sub(r"\[tokenizer\.train\]\nvocab_size = \d+\n", "[tokenizer]\n" + "\n".join(
        tokenizer_lines(name, work)) + "\n", text)
    text = re.sub(r'files = \["([^"]+)"\]', lambda m: f'files = ["{corpus / m.group(1)}"]', text)
    split = json.loads((corpus / "file_splits.json").read_text())
    for entry in split.values():
        for part in ("holdout", "train"):
            entry[part] = [str(corpus / p) for p in entry[part]]
    (work / "file_splits.json").write_text(json.dumps(split))
    text = text.replace('splits = "file_splits.json"', f'splits = "{work / "file_splits.json"}"')
    if steps:
        text = re.sub(r"\nsteps = \d+\n", f"\nsteps = {steps}\n", text)
    path = work / "recipe.toml"
    path.write_text(text)
    return path


def oracle_encode(name: str, work: Path):
    if name == "mistral":
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_file=str(work / "mistral-v1.model")).encode
    if name in HF_JSON:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(hf_json(name)))
        tok.encode_special_tokens = True
        return lambda t: tok.encode(t, add_special_tokens=False).ids
    import tiktoken

    return tiktoken.get_encoding(name).encode_ordinary


BARE = """
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
import tokmix
from tokmix.backends import huge_doc_chars, make_encoder
from tokmix.shards import read_index
from tokmix.sources import HugeText, batches, iter_file_texts, stream_files
from tokmix.stages import ENCODER_THREADS
out, recipe_path, split_path, path, backend = sys.argv[1:6]
index, raw = read_index(out), json.load(open(out + "/index.json"))
recipe, split = tokmix.load_recipe(recipe_path), json.load(open(split_path))
per_document = sum(map(len, index.delimiters.values()))  # prefix and suffix ids: counted as the stage counts them
huge = huge_doc_chars(path)
streams = raw["mix"]["streams"]

def texts(stream, part, docs=None):
    # the stream's documents in canonical order, as the stage reads them (a huge one in its pieces)
    n = 0
    for text in iter_file_texts(stream_files(recipe, split, stream, part), recipe.streams[stream].text_field,
                                stream, [], huge):
        if docs is not None and n >= docs:
            return
        if text:
            n += 1
            yield from text.pieces() if isinstance(text, HugeText) else [text]

best = 0
for _ in range(3):
    # as the stage process meets the text: one new encoder, first through the holdout stage's reads (its caches
    # warmed by the same holdout documents), then each stream's documents once, in the stage's batches, on as
    # many threads as the stage's workers; the texts read again each pass (an encoder that has read a str keeps
    # its UTF-8 in it)
    encoder = make_encoder(path, backend, ENCODER_THREADS)
    for domain in raw["val"].values():
        for stream, want in domain["tokens_by_stream"].items():
            got = 0
            for batch in batches(texts(stream, "holdout"), huge):
                got += int(encoder.encode_batch(batch)[0].size) + per_document * len(batch)
                if got >= want:
                    break
    work = [b for name, meta in streams.items() for b in batches(texts(name, "train", meta["docs"]), huge)]
    workers = max(meta["num_proc"] for meta in streams.values())
    with ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()
        tokens = sum(pool.map(lambda b: int(encoder.encode_batch(b)[0].size) + per_document * len(b), work))
        best = max(best, tokens / (time.perf_counter() - t0))
    del encoder, work
print(json.dumps({"bare_tok_s": best, "tokens": tokens, "workers": workers}))
"""


def one(corpus: Path, name: str, base: Path, steps: int | None, keep: bool) -> dict:
    work = base / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    recipe = recipe_for(corpus, name, work, steps)
    out = work / "out"
    load = os.getloadavg()[0]
    # --no-cache: a unit taken from the token cache (shared by every run on the machine) would time nothing
    peak, seconds, rc = peak_tree_rss([sys.executable, "-m", "tokmix", "run", str(recipe), "--out", str(out),
                                       "--no-cache"])
    print(json.dumps({"name": name, "rc": rc, "run_s": round(seconds, 1), "peak_tree_mib": round(peak / 2**20)}),
          flush=True)
    if rc:
        return {"name": name, "error": f"tokmix run exited {rc}"}
    index = json.loads((out / "index.json").read_text())
    timings = json.loads((out / "tokmix-state" / "timings.json").read_text())
    stream_tokens = sum(s["tokens"] for s in index["mix"]["streams"].values())
    t0 = time.perf_counter()
    checked = assert_first_shard_is_the_oracles(out, oracle_encode(name, work))
    check_s = time.perf_counter() - t0
    bare = json.loads(subprocess.run([sys.executable, "-c", BARE, str(out), str(recipe), str(work / "file_splits.json"),
                                      index["tokenizer"], index["throughput"]["backend"]], capture_output=True,
                                     text=True, check=True).stdout)
    streams_tok_s = stream_tokens / timings["streams"]
    streams = index["mix"]["streams"].values()  # the encoder's own rate inside the stage (its calls' time alone)
    encode_tok_s = sum(s["tokens"] * s["tok_s_tokenizer_capacity"] for s in streams) / stream_tokens
    row = {"name": name, "oracle": index["tokenizer_oracle"], "backend": index["throughput"]["backend"],
           "vocab_size": index["vocab_size"], "dtype": index["dtype"], "libraries": index["tokenizer_libraries"],
           "run_s": round(seconds, 1), "peak_tree_mib": round(peak / 2**20), "stream_tokens": stream_tokens,
           "streams_s": timings["streams"], "tokenizer_s": timings.get("tokenizer"),
           "streams_tok_s": round(streams_tok_s), "bare_tok_s": round(bare["bare_tok_s"]),
           "bare_tokens": bare["tokens"], "bare_threads": bare["workers"], "stage_encode_tok_s": round(encode_tok_s),
           "share_of_bare": round(streams_tok_s / bare["bare_tok_s"], 3), "first_shard_docs_checked": checked,
           "check_s": round(check_s, 1), "load_before": load, "load_after": os.getloadavg()[0]}
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=ROOT / "bench" / "work" / "corpus")
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "vocab")
    ap.add_argument("--only", default=",".join(NAMES))
    ap.add_argument("--steps", type=int, default=None, help="fewer steps than the bench recipe's")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tiktoken_package_cache(args.work / "tiktoken-cache"))
    for name in args.only.split(","):
        print(json.dumps(one(args.corpus, name, args.work, args.steps, args.keep)), flush=True)


if __name__ == "__main__":
    main()
