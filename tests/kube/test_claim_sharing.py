"""A claim shared over time, against the real API server, as the shipped ServiceAccount.

An unbound WaitForFirstConsumer claim (the first run on a real cluster), the ledger
annotation written in the class patch, and the claim's Lease with two holders.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.contract import LEDGER_ANNOTATION, lease_name, parse_ledger
from tests.kube.cluster import (
    BASELINE,
    CLAIM,
    NAMESPACE,
    THROUGHPUT,
    Cluster,
    run_hook,
    switch,
    wait_for,
)

pytestmark = pytest.mark.kube

LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{lease_name(CLAIM)}"


def read_lease(cluster: Cluster) -> dict | None:
    try:
        return cluster.request("GET", LEASE)
    except kube.NotFound:
        return None


def delete_lease(cluster: Cluster) -> None:
    try:
        cluster.request("DELETE", LEASE)
    except kube.NotFound:
        pass


@pytest.fixture
def no_lease(cluster: Cluster) -> Iterator[None]:
    """No Lease on the claim before and after: the other tests switch as the default holder
    (user@host), which a test holder's fresh Lease would refuse."""
    delete_lease(cluster)
    yield
    delete_lease(cluster)


def release(kubeconfig: Path, holder: str):
    return run_hook(
        kubeconfig, "release", "--namespace", NAMESPACE, "--claim", CLAIM, "--holder", holder
    )


def plan(kubeconfig: Path, profiles: str, *extra: str):
    return run_hook(
        kubeconfig, "plan", "--namespace", NAMESPACE, "--claim", CLAIM, "--profiles", profiles,
        *extra,
    )  # fmt: skip


# ------------------------------------------------------------------ the unbound claim


@pytest.fixture
def unbound(cluster: Cluster, no_lease: None) -> Iterator[dict]:
    """training-checkpoints as shipped (checkpoint-baseline), before its first consumer: the
    PV binder leaves a WaitForFirstConsumer claim Pending until a node is selected. Deleted
    afterwards (the `claim` fixture makes a bound one again)."""
    cluster.delete_claim(CLAIM, NAMESPACE)
    cluster.apply(cluster.shipped_claim())
    wait_for(
        "the binder to wait for the first consumer",
        lambda: any(e["reason"] == "WaitForFirstConsumer" for e in cluster.events()),
    )
    claim = cluster.claim()
    assert claim["status"]["phase"] == "Pending" and not claim["spec"].get("volumeName")
    yield claim
    cluster.delete_claim(CLAIM, NAMESPACE)


def test_an_unbound_claim_created_with_the_class_is_a_no_op(
    cluster: Cluster, unbound: dict, hook_kubeconfig: Path, tmp_path: Path
) -> None:
    summary = tmp_path / "switch.json"

    run = switch(
        hook_kubeconfig, BASELINE, "--holder", "pipeline-a", "--summary-json", str(summary)
    )

    assert run.exit_code == 0, run
    report = json.loads(summary.read_text())
    assert report["unbound_noop"] is True and report["outcome"] == "unbound-noop", report
    assert report["applied_class"] == BASELINE and report["k8s_settle_s"] == 0
    assert "nothing to patch or wait for" in run.output, run
    after = cluster.claim()
    # Not patched: no ledger entry (nothing was modified), same class, still unbound.
    assert LEDGER_ANNOTATION not in (after["metadata"].get("annotations") or {})
    assert after["spec"]["volumeAttributesClassName"] == BASELINE
    assert after["status"]["phase"] == "Pending"
    # The Lease was taken all the same: the pipeline holds the claim from its first op.
    assert read_lease(cluster)["spec"]["holderIdentity"] == "pipeline-a"
    # And the plan agrees: the run starting on the class it was created with fits.
    planned = plan(hook_kubeconfig, f"{BASELINE},{THROUGHPUT}", "--summary-json", str(summary))
    assert planned.exit_code == 0, planned
    data = json.loads(summary.read_text())
    assert data["bound"] is False and data["driver"] == "hostpath.csi.k8s.io"
    assert data["modifications_needed"] == 1


def test_an_unbound_claim_asking_for_another_class_is_refused(
    cluster: Cluster, unbound: dict, hook_kubeconfig: Path
) -> None:
    run = switch(hook_kubeconfig, THROUGHPUT, "--holder", "pipeline-a")

    assert run.exit_code == 3, run
    assert f"asks for {BASELINE}, not {THROUGHPUT}" in run.output, run
    assert f"Create the claim with spec.volumeAttributesClassName: {THROUGHPUT}" in run.output
    after = cluster.claim()
    assert after["metadata"]["resourceVersion"] == unbound["metadata"]["resourceVersion"]
    assert read_lease(cluster) is None  # refused in preflight, before the Lease
    # What the hook's message says the API server would answer, as the admin finds out:
    # the class of an unbound claim cannot change (422), so refusing first loses nothing.
    with pytest.raises(kube.Invalid) as info:
        cluster.patch_claim({"spec": {"volumeAttributesClassName": THROUGHPUT}})
    assert info.value.status == 422, info.value.body
    assert "volumeAttributesClassName for bound claims" in json.loads(info.value.body)["message"]
    planned = plan(hook_kubeconfig, f"{THROUGHPUT},{BASELINE}")
    assert planned.exit_code == 3, planned
    assert f"the first profile must be {BASELINE} (not {THROUGHPUT})" in planned.output


