"""The Kubernetes manifests and the agent configuration in ``connections/``."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import kubernetes_validate
import pytest

from tests.bundle.bundle import (
    AGENT_CONFIGS,
    CONNECTIONS,
    YAML_FILES,
    check,
    current,
    is_manifest,
    load_yaml_documents,
    manifests,
)


def by_name(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in manifests(kind)}


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(CONNECTIONS)))
def test_every_manifest_is_valid_kubernetes_1_34(path: Path) -> None:
    docs = load_yaml_documents(path)
    assert docs, f"{path} is empty"
    for doc in filter(is_manifest, docs):
        # strict: a misspelled field fails instead of being ignored by the API server.
        assert kubernetes_validate.validate(doc, "1.34.0", strict=True)


def test_strict_validation_catches_a_misspelled_field() -> None:
    claim = by_name("PersistentVolumeClaim")["training-checkpoints"]
    bad = {**claim, "spec": {**claim["spec"], "volumeAttributeClassName": "checkpoint-baseline"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.34.0", strict=True)


def test_the_seed_profiles_for_ebs_gp3() -> None:
    # The cluster's two classes, as the seed gives them (the sandbox's third gp3 class lives
    # in its own file, sandbox-vac-extra.yaml).
    docs = load_yaml_documents(CONNECTIONS / "vac-ebs-gp3.yaml")
    classes = {doc["metadata"]["name"]: doc["parameters"] for doc in docs}
    assert {doc["driverName"] for doc in docs} == {"ebs.csi.aws.com"}
    assert classes == {
        "checkpoint-baseline": {"type": "gp3", "iops": "3000", "throughput": "125"},
        "checkpoint-throughput": {"type": "gp3", "iops": "6000", "throughput": "250"},
    }
    sandbox = by_name_per_driver()["ebs.csi.aws.com"]
    assert set(sandbox) - set(classes) == {"checkpoint-gp3-500"}


def test_a_gke_hyperdisk_pair() -> None:
    classes = by_name_per_driver()["pd.csi.storage.gke.io"]
    assert set(classes) == {"checkpoint-baseline", "checkpoint-throughput"}
    for doc in classes.values():
        # The GKE driver accepts only these two keys.
        assert set(doc["parameters"]) == {"iops", "throughput"}


def by_name_per_driver() -> dict[str, dict[str, dict]]:
    """VolumeAttributesClasses grouped by CSI driver (one family per driver)."""
    families: dict[str, dict[str, dict]] = defaultdict(dict)
    for doc in manifests("VolumeAttributesClass"):
        name = doc["metadata"]["name"]
        assert name not in families[doc["driverName"]], f"{name} defined twice"
        families[doc["driverName"]][name] = doc
    return families


def test_every_class_family_repeats_every_key() -> None:
    # A switch behaves like a patch: a key missing from the target keeps its old value.
    families = by_name_per_driver()
    assert len(families) >= 2
    for driver, classes in families.items():
        keys = {name: set(doc["parameters"]) for name, doc in classes.items()}
        assert len(set(map(frozenset, keys.values()))) == 1, (driver, keys)
        for doc in classes.values():
            assert all(isinstance(v, str) for v in doc["parameters"].values()), doc


def test_the_claim_and_its_storage_class() -> None:
    claim = by_name("PersistentVolumeClaim")["training-checkpoints"]
    assert claim["metadata"]["namespace"] == "ml-team"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["volumeAttributesClassName"] == "checkpoint-baseline"
    storage_class = by_name("StorageClass")[claim["spec"]["storageClassName"]]
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"
    # Deleting the example claim must not delete the volume with the checkpoints.
    assert storage_class["reclaimPolicy"] == "Retain"
    # Every StorageClass provisions with a driver that has the pipeline's two profiles.
    families = by_name_per_driver()
    for sc in manifests("StorageClass"):
        assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
        assert {"checkpoint-baseline", "checkpoint-throughput"} <= set(families[sc["provisioner"]])


def test_agent_configs_expose_the_claim_as_the_checkpoints_connection() -> None:
    claim = by_name("PersistentVolumeClaim")["training-checkpoints"]
    configs = [load_yaml_documents(path)[0] for path in AGENT_CONFIGS]
    assert {c["artifactsStore"]["kind"] for c in configs} == {"s3", "gcs"}
    for config in configs:
        assert config["namespace"] == claim["metadata"]["namespace"]
        assert config["artifactsStore"]["name"] == "artifacts-store"
        (checkpoints,) = [c for c in config["connections"] if c["name"] == "checkpoints"]
        assert checkpoints["kind"] == "volume_claim"
        assert checkpoints["schema"] == {
            "mountPath": "/checkpoints",
            "volumeClaim": claim["metadata"]["name"],
            "readOnly": False,
        }
    # The S3 and GCS variants differ only in the artifacts store.
    assert all(c["connections"] == configs[0]["connections"] for c in configs)


def test_the_hook_service_account_has_its_rbac() -> None:
    # connections/rbac-storage-profile.yaml is written with the hook; this checks the names
    # agree once both are in the tree.
    accounts = {
        (d["metadata"].get("namespace"), d["metadata"]["name"]) for d in manifests("ServiceAccount")
    }
    if not accounts:
        pytest.skip("no ServiceAccount manifest in connections/ yet (rbac-storage-profile.yaml)")
    component = check(current("storage-profile"), {"target_class": "x"})
    name = component.component.run.environment.service_account_name
    assert ("ml-team", name) in accounts
    bound = {
        (subject.get("namespace"), subject["name"])
        for kind in ("RoleBinding", "ClusterRoleBinding")
        for binding in manifests(kind)
        for subject in binding.get("subjects") or []
        if subject["kind"] == "ServiceAccount"
    }
    assert ("ml-team", name) in bound
