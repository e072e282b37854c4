"""Line counts per module, the longest functions, the import graph between tokmix's modules, the raw reads of
index.json's keys outside its records module and the storage checks outside the store module: the before/after
figures of a refactor (issues 16, 26). Run from the repository root (or `--root DIR`, e.g. a `git worktree` of
an older commit): `python scripts/code_figures.py [N] [--root DIR]`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

RECORDS_MODULES = {"tokmix/format/records.py", "tokmix/manifest.py"}  # where index.json's keys may be read
STORE_MODULES = {"tokmix/store.py"}
INDEX_NAMES = {"index", "idx"}  # the names a raw dict of index.json goes by in tokmix's code


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(files: list[Path], root: Path) -> tuple[set[str], set[tuple[str, str]]]:
    """tokmix's modules and the arrows between them (a module -> a tokmix module it imports, at any depth)."""
    names = {module_name(p, root) for p in files}
    arrows = set()
    for path in files:
        here = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text())):
            found = []
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            arrows |= {(here, f) for f in found if f in names and f != here and f != "tokmix"}
    return names, arrows


def is_index(node: ast.AST) -> bool:
    """`index`, `idx`, `x.index`: what holds a raw dict of index.json."""
    return (isinstance(node, ast.Name) and node.id in INDEX_NAMES) or \
        (isinstance(node, ast.Attribute) and node.attr in INDEX_NAMES)


def raw_index_reads(path: Path) -> int:
    """`index[...]` and `index.get(...)` of a raw index.json dict (its top-level keys)."""
    count = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and is_index(node.value) and isinstance(node.ctx, ast.Load):
            count += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and is_index(node.func.value):
            count += 1
    return count


def storage_checks(path: Path) -> tuple[int, int]:
    """`isinstance(..., ObjectPath)` (alone or in a tuple), and reads of a `.remote` flag: local or store
    decided again."""
    checks = flags = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2 and "ObjectPath" in ast.unparse(node.args[1]):
            checks += 1
        elif isinstance(node, ast.Attribute) and node.attr == "remote" and isinstance(node.ctx, ast.Load):
            flags += 1
    return checks, flags


def main(top: int = 15, root: Path = Path(".")) -> None:
    files = sorted((root / "tokmix").rglob("*.py"))
    rel = {p: p.relative_to(root).as_posix() for p in files}
    total = 0
    print("lines  module")
    for path in files:
        lines = len(path.read_text().splitlines())
        total += lines
        print(f"{lines:5d}  {rel[path]}")
    print(f"{total:5d}  total ({len(files)} files)")
    functions = []
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                functions.append((length, f"{rel[path]}:{node.lineno} {node.name}"))
    functions.sort(key=lambda item: (-item[0], item[1]))
    print(f"\nthe {top} longest functions (lines, decorators excluded)")
    for length, where in functions[:top]:
        print(f"{length:5d}  {where}")

    modules, arrows = import_graph(files, root)
    print(f"\nimport graph: {len(modules)} modules, {len(arrows)} arrows")
    for a, b in [("tokmix.pipeline", "tokmix.runner")]:
        print(f"  {a} -> {b}: {'yes' if (a, b) in arrows else 'no'}")
    importers: dict[str, int] = {}
    for _, b in arrows:
        importers[b] = importers.get(b, 0) + 1
    print("  most imported: " + ", ".join(f"{m} ({n})" for m, n in sorted(importers.items(), key=lambda i: -i[1])[:5]))

    reads = {rel[p]: raw_index_reads(p) for p in files if rel[p] not in RECORDS_MODULES}
    reads = {m: n for m, n in reads.items() if n}
    print(f"\nraw index.json key reads outside the records module: {sum(reads.values())}")
    for m, n in sorted(reads.items(), key=lambda i: -i[1]):
        print(f"{n:5d}  {m}")
    checks = {rel[p]: storage_checks(p) for p in files if rel[p] not in STORE_MODULES}
    checks = {m: n for m, n in checks.items() if any(n)}
    print(f"\nisinstance(..., ObjectPath) outside the store module: {sum(n[0] for n in checks.values())}, "
          f".remote reads: {sum(n[1] for n in checks.values())}")
    for m, n in sorted(checks.items(), key=lambda i: -sum(i[1])):
        print(f"{n[0]:5d} {n[1]:5d}  {m}")

if __name__ == "__main__":
    args = sys.argv[1:]
    where = Path(".")
    if "--root" in args:
        i = args.index("--root")
        where = Path(args[i + 1])
        del args[i : i + 2]
    main(int(args[0]) if args else 15, where)
