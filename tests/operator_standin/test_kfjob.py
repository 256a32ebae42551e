"""The operator stand-in's PyTorchJob path: the ``KfJob`` Polyaxon's agent makes for a
``kind: pytorchjob`` run becomes a ``kubeflow.org/v1`` PyTorchJob as mloperator writes it, the
job's conditions become the run's phases, and deleting the object stops the job."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from operator_standin import crd
from operator_standin.controller import (
    FAILED,
    RUNNING,
    SUCCEEDED,
    WARNING,
    Controller,
    Reconciler,
    kfjob_phase,
    pytorchjob_manifest,
)
from tests.kube.cluster import NAMESPACE, wait_for
from tests.operator_standin.objects import (
    PYTORCHJOBS,
    RecordingSink,
    create,
    custom,
    delete,
    polyaxon_object,
    read,
    run_uuid_of,
)

COMPONENT = """
kind: component
name: ddp
run:
  kind: pytorchjob
  cleanPodPolicy: Running
  nProcPerNode: 1
  master:
    replicas: 1
    environment: {restartPolicy: ExitCode, labels: {role: master}}
    container:
      image: localhost/csb-debian-base:bookworm
      command: [torchrun, --nnodes, "2", --node-rank, $(RANK), -m, trainer]
  worker:
    replicas: 1
    container:
      image: localhost/csb-debian-base:bookworm
      command: [torchrun, --nnodes, "2", --node-rank, $(RANK), -m, trainer]
"""


def kfjob(**plugins: bool) -> dict[str, Any]:
    return polyaxon_object(COMPONENT, **plugins)


# -- pure ------------------------------------------------------------------------------------


def test_the_agent_writes_a_kfjob_with_one_template_per_replica_type() -> None:
    obj = kfjob()
    assert obj["kind"] == crd.KFJOB_KIND and obj["apiVersion"] == crd.API_VERSION
    spec = obj["pytorchJobSpec"]
    assert set(spec["replicaSpecs"]) == {"Master", "Worker"}
    assert spec["cleanPodPolicy"] == "Running"


def test_the_pytorchjob_takes_the_replicas_labels_and_termination() -> None:
    obj = kfjob()
    obj["metadata"]["uid"] = "u-1"
    obj["termination"] = {"backoffLimit": 2, "activeDeadlineSeconds": 600}
    job = pytorchjob_manifest(obj)
    meta = obj["metadata"]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert job["metadata"]["name"] == meta["name"]
    assert job["metadata"]["labels"] == meta["labels"]
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("KfJob", "u-1", True)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    master = replicas["Master"]
    assert master["replicas"] == 1 and master["restartPolicy"] == "ExitCode"
    pod_labels = master["template"]["metadata"]["labels"]
    assert pod_labels["role"] == "master"  # the replica's own
    assert pod_labels["app.kubernetes.io/instance"] == meta["labels"]["app.kubernetes.io/instance"]
    source = obj["pytorchJobSpec"]["replicaSpecs"]["Master"]["template"]["spec"]
    assert master["template"]["spec"] == source
    assert job["spec"]["runPolicy"] == {
        "backoffLimit": 2,
        "activeDeadlineSeconds": 600,
        "cleanPodPolicy": "Running",
    }
    # mloperator drops the agent's nProcPerNode (it reads nprocPerNode, and copies neither).
    assert "nprocPerNode" not in job["spec"] and "nProcPerNode" not in job["spec"]


def test_without_termination_a_failed_pod_fails_the_job() -> None:
    obj = kfjob()
    obj["metadata"]["uid"] = "u-2"
    obj.pop("termination", None)
    assert pytorchjob_manifest(obj)["spec"]["runPolicy"]["backoffLimit"] == 0


def condition(kind: str, reason: str = "r", message: str = "m") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


def test_the_jobs_last_condition_is_the_runs_phase() -> None:
    def phase(*kinds: str) -> str | None:
        found = kfjob_phase({"status": {"conditions": [condition(k) for k in kinds]}}, [])
        return found[0] if found else None

    assert phase() is None
    assert phase("Created") == RUNNING
    assert phase("Created", "Running") == RUNNING
    assert phase("Created", "Running", "Succeeded") == SUCCEEDED
    assert phase("Created", "Running", "Failed") == FAILED
    assert phase("Created", "Running", "Restarting") == WARNING
    failed = kfjob_phase({"status": {"conditions": [condition("Failed", "BackoffLimit", "x")]}}, [])
    assert failed == (FAILED, "BackoffLimit", "x")


# -- against the API server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def pytorchjob_crd(api: client.ApiClient) -> None:
    """The training operator's PyTorchJob CRD, from its pinned module (no operator runs: the
    tests write the job's conditions as it would)."""
    from localcluster import training_operator

    try:
        definitions = training_operator.crds()
    except training_operator.TrainingOperatorError as exc:
        pytest.skip(f"operator stand-in: the training operator's module: {exc}")
    ext = client.ApiextensionsV1Api(api)
    for body in definitions:
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
        wait_for(
            "the PyTorchJob CRD",
            lambda name=body["metadata"]["name"]: any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition(name).status.conditions or []
            ),
        )


