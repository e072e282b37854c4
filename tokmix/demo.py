"""The demo corpus: a small, real, multi-format corpus taken from the running Python installation.

build_demo_corpus() writes four streams in the formats tokmix reads (parquet, JSONL plain/gz/zst, plain text
files), a holdout/train split and a recipe sized to what it wrote, so `tokmix run DEST/demo.toml` works on any
machine with Python and no network. Same machine and scale -> the same files, byte for byte.

The split (file_splits.json) holds out the last file of each stream, as tokmix's own split would, except for
code_c, where it holds out the largest header: one header is one document, and the last one in path order
(weakrefobject.h, 1.2 KB) is far too small for its part of the code holdout.

Measured here (Python 3.11.7 from pyenv, 2 CPUs), scale 1.0: text bytes per stream, held-out file in brackets
  docstrings  1,191,654 in   4 parquet files  (298,978)     per module, 2/3 of the library (all it has)
  comments    1,342,935 in   6 JSONL files    (223,882)     pydoc topics, LICENSE, IDLE notes, comment runs
  code_py     5,016,102 in   4 parquet files  (1,309,584)   the other 1/3 of the library, then tests
  code_c        890,183 in 189 header files   (53,230)      all of Python's include dir
  8.4 MB of text, ~4 MB on disk, built in ~2.5 s of CPU. Recipe: shares 0.14/0.17/0.56/0.13 (prose 31%: the
  library has no more docstrings), steps 127, shard_tokens 320,768 (4 shards); each stream is asked for ~60% of
  its train text. Scale 0.25 is about the smallest that builds (~2 MB, under a second); above ~1.1 only code_py
  grows.
"""

import ast
import gzip
import json
import math
import os
import random
import re
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from tokmix.errors import TokmixError

SEED = 1234  # the file order and the document order; also the recipe's seed
BYTES_PER_TOKEN = 3.5  # estimate for a 4096-token BPE on this text; sizes the recipe, never the output

# Text bytes per stream at scale 1.0. code_c is all the headers Python ships (~0.9 MB), whatever the scale.
TARGET_BYTES = {"docstrings": 1_200_000, "comments": 1_400_000, "code_py": 5_000_000, "code_c": 1_000_000}
N_FILES = {"docstrings": 4, "comments": 6, "code_py": 4}
ROW_GROUP_ROWS = {"docstrings": 40, "code_py": 16}  # small groups (3+ a file), so a file makes several units
CODING = re.compile(r"coding[:=]\s*[-\w.]+")  # a PEP 263 encoding line, not prose
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
EMPTY_EVERY = 8  # every 8th module without a docstring stays, as a "" row the pipeline must skip (~7 rows)

STREAMS = {  # name -> (domain, folder under dest, glob in the recipe)
    "docstrings": ("prose", "prose/docstrings", "prose/docstrings/*.parquet"),
    "comments": ("prose", "prose/comments", "prose/comments/*.jsonl*"),
    "code_py": ("code", "code/py", "code/py/*.parquet"),
    "code_c": ("code", "code/c", "code/c/**/*.h"),
}

SEQ_LEN, SEQS_PER_STEP, MARGIN_STEPS, STREAM_SLACK = 256, 32, 10, 1.002
HOLDOUT_TOKENS, EVAL_WINDOWS, VOCAB_SIZE = 20_000, 16, 4096
RUN_FRACTION = 0.6  # the run needs ~60% of all train tokens ...
STREAM_CAP = 0.7  # ... and no stream gives more than 70% of its own
HOLDOUT_ROOM = 2.0  # every held-out file holds at least twice its stream's part of the holdout
HELD_FILE_BYTES = int(2 * HOLDOUT_TOKENS * BYTES_PER_TOKEN)  # twice a whole domain's holdout, whatever the shares

EOT_DOC = (
    "tokmix demo: this document contains the literal text <|endoftext|> in the middle of a sentence. "
    "A tokenizer must read it as plain text here, never as the end-of-text token that separates documents."
)

