"""The hook's --help: every subcommand listed with a whole sentence, every option with help
text, the exit codes once, and the same table in the docs."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from hooks.storage_profile.cli import main
from tests.hooks.helpers import run_hook

ROOT = Path(__file__).resolve().parents[2]

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


def test_help_documents_exit_codes():
    result = run_hook("switch", "--help")
    assert result.exit_code == 0
    for line in (
        "0  settled",
        "2  bad arguments",
        "3  preflight refused",
        "4  infeasible",
        "5  deadline",
    ):
        assert line in result.stdout


def test_docs_list_every_exit_code_of_the_one_table():
    from hooks.storage_profile.errors import EXIT_CODES

    docs = (ROOT / "docs" / "storage-profile.md").read_text()
    table = docs.split("### Exit codes", 1)[1].split("###", 1)[0]
    documented = {int(code) for code in re.findall(r"^\| (\d) \|", table, re.MULTILINE)}
    assert documented == set(EXIT_CODES)
    help_text = run_hook("status", "--help").stdout
    for code in EXIT_CODES:
        assert f"\n    {code}  " in help_text


def test_every_option_has_help_text():
    from hooks.storage_profile.cli import main

    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"{name} {param.opts}"
