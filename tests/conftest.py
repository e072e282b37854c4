"""Shared fixtures: one real finished run per session, which tests copy before changing anything. And no
silent gaps: under CI=true a skipped test fails the run unless its reason is on the allow-list below."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.corpus import make_inputs

# What CI may skip: only what its test command does not install or lay beside the clone. The default torch
# wheel is several GB, so torch (and megatron-core, which needs it) is not in the test extras; a bare clone has
# no reference script beside it (the golden conformance tests still run). Everything else a test needs (Ray
# included) is installed by the test command, and must run.
ALLOWED_SKIPS = ("torch is not installed", "megatron-core is not installed",
                 "the reference script is not beside this clone")


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A real run of the test corpus (decontamination on), finished and validated, its intermediates kept:
    root/out under a root that holds its corpus, split file, tokenizer and recipe. Read-only: copy it before
    changing anything."""
    import tokmix

    root = tmp_path_factory.mktemp("finished-run")
    recipe = make_inputs(root, doc_limit=400, rows_per_group=16, decontaminate=True)
    tokmix.run(tokmix.load_recipe(recipe), root / "out", workers=1, keep_streams=True)
    return root / "out"


def _skip_reason(report: pytest.TestReport) -> str:
    _, _, reason = report.longrepr if isinstance(report.longrepr, tuple) else ("", 0, str(report.longrepr))
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if not any(allowed in reason for allowed in ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, and its reason is not on tests/conftest.py's ALLOWED_SKIPS: " \
                          f"{reason}"
