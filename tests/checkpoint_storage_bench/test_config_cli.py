"""checkpoint_storage_bench.config_cli: a command's options generated from a settings
dataclass (the trainer's, the data workloads', the hook's and the fio sweep's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from checkpoint_storage_bench.config_cli import Output, cli, config_options, output_option


@dataclass(kw_only=True)
class Settings:
    name: str = field(metadata=cli(flag=("--name", "-N")))
    """Who."""

    force: bool = field(default=False, metadata=cli(flag="--force"))
    """Go ahead anyway."""

    track: bool = True
    """Record the run."""

    who: str | None = field(default=None, metadata=cli(envvar="SETTINGS_WHO", show_envvar=False))
    """Taken from $SETTINGS_WHO when not given."""

    limit: float | None = field(default=None, metadata=cli(help_values=lambda: {"n": 42}))
    """At most this [default: {n}]."""

    seam: Path = field(default=Path("x"), metadata=cli(option=False))
    """Set by the program."""


@click.command()
@config_options(Settings)
def show(**settings: object) -> None:
    click.echo(repr(sorted(Settings(**settings).__dict__.items())))  # type: ignore[arg-type]


def _help() -> str:
    result = CliRunner().invoke(show, ["--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def test_an_option_may_have_several_spellings() -> None:
    run = CliRunner().invoke
    assert "('name', 'a')" in run(show, ["-N", "a"]).output
    assert "('name', 'b')" in run(show, ["--name", "b"]).output
    assert "-N, --name TEXT" in _help()


def test_a_bool_declared_without_an_off_spelling_is_a_switch_without_a_value() -> None:
    run = CliRunner().invoke
    assert "('force', True)" in run(show, ["-N", "a", "--force"]).output
    assert "('force', False)" in run(show, ["-N", "a"]).output
    assert run(show, ["-N", "a", "--force", "yes"]).exit_code == 2
    assert "--no-force" not in _help()
    assert "--track / --no-track" in _help()


def test_a_setting_the_program_fills_in_is_no_option() -> None:
    assert "--seam" not in _help()
    assert "('seam', PosixPath('x'))" in CliRunner().invoke(show, ["-N", "a"]).output


def test_an_environment_variable_named_by_the_help_text_is_not_listed_twice() -> None:
    assert "env var" not in _help()
    output = CliRunner().invoke(show, ["-N", "a"], env={"SETTINGS_WHO": "me"}).output
    assert "('who', 'me')" in output


def test_a_help_text_quotes_values_declared_elsewhere() -> None:
    assert "At most this [default: 42]." in _help()


def test_output_is_a_setting_that_a_command_takes_as_a_base() -> None:
    @dataclass(kw_only=True)
    class Shown(Output):
        claim: str
        """The claim."""

    @click.command()
    @config_options(Shown)
    def status(**settings: object) -> None:
        click.echo("json" if Shown(**settings).as_json else "text")  # type: ignore[arg-type]

    run = CliRunner().invoke
    assert run(status, ["--claim", "c"]).output == "text\n"
    assert run(status, ["--claim", "c", "-o", "json"]).output == "json\n"
    assert run(status, ["--claim", "c", "--output", "yaml"]).exit_code == 2


def test_a_field_without_a_docstring_is_refused() -> None:
    @dataclass
    class Undocumented:
        silent: int = 1

    with pytest.raises(TypeError, match="Undocumented.silent has no docstring"):
        config_options(Undocumented)(lambda **_: None)


def test_commands_that_print_a_state_take_output_text_or_json() -> None:
    @click.command()
    @output_option
    def show(as_json: bool) -> None:
        click.echo("json" if as_json else "text")

    run = CliRunner().invoke
    assert [run(show, a).output for a in ([], ["-o", "json"], ["--output", "text"])] == [
        "text\n",
        "json\n",
        "text\n",
    ]
    # --json names a file to write on every CLI: here it is no option at all.
    assert run(show, ["--json"]).exit_code == 2
    assert run(show, ["-o", "yaml"]).exit_code == 2


def test_a_field_may_be_a_positional_argument_given_any_number_of_times() -> None:
    @dataclass(kw_only=True)
    class Build:
        names: tuple[str, ...] = field(
            default=(),
            metadata=cli(argument=True, multiple=True, click_type=str, metavar="NAME..."),
        )
        """Only these."""

        force: bool = field(default=False, metadata=cli(flag="--force"))
        """Go ahead anyway."""

    @click.command()
    @config_options(Build)
    def build(**settings: object) -> None:
        click.echo(repr(Build(**settings).names))  # type: ignore[arg-type]

    run = CliRunner().invoke
    assert run(build, []).output == "()\n"
    assert run(build, ["a", "--force", "b"]).output == "('a', 'b')\n"
    usage = run(build, ["--help"]).output
    assert "Usage: build [OPTIONS] NAME..." in usage and "--names" not in usage
