"""The walls between tokmix's modules (docs/architecture.md), read from the code's own imports: an AST scan of
every module for what it may not import, and fresh interpreters for what an import loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tokmix

PACKAGE = Path(tokmix.__file__).parent


def imports_of(path: Path) -> set[str]:
    """Every tokmix module `path` imports, at any depth of its code (lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name.split(".")[0] == "tokmix"}


def modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py")) if (PACKAGE / folder).is_dir() else [PACKAGE / f"{folder}.py"]


def breaches(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)} imports {name}" for path in modules(folder)
            for name in sorted(imports_of(path)) if name.startswith(forbidden)]


def loaded_by(statement: str) -> set[str]:
    """Top-level names of the modules a fresh interpreter holds after `statement`."""
    code = f"import sys; {statement}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def test_reading_sources_knows_no_tokenizer():
    assert breaches("sources", ("tokmix.backends", "tokmix.tokenizer", "tokmix.stages", "tokmix.pipeline")) == []


def test_importing_a_stage_loads_no_display():
    """A Ray worker imports the unit functions: the rich display and the CLI stay out of it."""
    assert {"rich", "typer"} & loaded_by("import tokmix.stages.streams, tokmix.stages.assemble") == set()
