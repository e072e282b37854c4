"""Regenerate the examples in README.md and docs/*.md from real runs, so they cannot drift from the program.

An example is a fenced block between two markers, and only that block is rewritten; the prose around it is
not touched:

    <!-- example: NAME -->
    ```
    (written by this script)
    ```
    <!-- /example -->

NAME is one of EXAMPLES below. The runs use the golden inputs in tests/golden/ (committed JSONL files and a
committed tokenizer, so every machine gets the same tokens), copied into a scratch directory and run there
with the installed `tokmix`, as a user would type the commands. What changes from run to run (seconds,
speeds, free disk space, the recipe fingerprint, which covers absolute paths) is shown as `…` or left out.

    python scripts/docs_examples.py           # rewrite the examples in place
    python scripts/docs_examples.py --check   # exit 1 naming each example that differs (the test suite runs this)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# the examples are runs without the token cache (its folder and counts are this machine's), and they never
# write into the user's one
os.environ["TOKMIX_CACHE"] = "off"

from tests.reference import GOLDEN, stable_json  # noqa: E402

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- example: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /example -->)", re.DOTALL)
WIDTH = "140"  # the width tokmix's tables take when stdout is not a terminal
# figures that differ between two runs of the same inputs
VOLATILE = [
    (re.compile(r"\((\d+\.\d+)s\)"), "(…s)"),  # plan ok (0.8s)
    (re.compile(r"(?<=: recipe )[0-9a-f]{16}\b"), "…"),  # the recipe's fingerprint covers its absolute paths
    (re.compile(r"(│ free on \S+\s+│)\s*[\d.]+ \w+ │"), None),  # the disk's free space
]


class Workspace:
    """The golden inputs in a scratch directory, and the commands run in it, each once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "example"
        shutil.copytree(GOLDEN, self.dir, ignore=shutil.ignore_patterns("reference"))
        self._outputs: dict[str, str] = {}

    def tokmix(self, *args: str) -> str:
        """`$ tokmix ARGS` and what it printed (stdout, then stderr), as a reader would see it."""
        command = " ".join(["tokmix", *args])
        if command not in self._outputs:
            # the command line's own code in this process (a run still starts its stage process): one
            # interpreter start-up for all the examples instead of one per command
            from typer.testing import CliRunner

            from tokmix.cli import app

            cwd = os.getcwd()
            os.chdir(self.dir)
            try:
                result = CliRunner().invoke(app, list(args), env={"COLUMNS": WIDTH, "NO_COLOR": "1", "TERM": "dumb"})
            finally:
                os.chdir(cwd)
            if result.exit_code not in (0, 1):
                raise SystemExit(f"docs_examples: `{command}` failed ({result.exit_code}): {result.stderr.strip()}")
            self._outputs[command] = f"$ {command}\n" + _stable(result.stdout + result.stderr, self.dir)
        return self._outputs[command]

    def finished_run(self) -> Path:
        self.tokmix("plan", "recipe.toml", "--out", "run")  # before the run: it reads the sources only
        self.tokmix("run", "recipe.toml", "--out", "run", "--workers", "2")
        return self.dir / "run"


