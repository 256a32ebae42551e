"""The hook against a real API server, PV binder, csi-provisioner and csi-resizer.

The hook runs as ``python -m hooks.storage_profile switch`` in a subprocess, as the shipped
ServiceAccount (a TokenRequest token), with ``--settle kubernetes`` (the host-path driver has
no provider to wait for).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.kube.cluster import (
    BASELINE,
    CLAIM,
    NAMESPACE,
    REFUSED,
    THROUGHPUT,
    Cluster,
    switch,
    wait_for,
)

pytestmark = pytest.mark.kube

MODIFY_CONDITIONS = {"ModifyingVolume", "ModifyVolumeError"}


def reasons(cluster: Cluster) -> list[str]:
    return [e["reason"] for e in cluster.events()]


def driver_volume(cluster: Cluster, handle: str) -> dict:
    """What the CSI driver itself recorded for a volume (its state file)."""
    state = json.loads((cluster.plane.state_dir / "volumes" / "state.json").read_text())
    (volume,) = [v for v in state if v["id"] == handle]
    return volume


def test_switch_settles_through_the_real_resizer(
    cluster: Cluster, claim: dict, hook_kubeconfig: Path, tmp_path: Path
) -> None:
    pv_name = claim["spec"]["volumeName"]
    handle = cluster.pv(pv_name)["spec"]["csi"]["volumeHandle"]
    assert driver_volume(cluster, handle)["mutable"] == {"iops": "3000", "throughput": "125"}
    summary = tmp_path / "switch.json"

    run = switch(hook_kubeconfig, THROUGHPUT, "--summary-json", str(summary))

    assert run.exit_code == 0, run
    after = cluster.claim()
    assert after["spec"]["volumeAttributesClassName"] == THROUGHPUT
    assert after["status"]["currentVolumeAttributesClassName"] == THROUGHPUT
    assert "modifyVolumeStatus" not in after["status"]
    assert not {c["type"] for c in after["status"].get("conditions", [])} & MODIFY_CONDITIONS
    assert cluster.pv(pv_name)["spec"]["volumeAttributesClassName"] == THROUGHPUT
    # The driver really got ControllerModifyVolume with the class's parameters.
    assert driver_volume(cluster, handle)["mutable"] == {"iops": "6000", "throughput": "250"}
    assert {"VolumeModify", "VolumeModifySuccessful"} <= set(reasons(cluster))
    report = json.loads(summary.read_text())
    assert report["outcome"] == "settled", report
    assert (report["previous_class"], report["target_class"], report["applied_class"]) == (
        BASELINE,
        THROUGHPUT,
        THROUGHPUT,
    )
    assert report["driver"] == "hostpath.csi.k8s.io"
    assert report["volume_handle"] == handle

    # And back, so the claim ends where the next test wants it.
    back = switch(hook_kubeconfig, BASELINE)
    assert back.exit_code == 0, back
    assert cluster.settled(BASELINE)
    assert cluster.pv(pv_name)["spec"]["volumeAttributesClassName"] == BASELINE


def test_a_switch_to_the_current_class_is_a_no_op(
    cluster: Cluster, claim: dict, hook_kubeconfig: Path
) -> None:
    run = switch(hook_kubeconfig, BASELINE)

    assert run.exit_code == 0, run
    # Nothing was written: the claim's resourceVersion did not move.
    assert cluster.claim()["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]


def test_a_class_the_driver_refuses_is_infeasible(
    cluster: Cluster, claim: dict, hook_kubeconfig: Path
) -> None:
    run = switch(hook_kubeconfig, REFUSED)

    assert run.exit_code == 4, run
    after = cluster.claim()
    status = after["status"]
    assert after["spec"]["volumeAttributesClassName"] == REFUSED  # --on-infeasible fail
    assert status["currentVolumeAttributesClassName"] == BASELINE
    assert status["modifyVolumeStatus"] == {
        "status": "Infeasible",
        "targetVolumeAttributesClassName": REFUSED,
    }
    (error,) = [c for c in status["conditions"] if c["type"] == "ModifyVolumeError"]
    # The real resizer puts the gRPC code in the reason and only the driver's text in the
    # message (no "rpc error: code = ..." prefix).
    assert error["reason"] == "InvalidArgument", error
    assert error["message"] == "invalid parameters: [tier]", error
    assert "InvalidArgument: invalid parameters: [tier]" in run.output, run
    assert "VolumeModifyFailed" in reasons(cluster)
    pv = cluster.pv(after["spec"]["volumeName"])
    assert pv["spec"]["volumeAttributesClassName"] == BASELINE


def test_rollback_after_infeasible_returns_to_the_previous_class(
    cluster: Cluster, claim: dict, hook_kubeconfig: Path
) -> None:
    run = switch(hook_kubeconfig, REFUSED, "--on-infeasible", "rollback")

    assert run.exit_code == 4, run
    assert run.output.startswith("storage profile: rolled-back (exit 4)"), run
    after = cluster.settled(BASELINE)
    assert after is not None, cluster.claim()
    assert cluster.pv(after["spec"]["volumeName"])["spec"]["volumeAttributesClassName"] == BASELINE


def test_a_missing_class_is_refused_before_any_write(
    cluster: Cluster, claim: dict, hook_kubeconfig: Path
) -> None:
    run = switch(hook_kubeconfig, "checkpoint-missing")

    assert run.exit_code == 3, run
    assert "checkpoint-missing" in run.output and "not found" in run.output, run
    assert cluster.claim()["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]


def test_what_preflight_prevents_a_claim_left_pending(
    cluster: Cluster, claim: dict, hook_kubeconfig: Path
) -> None:
    """Without the preflight (the admin patches directly) the real resizer leaves the claim
    Pending, and creating the class afterwards does not re-queue it. The hook can still
    switch such a claim to a class that exists."""
    late = "checkpoint-late"
    cluster.patch_claim({"spec": {"volumeAttributesClassName": late}})
    pending = wait_for(
        "modifyVolumeStatus Pending",
        lambda: (
            (cluster.claim()["status"].get("modifyVolumeStatus") or {}).get("status") == "Pending"
        ),
    )
    assert pending
    status = cluster.claim()["status"]
    assert status["currentVolumeAttributesClassName"] == BASELINE
    # The event is recorded after the status (the recorder batches): wait for it too.
    wait_for(
        f"a VolumeModifyFailed event naming {late}",
        lambda: [
            e
            for e in cluster.events()
            if e["reason"] == "VolumeModifyFailed" and late in e["message"]
        ],
    )

    cluster.apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttributesClass",
            "metadata": {"name": late},
            "driverName": "hostpath.csi.k8s.io",
            "parameters": {"iops": "4000", "throughput": "150"},
        }
    )
    try:
        # Well past the resizer's retry interval (1 s here): still Pending, no requeue.
        time.sleep(5)
        # Usually still Pending (the resizer does not re-queue a claim when its class
        # appears), but a resync of the resizer's informer can pick it up: either way the
        # hook must be able to move the claim on to a class that exists.
        still = cluster.claim()["status"]
        assert still.get("currentVolumeAttributesClassName") in (BASELINE, late), still

        run = switch(hook_kubeconfig, THROUGHPUT)
        assert run.exit_code == 0, run
        assert cluster.settled(THROUGHPUT)
    finally:
        cluster.request("DELETE", f"/apis/storage.k8s.io/v1/volumeattributesclasses/{late}")


def test_a_deleted_claim_is_refused(cluster: Cluster, claim: dict, hook_kubeconfig: Path) -> None:
    cluster.delete_claim(CLAIM, NAMESPACE)

    run = switch(hook_kubeconfig, THROUGHPUT)

    assert run.exit_code == 3, run
    assert "not found" in run.output, run
