"""``switch`` on Kubernetes: preflight, one patch, wait for Kubernetes, then the provider."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime

from kubernetes.client.rest import ApiException

from checkpoint_storage_bench.errors import BenchError
from checkpoint_storage_bench.retry import Deadline, TemporaryError
from hooks.storage_profile.config import SwitchConfig
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
        BenchError: Any refusal or failure, with its exit code; ``report`` holds what was
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
        report.warnings.extend(provider.check_rate_limit(plan.volume_handle, cfg.force, deadline))
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
        _patch(kube, cfg, cfg.target, plan.claim, deadline)
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
        uid=plan.uid,
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
        # Only a modification this switch started is ours to judge; when nothing was
        # patched, the provider judges what is still running.
        since = datetime.fromisoformat(report.requested_at) if report.patched else None
        note = provider.wait_settled(plan.volume_handle, deadline, since)
        report.provider_settled_at = now_iso()
        report.notes.append(note)
        echo(note)
    return report


def _describe(report: Report, plan: Plan) -> None:
    report.claim_uid = plan.uid
    report.pv = plan.pv["metadata"]["name"]
    report.volume_handle = plan.volume_handle
    report.driver = plan.driver
    report.previous_class = plan.previous_class
    report.applied_class = plan.previous_class
    report.class_parameters = dict(plan.target_class.get("parameters") or {})
    report.warnings.extend(plan.warnings)


def _patch(
    kube: Kube, cfg: SwitchConfig, target: str | None, claim: dict, deadline: Deadline
) -> None:
    """Patch the class of ``claim`` as it was read: its uid and resourceVersion must match.

    Raises:
        PreflightRefused: The API server refused (nothing changed), including a claim that
            changed or was re-created since it was read (409).
    """
    meta = claim["metadata"]
    ref = f"{cfg.namespace}/{cfg.claim}"
    try:
        kube.patch_claim_class(
            cfg.namespace, cfg.claim, target, deadline, meta.get("uid"), meta.get("resourceVersion")
        )
    except ApiException as exc:
        if exc.status == 409:
            _judge_conflict(kube, cfg, target, claim, deadline, exc)
            return
        # 403: RBAC or a per-class quota; 422: the API server's rules (e.g. an unbound
        # claim, or nil after a class was applied). Nothing changed either way.
        if exc.status in (403, 404, 422):
            raise PreflightRefused(
                f"the API server refused to patch claim {ref}: {api_message(exc)}"
            ) from exc
        raise HookError(f"patching claim {ref} failed: {api_message(exc)}") from exc


def _judge_conflict(
    kube: Kube,
    cfg: SwitchConfig,
    target: str | None,
    claim: dict,
    deadline: Deadline,
    exc: ApiException,
) -> None:
    """A 409: the claim is not the one that was read. Our own patch may have landed on an
    earlier try whose answer was lost (a retried patch then meets its own change)."""
    ref = f"{cfg.namespace}/{cfg.claim}"
    now = kube.read_claim(cfg.namespace, cfg.claim, deadline)
    if now is None:
        raise PreflightRefused(f"claim {ref} was deleted since it was read; not patched") from exc
    if now["metadata"].get("uid") != claim["metadata"].get("uid"):
        raise PreflightRefused(
            f"claim {ref} was deleted and re-created since it was read (uid "
            f"{claim['metadata'].get('uid')} -> {now['metadata'].get('uid')}); not patched"
        ) from exc
    if now["spec"].get("volumeAttributesClassName") == target:
        log.info("claim %s already asks for %s: an earlier try of the patch landed", ref, target)
        return
    raise PreflightRefused(
        f"claim {ref} changed since it was read (resourceVersion "
        f"{claim['metadata'].get('resourceVersion')} -> {now['metadata'].get('resourceVersion')})"
        f"; not patched, run the switch again: {api_message(exc)}"
    ) from exc


def _rollback(
    kube: Kube,
    cfg: SwitchConfig,
    plan: Plan,
    waiter: ClaimWaiter,
    report: Report,
    echo: Callable[[str], None],
) -> None:
    """Ask for the class that was applied before again and wait for it; the switch still
    ends infeasible. Not the class the spec asked for before: that one may never have
    applied (an earlier Infeasible switch)."""
    previous = plan.previous_class
    echo(f"rolling claim {cfg.namespace}/{cfg.claim} back to {previous}")
    try:
        if previous is not None and kube.read_class(previous, waiter.deadline) is None:
            # Same reason as in preflight: the resizer would leave the claim Pending forever.
            raise PreflightRefused(f"VolumeAttributesClass {previous} no longer exists")
        claim = kube.read_claim(cfg.namespace, cfg.claim, waiter.deadline)
        if claim is None or claim["metadata"].get("uid") != plan.uid:
            raise PreflightRefused(f"claim {cfg.namespace}/{cfg.claim} was deleted or re-created")
        _patch(kube, cfg, previous, claim, waiter.deadline)
        waiter.wait(previous)
    except (BenchError, TemporaryError) as exc:
        report.warnings.append(f"rollback to {previous} failed: {exc}")
        echo(f"warning: rollback to {previous} failed: {exc}")
        return
    report.rolled_back = True
    report.applied_class = previous
    report.notes.append(f"rolled back to {previous}")
