"""``python -m trainer``: parse → :class:`TrainConfig` → :func:`trainer.commands.run_job`.

The options are generated from :class:`TrainConfig`'s fields (type, default, docstring), so
the config is the one place a setting is declared. Errors are
:class:`trainer.errors.TrainerError`, which click maps to their exit codes
(:data:`trainer.errors.EXIT_CODES`, listed in ``--help``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import click

from checkpoint_storage_bench.config_cli import config_options
from checkpoint_storage_bench.errors import exit_codes_help
from trainer.config import TrainConfig
from trainer.errors import EXIT_CODES
from trainer.preflight import check_before_training

F = TypeVar("F", bound=Callable[..., Any])


@click.command(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=exit_codes_help(EXIT_CODES),
)
@config_options(TrainConfig)
def main(**settings: Any) -> None:
    """Train a small transformer and time every checkpoint stage on the mounted volume."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = TrainConfig(**settings)
    check_before_training(cfg, lambda line: click.echo(line, err=True))  # before torch, tracking
    from trainer.commands import run_job  # torch is slow to import: not for --help

    try:
        run_job(cfg)
    except Exception as error:
        from trainer.distributed import exit_rank, world_env

        if world_env().world_size > 1:
            exit_rank(error)  # under torchrun: this rank's own code in torchrun's report
        raise
