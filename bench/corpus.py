"""Build the benchmark corpus: a few hundred MB of real text found on this machine, in the reference's
45/35/7/13 mix, as parquet files plus a recipe (bench.toml) and a holdout/train split (file_splits.json).

    python bench/corpus.py DEST [--mb 250] [--workers N]

Streams and where their text comes from (each stream takes its sources in turn, byte for byte, so every
source is represented until it runs out; exact duplicate documents are dropped, nothing is repeated):
  web         domain web   0.45  man pages rendered to text (groff, or a roff stripper without it), HTML
                                 and copyright files of /usr/share/doc
  edu         domain edu   0.35  docstrings and comment runs of the Python installation's modules, prose
                                 shipped with Python (pydoc topics, package READMEs and METADATA), READMEs,
                                 NEWS and changelogs of /usr/share/doc
  code_py     domain code  0.07  Python sources (files disjoint from those edu took docstrings from)
  code_other  domain code  0.13  C headers of /usr/include
Each stream is one held-out file, val.parquet, large enough for 1.5x the stream's part of its domain's
holdout (sampled from the first half of the stream), plus train files of ~64 MB (row groups of 1000
rows), train_NNN.parquet, holding the stream's share of the rest of --mb MB.

Output is deterministic on a given machine: files are found in sorted order, then put in a seeded hash
order; per-file work runs in a process pool but its results are consumed in order; nothing depends on time.

Measured on the machine this was written on (2 CPUs shared with other jobs; Debian with groff 1.22.4, 21k
man pages, Python 3.11 with ~200 MB of site-packages): --mb 250 builds in 110-165 s (web ~50 s, most of it groff;
edu ~60-105 s, most of it ast.parse), 250.2 MB of text, 65 MB of parquet on disk. All the distinct text there is
comes to ~387 MB (web 118, edu 154, code_py 57, code_other 58), so at these shares web runs out past ~260 MB.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import heapq
import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tokmix.demo import comment_blocks  # noqa: E402  (the demo's comment extraction: one copy)

SEED = 1234
STREAMS = {"web": ("web", 0.45), "edu": ("edu", 0.35), "code_py": ("code", 0.07), "code_other": ("code", 0.13)}
MB = 1_000_000
FILE_BYTES = 64 * MB  # text per train file
ROW_GROUP_ROWS = 1000
BYTES_PER_TOKEN = 4.0  # estimate for a 32k BPE on this mix (English prose ~4.3, code ~3.5); sizes the recipe
FULL_MB = 250  # the size the recipe numbers below are given for; a smaller --mb scales the holdout down
HOLDOUT_TOKENS, EVAL_WINDOWS = 2_000_000, 1600
HOLDOUT_ROOM = 1.5  # a held-out file holds 1.5x its stream's part of the domain holdout
SEQ_LEN, SEQS_PER_STEP, MARGIN_STEPS, STREAM_SLACK, VOCAB_SIZE = 1024, 64, 30, 1.002, 32000
RUN_FRACTION = 0.7  # the run uses ~70% of the train tokens of the stream that has the least for its share
N_SHARDS = 6
BATCH = {"man": 32, "python": 8}  # files per pool task; 4 for the others
# groff: preconv (-k) and tbl (-t) on, no SGR or overstrike, 78 columns, no hyphenation, continuous page
GROFF = ["groff", "-k", "-t", "-Tutf8", "-P-cbou", "-rLL=78n", "-rHY=0", "-rcR=1"]
MAN_MARK = "TOKMIX-MAN-PAGE-START"
# an-old.tmac directly (man.tmac would load it at the first .TH, over these definitions): the page header
# (PT) prints the marker, the footer (BT) nothing, and text is set ragged right
MAN_PRELUDE = f".de1 PT\n.  tl '{MAN_MARK}'''\n..\n.de1 BT\n..\n.ad l\n".encode()
MAN_RESET = b"\n.fi\n.ft R\n.ad l\n"  # between two pages of one run: undo what a page may leave on
SKIP_DIRS = {"__pycache__", ".git"}


# ---------------------------------------------------------------- per-file converters (run in the pool)


def _raw(path: str) -> bytes:
    data = Path(path).read_bytes()
    return gzip.decompress(data) if path.endswith(".gz") else data


def _text(data: bytes) -> str | None:
    """UTF-8 text, or None for binary or other encodings."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _tidy(text: str) -> str:
    """Trailing spaces off, at most one blank line in a row."""
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