def _stable(text: str, where: Path) -> str:
    text = text.replace(f"{where}/", "").replace(str(where), ".")
    for pattern, replacement in VOLATILE:
        if replacement is None:  # keep the column's width: right-aligned `…`
            text = pattern.sub(lambda m: m.group(1) + "…".rjust(len(m.group(0)) - len(m.group(1)) - 2) + " │", text)
        else:
            text = pattern.sub(replacement, text)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def _from(text: str, first_line: str) -> str:
    """The part of a command's output from the line that starts with first_line, after its `$ ...` line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_line))
    return "\n".join([lines[0], "...", *lines[start:]]) + "\n"


def index_excerpt(ws: Workspace) -> str:
    """index.json of the example run: every key, lists cut to their first element, speeds and seconds left out."""
    index = stable_json(json.loads((ws.finished_run() / "index.json").read_text()))
    index["recipe_fingerprint"] = "…"
    index["tokenizer_libraries"] = {k: "…" for k in index["tokenizer_libraries"]}  # this machine's versions
    index["tokenizer_ids_sha256"] = "…"  # the oracle version's ids
    index["shards"] = index["shards"][:1] + ["…"]
    index["val"] = dict(list(index["val"].items())[:1])
    if "provenance" in index:
        index["provenance"]["sources"] = index["provenance"]["sources"][:1] + ["…"]
    return _json(index).replace('"…"', "…").replace(f"{ws.dir}/", "") + "\n"  # the tokenizer's, the sources' paths


def _json(value, indent: str = "") -> str:
    """JSON with an object or list that fits in 100 columns on one line, the rest one key a line."""
    flat = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if len(indent) + len(flat) <= 100 or not isinstance(value, (dict, list)) or not value:
        return flat
    inner = indent + "  "
    if isinstance(value, list):
        items = [inner + _json(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    items = [f"{inner}{json.dumps(k)}: {_json(v, inner)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"


def _without_column(text: str, header: str) -> str:
    """A table's column left out of every line of the table (one whose figures change from run to run and
    whose width changes with them, such as status's seconds)."""
    lines = text.splitlines()
    head = next(line for line in lines if f"┃ {header} " in line or re.search(rf"┃ +{header} ┃", line))
    at = re.search(rf"┃ *{header} *┃", head)
    start, end = at.start(), at.end() - 1  # from the border before the column to the one before the next
    table = "┏┃┡│├└┗"
    return "\n".join(line[:start] + line[end:] if line[:1] in table and len(line) > end else line
                     for line in lines) + "\n"


def _finished(ws: Workspace, *args: str) -> str:
    ws.finished_run()
    return ws.tokmix(*args)


def plan_short(ws: Workspace) -> str:
    """The example recipe asking for ten times the steps its files can give."""
    recipe = (ws.dir / "recipe.toml").read_text()
    (ws.dir / "short.toml").write_text(recipe.replace("steps = 24", "steps = 240"))
    return ws.tokmix("plan", "short.toml", "--out", "short")


def plan_before_the_run(ws: Workspace) -> str:
    ws.finished_run()  # its first command is this plan, run before anything was written
    return ws.tokmix("plan", "recipe.toml", "--out", "run")


EXAMPLES: dict[str, Callable[[Workspace], str]] = {
    "local-recipe": lambda ws: (REPO / "recipes" / "local.toml").read_text(),
    "plan": plan_before_the_run,
    "plan-short": plan_short,
    "status": lambda ws: _without_column(_finished(ws, "status", "run"), "time"),  # its seconds vary
    "inspect": lambda ws: _from(_finished(ws, "inspect", "run"), "shards"),
    "inspect-block": lambda ws: _finished(ws, "inspect", "run", "--shard", "1", "--block", "3"),
    "trace-step": lambda ws: _finished(ws, "trace", "run", "--step", "2", "--rank", "1", "--world-size", "2"),
    "trace-text": lambda ws: _finished(ws, "trace", "run", "--shard", "1", "--block", "3", "--text"),
    "report": lambda ws: _finished(ws, "report", "run"),
    "index": index_excerpt,
}


def render(doc: str, ws: Workspace) -> str:
    def block(m: re.Match) -> str:
        name = m.group("name")
        if name not in EXAMPLES:
            raise SystemExit(f"docs_examples: unknown example {name!r}; known: {', '.join(EXAMPLES)}")
        fence = re.match(r"```(\w*)", m.group("body"))
        lang = fence.group(1) if fence else ""
        return f"{m.group(1)}```{lang}\n{EXAMPLES[name](ws)}```\n{m.group(4)}"

    return BLOCK.sub(block, doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if an example differs")
    args = ap.parse_args()
    stale = []
    with tempfile.TemporaryDirectory(prefix="tokmix-docs-") as tmp:
        ws = Workspace(Path(tmp))
        for path in DOCS:
            text = path.read_text(encoding="utf-8")
            new = render(text, ws)
            if new != text:
                stale.append(path.relative_to(REPO).as_posix())
                if not args.check:
                    path.write_text(new, encoding="utf-8")
    if args.check and stale:
        sys.exit(f"examples out of date in {', '.join(stale)}: run python scripts/docs_examples.py")
    print(f"{'stale' if stale else 'up to date'}: {', '.join(stale) or 'every example'}")


if __name__ == "__main__":
    main()