Doc = tuple[str, str]  # (source, text); source is a path relative to the Python installation


def build_demo_corpus(dest: Path, scale: float = 1.0) -> Path:
    """Write the demo corpus, dest/file_splits.json and dest/demo.toml under dest; return the recipe path."""
    if not scale > 0:
        raise TokmixError(f"demo corpus: scale must be > 0, got {scale}")
    dest = Path(dest)
    stdlib, include = Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["include"])
    prose, code = _python_pools(stdlib)
    target = {name: int(n * scale) for name, n in TARGET_BYTES.items()}

    files = {  # stream -> [(path relative to dest, text bytes)], in file order
        "docstrings": _write_parquet_stream(dest, "docstrings", _docstring_docs(stdlib, prose, target["docstrings"])),
        "comments": _write_jsonl_stream(dest, _comment_docs(stdlib, prose, target["comments"])),
        "code_py": _write_parquet_stream(dest, "code_py", _code_docs(stdlib, code, target["code_py"])),
        "code_c": _write_headers(dest, include, target["code_c"]),
    }
    holdout = {name: _holdout_file(name, listed) for name, listed in files.items()}
    numbers = _recipe_numbers(files, holdout, scale)
    _write_splits(dest / "file_splits.json", files, holdout)
    recipe = dest / "demo.toml"
    recipe.write_text(_recipe_text(numbers))
    return recipe


# ---------------------------------------------------------------- sources


def _python_pools(stdlib: Path) -> tuple[list[str], list[str]]:
    """The stdlib's .py files (paths relative to it) in two disjoint pools, prose and code, so that no held-out
    prose is also training code or the other way round. Library modules are dealt in a seeded order, two to
    prose, one to code; the test suite, where the installation ships one, goes to code after them (its
    docstrings are thin prose)."""
    library, tests = [], []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__")]
        parts = Path(root).relative_to(stdlib).parts
        for name in names:
            if name.endswith(".py"):
                rel = "/".join(parts + (name,))
                (tests if {"test", "tests", "idle_test"} & set(parts) else library).append(rel)
    library = sorted(p for p in library if p != "pydoc_data/topics.py")  # a comments source of its own
    tests.sort()
    rng = random.Random(SEED)
    rng.shuffle(library)
    rng.shuffle(tests)
    prose = [p for i, p in enumerate(library) if i % 3 != 2]
    return prose, [p for i, p in enumerate(library) if i % 3 == 2] + tests


