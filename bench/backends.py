"""Tokenizer backend throughput and memory: tokens/s of every backend that reads a tokenizer's format (and
gigatoken, measured beside them), on the same text, one thread and all cores, ids checked against the format's
oracle; each cell's resident memory once built and its peak.

    .venv/bin/python bench/backends.py [--tokenizer tokenizer.json] [--mb 30] [--batch-docs 256]
    .venv/bin/python bench/backends.py --families [--mb 10]   # r50k, p50k, cl100k, o200k, Mistral SP, DeepSeek-V3

The text is Python stdlib sources and /usr/share/doc copyright files and changelogs, half and half. Without
--tokenizer a 32k byte-level BPE is trained on the first 8 MB, as tokmix trains one. --families takes the
pretrained vocabularies the tests use (tests/vocab.py: fetched from PyPI into the test cache once) in the run
files tokmix makes of them. Each (backend, threads) cell runs in a fresh process, because the Rust thread pools
are sized once per process.
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

from tokmix.backends import ORACLE, SERVES, backend_forms, installed_backends, make_encoder, tokenizer_format

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


class Gigatoken:
    """gigatoken 0.10 (measured here, not a tokmix backend): its Tokenizer on the same file, in tokmix's
    encode_batch shape."""

    def __init__(self, path: str, threads: int | None):
        import gigatoken

        from tokmix.backends import read_tiktoken_file

        fmt = tokenizer_format(path)
        if fmt == "sentencepiece":
            self._tok = gigatoken.Tokenizer.from_sentencepiece(path)
        elif fmt == "tiktoken":
            self._tok = gigatoken.Tokenizer.from_json(read_tiktoken_file(path, "tokenizer_json"))
        else:
            self._tok = gigatoken.Tokenizer(path)
        self._parallel = threads != 1

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        import awkward as ak

        out = self._tok.encode_batch(texts, parallel=self._parallel)
        return ak.to_numpy(ak.flatten(out)).astype(np.uint32), ak.to_numpy(ak.num(out)).astype(np.int64)


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def run_one(tokenizer: str, backend: str, threads: int | None, mb: float, batch_docs: int) -> dict:
    """One cell, in this process: encode the corpus in batches (whole passes, at least MIN_SECONDS of them),
    return tokens/s, a digest of the first pass's ids, and the process's RSS once the backend is built and its
    peak (ru_maxrss)."""
    import resource

    docs = corpus(mb)
    base = rss_mib()
    start = time.perf_counter()
    encoder = Gigatoken(tokenizer, threads) if backend == "gigatoken" else make_encoder(tokenizer, backend, threads)
    load = time.perf_counter() - start
    built = rss_mib() - base
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
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"tokens": tokens, "seconds": seconds, "mb": mb, "sha256": digest.hexdigest(), "load_s": load,
            "built_mib": built, "peak_mib": peak}


def family_files(folder: Path) -> dict[str, str]:
    """The pretrained vocabularies of tests/test_pretrained.py, as the files a run reads."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gzip as gz

    from tests.vocab import DATA, package_file, tiktoken_package_cache
    from tokmix.recipe import recipe_from_dict
    from tokmix.tokenizer import tokenizer_file

    os.environ["TIKTOKEN_CACHE_DIR"] = str(tiktoken_package_cache(folder / "tiktoken-cache"))
    files = {}
    for name in ("r50k_base", "p50k_base", "cl100k_base", "o200k_base"):
        recipe = recipe_from_dict({"seed": 1, "tokenizer": {"tiktoken": name}, "layout": {"steps": 1,
                                   "seqs_per_step": 1}, "holdout": {"tokens": 1, "eval_windows": 0},
                                   "streams": {"a": {"domain": "a", "share": 1.0, "files": ["x"]}}}, folder)
        files[name] = tokenizer_file(recipe, folder / f"{name}.tiktoken.json")
    model = folder / "mistral-v1.model"
    model.write_bytes(gz.decompress((DATA / "mistral-v1.model.gz").read_bytes()))
    files["mistral-v1 (SentencePiece)"] = str(model)
    files["deepseek-v3 (tokenizer.json)"] = str(package_file("deepseek_v3"))
    return files


def bench(tokenizer: str, args, cores: int) -> None:
    fmt = tokenizer_format(tokenizer)
    oracle = ORACLE[fmt]
    backends = [oracle] + [f for b in SERVES[fmt] if b != oracle for f in backend_forms(b, tokenizer)] + ["gigatoken"]
    print(f"{'backend':<14} {'threads':>7} {'M tok/s':>9} {'MB/s':>7} {'load s':>7} {'MiB built':>9} "
          f"{'MiB peak':>8}  ids")
    reference = None
    for backend in backends:
        if backend != "gigatoken" and backend.removesuffix("-as-written") not in installed_backends():
            print(f"{backend:<14} not installed")
            continue
        for threads in ("1", "all"):
            cmd = [sys.executable, __file__, "--tokenizer", tokenizer, "--mb", str(args.mb)]
            cmd += ["--batch-docs", str(args.batch_docs), "--one", backend, threads]
            done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            if done.returncode:  # e.g. tiktoken on a SentencePiece tokenizer: not applicable
                print(f"{backend:<14} {threads:>7}  cannot serve it: {done.stderr.strip().splitlines()[-1]}")
                break
            out = json.loads(done.stdout)
            reference = reference or out["sha256"]
            same = f"= {oracle}" if out["sha256"] == reference else f"DIFFER from {oracle}"
            rate, mb_s = out["tokens"] / out["seconds"] / 1e6, out["mb"] / out["seconds"]
            shown = threads if threads == "1" else cores
            print(f"{backend:<14} {shown:>7} {rate:>9.2f} {mb_s:>7.1f} {out['load_s']:>7.1f} "
                  f"{out['built_mib']:>9.0f} {out['peak_mib']:>8.0f}  {same}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", help="tokenizer.json (default: train a 32k BPE on the first 8 MB)")
    ap.add_argument("--mb", type=float, default=30.0, help="MB of text (default 30)")
    ap.add_argument("--batch-docs", type=int, default=256)
    ap.add_argument("--vocab-size", type=int, default=32_000)
    ap.add_argument("--families", action="store_true", help="the pretrained vocabularies of the tests")
    ap.add_argument("--one", nargs=2, metavar=("BACKEND", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.one:
        backend, threads = args.one[0], (None if args.one[1] == "all" else int(args.one[1]))
        print(json.dumps(run_one(args.tokenizer, backend, threads, args.mb, args.batch_docs)))
        return

    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        if args.families:
            families = family_files(Path(tmp))
        else:
            tokenizer = args.tokenizer
            if tokenizer is None:
                tokenizer = str(Path(tmp) / "tokenizer.json")
                start = time.perf_counter()
                train(corpus(8.0), Path(tokenizer), args.vocab_size)
                print(f"trained a {args.vocab_size:,}-token BPE on 8 MB in {time.perf_counter() - start:.0f}s")
            families = {tokenizer: tokenizer}
        print(f"{args.mb:g} MB of text, batches of {args.batch_docs} documents, {cores} cores, load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        for name, path in families.items():
            print(f"\n{name}: {path}")
            bench(path, args, cores)
        print(f"\nload average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
