"""`tokmix --help` and every command's --help show a flag as a flag: no value placeholder after it (a flag
shown as `--debug <bool>` invites `--debug true`, which fails)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from tokmix.cli import app

COMMANDS = [c.name or c.callback.__name__ for c in app.registered_commands]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_shows_flags_without_a_value(command):
    result = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    flags = re.findall(r"│[\s*]+(--[a-z-]+)(?:\s+-[a-z])?(?:\s+--no-[a-z-]+)?\s{2,}(\S+)", result.output)
    assert ("--help", "Show") in flags  # a flag's row goes on with its help text, not a type
    if command:
        assert any(flag == "--debug" and after != "<bool>" for flag, after in flags)

