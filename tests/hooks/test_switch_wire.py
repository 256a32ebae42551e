"""``switch`` end to end over the HTTP double: what the wire does in the middle of a switch
(a dropped or expired watch, throttling with ``Retry-After``, an answer lost after the
server acted) and whether the least-privilege Role allows every request it makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooks.conftest import assert_claim_class_patch
from tests.hooks.helpers import run_hook
from tests.hooks.kube_double import KubeDouble
from tests.hooks.kube_state import CLAIMS, Rbac, claim_state, make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"
CLAIM_PATH = f"/api/v1/namespaces/{NS}/{CLAIMS}/{CLAIM}"
ROOT = Path(__file__).resolve().parents[2]


def switch(kubeconfig: Path, *extra: str, to: str = "fast", claim: str = CLAIM):
    return run_hook(
        "switch", "-n", NS, "--claim", claim, "--to", to, "--kubeconfig", str(kubeconfig),
        "--settle", "kubernetes", *extra,
    )  # fmt: skip


def release(kubeconfig: Path, holder: str, claim: str = CLAIM):
    return run_hook(
        "release", "-n", NS, "--claim", claim, "--holder", holder, "--kubeconfig", str(kubeconfig)
    )


def assert_only_claim_patched(double: KubeDouble, expected: list[str | None]) -> None:
    """Every write was a merge patch of the named claim's class field (and its ledger), or
    one of its Lease; nothing else."""
    assert all(
        f"/{CLAIMS}/" in w.path
        or w.path.startswith(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/")
        for w in double.writes()
    )
    writes = [w for w in double.claim_writes() if w.status < 400]
    assert [(w.method, w.path) for w in writes] == [("PATCH", CLAIM_PATH)] * len(expected)
    for write, target in zip(writes, expected, strict=True):
        assert_claim_class_patch(write)
        assert write.body["spec"] == {"volumeAttributesClassName": target}


def test_watch_dropped_mid_wait_relists_and_settles(wire_cluster: KubeDouble, kubeconfig: Path):
    wire_cluster.resizer.driver_delay = 1.0  # the faults land well before it settles
    wire_cluster.watch_faults.extend(["drop"])
    result = switch(kubeconfig)
    assert result.exit_code == 0, result.output
    assert claim_state(wire_cluster) == ("fast", "fast", None)
    assert wire_cluster.count("watch") == 2 and wire_cluster.count("list") == 2
    assert_only_claim_patched(wire_cluster, ["fast"])


@pytest.mark.parametrize("form", ["gone", "gone-http"])
def test_410_gone_mid_wait_relists_and_settles(
    wire_cluster: KubeDouble, kubeconfig: Path, form: str
):
    wire_cluster.resizer.driver_delay = 1.0  # the faults land well before it settles
    wire_cluster.watch_faults.extend([form, form])
    result = switch(kubeconfig)
    assert result.exit_code == 0, result.output
    assert wire_cluster.count("watch") == 3
    assert wire_cluster.count("list") == 3
    assert claim_state(wire_cluster) == ("fast", "fast", None)


def test_throttling_honours_retry_after(wire_cluster: KubeDouble, kubeconfig: Path):
    wire_cluster.fail("PATCH", CLAIMS, 429, retry_after="1")
    wire_cluster.fail("GET", f"{CLAIMS}$", 503, times=2)  # the wait's list
    result = switch(kubeconfig)
    assert result.exit_code == 0, result.output
    patches = [w for w in wire_cluster.claim_writes()]
    assert [p.status for p in patches] == [429, 200]
    assert patches[1].at - patches[0].at >= 0.95
    assert_only_claim_patched(wire_cluster, ["fast"])
    assert claim_state(wire_cluster) == ("fast", "fast", None)


def test_least_privilege_rbac_is_enough(wire_cluster: KubeDouble, kubeconfig: Path):
    wire_cluster.rbac = Rbac.from_manifests(
        ROOT / "connections" / "rbac-storage-profile.yaml", "ml-team:storage-profile-hook"
    )
    wire_cluster.resizer.results["fast"] = ["Internal", "ok"]  # also reads events
    result = switch(kubeconfig)
    assert result.exit_code == 0, result.output
    assert all(r.status != 403 for r in wire_cluster.requests)
    assert (
        run_hook("status", "-n", NS, "--claim", CLAIM, "--kubeconfig", str(kubeconfig)).exit_code
        == 0
    )
    # Another claim in the namespace is out of reach.
    make_volume(wire_cluster, claim="someone-else", pv="pvc-0002")
    result = switch(kubeconfig, claim="someone-else")
    assert result.exit_code == 3
    assert "forbidden" in result.stderr
    assert not [w for w in wire_cluster.claim_writes() if "someone-else" in w.path]


def test_least_privilege_rbac_reads_an_unbound_claims_storage_class(double: KubeDouble, tmp_path):
    # A fresh WaitForFirstConsumer claim: the class's driver is checked against the
    # StorageClass's provisioner, which the Role allows to get (and nothing more).
    make_volume(double, bound=False, current="fast")
    make_class(double, "fast", type="gp3", iops="6000", throughput="250")
    double.rbac = Rbac.from_manifests(
        ROOT / "connections" / "rbac-storage-profile.yaml", "ml-team:storage-profile-hook"
    )
    result = switch(double.write_kubeconfig(tmp_path / "kubeconfig"))
    assert result.exit_code == 0, result.output
    assert any(r.path.endswith("/storageclasses/ebs-gp3") for r in double.requests)
    assert all(r.status != 403 for r in double.requests)
    assert double.rbac.allows("get", "storage.k8s.io", "storageclasses", None, "any")
    assert not double.rbac.allows("list", "storage.k8s.io", "storageclasses", None, None)


def test_a_patch_whose_answer_was_lost_is_not_refused_on_retry(
    wire_cluster: KubeDouble, kubeconfig: Path
):
    # The server applied the patch but the answer never arrived; the retry meets the
    # changed resourceVersion (409) and recognises its own change.
    wire_cluster.fail("PATCH", CLAIMS, 503, lost=True)
    result = switch(kubeconfig)
    assert result.exit_code == 0, result.output
    assert [w.status for w in wire_cluster.claim_writes()] == [503, 409]
    assert claim_state(wire_cluster) == ("fast", "fast", None)


def test_least_privilege_rbac_covers_the_lease_and_no_other(
    wire_cluster: KubeDouble, kubeconfig: Path
):
    wire_cluster.rbac = Rbac.from_manifests(
        ROOT / "connections" / "rbac-storage-profile.yaml", "ml-team:storage-profile-hook"
    )
    assert switch(kubeconfig).exit_code == 0  # create
    assert switch(kubeconfig, to="baseline").exit_code == 0  # get + update
    assert release(kubeconfig, "pipeline-a").exit_code == 0
    assert all(r.status != 403 for r in wire_cluster.requests)
    # Another claim's Lease is out of reach (get and update are restricted by name).
    result = release(kubeconfig, "pipeline-a", claim="someone-else")
    assert result.exit_code == 3, result.output
    assert "cannot read Lease ml-team/storage-profile-someone-else" in result.stderr
