"""``switch`` on Kubernetes: preflight, the Lease, one patch, wait for Kubernetes, then the
provider."""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Callable
from datetime import datetime

from checkpoint_storage_bench.contract import LEDGER_ANNOTATION, LedgerEntry, format_ledger
from checkpoint_storage_bench.errors import BenchError
from checkpoint_storage_bench.retry import Deadline, TemporaryError
from hooks.storage_profile.config import SwitchConfig
from hooks.storage_profile.errors import (
    ApiError,
    BudgetExceeded,
    Conflict,
    Forbidden,
    HookError,
    Infeasible,
    Invalid,
    NotFound,
    PreflightRefused,
)
from hooks.storage_profile.heartbeat import BeatingDeadline, Heartbeat
from hooks.storage_profile.kube import Kube
from hooks.storage_profile.lease import ClaimLease
from hooks.storage_profile.ledger import budget, read_ledger, utcnow, with_entry
from hooks.storage_profile.preflight import Plan, preflight
from hooks.storage_profile.providers import PROVIDERS, Provider
from hooks.storage_profile.report import Report, not_switched, now_iso
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
    deadline: BeatingDeadline | None = None,
) -> Report:
    """Switch the claim's class and wait until it settled; fill ``report`` on the way.

    Args:
        cfg: The switch; ``cfg.holder`` is set (the CLI fills in the default).
        deadline: The switch's ``--timeout``, if it started before (the CLI's did, when it
            looked up the holder); else it starts now.

    Raises:
        BenchError: Any refusal or failure, with its exit code; ``report`` holds what was
            known until then.
    """
    assert cfg.holder is not None and cfg.timeout is not None
    if deadline is None:
        deadline = BeatingDeadline(cfg.timeout)
    heartbeat = Heartbeat(echo, interval=cfg.heartbeat, deadline=deadline)
    deadline.heartbeat = heartbeat
    if cfg.only_if_switched:
        # Before preflight: a claim this holder never switched is left as it is, whatever
        # preflight would have said about it.
        if not _switched_by_holder(kube, cfg, deadline):
            return not_switched(report, cfg.holder, echo)
    plan = preflight(kube, cfg.namespace, cfg.claim, cfg.target, deadline, cfg.force)
    _describe(report, plan)
    report.holder = cfg.holder
    lease = ClaimLease(kube, cfg.namespace, cfg.claim, cfg.holder, cfg.lease_duration)
    if plan.unbound:
        return _unbound_noop(cfg, plan, lease, report, deadline, echo)
    assert plan.driver is not None and plan.volume_handle is not None

    provider = None
    if cfg.settle == "provider":
        provider = provider_for(plan.driver, plan.pv)
        if provider is None:
            report.notes.append(
                f"no provider settle for driver {plan.driver}: settled means settled in Kubernetes"
            )
        else:
            report.provider = provider.name
    if cfg.timeout > cfg.lease_duration:
        report.warnings.append(
            f"--timeout {cfg.timeout:g}s is longer than --lease-duration "
            f"{cfg.lease_duration:g}s: the Lease may expire while this switch waits"
        )
    if not plan.already_requested:
        _check_budget(cfg, plan, provider, report, deadline)
    for warning in report.warnings:
        echo(f"warning: {warning}")

    entry = LedgerEntry(utcnow(), plan.previous_class, cfg.target, cfg.holder)
    if cfg.dry_run:
        lease.check(deadline)
        report.outcome = "dry-run"
        verb = "would not patch (already requested)" if plan.already_requested else "would patch"
        echo(f"dry run: {verb}: {dry_run_command(cfg, plan.patch(entry))}")
        return report

    report.lease = lease.acquire(deadline)
    echo(report.lease)
    report.requested_at = now_iso()
    if plan.already_requested:
        report.notes.append(f"claim already asks for {cfg.target}; not patched")
        report.ledger = format_ledger(plan.ledger) if plan.ledger else None
    else:
        report.ledger = _patch(kube, cfg, plan.claim, entry, deadline, plan.ledger)
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
        heartbeat=heartbeat,
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
        # patched, the provider judges what is still running. The class's parameters are
        # what a provider that reports them (GKE's disk) must show.
        since = datetime.fromisoformat(report.requested_at) if report.patched else None
        heartbeat.phase, heartbeat.kubernetes = "provider", f"settled on {cfg.target}"
        heartbeat.provider = "asking"
        note = provider.wait_settled(
            plan.volume_handle, deadline, since, target_class=plan.target_class
        )
        report.provider_settled_at = now_iso()
        report.notes.append(note)
        echo(note)
    return report


