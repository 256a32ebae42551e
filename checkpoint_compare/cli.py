"""``python -m checkpoint_compare``: parse the arguments into a
:class:`~checkpoint_compare.config.CompareConfig`, then :func:`checkpoint_compare.commands.run`.

Errors are :class:`~checkpoint_compare.errors.CompareError`\\ s carrying their exit code;
click prints them and exits with it.
"""

from __future__ import annotations

import logging
from typing import Any

import click

from checkpoint_compare import commands
from checkpoint_compare.config import SECTIONS, from_options
from checkpoint_compare.errors import EXIT_CODES
from checkpoint_storage_bench.config_cli import config_options
from checkpoint_storage_bench.errors import exit_codes_help


def _options(fn: Any) -> Any:
    """Every section's options, in the order of the sections."""
    for _, section in reversed(SECTIONS):
        fn = config_options(section)(fn)
    return fn


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=exit_codes_help(EXIT_CODES),
)
@_options
def main(**options: Any) -> None:
    """Compare the training (or data-workload) runs of storage profiles and say which one to
    keep."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    commands.run(from_options(options))
