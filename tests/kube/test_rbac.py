"""Least privilege, proved by the real authorizer (RBAC) with the shipped ServiceAccount."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from checkpoint_storage_bench.contract import lease_name
from tests.kube.cluster import BASELINE, CLAIM, NAMESPACE, THROUGHPUT, Cluster, switch

pytestmark = pytest.mark.kube

OTHER_NAMESPACE = "other-team"
BYSTANDER = "scratch"
LEASE = lease_name(CLAIM)


@pytest.fixture(scope="module")
def bystanders(cluster: Cluster) -> Iterator[dict[tuple[str, str], dict]]:
    """Another claim in ml-team, and a claim of the same name in another namespace."""
    claims = {
        (NAMESPACE, BYSTANDER): cluster.create_bound_claim(BYSTANDER, NAMESPACE),
        (OTHER_NAMESPACE, CLAIM): cluster.create_bound_claim(CLAIM, OTHER_NAMESPACE),
    }
    yield claims
    for namespace, name in claims:
        cluster.delete_claim(name, namespace)


@pytest.fixture(scope="module")
def hook_api(hook_kubeconfig: Path) -> client.ApiClient:
    return config.new_client_from_config(str(hook_kubeconfig))


def forbidden(call, *args, **kwargs) -> dict:
    """Call as the hook's account; it must be refused with 403. Returns the Status body."""
    with pytest.raises(ApiException) as info:
        call(*args, **kwargs)
    assert info.value.status == 403, info.value
    return json.loads(info.value.body)


def test_bystander_claims_are_never_touched(
    cluster: Cluster, claim: dict, bystanders: dict, hook_kubeconfig: Path
) -> None:
    before = {
        (namespace, name): cluster.claim(name, namespace)["metadata"]["resourceVersion"]
        for namespace, name in bystanders
    }
    pvs_before = {
        key: cluster.pv(obj["spec"]["volumeName"])["metadata"]["resourceVersion"]
        for key, obj in bystanders.items()
    }

    for target in (THROUGHPUT, BASELINE):
        run = switch(hook_kubeconfig, target)
        assert run.exit_code == 0, run

    for (namespace, name), version in before.items():
        after = cluster.claim(name, namespace)
        assert after["metadata"]["resourceVersion"] == version, (namespace, name)
        assert after["spec"]["volumeAttributesClassName"] == BASELINE
        pv = cluster.pv(after["spec"]["volumeName"])
        assert pv["metadata"]["resourceVersion"] == pvs_before[(namespace, name)]


def test_the_service_account_reaches_only_its_claim(
    cluster: Cluster, claim: dict, bystanders: dict, hook_api: client.ApiClient
) -> None:
    core = client.CoreV1Api(hook_api)
    patch = {"spec": {"volumeAttributesClassName": THROUGHPUT}}

    # Its own claim: get and list/watch by name.
    assert core.read_namespaced_persistent_volume_claim(CLAIM, NAMESPACE).metadata.name == CLAIM
    listed = core.list_namespaced_persistent_volume_claim(
        NAMESPACE, field_selector=f"metadata.name={CLAIM}"
    )
    assert [c.metadata.name for c in listed.items] == [CLAIM]

    # Another claim of the namespace: no read, no patch, no list by its name.
    denied = forbidden(core.read_namespaced_persistent_volume_claim, BYSTANDER, NAMESPACE)
    assert (
        f'persistentvolumeclaims "{BYSTANDER}" is forbidden: User '
        f'"system:serviceaccount:{NAMESPACE}:storage-profile-hook" cannot get resource '
        f'"persistentvolumeclaims" in API group "" in the namespace "{NAMESPACE}"'
    ) == denied["message"]
    assert denied["reason"] == "Forbidden"
    assert denied["details"] == {"name": BYSTANDER, "kind": "persistentvolumeclaims"}
    forbidden(core.patch_namespaced_persistent_volume_claim, BYSTANDER, NAMESPACE, patch)
    forbidden(
        core.list_namespaced_persistent_volume_claim,
        NAMESPACE,
        field_selector=f"metadata.name={BYSTANDER}",
    )
    # Listing without the name selector is a list of every claim: refused.
    forbidden(core.list_namespaced_persistent_volume_claim, NAMESPACE)
    # The same claim name in another namespace.
    forbidden(core.read_namespaced_persistent_volume_claim, CLAIM, OTHER_NAMESPACE)
    forbidden(core.patch_namespaced_persistent_volume_claim, CLAIM, OTHER_NAMESPACE, patch)
    # Its own claim, beyond the hook's verbs: no delete, no status writes, no replace.
    forbidden(core.delete_namespaced_persistent_volume_claim, CLAIM, NAMESPACE)
    forbidden(
        core.patch_namespaced_persistent_volume_claim_status,
        CLAIM,
        NAMESPACE,
        {"status": {"phase": "Lost"}},
    )
    # Cluster objects: get only.
    pv_name = claim["spec"]["volumeName"]
    assert core.read_persistent_volume(pv_name).metadata.name == pv_name
    forbidden(core.list_persistent_volume)
    forbidden(core.patch_persistent_volume, pv_name, {"metadata": {"labels": {"x": "y"}}})
    storage = client.StorageV1Api(hook_api)
    assert storage.read_volume_attributes_class(THROUGHPUT).driver_name == "hostpath.csi.k8s.io"
    forbidden(storage.list_volume_attributes_class)
    forbidden(
        storage.create_volume_attributes_class,
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttributesClass",
            "metadata": {"name": "sneaky"},
            "driverName": "hostpath.csi.k8s.io",
            "parameters": {"iops": "1"},
        },
    )
    # Namespace reads it needs; nothing else.
    core.list_namespaced_event(NAMESPACE)
    core.list_namespaced_pod(NAMESPACE)
    forbidden(core.list_namespaced_event, OTHER_NAMESPACE)
    forbidden(core.list_namespaced_secret, NAMESPACE)
    forbidden(core.list_namespaced_config_map, NAMESPACE)


