#!/usr/bin/env bash
# Install tokmix into .venv (created if missing), run the demo end to end on this machine's own files (no
# network), and write its HTML report. The output goes to $1, default $TMPDIR/tokmix-demo (outside the repo).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${TMPDIR:-/tmp}/tokmix-demo}"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
# Bytecode of tokmix's own modules, which pip does not compile for an editable install: every process a run
# starts imports them, and where PYTHONDONTWRITEBYTECODE is set each would compile them from source again.
.venv/bin/python -m compileall -q tokmix >/dev/null
.venv/bin/tokmix demo --out "$out"
.venv/bin/tokmix report "$out/run"
