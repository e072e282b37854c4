#!/usr/bin/env bash
# Install tokmix with its test and Ray extras into .venv (created if missing), lint, run the tests.
# Conformance is checked against the reference's recorded output (tests/golden) anywhere, and against a real
# run of the reference too where shared/reference/prepare_tokens.py lies beside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,ray]"
.venv/bin/ruff check tokmix tests bench scripts
# Bytecode of tokmix's own modules, which pip does not compile for an editable install: every process a run
# starts imports them, and where PYTHONDONTWRITEBYTECODE is set each would compile them from source again.
.venv/bin/python -m compileall -q tokmix tests >/dev/null
# Two pytest-xdist workers: the suite keeps both cores of a 2-core machine busy (its tests wait on processes
# they start); tests/conftest.py gives each worker whole modules, heaviest first. `-n 0` runs in one process.
.venv/bin/python -m pytest -q -n 2 "$@"