def _switched_by_holder(kube: Kube, cfg: SwitchConfig, deadline: Deadline) -> bool:
    """Whether the claim's ledger has a switch by ``cfg.holder`` (``--only-if-switched``).

    Raises:
        PreflightRefused: The claim is missing, or its ledger cannot be read (then nobody
            can tell who switched it: nothing is changed).
    """
    ref = f"{cfg.namespace}/{cfg.claim}"
    claim = kube.read_claim(cfg.namespace, cfg.claim, deadline)
    if claim is None:
        raise PreflightRefused(f"claim {ref} not found")
    try:
        ledger = read_ledger(claim)
    except ValueError as exc:
        raise PreflightRefused(
            f"claim {ref}: annotation {LEDGER_ANNOTATION} is not a ledger of switches ({exc}), "
            f"so whether {cfg.holder} switched the claim is unknown (--only-if-switched); "
            "nothing was changed"
        ) from exc
    return any(entry.holder == cfg.holder for entry in ledger)


def dry_run_command(cfg: SwitchConfig, patch: dict) -> str:
    """The ``kubectl patch`` the switch would send, quoted so that it can be pasted: the
    patch carries the holder (free text, ``'`` included) inside its ledger."""
    return shlex.join(
        [
            "kubectl",
            "patch",
            f"persistentvolumeclaims/{cfg.claim}",
            "-n",
            cfg.namespace,
            "--type=merge",
            "-p",
            json.dumps(patch),
        ]
    )


def _unbound_noop(
    cfg: SwitchConfig,
    plan: Plan,
    lease: ClaimLease,
    report: Report,
    deadline: Deadline,
    echo: Callable[[str], None],
) -> Report:
    """A claim not bound yet that already asks for the target: the class applies when its
    volume is provisioned, so there is nothing to patch or to wait for."""
    report.unbound_noop = True
    note = (
        f"claim {cfg.namespace}/{cfg.claim} is not bound yet and asks for {cfg.target}: the "
        "class applies when its volume is provisioned (when its first consumer is "
        "scheduled); nothing to patch or wait for"
    )
    report.notes.append(note)
    for warning in report.warnings:
        echo(f"warning: {warning}")
    echo(note)
    if cfg.dry_run:
        lease.check(deadline)
        report.outcome = "dry-run"
        return report
    report.lease = lease.acquire(deadline)
    echo(report.lease)
    now = now_iso()
    report.requested_at = report.k8s_settled_at = now
    if cfg.settle == "provider":
        report.provider_settled_at = now
    report.applied_class = cfg.target
    report.outcome = "unbound-noop"
    return report


def _check_budget(
    cfg: SwitchConfig,
    plan: Plan,
    provider: Provider | None,
    report: Report,
    deadline: Deadline,
) -> None:
    """Refuse a switch that would exceed the driver's modification window.

    Two sources: the claim's ledger (every switch the hook made) and, where available, the
    provider's own record. The stricter wins: either one refuses, and the refusal names the
    later of their "next allowed" times. ``--force`` turns refusals into warnings.
    """
    assert plan.driver is not None and plan.volume_handle is not None
    problems: list[tuple[str, datetime | None]] = []
    mine = budget(plan.ledger, plan.driver, utcnow())
    if mine is not None and mine.exhausted:
        problems.append(
            (f"{mine.describe(plan.driver)}, the next from {mine.next_at:%Y-%m-%dT%H:%M:%SZ}",
             mine.next_at)
        )  # fmt: skip
    if provider is not None:
        try:
            report.warnings.extend(
                provider.check_rate_limit(plan.volume_handle, cfg.force, deadline)
            )
        except BudgetExceeded as exc:
            problems.append((exc.format_message(), exc.next_at))
    if not problems:
        return
    message = "; ".join(text for text, _ in problems)
    known = [at for _, at in problems if at is not None]
    later = max(known) if known else None
    if later is not None and len(problems) > 1:
        message += f"; the stricter: the next switch is allowed from {later:%Y-%m-%dT%H:%M:%SZ}"
    if cfg.force:
        report.warnings.append(f"--force: {message}")
        return
    if not message.endswith("(--force to try anyway)"):
        message += " (--force to try anyway)"
    raise BudgetExceeded(message, later)


