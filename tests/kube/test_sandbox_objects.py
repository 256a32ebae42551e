"""The on-node sandbox's cluster objects applied through the object layer to the real API
server: a first start creates them and binds the artifacts store, a second changes nothing."""

from __future__ import annotations

from pathlib import Path

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.retry import Deadline
from operator_standin import crd
from sandbox.on_node import apply_bundle, prepare_cluster, store_volume_name
from tests.kube.cluster import Cluster

SPACE = "sandbox-node"
CONFIG = {
    "namespace": SPACE,
    "artifactsStore": {"kind": "volume_claim", "schema": {"volumeClaim": "plx-artifacts"}},
    "runsSa": "runs",
}


def _bound(claim: dict | None) -> dict | None:
    return claim if claim and (claim.get("status") or {}).get("phase") == "Bound" else None


def test_a_second_start_changes_nothing_and_the_store_stays_bound(
    cluster: Cluster, tmp_path: Path
) -> None:
    api = kube.Client(cluster.api)
    store = tmp_path / "server-data"
    crds = [d["metadata"]["name"] for d in crd.definitions()]
    made = prepare_cluster(cluster.api, CONFIG, store)
    assert [m for m in made if m not in crds] == [
        f"Namespace {SPACE}",
        f"PersistentVolume {store_volume_name(SPACE, 'plx-artifacts')}",
        "PersistentVolumeClaim plx-artifacts",
        "ServiceAccount runs",
        "Role polyaxon-runs-sidecar",
        "RoleBinding polyaxon-runs-sidecar",
    ]
    assert store.is_dir()
    claim = api.wait(kube.CLAIM, "plx-artifacts", _bound, Deadline(60), SPACE)

    assert prepare_cluster(cluster.api, CONFIG, store) == crds
    volume = api.get(kube.VOLUME, store_volume_name(SPACE, "plx-artifacts"))
    # The volume keeps the binder's claimRef (with the claim's uid): applying the same
    # manifest again does not unbind it.
    assert volume["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert _bound(api.get(kube.CLAIM, "plx-artifacts", SPACE))
    namespace = api.get(kube.NAMESPACE, SPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


def test_the_bundle_is_applied_with_its_claim_in_the_namespace(cluster: Cluster) -> None:
    api = kube.Client(cluster.api)
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SPACE}})
    applied, classes = apply_bundle(cluster.api, SPACE)
    assert "PersistentVolumeClaim training-checkpoints" in applied
    assert classes and all(api.get(kube.VOLUME_ATTRIBUTES_CLASS, c) for c in classes)
    claim = api.get(kube.CLAIM, "training-checkpoints", SPACE)
    assert claim["spec"]["storageClassName"] == cluster.storage_class_name()
    assert apply_bundle(cluster.api, SPACE) == (applied, classes)
    api.delete(kube.CLAIM, "training-checkpoints", SPACE)