def _read(path: Path) -> str | None:
    """The file as UTF-8 text; None for the few stdlib files that are not (encoding tests)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def _take(docs: Iterable[Doc], target: int) -> list[Doc]:
    """Documents from an iterator until their text reaches target bytes (the last one crosses it)."""
    taken, size = [], 0
    for doc in docs:
        if size >= target:
            break
        taken.append(doc)
        size += len(doc[1].encode())
    return taken


def _docstrings(tree: ast.AST) -> list[str]:
    """Module, class and function docstrings, outermost first."""
    found = [ast.get_docstring(tree)]
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found += _docstrings(node)
    return [d for d in found if d]


def _docstring_docs(stdlib: Path, pool: list[str], target: int) -> list[Doc]:
    """One document per module: its docstrings joined; every EMPTY_EVERY-th module without any gives ""."""

    def docs() -> Iterable[Doc]:
        docless = 0
        for rel in pool:
            text = _read(stdlib / rel)
            if text is None:
                continue
            try:
                tree = ast.parse(text)
            except SyntaxError:  # lib2to3's Python 2 test data
                continue
            joined = "\n\n".join(_docstrings(tree))
            if not joined:
                docless += 1
            if joined or docless % EMPTY_EVERY == 1:
                yield rel, joined

    return _take(docs(), target)


def comment_blocks(text: str) -> str:
    """Runs of full-line `#` comments, '#' stripped, one paragraph per run; rulers and coding lines dropped."""
    blocks, run = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith("#!") and not CODING.search(stripped):
            body = stripped.lstrip("#").strip()
            if body.strip("-=*~#_ "):
                run.append(body)
                continue
        if run:
            blocks.append("\n".join(run))
            run = []
    if run:
        blocks.append("\n".join(run))
    return "\n\n".join(blocks)


def _shipped_text(stdlib: Path) -> list[Doc]:
    """Prose Python ships outside code: pydoc's help topics (non-ASCII included), LICENSE, IDLE's and lib2to3's
    text files, plus one document holding a literal <|endoftext|>."""
    docs = [("tokmix/demo.py", EOT_DOC)]
    topics = stdlib / "pydoc_data" / "topics.py"
    if topics.exists():
        for node in ast.parse(topics.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign):
                topic_texts = ast.literal_eval(node.value)
                docs += [(f"pydoc_data/topics.py#{k}", topic_texts[k]) for k in sorted(topic_texts)]
    for pattern in ("LICENSE.txt", "idlelib/*.txt", "lib2to3/*.txt"):
        for path in sorted(stdlib.glob(pattern)):
            text = _read(path)
            if text:
                docs.append((path.relative_to(stdlib).as_posix(), text))
    return docs


def _comment_docs(stdlib: Path, pool: list[str], target: int) -> list[Doc]:
    """Shipped text up to half the target, comment runs of prose-pool modules for the rest, in a seeded order."""

    def module_comments() -> Iterable[Doc]:
        for rel in pool:
            text = comment_blocks(_read(stdlib / rel) or "")
            if text:
                yield rel, text

    shipped = _take(_shipped_text(stdlib), target // 2)
    taken = shipped + _take(module_comments(), target - sum(len(t.encode()) for _, t in shipped))
    rng = random.Random(SEED)
    return [taken[0]] + rng.sample(taken[1:], len(taken) - 1)  # the <|endoftext|> document leads the stream


def _code_docs(stdlib: Path, pool: list[str], target: int) -> list[Doc]:
    """One document per file, its source as it is; empty files left out."""
    return _take(((rel, text) for rel in pool if (text := _read(stdlib / rel))), target)


# ---------------------------------------------------------------- writers


def _file_runs(name: str, docs: list[Doc], n: int) -> list[list[Doc]]:
    """Cut a stream's documents into n contiguous runs, one per file. The last run is the held-out file (the
    split tokmix creates holds out the last file too) and gets at least HELD_FILE_BYTES; the others share the
    rest about equally."""
    sizes = [len(t.encode()) for _, t in docs]
    held, cut = 0, len(docs)
    while cut > 0 and held < max(sum(sizes) / n, HELD_FILE_BYTES):
        cut -= 1
        held += sizes[cut]
    runs, i, left = [], 0, sum(sizes[:cut])
    for k in range(n - 1):
        goal, size, start = left / (n - 1 - k), 0, i
        while i < cut and (size < goal or k == n - 2):
            size += sizes[i]
            i += 1
        runs.append(docs[start:i])
        left -= size
    if not all(runs):
        raise TokmixError(f"demo corpus: too little {name} text for {n} files; use a larger scale")
    return runs + [docs[cut:]]


def _clear(folder: Path, pattern: str) -> None:
    """Remove what an earlier build left, so the recipe's glob sees this build's files only."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted(folder.glob(pattern)):
        path.unlink()


