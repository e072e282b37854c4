"""Tokenizer backend throughput: tokens/s of hf, tiktoken and fastokens on the same text, one thread and all cores.

    .venv/bin/python bench/backends.py [--tokenizer tokenizer.json] [--mb 30] [--batch-docs 256]

The text is Python stdlib sources and /usr/share/doc copyright files and changelogs, half and half. Without
--tokenizer a 32k byte-level BPE is trained on the first 8 MB, as tokmix trains one. Each (backend, threads) cell
runs in a fresh process, because the Rust thread pools are sized once per process; ids are checked against HF.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import itertools
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from tokmix.backends import BACKENDS, installed_backends, make_encoder

MIN_SECONDS = 3.0  # fastokens does 30 MB in a fraction of a second: repeat passes for a stable rate


def corpus(mb: float) -> list[str]:
    """Deterministic: sorted file order, half code and half prose by characters."""
    half = int(mb * 1e6 / 2)
    code = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    prose = sorted(Path("/usr/share/doc").rglob("copyright")) + sorted(Path("/usr/share/doc").rglob("changelog*.gz"))
    docs = []
    for paths in (code, prose):
        n = 0
        for path in paths:
            if n >= half:
                break
            raw = path.read_bytes()
            text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8", "replace")
            docs.append(text)
            n += len(text)
    return docs


def train(texts: list[str], path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))


def run_one(tokenizer: str, backend: str, threads: int | None, mb: float, batch_docs: int) -> dict:
    """One cell, in this process: encode the corpus in batches (whole passes, at least MIN_SECONDS of them),
    return tokens/s and a digest of the first pass's ids."""
    docs = corpus(mb)
    encoder = make_encoder(tokenizer, backend, threads)
    encoder.encode_batch(docs[:batch_docs])  # warm up: thread pools, caches
    digest, tokens, start = hashlib.sha256(), 0, time.perf_counter()
    for n_pass in itertools.count():
        for i in range(0, len(docs), batch_docs):
            ids, counts = encoder.encode_batch(docs[i : i + batch_docs])
            if n_pass == 0:
                digest.update(np.ascontiguousarray(ids).tobytes())
                digest.update(counts.tobytes())
            tokens += ids.size
        if time.perf_counter() - start >= MIN_SECONDS:
            break
    seconds = time.perf_counter() - start
    mb = (n_pass + 1) * sum(len(d.encode("utf-8", "replace")) for d in docs) / 1e6
    return {"tokens": tokens, "seconds": seconds, "mb": mb, "sha256": digest.hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", help="tokenizer.json (default: train a 32k BPE on the first 8 MB)")
    ap.add_argument("--mb", type=float, default=30.0, help="MB of text (default 30)")
    ap.add_argument("--batch-docs", type=int, default=256)
    ap.add_argument("--vocab-size", type=int, default=32_000)
    ap.add_argument("--one", nargs=2, metavar=("BACKEND", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.one:
        backend, threads = args.one[0], (None if args.one[1] == "all" else int(args.one[1]))
        print(json.dumps(run_one(args.tokenizer, backend, threads, args.mb, args.batch_docs)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = args.tokenizer
        if tokenizer is None:
            tokenizer = str(Path(tmp) / "tokenizer.json")
            start = time.perf_counter()
            train(corpus(8.0), Path(tokenizer), args.vocab_size)
            print(f"trained a {args.vocab_size:,}-token BPE on 8 MB in {time.perf_counter() - start:.0f}s")
        cores = os.cpu_count() or 1
        print(f"{args.mb:g} MB of text, batches of {args.batch_docs} documents, {cores} cores\n")
        print(f"{'backend':<10} {'threads':>7} {'M tok/s':>9} {'MB/s':>7} {'seconds':>8}  ids")
        reference = None
        for backend in reversed(BACKENDS):  # hf first: the others are checked against it
            if backend not in installed_backends():
                print(f"{backend:<10} not installed")
                continue
            for threads in ("1", "all"):
                cmd = [sys.executable, __file__, "--tokenizer", tokenizer, "--mb", str(args.mb)]
                cmd += ["--batch-docs", str(args.batch_docs), "--one", backend, threads]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:  # e.g. tiktoken on a SentencePiece tokenizer: not applicable
                    print(f"{backend:<10} {threads:>7}  cannot serve it: {done.stderr.strip().splitlines()[-1]}")
                    break
                out = json.loads(done.stdout)
                reference = reference or out["sha256"]
                same = "= hf" if out["sha256"] == reference else "DIFFER from hf"
                rate, mb_s = out["tokens"] / out["seconds"] / 1e6, out["mb"] / out["seconds"]
                shown = threads if threads == "1" else cores
                print(f"{backend:<10} {shown:>7} {rate:>9.1f} {mb_s:>7.1f} {out['seconds']:>8.2f}  {same}")


if __name__ == "__main__":
    main()
