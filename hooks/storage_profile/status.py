"""``status``: what ``kubectl get -o jsonpath`` and ``kubectl describe`` say, in one block."""

from __future__ import annotations

from checkpoint_storage_bench.contract import lease_name
from checkpoint_storage_bench.retry import Deadline
from hooks.storage_profile.errors import ApiError, PreflightRefused
from hooks.storage_profile.kube import Kube
from hooks.storage_profile.lease import LeaseState
from hooks.storage_profile.ledger import read_ledger

RECENT_EVENTS = 10


def claim_status(kube: Kube, namespace: str, name: str, deadline: Deadline) -> dict:
    """The class-related state of a claim, its PV's driver and its recent events.

    Raises:
        PreflightRefused: The claim does not exist.
        DeadlineExceeded: The API server did not answer in time.
    """
    claim = kube.read_claim(namespace, name, deadline)
    if claim is None:
        raise PreflightRefused(f"claim {namespace}/{name} not found")
    status = claim.get("status") or {}
    volume = claim["spec"].get("volumeName")
    pv = kube.read_pv(volume, deadline) if volume else None
    csi = (pv or {}).get("spec", {}).get("csi") or {}
    events, events_error = _recent_events(kube, namespace, claim, deadline)
    try:
        ledger: list[dict] | str = [e.to_json() for e in read_ledger(claim)]
    except ValueError as exc:
        ledger = f"not a ledger: {exc}"
    return {
        "lease": _lease(kube, namespace, name, deadline),
        "ledger": ledger,
        "namespace": namespace,
        "claim": name,
        "uid": claim["metadata"].get("uid"),
        "phase": status.get("phase"),
        "volume": volume,
        "driver": csi.get("driver"),
        "volumeHandle": csi.get("volumeHandle"),
        "desiredClass": claim["spec"].get("volumeAttributesClassName"),
        "currentClass": status.get("currentVolumeAttributesClassName"),
        "modifyVolumeStatus": status.get("modifyVolumeStatus"),
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message", "lastTransitionTime")}
            for c in status.get("conditions") or []
        ],
        "events": [
            {
                "type": e.get("type"),
                "reason": e.get("reason"),
                "message": e.get("message"),
                "count": e.get("count"),
                "lastTimestamp": e.get("lastTimestamp") or e.get("eventTime"),
            }
            for e in events
        ],
        "eventsError": events_error,
    }


def _recent_events(
    kube: Kube, namespace: str, claim: dict, deadline: Deadline
) -> tuple[list[dict], str | None]:
    """The claim's recent events, and why there are none when they cannot be listed: a
    role without ``events`` ``list`` still gets the claim's state."""
    try:
        return kube.claim_events(namespace, claim, deadline)[-RECENT_EVENTS:], None
    except ApiError as exc:
        what = f"list events of claim {namespace}/{claim['metadata']['name']}"
        return [], f"cannot {what}: {exc.server_message}"


def _lease(kube: Kube, namespace: str, claim: str, deadline: Deadline) -> dict | str | None:
    """Who holds the claim's Lease; a string when it cannot be read (RBAC)."""
    try:
        lease = kube.read_lease(namespace, lease_name(claim), deadline)
    except ApiError as exc:
        return f"cannot read: {exc.server_message}"
    if lease is None:
        return None
    state = LeaseState.of(lease)
    expires = state.expires
    return {
        "name": lease_name(claim),
        "holder": state.holder,
        "expires": expires.strftime("%Y-%m-%dT%H:%M:%SZ") if expires else None,
    }


def render_status(data: dict) -> str:
    """The readable block printed by ``status`` for a claim on Kubernetes (the sandbox's is
    :func:`hooks.storage_profile.local.render_local`)."""
    modify = data["modifyVolumeStatus"] or {}
    lines = [
        f"claim {data['namespace']}/{data['claim']} (uid {data['uid'] or '-'}, "
        f"{data['phase'] or '-'})",
        f"  volume         {data['volume'] or '-'}  driver {data['driver'] or '-'}  "
        f"handle {data['volumeHandle'] or '-'}",
        f"  desired class  {data['desiredClass'] or '-'}",
        f"  current class  {data['currentClass'] or '-'}",
        f"  modify status  {modify.get('status') or '-'}"
        + (
            f" (target {modify['targetVolumeAttributesClassName']})"
            if modify.get("targetVolumeAttributesClassName")
            else ""
        ),
    ]
    lease = data.get("lease")
    if isinstance(lease, dict):
        holder = lease["holder"] or "nobody (released)"
        lines.append(f"  lease          {lease['name']}: {holder}, until {lease['expires'] or '-'}")
    else:
        lines.append(f"  lease          {lease or '-'}")
    ledger = data.get("ledger")
    if isinstance(ledger, list):
        lines.append("  switches" + ("" if ledger else "       -"))
        lines += [
            f"    {e['at']} {e['from'] or '-'} -> {e['to']} ({e['holder'] or '-'})" for e in ledger
        ]
    else:
        lines.append(f"  switches       {ledger}")
    lines.append("  conditions" + ("" if data["conditions"] else "     -"))
    for c in data["conditions"]:
        lines.append(f"    {c['type']}={c['status']} {c['reason'] or ''}: {c['message'] or ''}")
    if data.get("eventsError"):
        lines.append(f"  events         not shown: {data['eventsError']}")
    else:
        lines.append("  events" + ("" if data["events"] else "         -"))
    for e in data["events"]:
        lines.append(f"    {e['lastTimestamp'] or '-'} {e['type']} {e['reason']}: {e['message']}")
    return "\n".join(lines)
