#!/usr/bin/env bash
# Install tokmix with its test and fast-backend extras into .venv (created if missing), lint, run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[fast,test,report,ray]"
.venv/bin/ruff check tokmix tests bench
.venv/bin/python -m pytest -q "$@"
