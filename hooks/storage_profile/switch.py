"""``switch`` on Kubernetes: preflight, one patch, wait for Kubernetes, then the provider."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from kubernetes.client.rest import ApiException

from hooks.storage_profile.config import Deadline, SwitchConfig
from hooks.storage_profile.errors import HookError, Infeasible, PreflightRefused
from hooks.storage_profile.kube import Kube, api_message
from hooks.storage_profile.preflight import Plan, preflight
from hooks.storage_profile.providers import PROVIDERS, Provider
from hooks.storage_profile.report import Report, now_iso
from hooks.storage_profile.wait import ClaimClassState, ClaimWaiter

log = logging.getLogger(__name__)

ProviderFactory = Callable[[str, dict], Provider | None]


def default_provider(driver: str, pv: dict) -> Provider | None:
    factory = PROVIDERS.get(driver)
    return factory(pv) if factory else None


def switch_kubernetes(
    cfg: SwitchConfig,
    kube: Kube,
    report: Report,
    provider_for: ProviderFactory = default_provider,
    echo: Callable[[str], None] = print,
) -> Report:
    """Switch the claim's class and wait until it settled; fill ``report`` on the way.

    Raises:
        HookError: Any refusal or failure, with its exit code; ``report`` holds what was
            known until then.
    """
    deadline = Deadline(cfg.timeout)
    plan = preflight(kube, cfg.namespace, cfg.claim, cfg.target, deadline)
    _describe(report, plan)

    provider = None
    if cfg.settle == "provider":
        provider = provider_for(plan.driver, plan.pv)
        if provider is None:
            report.notes.append(
                f"no provider settle for driver {plan.driver}: settled means settled in Kubernetes"
            )
        else:
            report.provider = provider.name
    if provider is not None and not plan.already_requested:
        report.warnings.extend(provider.check_rate_limit(plan.volume_handle, cfg.force))
    for warning in report.warnings:
        echo(f"warning: {warning}")

    if cfg.dry_run:
        report.outcome = "dry-run"
        verb = "would not patch (already requested)" if plan.already_requested else "would patch"
        echo(
            f"dry run: {verb} persistentvolumeclaims/{cfg.claim} -n {cfg.namespace} "
            f"--type=merge -p '{json.dumps(plan.patch)}'"
        )
        return report

    report.requested_at = now_iso()
    if plan.already_requested:
        report.notes.append(f"claim already asks for {cfg.target}; not patched")
    else:
        _patch(kube, cfg, cfg.target, deadline)
        report.patched = True

    def warn(message: str) -> None:
        report.warnings.append(message)
        echo(f"warning: {message}")

    waiter = ClaimWaiter(
        kube,
        cfg.namespace,
        cfg.claim,
        deadline,
        cfg.pending_grace,
        cfg.watch_timeout,
        warn=warn,
        uid=plan.claim["metadata"].get("uid"),
        stale=ClaimClassState.of(plan.claim) if report.patched else None,
    )
    try:
        waiter.wait(cfg.target)
    except Infeasible:
        if cfg.on_infeasible == "rollback" and report.patched:
            _rollback(kube, cfg, plan, waiter, report, echo)
        raise
    report.k8s_settled_at = now_iso()
    report.applied_class = cfg.target
    report.outcome = "settled" if report.patched else "already-settled"
    echo(f"claim {cfg.namespace}/{cfg.claim} settled on {cfg.target} in Kubernetes")

    if provider is not None:
        note = provider.wait_settled(plan.volume_handle, deadline, target_class=plan.target_class)
        report.provider_settled_at = now_iso()
        report.notes.append(note)
        echo(note)
    return report


def _describe(report: Report, plan: Plan) -> None:
    report.claim_uid = plan.claim["metadata"].get("uid")
    report.pv = plan.pv["metadata"]["name"]
    report.volume_handle = plan.volume_handle
    report.driver = plan.driver
    report.previous_class = plan.previous_class
    report.applied_class = (plan.claim.get("status") or {}).get("currentVolumeAttributesClassName")
    report.class_parameters = dict(plan.target_class.get("parameters") or {})
    report.warnings.extend(plan.warnings)


def _patch(kube: Kube, cfg: SwitchConfig, target: str | None, deadline: Deadline) -> None:
    try:
        kube.patch_claim_class(cfg.namespace, cfg.claim, target, deadline)
    except ApiException as exc:
        # 403: RBAC or a per-class quota; 422: the API server's rules (e.g. an unbound
        # claim, or nil after a class was applied). Nothing changed either way.
        if exc.status in (403, 404, 409, 422):
            raise PreflightRefused(
                f"the API server refused to patch claim "
                f"{cfg.namespace}/{cfg.claim}: {api_message(exc)}"
            ) from exc
        raise HookError(
            f"patching claim {cfg.namespace}/{cfg.claim} failed: {api_message(exc)}"
        ) from exc


def _rollback(
    kube: Kube,
    cfg: SwitchConfig,
    plan: Plan,
    waiter: ClaimWaiter,
    report: Report,
    echo: Callable[[str], None],
) -> None:
    """Ask for the previous class again and wait for it; the switch still ends infeasible."""
    previous = plan.previous_class
    echo(f"rolling claim {cfg.namespace}/{cfg.claim} back to {previous}")
    try:
        if previous is not None and kube.read_class(previous, waiter.deadline) is None:
            # Same reason as in preflight: the resizer would leave the claim Pending forever.
            raise PreflightRefused(f"VolumeAttributesClass {previous} no longer exists")
        _patch(kube, cfg, previous, waiter.deadline)
        waiter.wait(previous)
    except HookError as exc:
        report.warnings.append(f"rollback to {previous} failed: {exc}")
        echo(f"warning: rollback to {previous} failed: {exc}")
        return
    report.rolled_back = True
    report.applied_class = previous
    report.notes.append(f"rolled back to {previous}")
