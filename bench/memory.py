"""Peak memory of a whole `tokmix run` process tree on the inputs that break naive tokenizers: one 200 MB
document (300 MB: issue 31), 10,000 small files, and 50,000 empty files beside 3 real ones. Also checks that the
huge document's ids equal encoding it whole (with fastokens, id-identical to HF; HF itself would need ~8 GB and
minutes).

    python bench/memory.py [--work bench/work/memory] [--doc-mb 200] [--files 10000] [--empty-files 50000]
                           [--cases text,parquet,jsonl,files,empty] [--tokenizer trained|mistral|deepseek_v3]

--tokenizer: the huge document's cases with the bench's trained BPE (default), Mistral 7B's SentencePiece model
(tests/data/vocab) or DeepSeek-V3's tokenizer.json (from litellm's wheel, tests/vocab.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import os  # noqa: E402

from tests.corpus import make_corpus, train_test_tokenizer, write_recipe, write_split  # noqa: E402
from tests.memory import tree_peak  # noqa: E402

# measured without the token cache (a second run would take its units from it): bench/cache.py measures it
os.environ.setdefault("TOKMIX_CACHE", "off")


def peak_tree_rss(cmd: list[str], log: Path | None = None) -> tuple[int, float, int]:
    """Run cmd (its output into `log`); the summed RSS of it and all its descendants sampled every 20 ms.
    (peak bytes, seconds, rc)"""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log.open("w") if log else subprocess.DEVNULL)
    peak = tree_peak(proc)
    return peak, time.perf_counter() - t0, proc.returncode


# [tokenizer] lines of a pretrained --tokenizer (its file, its document delimiter)
PRETRAINED = {"mistral": ("sentencepiece", "<s>"), "deepseek_v3": ("path", "<｜begin▁of▁sentence｜>")}


def pretrained_file(name: str, work: Path) -> Path:
    import gzip

    from tests.vocab import DATA, package_file

    if name == "deepseek_v3":
        return package_file(name)
    path = work / "mistral.model"
    path.write_bytes(gzip.decompress((DATA / "mistral-v1.model.gz").read_bytes()))
    return path


def huge_document_case(work: Path, doc_mb: int, fmt: str, tokenizer: str = "trained") -> dict:
    files = make_corpus(work)
    tok = train_test_tokenizer(files, work / "tokenizer" / "tokenizer.json")
    if tokenizer != "trained":
        tok = pretrained_file(tokenizer, work)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text(errors="replace") for p in sorted(stdlib.rglob("*.py"))[:2000])
    huge = (text * (doc_mb * 2**20 // len(text) + 1))[: doc_mb * 2**20]
    import pyarrow as pa
    import pyarrow.parquet as pq

    edu = files["edu"][0]
    texts = pq.read_table(edu)["text"].to_pylist()
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts[:2] + [huge] + texts[2:]}), edu, row_group_size=64)
    else:  # the document as a file of its own, first in the stream: .txt (one document) or one JSONL line
        path = work / "corpus" / "edu" / ("part-0.txt" if fmt == "text" else "part-0.jsonl")
        path.write_text(huge if fmt == "text" else json.dumps({"text": huge}) + "\n")
        files["edu"].insert(0, path)
    del texts
    write_split(work, files)
    # (a pretrained vocabulary writes fewer tokens of the corpus's text than the bench's small trained one)
    recipe = write_recipe(work, "tokenizer/tokenizer.json", blocks=6_000 if tokenizer == "trained" else 3_000)
    if tokenizer != "trained":
        key, prefix = PRETRAINED[tokenizer]
        recipe.write_text(recipe.read_text().replace('path = "tokenizer/tokenizer.json"',
                                                     f'{key} = "{tok}"\ndoc_prefix = "{prefix}"'))
    if fmt != "parquet":
        recipe.write_text(recipe.read_text().replace('"corpus/edu/*.parquet"', '"corpus/edu/*.*"'))
    out = work / "out"
    peak, secs, rc = peak_tree_rss([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out),
                                    "--workers", "2", "--keep-streams", "--restart"], work / "run.log")
    identical = None
    if rc == 0:
        from tokmix.backends import make_encoder
        from tokmix.tokens import LENGTH_DTYPE

        want, _ = make_encoder(tok, "fastokens").encode_batch([huge])  # id-identical to the oracle, at its check
        dtype = json.loads((out / "index.json").read_text())["dtype"]
        units = sorted((out / "streams/edu/units").glob("*.tok"))
        tokens = np.concatenate([np.fromfile(u, dtype) for u in units])
        lengths = np.concatenate([np.fromfile(u.with_suffix(".len"), LENGTH_DTYPE) for u in units])
        starts = np.cumsum(lengths) - lengths
        at = np.flatnonzero(lengths == len(want) + 1)  # the one document of the huge one's length
        identical = bool(len(at) == 1 and np.array_equal(tokens[starts[at[0]] + 1:][: len(want)], want))
    alone = "runs alone" in (work / "run.log").read_text()  # tokmix.stages.alone_share
    return {"case": f"one {doc_mb} MB document ({fmt})", "peak_mib": peak / 2**20, "seconds": secs, "exit": rc,
            "ids_identical_to_whole": identical, "alone": alone}


def many_files_case(work: Path, n_files: int) -> dict:
    files = make_corpus(work)
    train_test_tokenizer(files, work / "tokenizer" / "tokenizer.json")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = [p.read_text(errors="replace") for p in sorted(stdlib.rglob("*.py"))[:n_files]]
    folder = work / "corpus" / "code_py"
    for p in folder.glob("*.parquet"):
        p.unlink()
    for i in range(n_files):
        (folder / f"f{i:05d}.py").write_text(sources[i % len(sources)])
    files["code_py"] = sorted(folder.glob("*.py"))
    split_path = write_split(work, files)
    split = json.loads(split_path.read_text())  # hold out the last 500 small files, not one
    moved = [str(p.relative_to(work)) for p in files["code_py"][-500:]]
    split["code"]["holdout"] = [f for f in split["code"]["holdout"] if "code_py" not in f] + moved
    split["code"]["train"] = [f for f in split["code"]["train"] if f not in moved]
    split_path.write_text(json.dumps(split))
    recipe = write_recipe(work, "tokenizer/tokenizer.json")
    recipe.write_text(recipe.read_text().replace('files = ["corpus/code_py/*.parquet"]',
                                                 'files = ["corpus/code_py/*.py"]'))
    peak, secs, rc = peak_tree_rss([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out",
                                    str(work / "out"), "--workers", "2", "--restart"])
    return {"case": f"{n_files:,} small files", "peak_mib": peak / 2**20, "seconds": secs, "exit": rc}


def empty_files_case(work: Path, n_files: int) -> dict:
    """`n_files` empty JSONL files beside the edu stream's 3 real ones (issue 31: 5,000 took 112 s)."""
    files = make_corpus(work)
    train_test_tokenizer(files, work / "tokenizer" / "tokenizer.json")
    folder = work / "corpus" / "edu"
    for i in range(n_files):
        (folder / f"empty-{i:05d}.jsonl").touch()
    files["edu"] = sorted(files["edu"] + list(folder.glob("empty-*.jsonl")))
    write_split(work, files)
    recipe = write_recipe(work, "tokenizer/tokenizer.json")
    recipe.write_text(recipe.read_text().replace('"corpus/edu/*.parquet"', '"corpus/edu/*.*"'))
    peak, secs, rc = peak_tree_rss([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out",
                                    str(work / "out"), "--workers", "2", "--restart"])
    return {"case": f"{n_files:,} empty files beside 3", "peak_mib": peak / 2**20, "seconds": secs, "exit": rc}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "memory")
    ap.add_argument("--doc-mb", type=int, default=200)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--empty-files", type=int, default=50_000)
    ap.add_argument("--tokenizer", default="trained", choices=["trained", *PRETRAINED])
    ap.add_argument("--cases", default="text,parquet,jsonl,files,empty",
                    help="which of text, parquet, jsonl (one huge document), files, empty (comma-separated)")
    args = ap.parse_args()
    cases = args.cases.split(",")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = [huge_document_case(args.work / f"huge-{fmt}", args.doc_mb, fmt, args.tokenizer)
            for fmt in ("text", "parquet", "jsonl") if fmt in cases]
    if "files" in cases:
        rows.append(many_files_case(args.work / "files", args.files))
    if "empty" in cases:
        rows.append(empty_files_case(args.work / "empty", args.empty_files))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'case':<36} {'peak RSS (tree)':>16} {'seconds':>8} {'exit':>5}  ids identical  ran alone")
    for r in rows:
        print(f"{r['case']:<36} {r['peak_mib']:>12,.0f} MiB {r['seconds']:>8.1f} {r['exit']:>5}  "
              f"{str(r.get('ids_identical_to_whole', '')):<13}  {r.get('alone', '')}")


if __name__ == "__main__":
    main()
