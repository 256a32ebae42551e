"""The bundle's manifests and compiled pods, as the real API server validates and admits them.

Every object is created with ``dryRun=All`` and ``fieldValidation=Strict``: decoding (unknown
or duplicate fields are errors), defaulting, validation and admission all run; nothing is
stored. The copies get a ``-validate`` name suffix so objects the tier already applied (the
hostpath classes, the RBAC, the claim) or that would conflict with them (the EBS and GKE
classes of the same names) are validated as new objects, not rejected as already existing.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from tests.bundle.bundle import (
    AGENT_CONFIG,
    COMPONENTS,
    CONNECTIONS,
    compile_component,
    load_dag,
    load_yaml_documents,
)
from tests.kube.cluster import NAMESPACE, Cluster, is_manifest

pytestmark = pytest.mark.kube

YAML_FILES = sorted([*CONNECTIONS.rglob("*.yaml"), *CONNECTIONS.rglob("*.yml")])
MANIFEST_FILES = [p for p in YAML_FILES if any(map(is_manifest, load_yaml_documents(p)))]


def renamed(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["metadata"]["name"] += "-validate"
    return doc


def test_some_files_are_not_kubernetes_objects() -> None:
    # The agent configs and the sandbox profiles are Polyaxon/bench config, not objects.
    skipped = {p.name for p in YAML_FILES} - {p.name for p in MANIFEST_FILES}
    assert {"agent-config.yaml", "agent-config-gcs.yaml"} <= skipped
    assert "claim-training-checkpoints.yaml" in {p.name for p in MANIFEST_FILES}


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda p: p.name)
def test_every_manifest_is_accepted_by_the_server(cluster: Cluster, path: Path) -> None:
    for doc in filter(is_manifest, load_yaml_documents(path)):
        created = cluster.create_dry_run(renamed(doc))
        assert created["kind"] == doc["kind"]
        assert created["metadata"]["name"] == doc["metadata"]["name"] + "-validate"


def test_strict_field_validation_rejects_a_misspelled_field(cluster: Cluster) -> None:
    (claim,) = load_yaml_documents(CONNECTIONS / "claim-training-checkpoints.yaml")
    bad = renamed(claim)
    bad["spec"]["volumeAttributeClassName"] = bad["spec"].pop("volumeAttributesClassName")
    with pytest.raises(ApiException) as info:
        cluster.create_dry_run(bad)
    assert info.value.status == 400, info.value
    message = json.loads(info.value.body)["message"]
    assert 'strict decoding error: unknown field "spec.volumeAttributeClassName"' in message


def test_a_shipped_manifest_applies_server_side(cluster: Cluster) -> None:
    # Server-side apply (dry run) of the shipped claim as it is, strict.
    (claim,) = load_yaml_documents(CONNECTIONS / "claim-training-checkpoints.yaml")
    applied = cluster.apply(renamed(claim), dry_run=True)
    assert applied["spec"]["volumeAttributesClassName"] == "checkpoint-baseline"


# -- the pods the components compile to ----------------------------------------------------

PARAMS = {
    "checkpoint-training": {"storage_profile": "checkpoint-baseline"},
    "storage-profile": {"target_class": "checkpoint-throughput"},
    "fio-sweep": {},
    "checkpoint-compare": {"pipeline": "0" * 32},
}
COMPONENT_FILES = sorted(COMPONENTS.glob("*/*.yaml"))


def dry_run_pod(cluster: Cluster, manifest: dict, name: str) -> dict:
    template = manifest["batchJobSpec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**copy.deepcopy(template.get("metadata") or {}), "name": name},
        "spec": copy.deepcopy(template["spec"]),
    }
    assert manifest["metadata"]["namespace"] == NAMESPACE
    pod["metadata"]["namespace"] = NAMESPACE
    return cluster.create_dry_run(pod)


@pytest.mark.parametrize("path", COMPONENT_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_component_pods_are_admitted(cluster: Cluster, path: Path) -> None:
    pod = compile_component(path, PARAMS[path.parent.name], agent_config=AGENT_CONFIG)
    name = f"{path.parent.name}-{path.stem.replace('.', '-')}"
    created = dry_run_pod(cluster, pod.manifest, name)
    assert created["metadata"]["name"] == name
    # Admission defaulted it like a real pod (the ServiceAccount plugin, defaults).
    assert created["spec"]["serviceAccountName"]
    assert created["status"]["phase"] == "Pending"


def test_pipeline_op_pods_are_admitted(cluster: Cluster) -> None:
    dag = load_dag()
    for op in dag.order():
        created = dry_run_pod(cluster, dag.compile_op(op).manifest, op)
        assert created["metadata"]["name"] == op
