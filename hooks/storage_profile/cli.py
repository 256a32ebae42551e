"""Command line: ``python -m hooks.storage_profile switch|status``."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from hooks.storage_profile import errors
from hooks.storage_profile.config import (
    BACKENDS,
    INFEASIBLE_ACTIONS,
    SETTLE_MODES,
    Backoff,
    SwitchConfig,
)
from hooks.storage_profile.errors import HookError
from hooks.storage_profile.kube import Kube, load_api_client
from hooks.storage_profile.local import SandboxProfiles, status_local, switch_local
from hooks.storage_profile.report import Report
from hooks.storage_profile.status import claim_status, render_status
from hooks.storage_profile.switch import default_provider, switch_kubernetes

EXIT_CODES_HELP = """\b
Exit codes:
  0  settled (including "already on that class"), or a dry run passed preflight
  1  unexpected error (unknown modify status, claim deleted or changed by others, …)
  2  bad arguments
  3  preflight refused (claim or class missing, claim not bound, driver mismatch,
     provider rate limit, API server refused the patch) — nothing was changed
  4  infeasible (Infeasible status, Pending beyond --pending-grace, provider failed)
  5  deadline (--timeout) passed
"""

OUTCOMES = {
    errors.EXIT_PREFLIGHT: "refused",
    errors.EXIT_INFEASIBLE: "infeasible",
    errors.EXIT_DEADLINE: "deadline",
    errors.EXIT_UNEXPECTED: "error",
}

# Seams for tests: retry schedule, provider lookup, longest single watch.
BACKOFF = Backoff()
PROVIDER_FOR = default_provider
WATCH_TIMEOUT = 300.0


def _echo(message: str) -> None:
    click.echo(message, err=True)


@click.group(epilog=EXIT_CODES_HELP)
@click.option("-v", "--verbose", is_flag=True, help="Log retries and re-lists.")
def main(verbose: bool) -> None:
    """Switch a claim's VolumeAttributesClass and wait until it really settled."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


def _common(fn):
    options = [
        click.option("--namespace", "-n", required=True, help="The claim's namespace."),
        click.option("--claim", required=True, help="The PersistentVolumeClaim's name."),
        click.option(
            "--kubeconfig",
            type=click.Path(exists=True, dir_okay=False),
            help="Else in-cluster config, else the default kubeconfig.",
        ),
        click.option(
            "--backend",
            type=click.Choice(BACKENDS),
            default="kubernetes",
            show_default=True,
            help="local: the embedded sandbox, no Kubernetes.",
        ),
        click.option(
            "--profiles-file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Sandbox profiles (default: connections/sandbox-profiles.yaml "
            "under $SANDBOX_ROOT or the working directory).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@main.command(epilog=EXIT_CODES_HELP)
@_common
@click.option("--to", "target", required=True, help="The VolumeAttributesClass (or profile).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=1800.0,
    show_default=True,
    help="Overall deadline in seconds.",
)
@click.option(
    "--pending-grace",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="Seconds a Pending modify status may last.",
)
@click.option(
    "--settle",
    type=click.Choice(SETTLE_MODES),
    default="provider",
    show_default=True,
    help="provider: also wait for the cloud (EBS optimizing).",
)
@click.option(
    "--on-infeasible",
    type=click.Choice(INFEASIBLE_ACTIONS),
    default="fail",
    show_default=True,
    help="rollback: switch back to the previous class, wait, still exit 4.",
)
@click.option("--dry-run", is_flag=True, help="Preflight and print the patch; change nothing.")
@click.option("--force", is_flag=True, help="Switch even past the provider's rate limit.")
@click.option(
    "--summary-json", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here."
)
def switch(
    namespace: str,
    claim: str,
    kubeconfig: str | None,
    backend: str,
    profiles_file: Path | None,
    target: str,
    timeout: float,
    pending_grace: float,
    settle: str,
    on_infeasible: str,
    dry_run: bool,
    force: bool,
    summary_json: Path | None,
) -> None:
    """Preflight, patch spec.volumeAttributesClassName, wait until settled, report."""
    try:
        cfg = SwitchConfig(
            namespace=namespace,
            claim=claim,
            target=target,
            timeout=timeout,
            pending_grace=pending_grace,
            settle=settle,
            on_infeasible=on_infeasible,
            dry_run=dry_run,
            force=force,
            backoff=BACKOFF,
            watch_timeout=WATCH_TIMEOUT,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    report = Report(
        backend=backend,
        namespace=namespace,
        claim=claim,
        target_class=target,
        settle=settle if backend == "kubernetes" else "local",
        dry_run=dry_run,
    )
    code = errors.EXIT_OK
    try:
        if backend == "local":
            switch_local(cfg, SandboxProfiles.load(profiles_file), report, echo=_echo)
        else:
            kube = Kube(load_api_client(kubeconfig), BACKOFF)
            switch_kubernetes(cfg, kube, report, provider_for=PROVIDER_FOR, echo=_echo)
    except HookError as exc:
        code = exc.exit_code
        report.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - the contract: anything else exits 1
        code = errors.EXIT_UNEXPECTED
        report.error = f"unexpected {type(exc).__name__}: {exc}"
        logging.getLogger(__name__).debug("unexpected error", exc_info=True)
    if code:
        report.outcome = "rolled-back" if report.rolled_back else OUTCOMES.get(code, "error")
    report.exit_code = code
    click.echo(report.render())
    if summary_json:
        report.write_json(summary_json)
    if not dry_run:
        report.log_to_polyaxon(summary_json)
    if report.error:
        _echo(f"error: {report.error}")
    sys.exit(code)


@main.command(epilog=EXIT_CODES_HELP)
@_common
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the block.")
def status(
    namespace: str,
    claim: str,
    kubeconfig: str | None,
    backend: str,
    profiles_file: Path | None,
    as_json: bool,
) -> None:
    """Desired and current class, modify status, conditions and recent events of a claim."""
    try:
        if backend == "local":
            sandbox = SandboxProfiles.load(profiles_file)
            sandbox.check_claim(namespace, claim)
            data = status_local(sandbox)
        else:
            data = claim_status(Kube(load_api_client(kubeconfig), BACKOFF), namespace, claim)
    except HookError as exc:
        _echo(f"error: {exc}")
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001
        _echo(f"error: unexpected {type(exc).__name__}: {exc}")
        sys.exit(errors.EXIT_UNEXPECTED)
    click.echo(json.dumps(data, indent=2, sort_keys=True) if as_json else render_status(data))


# The modification plan (issue 17) is a module of its own; registered here so that
# `python -m hooks.storage_profile plan` finds it.
from hooks.storage_profile.plan import plan_command  # noqa: E402

main.add_command(plan_command)