NEEDED = [
    # (verb, group, resource, namespace, name)
    ("get", "", "persistentvolumeclaims", NAMESPACE, CLAIM),
    ("patch", "", "persistentvolumeclaims", NAMESPACE, CLAIM),
    ("list", "", "persistentvolumeclaims", NAMESPACE, CLAIM),
    ("watch", "", "persistentvolumeclaims", NAMESPACE, CLAIM),
    ("list", "", "events", NAMESPACE, None),
    ("list", "", "pods", NAMESPACE, None),
    ("get", "", "persistentvolumes", None, "pvc-anything"),
    ("get", "storage.k8s.io", "volumeattributesclasses", None, THROUGHPUT),
    # an unbound claim's StorageClass: its provisioner must be the class's driver
    ("get", "storage.k8s.io", "storageclasses", None, "gp3"),
    ("get", "coordination.k8s.io", "leases", NAMESPACE, LEASE),
    ("update", "coordination.k8s.io", "leases", NAMESPACE, LEASE),
    # create cannot be restricted by name (the name is in the body): any Lease of ml-team
    ("create", "coordination.k8s.io", "leases", NAMESPACE, None),
]
NOT_GRANTED = [
    ("update", "", "persistentvolumeclaims", NAMESPACE, CLAIM),
    ("delete", "", "persistentvolumeclaims", NAMESPACE, CLAIM),
    ("create", "", "persistentvolumeclaims", NAMESPACE, None),
    ("patch", "", "persistentvolumeclaims", NAMESPACE, BYSTANDER),
    ("get", "", "persistentvolumeclaims", OTHER_NAMESPACE, CLAIM),
    ("watch", "", "events", NAMESPACE, None),
    ("get", "", "pods", NAMESPACE, "any"),
    ("list", "", "persistentvolumes", None, None),
    ("patch", "", "persistentvolumes", None, "pvc-anything"),
    ("list", "storage.k8s.io", "volumeattributesclasses", None, None),
    ("create", "storage.k8s.io", "volumeattributesclasses", None, None),
    ("list", "storage.k8s.io", "storageclasses", None, None),
    ("watch", "storage.k8s.io", "storageclasses", None, None),
    ("patch", "storage.k8s.io", "storageclasses", None, "gp3"),
    ("get", "", "secrets", NAMESPACE, "artifacts-store-s3"),
    ("get", "coordination.k8s.io", "leases", NAMESPACE, "storage-profile-scratch"),
    ("update", "coordination.k8s.io", "leases", NAMESPACE, "storage-profile-scratch"),
    ("patch", "coordination.k8s.io", "leases", NAMESPACE, LEASE),
    ("delete", "coordination.k8s.io", "leases", NAMESPACE, LEASE),
    ("list", "coordination.k8s.io", "leases", NAMESPACE, None),
    ("watch", "coordination.k8s.io", "leases", NAMESPACE, None),
    ("create", "coordination.k8s.io", "leases", OTHER_NAMESPACE, None),
]


def self_review(api: client.ApiClient, verb, group, resource, namespace, name) -> bool:
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, group=group, resource=resource, namespace=namespace, name=name
            )
        )
    )
    return client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed


@pytest.mark.parametrize("attrs", NEEDED, ids=lambda a: f"{a[0]}-{a[2]}")
def test_every_verb_the_hook_needs_is_allowed(hook_api: client.ApiClient, attrs) -> None:
    assert self_review(hook_api, *attrs), attrs


@pytest.mark.parametrize("attrs", NOT_GRANTED, ids=lambda a: f"{a[0]}-{a[2]}-{a[4]}")
def test_nothing_more_is_allowed(hook_api: client.ApiClient, attrs) -> None:
    assert not self_review(hook_api, *attrs), attrs
