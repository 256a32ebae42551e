"""Command line: ``python -m hooks.storage_profile switch|renew|release|status|plan``.

Parse the options → build the config (``config.py``) → call (``commands.py``). Every
failure leaves as one of the hook's errors, which click maps to the exit code its class
carries (:data:`errors.EXIT_CODES`, also the ``--help`` epilog).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from checkpoint_storage_bench.config_cli import output_option
from checkpoint_storage_bench.errors import BenchError, exit_codes_help
from checkpoint_storage_bench.retry import Backoff
from hooks.storage_profile import commands
from hooks.storage_profile.config import (
    BACKENDS,
    DEFAULT_TIMEOUT,
    HEARTBEAT_INTERVAL,
    INFEASIBLE_ACTIONS,
    LEASE_DURATION,
    SETTLE_MODES,
    PlanConfig,
    ReleaseConfig,
    RenewConfig,
    StatusConfig,
    SwitchConfig,
    parse_profiles,
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
WATCH_TIMEOUT = 300.0
HEARTBEAT = HEARTBEAT_INTERVAL

HOLDER_HELP = (
    "Who holds the claim's Lease [default: $STORAGE_PROFILE_HOLDER, else inside a Polyaxon "
    "run its pipeline's uuid (else the run's), else user@host]."
)


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


def _shown(name: str, default: Any, help: str, type: Any = float) -> Any:
    """An option whose ``--help`` shows its default."""
    return click.option(name, type=type, default=default, show_default=True, help=help)


def _file(name: str, help: str) -> Any:
    """An option naming a file that the command writes or reads (it need not exist)."""
    return click.option(name, type=click.Path(dir_okay=False, path_type=Path), help=help)


_holder = click.option("--holder", envvar="STORAGE_PROFILE_HOLDER", help=HOLDER_HELP)


def _target_options(fn: Any) -> Any:
    options = [
        click.option("--namespace", "-n", required=True, help="The claim's namespace."),
        click.option("--claim", required=True, help="The PersistentVolumeClaim's name."),
        click.option(
            "--kubeconfig",
            type=click.Path(exists=True, dir_okay=False),
            help="Else in-cluster config, else the default kubeconfig.",
        ),
        _shown(
            "--backend",
            "kubernetes",
            "local: the embedded sandbox, no Kubernetes.",
            click.Choice(BACKENDS),
        ),
        _file(
            "--profiles-file",
            "Sandbox profiles (default: connections/sandbox-profiles.yaml under $SANDBOX_ROOT "
            "or the working directory).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _lease_duration(command: str) -> Any:
    return _shown(
        "--lease-duration", LEASE_DURATION, f"Seconds the claim's Lease lasts from this {command}."
    )


@main.command(epilog=EPILOG, short_help=SHORT_HELP["switch"])
@_target_options
@click.option("--to", "target", required=True, help="The VolumeAttributesClass (or profile).")
@click.option(
    "--timeout",
    type=float,
    help="Overall deadline in seconds (positive, finite) [default: "
    f"{DEFAULT_TIMEOUT['kubernetes']:g} with --settle kubernetes, "
    f"{DEFAULT_TIMEOUT['provider']:g} with --settle provider: an EBS volume can stay "
    "optimizing for hours].",
)
@_shown("--pending-grace", 120.0, "Seconds a Pending modify status may last.")
@_shown(
    "--settle", "provider", "provider: also wait for the cloud (EBS optimizing).",
    click.Choice(SETTLE_MODES),
)  # fmt: skip
@_shown(
    "--on-infeasible", "fail", "rollback: switch back to the previous class, wait, still exit 4.",
    click.Choice(INFEASIBLE_ACTIONS),
)  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Preflight and print the patch; change nothing.")
@click.option("--force", is_flag=True, help="Switch even past the provider's rate limit.")
@click.option(
    "--stop-after-failure",
    is_flag=True,
    help="Refuse (exit 3, nothing changed) when a run of the Polyaxon pipeline this switch "
    "runs in (its outermost run, at any depth of nesting) has failed: a pipeline's later "
    "stage does not switch the claim.",
)
@click.option(
    "--only-if-switched",
    is_flag=True,
    help="Do nothing (exit 0) unless the claim's ledger has a switch by this holder: a "
    "pipeline's restore leaves a claim it never switched alone.",
)
@_file("--summary-json", "Write the report here.")
@_holder
@_lease_duration("switch")
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
    commands.run_switch(cfg, provider_for=PROVIDER_FOR)


# renew, release, status and plan only read (or write a Lease): one short deadline for all.
_read_timeout = _shown("--timeout", 60.0, "Overall deadline in seconds for every API call.")


@main.command(epilog=EPILOG, short_help=SHORT_HELP["release"])
@_target_options
@_holder
@_read_timeout
def release(**options: Any) -> None:
    """Release the claim's Lease (the pipeline's last op): only its holder can."""
    commands.run_release(config_or_usage_error(ReleaseConfig, backoff=BACKOFF, **options))


@main.command(epilog=EPILOG, short_help=SHORT_HELP["renew"])
@_target_options
@_holder
@_lease_duration("renewal")
@_read_timeout
def renew(**options: Any) -> None:
    """Extend the claim's Lease by --lease-duration from now, only while this holder still
    holds it (a stage's op between its fio sweep and its training runs); exit 3 when the
    Lease was lost, released or taken."""
    commands.run_renew(config_or_usage_error(RenewConfig, backoff=BACKOFF, **options))


@main.command(epilog=EPILOG, short_help=SHORT_HELP["status"])
@_target_options
@output_option
@_read_timeout
def status(**options: Any) -> None:
    """Desired and current class, modify status, conditions and recent events of a claim."""
    commands.run_status(config_or_usage_error(StatusConfig, backoff=BACKOFF, **options))


def _profiles_list(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    try:
        return parse_profiles(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from exc


@main.command(epilog=EPILOG, short_help=SHORT_HELP["plan"])
@_target_options
@click.option(
    "--profiles",
    required=True,
    callback=_profiles_list,
    help="The classes (sandbox profiles) the run switches to, in order, comma-separated.",
)
@click.option(
    "--return-to-first",
    is_flag=True,
    help="The run ends with a switch back to the first profile (A…B…A, measures drift).",
)
@click.option(
    "--restore-after",
    is_flag=True,
    help="The run ends by switching the claim to --restore-class (the pipeline's restore): "
    "counted as one more modification when the claim is not already on it by then.",
)
@click.option(
    "--restore-class",
    metavar="CLASS",
    help="The class the restore switches the claim to (counted only with --restore-after).",
)
@_file("--summary-json", "Write the plan here.")
@_read_timeout
def plan(**options: Any) -> None:
    """How many volume modifications the run over the profiles needs, and whether the
    provider's window allows them now (else exit 3 naming when); changes nothing."""
    commands.run_plan(config_or_usage_error(PlanConfig, backoff=BACKOFF, **options))
