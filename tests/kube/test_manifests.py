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

from checkpoint_storage_bench import kube
from tests.bundle.bundle import (
    AGENT_CONFIG,
    CONNECTIONS,
    JOB_FILES,
    Pod,
    compile_component,
    load_yaml_documents,
    pipeline_jobs,
)
from tests.bundle.params import KIND_OF_COMPONENT
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
    with pytest.raises(kube.KubeError) as info:
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


def dry_run_pod(cluster: Cluster, pod: Pod, name: str) -> dict:
    """Create ``pod``'s template (one replica's, for a PyTorchJob: as the operator makes it)
    as a Pod in the claim's namespace, server-side dry run."""
    manifest = copy.deepcopy(pod.as_pod())
    manifest["metadata"] = {**(manifest.get("metadata") or {}), "name": name}
    assert pod.manifest["metadata"]["namespace"] == NAMESPACE
    manifest["metadata"]["namespace"] = NAMESPACE
    return cluster.create_dry_run(manifest)


def admitted(cluster: Cluster, job: Pod, name: str) -> None:
    pods = job.replicas() if "pytorchJobSpec" in job.manifest else {"": job}
    for replica, pod in pods.items():
        pod_name = f"{name}-{replica.lower()}" if replica else name
        created = dry_run_pod(cluster, pod, pod_name)
        assert created["metadata"]["name"] == pod_name
        # Admission defaulted it like a real pod (the ServiceAccount plugin, defaults).
        assert created["spec"]["serviceAccountName"]
        assert created["status"]["phase"] == "Pending"


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_component_pods_are_admitted(cluster: Cluster, path: Path) -> None:
    _, params = KIND_OF_COMPONENT[path.parent.name]
    job = compile_component(path, params, agent_config=AGENT_CONFIG)
    admitted(cluster, job, f"{path.parent.name}-{path.stem.replace('.', '-')}")


def test_pipeline_job_pods_are_admitted(cluster: Cluster) -> None:
    """Every job of the pipeline's tree (plan, each profile's switch/fio/train, compare,
    release), compiled as the server would create it."""
    jobs = pipeline_jobs(agent_config=AGENT_CONFIG)
    assert {job.run_name for job in jobs.values()} >= {"switch", "fio", "train"}
    for index, job in enumerate(jobs.values()):
        admitted(cluster, job, f"{job.run_name}-{index}")
