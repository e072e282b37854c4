"""The examples in README.md and docs/*.md are what the commands print: scripts/docs_examples.py reruns them
on the golden inputs and the committed docs must equal its output (prose outside the marked blocks is free)."""

from __future__ import annotations

import subprocess
import sys

from tests.reference import REPO


def test_docs_examples_are_what_the_commands_print():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "docs_examples.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.endswith("up to date: every example\n")  # after the example run's own log lines


def test_every_marked_block_names_an_example():
    sys.path.insert(0, str(REPO / "scripts"))
    from docs_examples import BLOCK, DOCS, EXAMPLES

    used = {m.group("name") for doc in DOCS for m in BLOCK.finditer(doc.read_text(encoding="utf-8"))}
    assert used == set(EXAMPLES)
