#!/usr/bin/env bash
# Install tokmix into .venv (created if missing) and run the demo end to end on this machine's own files.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[fast]"
.venv/bin/tokmix demo --out "${1:-tokmix-demo}"
