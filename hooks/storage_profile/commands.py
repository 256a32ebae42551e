"""What each subcommand does once ``cli.py`` parsed its options into a config.

Failures are raised as the hook's errors (each carries its exit code); click maps them to
the exit. ``switch`` first prints and writes its report, failed or not.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import click

from checkpoint_storage_bench.retry import Deadline
from hooks.storage_profile import plan as planning
from hooks.storage_profile.config import (
    LEASE_DURATION,
    PlanConfig,
    ReleaseConfig,
    RenewConfig,
    StatusConfig,
    SwitchConfig,
)
from hooks.storage_profile.errors import EXIT_OK, OUTCOMES, PlanRefused, as_hook_error
from hooks.storage_profile.heartbeat import BeatingDeadline
from hooks.storage_profile.kube import Kube, load_api_client
from hooks.storage_profile.lease import ClaimLease, default_holder, refuse_after_failure
from hooks.storage_profile.local import SandboxProfiles, render_local, status_local, switch_local
from hooks.storage_profile.report import Report
from hooks.storage_profile.status import claim_status, render_status
from hooks.storage_profile.switch import ProviderFactory, default_provider, switch_kubernetes

log = logging.getLogger(__name__)


def progress(message: str) -> None:
    """Progress lines go to stderr; stdout carries the report (or the status)."""
    click.echo(message, err=True)


def connect(
    cfg: SwitchConfig | ReleaseConfig | StatusConfig | PlanConfig, deadline: Deadline
) -> Kube:
    """The subcommand's access to the API server, its configuration loaded by ``deadline``
    (a kubeconfig's ``exec`` credential plugin runs then)."""
    return Kube(load_api_client(cfg.kubeconfig, deadline), cfg.backoff)


def run_switch(
    cfg: SwitchConfig,
    provider_for: ProviderFactory = default_provider,
    echo: Callable[[str], None] = progress,
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
        settle=cfg.settle if cfg.backend == "kubernetes" else "local",
        dry_run=cfg.dry_run,
    )
    failure = None
    try:
        if cfg.backend == "local":
            if cfg.only_if_switched and cfg.holder is None:
                cfg.holder = default_holder()
            if cfg.stop_after_failure:
                refuse_after_failure()
            switch_local(cfg, SandboxProfiles.load(cfg.profiles_file), report, echo=echo)
        else:
            # The deadline starts first: finding the holder and loading the configuration
            # (an exec credential plugin) are waits of this switch too.
            assert cfg.timeout is not None
            deadline = BeatingDeadline(cfg.timeout)
            if cfg.holder is None:
                cfg.holder = default_holder(deadline=deadline)
            if cfg.stop_after_failure:
                refuse_after_failure(deadline=deadline)
            kube = connect(cfg, deadline)
            switch_kubernetes(
                cfg, kube, report, provider_for=provider_for, echo=echo, deadline=deadline
            )
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


def run_release(cfg: ReleaseConfig) -> str:
    """Give up the claim's Lease held by ``cfg.holder``; print what was done.

    Raises:
        PreflightRefused: Another holder's Lease is fresh, or RBAC forbids it.
    """
    return _on_lease(cfg, "release", ClaimLease.release)


def run_renew(cfg: RenewConfig) -> str:
    """Extend the claim's Lease held by ``cfg.holder`` by ``cfg.lease_duration``; print
    what was done.

    Raises:
        PreflightRefused: The Lease is not (or no longer) held by ``cfg.holder``, or RBAC
            forbids it.
    """
    return _on_lease(cfg, "renew", ClaimLease.renew, cfg.lease_duration)


def _on_lease(
    cfg: ReleaseConfig,
    verb: str,
    act: Callable[[ClaimLease, Deadline], str],
    duration: float = LEASE_DURATION,
) -> str:
    """Do ``act`` to the claim's Lease as ``cfg.holder`` (else the default holder) and
    print its note; the local backend has no Lease."""
    if cfg.backend == "local":
        note = f"local backend: the sandbox has no Lease; nothing to {verb}"
    else:
        deadline = Deadline(cfg.timeout)
        holder = cfg.holder or default_holder(deadline=deadline)
        kube = connect(cfg, deadline)
        note = act(ClaimLease(kube, cfg.namespace, cfg.claim, holder, duration), deadline)
    click.echo(note)
    return note


def run_status(cfg: StatusConfig) -> dict:
    """Print a claim's class state (or the sandbox's) as a block or as JSON."""
    if cfg.backend == "local":
        sandbox = SandboxProfiles.load(cfg.profiles_file)
        sandbox.check_claim(cfg.namespace, cfg.claim)
        data, render = status_local(sandbox), render_local
    else:
        deadline = Deadline(cfg.timeout)
        kube = connect(cfg, deadline)
        data, render = claim_status(kube, cfg.namespace, cfg.claim, deadline), render_status
    click.echo(json.dumps(data, indent=2, sort_keys=True) if cfg.as_json else render(data))
    return data


def run_plan(cfg: PlanConfig) -> planning.ModificationPlan:
    """Judge the run's modifications against the provider's window; print the plan, write it
    (``--summary-json``) and log it to Polyaxon, then refuse if it does not fit now.

    Raises:
        PlanRefused: The plan does not fit now (or never in one run), or cannot start on its
            first profile; nothing was changed.
    """
    now = planning.NOW()
    if cfg.backend == "local":
        sandbox = SandboxProfiles.load(cfg.profiles_file)
        plan = planning.plan_local(
            sandbox, cfg.namespace, cfg.claim, cfg.profiles, cfg.return_to_first, now,
            cfg.restore_to,
        )  # fmt: skip
    else:
        deadline = Deadline(cfg.timeout)
        kube = connect(cfg, deadline)
        plan = planning.plan_kubernetes(
            kube, cfg.namespace, cfg.claim, cfg.profiles, cfg.return_to_first, now, deadline,
            cfg.restore_to,
        )  # fmt: skip
    click.echo(plan.render())
    if cfg.summary_json is not None:
        cfg.summary_json.parent.mkdir(parents=True, exist_ok=True)
        cfg.summary_json.write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    plan.log_to_polyaxon()
    reason = plan.refusal()
    if reason is not None:
        raise PlanRefused(reason)
    return plan
