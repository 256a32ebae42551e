"""Checks made before any write: the claim, its volume, the target class and their drivers."""

from __future__ import annotations

from dataclasses import dataclass, field

from checkpoint_storage_bench.contract import LEDGER_ANNOTATION, LedgerEntry
from checkpoint_storage_bench.retry import Deadline
from hooks.storage_profile.errors import PreflightRefused
from hooks.storage_profile.kube import Kube, class_patch
from hooks.storage_profile.ledger import read_ledger, with_entry


@dataclass
class Plan:
    """What preflight found, and so what ``switch`` will do.

    Attributes:
        claim: The claim as read.
        pv: Its PersistentVolume (None while the claim is unbound).
        target_class: The target VolumeAttributesClass.
        previous_class: The class applied before the switch
            (``status.currentVolumeAttributesClassName``): what a rollback returns to. The
            spec may ask for another one that never applied (an earlier Infeasible switch).
        requested_class: ``spec.volumeAttributesClassName`` before the switch.
        driver: The PV's CSI driver (None while unbound).
        volume_handle: The PV's ``spec.csi.volumeHandle`` (for EBS the volume id).
        already_requested: The claim's spec already names the target: nothing to patch.
        unbound: The claim has no volume yet and was created with the target class, which
            applies when the volume is provisioned: nothing to do.
        ledger: The claim's ledger of switches, oldest first.
        warnings: Things worth a look that do not stop the switch.
    """

    claim: dict
    pv: dict | None
    target_class: dict
    previous_class: str | None
    requested_class: str | None
    driver: str | None
    volume_handle: str | None
    already_requested: bool
    unbound: bool = False
    ledger: list[LedgerEntry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def uid(self) -> str | None:
        return self.claim["metadata"].get("uid")

    @property
    def resource_version(self) -> str | None:
        return self.claim["metadata"].get("resourceVersion")

    def patch(self, entry: LedgerEntry) -> dict:
        """The merge patch ``switch`` sends: the class, the ledger with ``entry`` appended,
        and the claim's identity as preconditions (see :func:`kube.class_patch`)."""
        return class_patch(
            entry.to_class, self.uid, self.resource_version, with_entry(self.ledger, entry)
        )


def preflight(
    kube: Kube,
    namespace: str,
    claim_name: str,
    target: str,
    deadline: Deadline | None = None,
    force: bool = False,
) -> Plan:
    """Read the claim, its PV and the target class, and refuse what cannot work.

    Raises:
        PreflightRefused: The claim or class is missing, the claim is not bound (unless it
            already asks for the target), the volume is not CSI, the class is for another
            driver, or the claim's ledger annotation is not a ledger (without ``force``).
    """
    ref = f"{namespace}/{claim_name}"
    claim = kube.read_claim(namespace, claim_name, deadline)
    if claim is None:
        raise PreflightRefused(f"claim {ref} not found")
    warnings = []
    try:
        ledger = read_ledger(claim)
    except ValueError as exc:
        if not force:
            raise PreflightRefused(
                f"claim {ref}: annotation {LEDGER_ANNOTATION} is not a ledger of switches "
                f"({exc}): fix or remove it (--force starts a new ledger)"
            ) from exc
        warnings.append(f"--force: annotation {LEDGER_ANNOTATION} was not a ledger ({exc}); "
                        "starting a new one")  # fmt: skip
        ledger = []
    phase = (claim.get("status") or {}).get("phase")
    volume_name = claim["spec"].get("volumeName")
    requested = claim["spec"].get("volumeAttributesClassName")
    if phase != "Bound" or not volume_name:
        return _unbound(kube, claim, ref, target, deadline, ledger, warnings)
    pv = kube.read_pv(volume_name, deadline)
    if pv is None:
        raise PreflightRefused(
            f"claim {ref} is bound to PersistentVolume {volume_name}, which does not exist"
        )
    csi = pv["spec"].get("csi")
    if not csi:
        raise PreflightRefused(
            f"PersistentVolume {volume_name} of claim {ref} is not a CSI "
            "volume; only CSI drivers can modify volume attributes"
        )
    target_class = kube.read_class(target, deadline)
    if target_class is None:
        # The resizer would leave the claim Pending and nothing re-queues it when the class
        # appears later, so refuse now instead.
        raise PreflightRefused(f"VolumeAttributesClass {target} not found")
    if target_class.get("driverName") != csi["driver"]:
        raise PreflightRefused(
            f"VolumeAttributesClass {target} is for driver {target_class.get('driverName')}, "
            f"but the volume of claim {ref} is provisioned by {csi['driver']}"
        )
    status = claim.get("status") or {}
    if requested == target and (status.get("modifyVolumeStatus") or {}).get("status") == "Pending":
        # The resizer marks a claim Pending when the class it asks for is missing, and
        # nothing re-queues it once the class exists: waiting would only spend the grace.
        raise PreflightRefused(
            f"claim {ref} is Pending on VolumeAttributesClass {target}, which exists now, but "
            "the external-resizer does not retry a Pending claim by itself: switch it to "
            "another class and back, or restart the external-resizer"
        )
    plan = Plan(
        claim=claim,
        pv=pv,
        target_class=target_class,
        previous_class=status.get("currentVolumeAttributesClassName"),
        requested_class=requested,
        driver=csi["driver"],
        volume_handle=csi["volumeHandle"],
        already_requested=requested == target,
        ledger=ledger,
        warnings=warnings,
    )
    plan.warnings.extend(_in_flight_warnings(claim, target))
    plan.warnings.extend(_shared_rwo_warnings(kube, namespace, claim, deadline))
    return plan


def _unbound(
    kube: Kube,
    claim: dict,
    ref: str,
    target: str,
    deadline: Deadline | None,
    ledger: list[LedgerEntry],
    warnings: list[str],
) -> Plan:
    """An unbound claim (a WaitForFirstConsumer claim before its first pod).

    The API server refuses any class change on it (422), but a class set at creation is
    applied when the volume is provisioned: asking for that class is already done.
    """
    phase = (claim.get("status") or {}).get("phase") or "not bound"
    requested = claim["spec"].get("volumeAttributesClassName")
    if requested != target:
        raise PreflightRefused(
            f"claim {ref} is {phase} (no volume yet) and asks for "
            f"{requested or 'no VolumeAttributesClass'}, not {target}: the class of an unbound "
            "claim cannot change (the API server answers 422). Create the claim with "
            f"spec.volumeAttributesClassName: {target} (delete and re-create it while no pod "
            "uses it), or let its first consumer bind it (a WaitForFirstConsumer claim binds "
            "when its first pod is scheduled) and switch then"
        )
    target_class = kube.read_class(target, deadline)
    if target_class is None:
        # The provisioner would fail to provision the volume with a class that is missing.
        raise PreflightRefused(
            f"VolumeAttributesClass {target} not found (claim {ref} asks for it and is not "
            "provisioned yet)"
        )
    driver, note = unbound_driver(kube, claim, ref, deadline)
    if note:
        warnings.append(note)
    if driver is not None and target_class.get("driverName") != driver:
        raise PreflightRefused(
            f"VolumeAttributesClass {target} is for driver {target_class.get('driverName')}, "
            f"but claim {ref} (not bound yet) will be provisioned by {driver}: the provisioner "
            "refuses another driver's class and the claim would never bind"
        )
    return Plan(
        claim=claim,
        pv=None,
        target_class=target_class,
        previous_class=None,
        requested_class=requested,
        driver=None,
        volume_handle=None,
        already_requested=True,
        unbound=True,
        ledger=ledger,
        warnings=warnings,
    )


def unbound_driver(
    kube: Kube, claim: dict, ref: str, deadline: Deadline | None
) -> tuple[str | None, str | None]:
    """The driver that will provision an unbound claim: its StorageClass's provisioner.

    Returns:
        The driver, or None with a note saying why it is unknown (a claim without a
        storageClassName, left to whatever default class exists when it is provisioned).

    Raises:
        PreflightRefused: The StorageClass does not exist (the claim cannot be provisioned),
            or RBAC forbids reading it.
    """
    name = claim["spec"].get("storageClassName")
    if not name:
        return None, (
            f"claim {ref} names no StorageClass: its provisioner (and so whether the class "
            "is for its driver) is unknown until the volume is provisioned"
        )
    storage_class = kube.read_storage_class(name, deadline)
    if storage_class is None:
        raise PreflightRefused(
            f"claim {ref} is not bound yet and its StorageClass {name} does not exist: no "
            "volume can be provisioned for it"
        )
    return storage_class.get("provisioner"), None


def _in_flight_warnings(claim: dict, target: str) -> list[str]:
    status = (claim.get("status") or {}).get("modifyVolumeStatus")
    if not status or status.get("targetVolumeAttributesClassName") in (None, target):
        return []
    return [
        f"a modification to {status.get('targetVolumeAttributesClassName')} is "
        f"{status.get('status')}; the resizer may finish it before starting {target}"
    ]


def _shared_rwo_warnings(
    kube: Kube, namespace: str, claim: dict, deadline: Deadline | None
) -> list[str]:
    if "ReadWriteOnce" not in (claim["spec"].get("accessModes") or []):
        return []
    name = claim["metadata"]["name"]
    try:
        pods = kube.pods(namespace, deadline)
    except PreflightRefused as exc:
        return [f"could not check which nodes mount the claim: {exc}"]
    nodes = {
        pod["spec"]["nodeName"]
        for pod in pods
        if pod["spec"].get("nodeName")
        and (pod.get("status") or {}).get("phase") in ("Pending", "Running")
        and any(
            (vol.get("persistentVolumeClaim") or {}).get("claimName") == name
            for vol in pod["spec"].get("volumes") or []
        )
    }
    if len(nodes) > 1:
        return [
            f"claim {namespace}/{name} is ReadWriteOnce but pods on {len(nodes)} nodes "
            f"mount it ({', '.join(sorted(nodes))}); measurements will not be comparable"
        ]
    return []