def _describe(report: Report, plan: Plan) -> None:
    report.claim_uid = plan.uid
    report.pv = plan.pv["metadata"]["name"] if plan.pv else None
    report.volume_handle = plan.volume_handle
    report.driver = plan.driver
    report.previous_class = plan.previous_class
    report.applied_class = plan.previous_class
    report.class_parameters = dict(plan.target_class.get("parameters") or {})
    report.warnings.extend(plan.warnings)


def _patch(
    kube: Kube,
    cfg: SwitchConfig,
    claim: dict,
    entry: LedgerEntry,
    deadline: Deadline,
    ledger: list[LedgerEntry] | None = None,
) -> str | None:
    """Patch the class of ``claim`` as it was read to ``entry.to_class`` and append ``entry``
    to its ledger, in one write; its uid and resourceVersion must still match.

    Returns:
        The ledger annotation's value as written (None when no entry was appended).

    Raises:
        PreflightRefused: The API server refused (nothing changed), including a claim that
            changed or was re-created since it was read (409).
    """
    meta = claim["metadata"]
    ref = f"{cfg.namespace}/{cfg.claim}"
    if ledger is None:
        ledger = read_ledger(claim)
    # Back to "no class" modifies nothing (the resizer ignores it): no ledger entry.
    annotations = with_entry(ledger, entry) if entry.to_class is not None else None
    try:
        kube.patch_claim_class(
            cfg.namespace,
            cfg.claim,
            entry.to_class,
            deadline,
            meta.get("uid"),
            meta.get("resourceVersion"),
            annotations,
        )
    except Conflict as exc:
        _judge_conflict(kube, cfg, claim, entry, deadline, exc)
        return annotations[LEDGER_ANNOTATION] if annotations else None
    except (Forbidden, NotFound, Invalid) as exc:
        # Forbidden: RBAC or a per-class quota; Invalid: the API server's rules (e.g. an
        # unbound claim, or nil after a class was applied). Nothing changed either way.
        raise PreflightRefused(
            f"the API server refused to patch claim {ref}: {exc.server_message}"
        ) from exc
    except ApiError as exc:
        raise HookError(f"patching claim {ref} failed: {exc.server_message}") from exc
    return annotations[LEDGER_ANNOTATION] if annotations else None


def _judge_conflict(
    kube: Kube,
    cfg: SwitchConfig,
    claim: dict,
    entry: LedgerEntry,
    deadline: Deadline,
    exc: Conflict,
) -> None:
    """A conflict: the claim is not the one that was read. Our own patch may have landed on an
    earlier try whose answer was lost (a retried patch then meets its own change): then the
    claim asks for our class and its ledger holds our entry. Found by what it is (time to
    the second, classes, holder), not by position: the ledger is sorted by time, and an
    entry dated later than ours (a clock ahead, a hand edit) sorts after it."""
    ref = f"{cfg.namespace}/{cfg.claim}"
    now = kube.read_claim(cfg.namespace, cfg.claim, deadline)
    if now is None:
        raise PreflightRefused(f"claim {ref} was deleted since it was read; not patched") from exc
    if now["metadata"].get("uid") != claim["metadata"].get("uid"):
        raise PreflightRefused(
            f"claim {ref} was deleted and re-created since it was read (uid "
            f"{claim['metadata'].get('uid')} -> {now['metadata'].get('uid')}); not patched"
        ) from exc
    try:
        recorded = entry.to_class is None or entry in read_ledger(now)
    except ValueError:
        recorded = False
    if recorded and now["spec"].get("volumeAttributesClassName") == entry.to_class:
        log.info("claim %s: an earlier try of the patch to %s landed", ref, entry.to_class)
        return
    raise PreflightRefused(
        f"claim {ref} changed since it was read (resourceVersion "
        f"{claim['metadata'].get('resourceVersion')} -> {now['metadata'].get('resourceVersion')})"
        f"; not patched, run the switch again: {exc.server_message}"
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
        # The ledger counts the rollback too: it is one more modification of the volume.
        entry = LedgerEntry(utcnow(), cfg.target, previous, cfg.holder)
        report.ledger = _patch(kube, cfg, claim, entry, waiter.deadline) or report.ledger
        waiter.wait(previous)
    except (BenchError, TemporaryError, ValueError) as exc:
        report.warnings.append(f"rollback to {previous} failed: {exc}")
        echo(f"warning: rollback to {previous} failed: {exc}")
        return
    report.rolled_back = True
    report.applied_class = previous
    report.notes.append(f"rolled back to {previous}")