def _write_parquet_stream(dest: Path, name: str, docs: list[Doc]) -> list[tuple[str, int]]:
    folder = dest / STREAMS[name][1]
    _clear(folder, "*.parquet")
    written = []
    for k, chunk in enumerate(_file_runs(name, docs, N_FILES[name])):
        table = pa.table({"text": [t for _, t in chunk], "source": [s for s, _ in chunk]})
        path = folder / f"{name}_{k:03d}.parquet"
        rows = max(1, min(ROW_GROUP_ROWS[name], len(chunk) // 3))
        pq.write_table(table, path, row_group_size=rows, compression="zstd")
        written.append((path.relative_to(dest).as_posix(), sum(len(t.encode()) for _, t in chunk)))
    return written


def _write_jsonl_stream(dest: Path, docs: list[Doc]) -> list[tuple[str, int]]:
    """JSONL in turn plain, gzip and zstd; raw UTF-8 (ensure_ascii off) so readers meet non-ASCII bytes."""
    folder = dest / STREAMS["comments"][1]
    _clear(folder, "*.jsonl*")
    written = []
    for k, chunk in enumerate(_file_runs("comments", docs, N_FILES["comments"])):
        lines = "".join(json.dumps({"text": t, "source": s}, ensure_ascii=False) + "\n" for s, t in chunk)
        data, suffix = lines.encode(), JSONL_SUFFIXES[k % len(JSONL_SUFFIXES)]
        if suffix == ".jsonl.gz":
            data = gzip.compress(data, mtime=0)  # mtime 0: no timestamp in the header
        elif suffix == ".jsonl.zst":
            data = zstandard.ZstdCompressor(level=10).compress(data)
        path = folder / f"comments_{k:03d}{suffix}"
        path.write_bytes(data)
        written.append((path.relative_to(dest).as_posix(), sum(len(t.encode()) for _, t in chunk)))
    return written


def _write_headers(dest: Path, include: Path, target: int) -> list[tuple[str, int]]:
    """C headers copied as they are under code/c/<include dir name>/, one document per file: the largest
    first (it is the one held out, as one header is one small document), then the rest in path order up to
    target bytes."""
    folder = dest / STREAMS["code_c"][1]
    _clear(folder, "**/*.h")
    headers = sorted(include.rglob("*.h"))
    largest = max(headers, key=lambda p: (p.stat().st_size, p.as_posix()))
    written, size = [], 0
    for path in [largest] + [p for p in headers if p != largest]:
        if size >= target and written:
            break
        data = path.read_bytes()
        rel = Path(STREAMS["code_c"][1]) / include.name / path.relative_to(include)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
        written.append((rel.as_posix(), len(data)))
        size += len(data)
    return written


# ---------------------------------------------------------------- split and recipe


def _holdout_file(name: str, files: list[tuple[str, int]]) -> str:
    """The held-out file: the largest header for code_c, the last file otherwise (a stream's files are cut to
    about the same size, and the first holds the <|endoftext|> document, which belongs in training)."""
    return files[0][0] if name == "code_c" else files[-1][0]


def _share_in_domain(shares: dict[str, float], name: str) -> float:
    domain = STREAMS[name][0]
    return shares[name] / sum(s for n, s in shares.items() if STREAMS[n][0] == domain)


def _recipe_numbers(files: dict, holdout: dict[str, str], scale: float) -> dict:
    """Shares follow the train bytes (rounded to 0.01); steps make the run need ~60% of the train tokens with
    no stream giving more than 70% of its own; shard_tokens gives 4 shards (3 when the blocks divide evenly)."""
    text_bytes = {name: sum(b for _, b in listed) for name, listed in files.items()}
    held_bytes = {name: dict(files[name])[holdout[name]] for name in files}
    train_tokens = {name: (text_bytes[name] - held_bytes[name]) / BYTES_PER_TOKEN for name in files}
    total = sum(train_tokens.values())
    shares = {name: max(0.01, round(t / total, 2)) for name, t in train_tokens.items()}
    largest = max(shares, key=shares.get)
    shares[largest] = round(1 - sum(s for n, s in shares.items() if n != largest), 2)

    run_tokens = min(
        RUN_FRACTION * total,
        min(STREAM_CAP * train_tokens[n] / (shares[n] * STREAM_SLACK) for n in files),
    )
    steps = int((run_tokens - 1) // SEQ_LEN) // SEQS_PER_STEP - MARGIN_STEPS
    if steps < 1:
        raise TokmixError(f"demo corpus: scale {scale} leaves too little text for a run ({total:,.0f} tokens)")
    blocks = (steps + MARGIN_STEPS) * SEQS_PER_STEP
    shard_blocks = math.ceil(blocks * 2 / 7)
    shard_tokens = shard_blocks * SEQ_LEN

    for name in files:
        need = (HOLDOUT_TOKENS + 1) * _share_in_domain(shares, name) * BYTES_PER_TOKEN * HOLDOUT_ROOM
        if held_bytes[name] < need:
            raise TokmixError(
                f"demo corpus: scale {scale} is too small: {holdout[name]} holds {held_bytes[name]:,} bytes "
                f"of text, the {name} part of the holdout wants {need:,.0f}"
            )
    run_tokens = blocks * SEQ_LEN + 1
    asked = {n: shares[n] * run_tokens * STREAM_SLACK / train_tokens[n] for n in files}
    return {
        "scale": scale,
        "text_bytes": text_bytes,
        "held_bytes": held_bytes,
        "n_files": {n: len(listed) for n, listed in files.items()},
        "shares": shares,
        "asked": asked,
        "steps": steps,
        "shard_tokens": shard_tokens,
        "n_shards": math.ceil(blocks / shard_blocks),
        "run_fraction": run_tokens / total,
    }


def _write_splits(path: Path, files: dict, holdout: dict[str, str]) -> None:
    """{domain: {"holdout": [...], "train": [...]}}, paths relative to dest, streams in recipe order."""
    splits: dict[str, dict[str, list[str]]] = {}
    for name, listed in files.items():
        split = splits.setdefault(STREAMS[name][0], {"holdout": [], "train": []})
        split["holdout"].append(holdout[name])
        split["train"] += sorted(p for p, _ in listed if p != holdout[name])
    path.write_text(json.dumps(splits, indent=2) + "\n")


def _recipe_text(n: dict) -> str:
    v = sys.version_info
    lines = [
        f"# tokmix demo recipe: written by tokmix.demo at scale {n['scale']} from Python {v.major}.{v.minor}."
        f"{v.micro}'s own files.",
        f"# Text bytes per stream (all files / the held-out file); tokens estimated at {BYTES_PER_TOKEN} bytes each:",
    ]
    for name in STREAMS:
        lines.append(
            f"#   {name:<10} {n['text_bytes'][name]:>10,} in {n['n_files'][name]:>3} files"
            f" / {n['held_bytes'][name]:>9,} held out; the run asks {100 * n['asked'][name]:.0f}% of its train"
        )
    lines += [
        f"# steps: the run needs {100 * n['run_fraction']:.0f}% of the train tokens; shard_tokens: "
        f"{n['n_shards']} train shards.",
        "",
        f"seed = {SEED}",
        "",
        "[tokenizer.train]",
        f"vocab_size = {VOCAB_SIZE}",
        "",
        "[layout]",
        f"seq_len = {SEQ_LEN}",
        f"steps = {n['steps']}",
        f"seqs_per_step = {SEQS_PER_STEP}",
        f"margin_steps = {MARGIN_STEPS}",
        f"shard_tokens = {n['shard_tokens']}",
        f"stream_slack = {STREAM_SLACK}",
        "",
        "[holdout]",
        f"tokens = {HOLDOUT_TOKENS}",
        f"eval_windows = {EVAL_WINDOWS}",
        'splits = "file_splits.json"',
        "holdout_files = 1",
    ]
    for name, (domain, _, pattern) in STREAMS.items():
        lines += ["", f"[streams.{name}]", f'domain = "{domain}"', f"share = {n['shares'][name]:.2f}"]
        lines.append(f'files = ["{pattern}"]')
    lines.append('text_field = "text"')
    return "\n".join(lines) + "\n"
