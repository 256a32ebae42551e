"""What each subcommand does once ``cli.py`` parsed its options into a config and chose its
backend (``backends.py``: the API server or the embedded sandbox).

Failures are raised as the hook's errors (each carries its exit code); click maps them to
the exit. ``switch`` first prints and writes its report, failed or not.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import click

from hooks.storage_profile import plan as planning
from hooks.storage_profile.backends import Backend
from hooks.storage_profile.config import (
    PlanConfig,
    ReleaseConfig,
    RenewConfig,
    StatusConfig,
    SwitchConfig,
)
from hooks.storage_profile.errors import EXIT_OK, OUTCOMES, PlanRefused, as_hook_error
from hooks.storage_profile.report import Report

log = logging.getLogger(__name__)


def progress(message: str) -> None:
    """Progress lines go to stderr; stdout carries the report (or the status)."""
    click.echo(message, err=True)


def run_switch(
    cfg: SwitchConfig, backend: Backend, echo: Callable[[str], None] = progress
) -> Report:
    """Switch, then print the report, write it (``--summary-json``) and log it to Polyaxon.

    Raises:
        BenchError: The switch failed; the report was printed and written first.
    """
    report = Report(
        backend=cfg.backend,
        namespace=cfg.namespace,
        claim=cfg.claim,
        target_class=cfg.target,
        settle=backend.settle(cfg),
        dry_run=cfg.dry_run,
    )
    failure = None
    try:
        backend.switch(cfg, report, echo)
    except Exception as exc:  # noqa: BLE001 - every failure still gets its report
        failure = as_hook_error(exc)
        report.error = failure.format_message()
        log.debug("switch failed", exc_info=True)
    code = failure.exit_code if failure is not None else EXIT_OK
    if code:
        report.outcome = "rolled-back" if report.rolled_back else OUTCOMES.get(code, "error")
    report.exit_code = code
    click.echo(report.render())
    if cfg.summary_json:
        report.write_json(cfg.summary_json)
    if not cfg.dry_run:
        report.log_to_polyaxon(cfg.summary_json)
    if failure is not None:
        raise failure
    return report


def run_release(cfg: ReleaseConfig, backend: Backend) -> str:
    """Give up the claim's Lease held by ``cfg.holder`` (else the default holder); print
    what was done.

    Raises:
        PreflightRefused: Another holder's Lease is fresh, or RBAC forbids it.
    """
    note = backend.release(cfg)
    click.echo(note)
    return note


def run_renew(cfg: RenewConfig, backend: Backend) -> str:
    """Extend the claim's Lease held by ``cfg.holder`` (else the default holder) by
    ``cfg.lease_duration``; print what was done.

    Raises:
        PreflightRefused: The Lease is not (or no longer) held by ``cfg.holder``, or RBAC
            forbids it.
    """
    note = backend.renew(cfg)
    click.echo(note)
    return note


def run_status(cfg: StatusConfig, backend: Backend) -> dict:
    """Print a claim's class state (or the sandbox's) as a block or as JSON."""
    data = backend.status(cfg)
    click.echo(json.dumps(data, indent=2, sort_keys=True) if cfg.as_json else backend.render(data))
    return data


def run_plan(cfg: PlanConfig, backend: Backend) -> planning.ModificationPlan:
    """Judge the run's modifications against the provider's window (and, with ``--repeats``,
    say what the verdict can answer); print the plan, write it (``--summary-json``) and log
    it to Polyaxon, then refuse if it does not fit now. A limit on the answer is a warning:
    the run may still answer a budget.

    Raises:
        PlanRefused: The plan does not fit now (or never in one run), or cannot start on its
            first profile; nothing was changed.
    """
    plan = backend.plan(cfg, planning.NOW())
    plan.answer, plan.repeats, plan.workload = cfg.answerability(), cfg.repeats, cfg.workload
    click.echo(plan.render())
    if cfg.summary_json is not None:
        cfg.summary_json.parent.mkdir(parents=True, exist_ok=True)
        cfg.summary_json.write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    plan.log_to_polyaxon()
    reason = plan.refusal()
    if reason is not None:
        raise PlanRefused(reason)
    return plan
