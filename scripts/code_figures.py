"""Line counts per module and the longest functions of tokmix/: the before/after
figures of a refactor (issue 16). Run from the repository root:
`python scripts/code_figures.py [N]`."""

import ast
import sys
from pathlib import Path


def main(top: int = 15) -> None:
    files = sorted(Path("tokmix").rglob("*.py"))
    total = 0
    print("lines  module")
    for path in files:
        lines = len(path.read_text().splitlines())
        total += lines
        print(f"{lines:5d}  {path}")
    print(f"{total:5d}  total ({len(files)} files)")
    functions = []
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                functions.append((length, f"{path}:{node.lineno} {node.name}"))
    functions.sort(key=lambda item: (-item[0], item[1]))
    print(f"\nthe {top} longest functions (lines, decorators excluded)")
    for length, where in functions[:top]:
        print(f"{length:5d}  {where}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
