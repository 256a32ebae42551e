"""The hook's --help: every subcommand listed with a whole sentence, the exit codes once."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hooks.storage_profile.cli import main

COMMANDS = ("plan", "release", "status", "switch")


def test_top_level_help_lists_every_subcommand_without_cutting_a_sentence() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    listed = result.output[result.output.index("Commands:") :].splitlines()[1:]
    rows = {line.split()[0]: line.split(None, 1)[1] for line in listed if line.startswith("  ")}
    assert set(COMMANDS) <= set(rows), rows
    for name in COMMANDS:
        assert rows[name].endswith(".") and not rows[name].endswith("..."), rows[name]


@pytest.mark.parametrize("args", [[], *([c] for c in COMMANDS)])
def test_the_exit_code_table_is_printed_once(args: list[str]) -> None:
    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.count("Exit codes:") == 1, result.output
