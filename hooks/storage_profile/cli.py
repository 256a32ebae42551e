"""Command line: ``python -m hooks.storage_profile switch|renew|release|status|plan``.

Each subcommand's options are generated from its settings dataclass (``config.py``: name,
type, default and help text declared there once), parsed into it, then run
(``commands.py``). Every failure leaves as one of the hook's errors, which click maps to the
exit code its class carries (:data:`errors.EXIT_CODES`, also the ``--help`` epilog).
"""

from __future__ import annotations

import logging
from typing import Any

import click

from checkpoint_storage_bench.config_cli import config_options
from checkpoint_storage_bench.errors import BenchError, exit_codes_help
from checkpoint_storage_bench.retry import Backoff
from hooks.storage_profile import commands, config
from hooks.storage_profile.backends import Backend, make_backend
from hooks.storage_profile.config import (
    PlanConfig,
    ReleaseConfig,
    RenewConfig,
    StatusConfig,
    SwitchConfig,
)
from hooks.storage_profile.errors import EXIT_CODES, as_hook_error
from hooks.storage_profile.switch import default_provider

EPILOG = exit_codes_help(EXIT_CODES)

# The top-level --help lists each subcommand with this: a whole sentence, where click would
# cut the docstring's first sentence at its width.
SHORT_HELP = {
    "plan": "Check that the provider's window allows the run's switches now.",
    "release": "Release the claim's Lease (only its holder can).",
    "renew": "Extend the claim's Lease while this holder still holds it.",
    "status": "Show a claim's class, modify status, conditions and events.",
    "switch": "Switch the claim's class and wait until it really settled.",
}


# Seams for tests: retry schedule, provider lookup, longest single watch, heartbeat.
BACKOFF = Backoff()
PROVIDER_FOR = default_provider
WATCH_TIMEOUT = config.WATCH_TIMEOUT
HEARTBEAT = config.HEARTBEAT_INTERVAL


def setup_logging(verbose: bool) -> None:
    """The one place logging is configured: warnings by default, retries with ``-v``."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


class HookGroup(click.Group):
    """Maps every failure of a subcommand to its exit, in one place.

    The hook's errors and click's own pass through (click shows them and exits with their
    code); anything else becomes an "unexpected" error (exit 1) instead of a traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BenchError as exc:
            as_hook_error(exc)  # the same error, shown under this CLI's name
            raise
        except (click.exceptions.Exit, click.Abort, click.ClickException):
            raise
        except Exception as exc:
            logging.getLogger(__name__).debug("unexpected error", exc_info=True)
            raise as_hook_error(exc) from exc


def backend_of(cfg: config.Target) -> Backend:
    """The one choice of where the command acts, from ``--backend``."""
    return make_backend(cfg.backend, provider_for=PROVIDER_FOR)


def config_or_usage_error(make: Any, **kwargs: Any) -> Any:
    """Build a config; its validation errors are usage errors (exit 2)."""
    try:
        return make(**kwargs)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


@click.group(cls=HookGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log retries and re-lists.")
def main(verbose: bool) -> None:
    """Switch a claim's VolumeAttributesClass and wait until it really settled."""
    setup_logging(verbose)


@main.command(epilog=EPILOG, short_help=SHORT_HELP["switch"])
@config_options(SwitchConfig)
def switch(**options: Any) -> None:
    """Preflight, take the claim's Lease, patch spec.volumeAttributesClassName (and the
    claim's ledger of switches), wait until settled, report."""
    cfg = config_or_usage_error(
        SwitchConfig,
        backoff=BACKOFF,
        watch_timeout=WATCH_TIMEOUT,
        heartbeat=HEARTBEAT,
        **options,
    )
    commands.run_switch(cfg, backend_of(cfg))


@main.command(epilog=EPILOG, short_help=SHORT_HELP["release"])
@config_options(ReleaseConfig)
def release(**options: Any) -> None:
    """Release the claim's Lease (the pipeline's last op): only its holder can."""
    cfg = config_or_usage_error(ReleaseConfig, backoff=BACKOFF, **options)
    commands.run_release(cfg, backend_of(cfg))


@main.command(epilog=EPILOG, short_help=SHORT_HELP["renew"])
@config_options(RenewConfig)
def renew(**options: Any) -> None:
    """Extend the claim's Lease by --lease-duration from now, only while this holder still
    holds it (a stage's op between its fio sweep and its training runs); exit 3 when the
    Lease was lost, released or taken."""
    cfg = config_or_usage_error(RenewConfig, backoff=BACKOFF, **options)
    commands.run_renew(cfg, backend_of(cfg))


@main.command(epilog=EPILOG, short_help=SHORT_HELP["status"])
@config_options(StatusConfig)
def status(**options: Any) -> None:
    """Desired and current class, modify status, conditions and recent events of a claim."""
    cfg = config_or_usage_error(StatusConfig, backoff=BACKOFF, **options)
    commands.run_status(cfg, backend_of(cfg))


@main.command(epilog=EPILOG, short_help=SHORT_HELP["plan"])
@config_options(PlanConfig)
def plan(**options: Any) -> None:
    """How many volume modifications the run over the profiles needs, and whether the
    provider's window allows them now (else exit 3 naming when); with --repeats, also what
    the verdict can answer at its confidence (a limit is a warning; settings that can answer
    nothing about the profiles are exit 2); changes nothing."""
    cfg = config_or_usage_error(PlanConfig, backoff=BACKOFF, **options)
    commands.run_plan(cfg, backend_of(cfg))