@pytest.fixture
def controller(
    api: client.ApiClient, crds: list[str], pytorchjob_crd: None, sink: RecordingSink
) -> Iterator[Controller]:
    ctl = Controller(Reconciler(api, NAMESPACE, sink, crd.KFJOB_PLURAL), resync=0.5).start()
    yield ctl
    ctl.stop()


def operator_reports(api: client.ApiClient, name: str, *kinds: str) -> None:
    """What the training operator would write to the PyTorchJob's status."""
    custom(api).patch_namespaced_custom_object_status(
        "kubeflow.org",
        "v1",
        NAMESPACE,
        PYTORCHJOBS,
        name,
        {"status": {"conditions": [condition(k) for k in kinds]}},
    )


@pytest.mark.kube
def test_the_kfjob_crd_accepts_what_polyaxons_agent_creates(api: client.ApiClient, crds) -> None:
    obj = kfjob()
    name = create(api, obj, crd.KFJOB_PLURAL)
    stored = read(api, name, crd.KFJOB_PLURAL)
    assert stored["pytorchJobSpec"] == obj["pytorchJobSpec"]
    delete(api, name, crd.KFJOB_PLURAL)


@pytest.mark.kube
def test_a_kfjob_runs_as_a_pytorchjob_and_reports_its_phases(
    api: client.ApiClient, controller: Controller, sink: RecordingSink
) -> None:
    obj = kfjob()
    run_uuid = run_uuid_of(obj)
    name = create(api, obj, crd.KFJOB_PLURAL)
    job = wait_for("the PyTorchJob", lambda: read(api, name, PYTORCHJOBS))
    assert job["metadata"]["ownerReferences"][0]["kind"] == "KfJob"
    wait_for("Starting", lambda: sink.types(run_uuid) == ["Starting"])
    operator_reports(api, name, "Created", "Running")
    wait_for("Running", lambda: sink.types(run_uuid) == ["Starting", "Running"])
    operator_reports(api, name, "Created", "Running", "Succeeded")
    wait_for("the object deleted", lambda: read(api, name, crd.KFJOB_PLURAL) is None, timeout=30)
    assert sink.types(run_uuid) == ["Starting", "Running", "Succeeded"]


@pytest.mark.kube
def test_deleting_the_kfjob_stops_the_pytorchjob(
    api: client.ApiClient, controller: Controller, sink: RecordingSink
) -> None:
    obj = kfjob()
    run_uuid = run_uuid_of(obj)
    name = create(api, obj, crd.KFJOB_PLURAL)
    wait_for("the PyTorchJob", lambda: read(api, name, PYTORCHJOBS))
    operator_reports(api, name, "Created", "Running")
    wait_for("Running", lambda: "Running" in sink.types(run_uuid))
    # The agent's stop: delete the custom object.
    delete(api, name, crd.KFJOB_PLURAL)
    wait_for("the object gone", lambda: read(api, name, crd.KFJOB_PLURAL) is None, timeout=30)
    wait_for("the PyTorchJob gone", lambda: read(api, name, PYTORCHJOBS) is None, timeout=30)
    assert sink.types(run_uuid)[-1] == "Stopped"