# ------------------------------------------------------------------ the ledger


def test_each_switch_is_in_the_claims_ledger(
    cluster: Cluster, claim: dict, hook_kubeconfig: Path, no_lease: None
) -> None:
    before = parse_ledger((claim["metadata"].get("annotations") or {}).get(LEDGER_ANNOTATION))
    for target in (THROUGHPUT, BASELINE):
        run = switch(hook_kubeconfig, target, "--holder", "pipeline-a")
        assert run.exit_code == 0, run
    after = cluster.settled(BASELINE)
    assert after is not None, cluster.claim()
    ledger = parse_ledger(after["metadata"]["annotations"][LEDGER_ANNOTATION])
    new = ledger[len(before) :]
    assert [(e.from_class, e.to_class, e.holder) for e in new] == [
        (BASELINE, THROUGHPUT, "pipeline-a"),
        (THROUGHPUT, BASELINE, "pipeline-a"),
    ]
    # The binder's and provisioner's annotations are still there (a merge patch).
    assert after["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"] == "yes"


# ------------------------------------------------------------------ the Lease


def test_two_holders_one_claim(
    cluster: Cluster, claim: dict, hook_kubeconfig: Path, no_lease: None
):
    first = switch(hook_kubeconfig, THROUGHPUT, "--holder", "pipeline-a")
    assert first.exit_code == 0, first
    lease = read_lease(cluster)
    assert lease["spec"]["holderIdentity"] == "pipeline-a"
    assert lease["spec"]["leaseDurationSeconds"] == 6 * 3600
    version = cluster.claim()["metadata"]["resourceVersion"]

    # A second pipeline is refused while the first one's Lease is fresh, before any write.
    second = switch(hook_kubeconfig, BASELINE, "--holder", "pipeline-b")
    assert second.exit_code == 3, second
    assert "is held by pipeline-a until " in second.output, second
    assert cluster.claim()["metadata"]["resourceVersion"] == version
    refused = release(hook_kubeconfig, "pipeline-b")
    assert refused.exit_code == 3 and "not released" in refused.output, refused
    assert read_lease(cluster)["spec"]["holderIdentity"] == "pipeline-a"

    # The first pipeline's last op gives it up; then the second may switch.
    done = release(hook_kubeconfig, "pipeline-a")
    assert done.exit_code == 0, done
    assert "holderIdentity" not in read_lease(cluster)["spec"]
    second = switch(hook_kubeconfig, BASELINE, "--holder", "pipeline-b", "--lease-duration", "1")
    assert second.exit_code == 0, second
    spec = read_lease(cluster)["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == ("pipeline-b", 1)
    assert spec["leaseTransitions"] == 1
    assert cluster.settled(BASELINE)

    # pipeline-b's one-second Lease runs out: a third holder takes it over (a no-op switch
    # takes the Lease too).
    time.sleep(1.5)
    third = switch(hook_kubeconfig, BASELINE, "--holder", "pipeline-c")
    assert third.exit_code == 0, third
    assert "took over Lease" in third.output and "from pipeline-b" in third.output, third
    spec = read_lease(cluster)["spec"]
    assert spec["holderIdentity"] == "pipeline-c" and spec["leaseTransitions"] == 2


def renew(kubeconfig: Path, holder: str, *extra: str):
    return run_hook(
        kubeconfig, "renew", "--namespace", NAMESPACE, "--claim", CLAIM, "--holder", holder,
        *extra,
    )  # fmt: skip


def test_a_stage_renews_its_lease_and_a_lost_one_is_refused(
    cluster: Cluster, claim: dict, hook_kubeconfig: Path, no_lease: None
):
    # As the shipped ServiceAccount: get and update of the claim's Lease are enough.
    taken = switch(hook_kubeconfig, THROUGHPUT, "--holder", "pipeline-a")
    assert taken.exit_code == 0, taken
    before = read_lease(cluster)["spec"]
    renewed = renew(hook_kubeconfig, "pipeline-a", "--lease-duration", "7200")
    assert renewed.exit_code == 0, renewed
    assert "renewed Lease" in renewed.output, renewed
    spec = read_lease(cluster)["spec"]
    assert spec["leaseDurationSeconds"] == 7200 and spec["renewTime"] > before["renewTime"]
    assert spec["leaseTransitions"] == before["leaseTransitions"]

    other = renew(hook_kubeconfig, "pipeline-b")
    assert other.exit_code == 3, other
    assert "is held by pipeline-a, not by pipeline-b: not renewed" in other.output, other
    assert release(hook_kubeconfig, "pipeline-a").exit_code == 0
    lost = renew(hook_kubeconfig, "pipeline-a")
    assert lost.exit_code == 3 and "is not held (released)" in lost.output, lost
    assert "holderIdentity" not in read_lease(cluster)["spec"]