ROFF_FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)")
ROFF_CHAR = {"\\-": "-", "\\e": "\\", "\\&": "", "\\(em": "—", "\\(en": "–", "\\(bu": "•", "\\ ": " ", "\\|": ""}


def _strip_roff(src: str) -> str:
    """Plain text from man(7) source, for machines without groff: requests dropped, headings and font
    macros kept as text, font escapes removed."""
    out = []
    for line in src.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith((".", "'")):
            name, _, rest = line[1:].partition(" ")
            if name in ("SH", "SS"):
                out += ["", rest.strip('"').upper() if name == "SH" else rest.strip('"')]
            elif name in ("B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "TP", "IP") and rest:
                out.append(rest.replace('"', ""))
            elif name in ("PP", "LP", "P", "TP", "IP"):
                out.append("")
            continue
        out.append(line)
    text = ROFF_FONT.sub("", "\n".join(out))
    for escape, char in ROFF_CHAR.items():
        text = text.replace(escape, char)
    return re.sub(r"\\\(..|\\\*.|\\.", "", text)


def _groff(source: bytes, args: list[str]) -> str | None:
    env = dict(os.environ, LC_ALL="C.UTF-8", SOURCE_DATE_EPOCH="0")
    try:
        done = subprocess.run(GROFF + args, input=source, capture_output=True, env=env, timeout=300)
    except subprocess.TimeoutExpired:
        return None
    return _text(done.stdout) if done.returncode == 0 else None


def _man_pieces(output: str | None) -> list[str]:
    """Rendered pages, cut at the marker each page's header line was replaced by."""
    if output is None:
        return []
    return [_tidy(piece) for piece in re.split(rf"^\s*{MAN_MARK}\s*$", output, flags=re.M)[1:]]


def _is_man7(data: bytes) -> bool:
    return re.search(rb"^\.TH ", data, re.M) is not None and re.search(rb"^\.Dd", data, re.M) is None


def man_pages(paths: list[str]) -> list[str]:
    """man(7) pages rendered by groff, many per groff run (a run costs ~20 ms, most pages much less): each
    page's header line becomes a marker to cut the output at, and the footer is dropped. A batch whose marker
    count comes out wrong (a page that leaves troff in an odd state) is rendered again page by page. mdoc(7)
    pages and pages not in UTF-8 go alone; without groff, a roff stripper stands in."""
    sources = [data for data in map(_raw, paths) if not data.lstrip().startswith(b".so ")]  # .so: an alias
    if not shutil.which("groff"):
        return [_tidy(_strip_roff(_text(d) or d.decode("latin-1"))) for d in sources]
    texts = []
    batch = [d for d in sources if _is_man7(d) and _text(d) is not None]
    if batch:
        texts = _man_pieces(_groff(MAN_PRELUDE + MAN_RESET.join(batch), ["-K", "utf8", "-man-old"]))
        if len(texts) != len(batch):
            texts = [t for d in batch for t in _man_pieces(_groff(MAN_PRELUDE + d, ["-K", "utf8", "-man-old"]))]
    for data in sources:
        if _is_man7(data) and _text(data) is not None:
            continue
        if _is_man7(data):  # not UTF-8
            texts += _man_pieces(_groff(MAN_PRELUDE + data, ["-K", "latin1", "-man-old"]))
        else:
            output = _groff(data, ["-K", "utf8" if _text(data) is not None else "latin1", "-mandoc"])
            texts += [_tidy(output)] if output else []
    return [t for t in texts if t.strip()]


class _HTMLText(HTMLParser):
    SKIP = {"script", "style", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        self.skipping += tag in self.SKIP
        if tag in ("p", "br", "div", "li", "tr", "h1", "h2", "h3", "h4", "pre", "dt", "dd"):
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        self.skipping -= tag in self.SKIP and self.skipping > 0

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def html_page(path: str) -> list[str]:
    source = _text(_raw(path))
    if source is None:
        return []
    parser = _HTMLText()
    parser.feed(source)
    parser.close()
    text = _tidy(re.sub(r"[ \t]+", " ", "".join(parser.parts)))
    return [text] if text else []


def text_file(path: str) -> list[str]:
    text = _text(_raw(path))
    return [text] if text and text.strip() else []


def _docstrings(tree: ast.AST) -> list[str]:
    found = [ast.get_docstring(tree)]
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found += _docstrings(node)
    return [d for d in found if d]


def python_prose(path: str) -> list[str]:
    """A module's docstrings joined, and its comment runs joined: two documents."""
    source = _text(_raw(path))
    if source is None:
        return []
    try:
        docstrings = "\n\n".join(_docstrings(ast.parse(source)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        docstrings = ""
    return [t for t in (docstrings, comment_blocks(source)) if t]


def pydoc_topics(path: str) -> list[str]:
    for node in ast.parse(Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign):
            topics = ast.literal_eval(node.value)
            return [topics[k] for k in sorted(topics)]
    return []


def _each(convert_one: Callable[[str], list[str]]) -> Callable[[list[str]], list[str]]:
    return lambda paths: [text for path in paths for text in convert_one(path)]


CONVERTERS: dict[str, Callable[[list[str]], list[str]]] = {
    "man": man_pages,
    "html": _each(html_page),
    "text": _each(text_file),
    "python": _each(python_prose),
    "topics": _each(pydoc_topics),
    "code": _each(text_file),
}


def convert(kind: str, paths: list[str]) -> list[str]:
    """One pool task: the documents of a batch of files, in order."""
    return CONVERTERS[kind](paths)


# ---------------------------------------------------------------- finding files (in the parent)


def walk(root: Path, keep: Callable[[Path], bool]) -> list[Path]:
    """Regular files under root that `keep` accepts, sorted; symlinks skipped (they repeat their target)."""
    found = []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in names:
            path = Path(dirpath, name)
            if not path.is_symlink() and keep(path):
                found.append(path)
    return sorted(found)


def mixed(paths: list[Path]) -> list[Path]:
    """A fixed pseudo-random order (seeded hash of the path), so that a stream cut short by --mb still
    samples all of a source rather than its alphabetical head (/usr/include/X11, gcloud's man pages)."""
    return sorted(paths, key=lambda p: hashlib.blake2b(f"{SEED}:{p}".encode(), digest_size=8).digest())


def man_pages() -> list[Path]:
    """Every section, every language."""
    root = Path("/usr/share/man")
    if not root.is_dir():
        return []
    return walk(root, lambda p: re.search(r"\.\d\w*(\.gz)?$", p.name) is not None)


def doc_files() -> dict[str, list[Path]]:
    """/usr/share/doc by kind: html, copyright, prose (READMEs, NEWS, changelogs, .md/.txt/.rst)."""
    kinds: dict[str, list[Path]] = {"html": [], "copyright": [], "prose": []}
    root = Path("/usr/share/doc")
    if not root.is_dir():
        return kinds
    for path in walk(root, lambda p: p.stat().st_size > 0):
        name = path.name.lower().removesuffix(".gz")
        ext = os.path.splitext(name)[1]
        if ext in (".html", ".htm"):
            kinds["html"].append(path)
        elif name == "copyright":
            kinds["copyright"].append(path)
        elif ext in ("", ".md", ".txt", ".rst", ".debian") or name.startswith(("readme", "news", "changelog")):
            kinds["prose"].append(path)
    return kinds


def python_dirs() -> list[Path]:
    """The running Python's stdlib and site-packages, and its base installation's site-packages."""
    base = {"base": sys.base_prefix, "platbase": sys.base_prefix}
    roots = [sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")]
    roots += [sysconfig.get_paths(vars=base)[k] for k in ("purelib", "platlib")]
    found = []
    for root in map(Path, roots):
        if root.is_dir() and not any(root == r or root.is_relative_to(r) for r in found):
            found.append(root)
    return sorted(found)


def python_files() -> tuple[list[Path], list[Path], list[Path]]:
    """(edu modules, code_py modules, Python prose files). Modules are deduplicated by content, then dealt
    in a fixed order three to edu, one to code_py, so no module feeds both a prose and a code stream."""
    modules, prose, seen = [], [], set()
    prose_name = re.compile(r"^(METADATA|(README|CHANGES|CHANGELOG|NEWS|HISTORY)(\.\w+)?|.*\.(rst|md))$", re.I)
    for root in python_dirs():
        for path in walk(root, lambda p: p.suffix == ".py" or prose_name.match(p.name) is not None):
            digest = hashlib.blake2b(path.read_bytes(), digest_size=16).digest()
            if digest in seen:
                continue
            seen.add(digest)
            (modules if path.suffix == ".py" else prose).append(path)
    modules = [m for m in modules if not m.as_posix().endswith("pydoc_data/topics.py")]  # its own source
    order = mixed(modules)
    edu = [p for i, p in enumerate(order) if i % 4 != 3]
    code = [p for i, p in enumerate(order) if i % 4 == 3]
    return edu, code, mixed(prose)


def plan_sources() -> dict[str, list[tuple[str, str, list[Path]]]]:
    """Per stream, its sources in turn: (label, converter kind, files)."""
    docs = doc_files()
    edu_modules, code_modules, py_prose = python_files()
    topics = Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    headers = walk(Path("/usr/include"), lambda p: p.suffix in (".h", ".hpp", ".hh", ".hxx"))
    return {
        "web": [
            ("man pages", "man", mixed(man_pages())),
            ("doc html", "html", mixed(docs["html"])),
            ("doc copyright", "text", mixed(docs["copyright"])),
        ],
        "edu": [
            ("python docstrings+comments", "python", edu_modules),
            ("python prose", "text", py_prose),
            ("pydoc topics", "topics", [topics] if topics.exists() else []),
            ("doc prose", "text", mixed(docs["prose"])),
        ],
        "code_py": [("python sources", "code", code_modules)],
        "code_other": [("C/C++ headers", "code", mixed(headers))],
    }


# ---------------------------------------------------------------- ordered parallel conversion


def converted(pool: ProcessPoolExecutor, kind: str, paths: list[Path], window: int) -> Iterator[str]:
    """Documents of `paths` in file order, converted in the pool with at most `window` tasks in flight."""
    size = BATCH.get(kind, 4)
    batches = iter([[str(p) for p in paths[i : i + size]] for i in range(0, len(paths), size)])
    pending: deque[Future] = deque()
    try:
        for batch in batches:
            pending.append(pool.submit(convert, kind, batch))
            if len(pending) >= window:
                break
        while pending:
            texts = pending.popleft().result()
            batch = next(batches, None)
            if batch is not None:
                pending.append(pool.submit(convert, kind, batch))
            yield from texts
    finally:
        for future in pending:
            future.cancel()


def interleave(sources: list[Iterator[str]]) -> Iterator[tuple[int, str]]:
    """(source index, text), always from the source that has given the fewest bytes so far."""
    heap = [(0, i) for i in range(len(sources))]
    while heap:
        given, i = heapq.heappop(heap)
        text = next(sources[i], None)
        if text is not None:
            heapq.heappush(heap, (given + len(text.encode()), i))
            yield i, text


# ---------------------------------------------------------------- writing a stream


class ParquetOut:
    """One parquet file with a "text" column, written in row groups of ROW_GROUP_ROWS documents."""

    def __init__(self, path: Path) -> None:
        self.path, self.rows, self.bytes, self.docs = path, [], 0, 0
        self.writer = pq.ParquetWriter(path, pa.schema([("text", pa.string())]), compression="zstd")

    def add(self, text: str) -> None:
        self.rows.append(text)
        self.bytes += len(text.encode())
        self.docs += 1
        if len(self.rows) == ROW_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.table({"text": self.rows}), row_group_size=ROW_GROUP_ROWS)
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()


def write_stream(dest: Path, name: str, sources: list, target: int, held_target: int, pool, workers: int) -> dict:
    """Documents of the stream's sources, interleaved, deduplicated, until `target` bytes: about every k-th
    goes to val.parquet until it holds `held_target` bytes (a sample of the first half of the stream), the
    rest to train_NNN.parquet files of FILE_BYTES each."""
    folder = dest / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    iters = [converted(pool, kind, paths, 2 * workers) for _, kind, paths in sources]
    per_source = [{"source": label, "files": len(paths), "docs": 0, "bytes": 0} for label, _, paths in sources]
    every = max(2, round(target / max(held_target, 1) / 2))  # fills about halfway through the stream
    held, train, seen, total, n = ParquetOut(folder / "val.parquet"), [], set(), 0, 0
    for i, text in interleave(iters):
        if total >= target:
            break
        digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
        if digest in seen:
            continue
        seen.add(digest)
        size = len(text.encode())
        per_source[i]["docs"] += 1
        per_source[i]["bytes"] += size
        total += size
        n += 1
        if n % every == 0 and held.bytes < held_target:
            held.add(text)
            continue
        if not train or train[-1].bytes >= FILE_BYTES:
            if train:
                train[-1].close()
            train.append(ParquetOut(folder / f"train_{len(train):03d}.parquet"))
        train[-1].add(text)
    for it in iters:
        it.close()
    held.close()
    if train:
        train[-1].close()
    return {
        "train": [(o.path.relative_to(dest).as_posix(), o.bytes, o.docs) for o in train],
        "holdout": (held.path.relative_to(dest).as_posix(), held.bytes, held.docs),
        "sources": per_source,
        "bytes": total,
    }


# ---------------------------------------------------------------- split and recipe


def holdout_parts(holdout_tokens: int) -> dict[str, float]:
    """Tokens each stream gives its domain's holdout: the domain's tokens split by share within the domain."""
    parts = {}
    for name, (domain, share) in STREAMS.items():
        domain_share = sum(s for d, s in STREAMS.values() if d == domain)
        parts[name] = (holdout_tokens + 1) * share / domain_share
    return parts


def recipe_numbers(written: dict, holdout_tokens: int) -> dict:
    train_tokens = {n: sum(b for _, b, _ in w["train"]) / BYTES_PER_TOKEN for n, w in written.items()}
    # a stream gives share x run tokens (x slack), so the run is bounded by the stream with least per share
    run_tokens = RUN_FRACTION * min(train_tokens[n] / (STREAMS[n][1] * STREAM_SLACK) for n in STREAMS)
    steps = int(run_tokens // (SEQ_LEN * SEQS_PER_STEP)) - MARGIN_STEPS
    if steps < 1:
        raise SystemExit(f"corpus too small for a run: {sum(train_tokens.values()):,.0f} train tokens")
    blocks = (steps + MARGIN_STEPS) * SEQS_PER_STEP
    shard_tokens = math.ceil(blocks / N_SHARDS) * SEQ_LEN
    used = blocks * SEQ_LEN + 1
    return {
        "steps": steps,
        "shard_tokens": shard_tokens,
        "train_tokens": train_tokens,
        "asked": {n: STREAMS[n][1] * used * STREAM_SLACK / train_tokens[n] for n in STREAMS},
        "holdout_tokens": holdout_tokens,
        "eval_windows": min(EVAL_WINDOWS, holdout_tokens // SEQ_LEN),
    }


def write_splits(dest: Path, written: dict) -> None:
    split: dict[str, dict[str, list[str]]] = {}
    for name, w in written.items():
        entry = split.setdefault(STREAMS[name][0], {"holdout": [], "train": []})
        entry["holdout"].append(w["holdout"][0])
        entry["train"] += [path for path, _, _ in w["train"]]
    (dest / "file_splits.json").write_text(json.dumps(split, indent=2) + "\n")


def recipe_text(written: dict, numbers: dict, mb: float) -> str:
    lines = [
        f"# tokmix benchmark recipe, written by bench/corpus.py --mb {mb:g} from this machine's files.",
        f"# Text bytes per stream (train / held out); tokens estimated at {BYTES_PER_TOKEN} bytes each:",
    ]
    for name, w in written.items():
        train = sum(b for _, b, _ in w["train"])
        lines.append(
            f"#   {name:<10} {train:>12,} in {len(w['train'])} train file(s) / {w['holdout'][1]:>11,} held out;"
            f" the run asks {100 * numbers['asked'][name]:.0f}% of its train"
        )
    lines += [
        f"# steps: the run uses {100 * RUN_FRACTION:.0f}% of the train tokens of the stream with the fewest "
        "for its share.",
        "",
        f"seed = {SEED}",
        "",
        "[tokenizer.train]",
        f"vocab_size = {VOCAB_SIZE}",
        "",
        "[layout]",
        f"seq_len = {SEQ_LEN}",
        f"steps = {numbers['steps']}",
        f"seqs_per_step = {SEQS_PER_STEP}",
        f"margin_steps = {MARGIN_STEPS}",
        f"shard_tokens = {numbers['shard_tokens']}",
        f"stream_slack = {STREAM_SLACK}",
        "",
        "[holdout]",
        f"tokens = {numbers['holdout_tokens']}",
        f"eval_windows = {numbers['eval_windows']}",
        'splits = "file_splits.json"',
        "holdout_files = 1",
    ]
    for name, (domain, share) in STREAMS.items():
        lines += ["", f"[streams.{name}]", f'domain = "{domain}"', f"share = {share}", f'files = ["{name}/*.parquet"]']
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def build(dest: Path, mb: float, workers: int) -> dict:
    """Each stream gets its holdout file plus its share of the rest of `mb` MB, so that every stream's train
    text is in proportion to its share."""
    dest.mkdir(parents=True, exist_ok=True)
    holdout_tokens = int(HOLDOUT_TOKENS * min(1.0, mb / FULL_MB))
    parts = holdout_parts(holdout_tokens)
    held = {name: int(HOLDOUT_ROOM * parts[name] * BYTES_PER_TOKEN) for name in STREAMS}
    train_bytes = mb * MB - sum(held.values())
    t0 = time.perf_counter()
    sources = plan_sources()
    print(f"planned sources in {time.perf_counter() - t0:.1f}s", flush=True)
    written = {}
    with ProcessPoolExecutor(workers) as pool:
        for name, (_, share) in STREAMS.items():
            t1 = time.perf_counter()
            target = int(share * train_bytes) + held[name]
            written[name] = w = write_stream(dest, name, sources[name], target, held[name], pool, workers)
            print(f"{name}: {w['bytes'] / MB:,.1f} MB in {time.perf_counter() - t1:.0f}s", flush=True)
            for s in w["sources"]:
                print(f"    {s['source']:<28} {s['docs']:>8,} docs {s['bytes'] / MB:>9,.1f} MB  ({s['files']:,} files)")
            if w["bytes"] < target:
                print(f"    ran out: {w['bytes'] / MB:,.1f} MB of distinct text, {target / MB:,.1f} MB wanted")
            if w["holdout"][1] < parts[name] * BYTES_PER_TOKEN:
                print(
                    f"    WARNING: {w['holdout'][0]} holds {w['holdout'][1]:,} bytes, too few for the holdout "
                    "(use a smaller --mb)"
                )
    numbers = recipe_numbers(written, holdout_tokens)
    write_splits(dest, written)
    (dest / "bench.toml").write_text(recipe_text(written, numbers, mb))
    total = sum(w["bytes"] for w in written.values())
    print(
        f"total {total / MB:,.1f} MB of text (asked {mb:g} MB) in {time.perf_counter() - t0:.0f}s; "
        f"recipe: steps {numbers['steps']:,}, shard_tokens {numbers['shard_tokens']:,}, "
        f"asked of train " + ", ".join(f"{n} {100 * a:.0f}%" for n, a in numbers["asked"].items())
    )
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--mb", type=float, default=FULL_MB, help="MB of text in all (each stream share x this)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    build(args.dest, args.mb, args.workers)


if __name__ == "__main__":
    main()
