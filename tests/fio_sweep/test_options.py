"""``python -m fio_sweep``'s options: generated from fio_sweep.config.Config, so each default
and help text is declared once, under the names the sweep always took."""

from __future__ import annotations

from dataclasses import MISSING, fields

import click
from click.testing import CliRunner

from fio_sweep.cli import main
from fio_sweep.config import Config
from fio_sweep.spec import MAX_WRITERS, WRITERS_CASE, shipped_specs

OPTIONS = [
    "--mount", "--target", "--spec", "--size-scale", "--runtime", "--writers",
    "--reference-dir", "--summary-json", "--allow-raw-device", "--track", "--no-track",
]  # fmt: skip


def _options() -> list[click.Option]:
    return [p for p in main.params if isinstance(p, click.Option) and p.name != "help"]


def test_the_sweep_takes_its_options_in_their_order() -> None:
    assert [o for p in _options() for o in (*p.opts, *p.secondary_opts)] == OPTIONS


def test_every_option_is_a_config_field_with_its_default() -> None:
    settings = {f.name: f for f in fields(Config)}
    assert [p.name for p in _options()] == list(settings)
    for option in _options():
        assert option.required == (settings[option.name].default is MISSING)
        if not option.required:
            assert option.default == settings[option.name].default, option.name


def test_help_names_the_shipped_specs_and_the_writers_case() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    assert f"a shipped name ({', '.join(sorted(shipped_specs()))})" in result.output
    assert f"Add the case {WRITERS_CASE!r}: N parallel" in result.output
    assert f"[1<=x<={MAX_WRITERS}]" in result.output


def test_allow_raw_device_is_a_switch_without_a_value() -> None:
    (raw,) = [o for o in _options() if o.name == "allow_raw_device"]
    assert raw.is_flag and not raw.secondary_opts
