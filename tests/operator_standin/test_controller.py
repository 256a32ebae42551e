"""The operator stand-in: Polyaxon's own custom objects in, batch Jobs and phases out."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from operator_standin.controller import (
    FINALIZERS,
    Controller,
    Reconciler,
    job_manifest,
    log_condition,
)
from tests.kube.cluster import NAMESPACE, wait_for
from tests.operator_standin.objects import (
    COMPONENT,
    RecordingSink,
    create,
    delete,
    polyaxon_object,
    read,
    run_uuid_of,
)


@pytest.fixture
def controller(api: client.ApiClient, crds: list[str], sink: RecordingSink) -> Iterator[Controller]:
    ctl = Controller(Reconciler(api, NAMESPACE, sink), resync=0.5).start()
    yield ctl
    ctl.stop()


def conditions(api: client.ApiClient, name: str) -> list[str]:
    obj = read(api, name) or {}
    return [c["type"] for c in (obj.get("status") or {}).get("conditions") or []]


def batch_job(api: client.ApiClient, name: str) -> Any:
    try:
        return client.BatchV1Api(api).read_namespaced_job(name, NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def the_pod(api: client.ApiClient, name: str) -> Any:
    pods = (
        client.CoreV1Api(api)
        .list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={name}")
        .items
    )
    return pods[0] if len(pods) == 1 else None


def kubelet_reports(api: client.ApiClient, pod: Any, phase: str, exit_code: int = 0) -> None:
    """What a kubelet would write for the pod: its phase and its containers' states."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    names = [c.name for c in pod.spec.containers]
    if phase == "Running":
        state: dict[str, Any] = {"running": {"startedAt": stamp}}
    else:
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": stamp,
                "finishedAt": stamp,
            }
        }
    status = {
        "phase": phase,
        "startTime": stamp,
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {
                "name": n,
                "image": "x",
                "imageID": "",
                "ready": phase == "Running",
                "restartCount": 0,
                "state": state,
            }
            for n in names
        ],
    }
    client.CoreV1Api(api).patch_namespaced_pod_status(
        pod.metadata.name, NAMESPACE, {"status": status}
    )


# -- pure ------------------------------------------------------------------------------------


def test_a_condition_is_logged_once_and_replaced_by_type() -> None:
    status: dict[str, Any] = {}
    assert log_condition(status, "Starting", "r", "m")
    assert not log_condition(status, "Starting", "r", "m")  # no change
    assert log_condition(status, "Running", "r", "m")
    assert log_condition(status, "Warning", "Unschedulable", "no node")
    assert log_condition(status, "Running", "r", "m")  # back: the old Running goes
    assert [c["type"] for c in status["conditions"]] == ["Starting", "Warning", "Running"]
    assert log_condition(status, "Succeeded", "r", "m")
    assert log_condition(status, "Succeeded", "r", "m")  # final conditions always update


def test_the_batch_job_takes_the_objects_template_and_termination() -> None:
    obj = polyaxon_object()
    obj["metadata"]["uid"] = "u-1"
    obj["termination"] = {"backoffLimit": 2, "activeDeadlineSeconds": 60}
    job = job_manifest(obj)
    assert job["metadata"]["name"] == obj["metadata"]["name"]
    assert job["metadata"]["ownerReferences"][0] == {
        "apiVersion": "polyaxon.com/v1",
        "kind": "Job",
        "name": obj["metadata"]["name"],
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert job["spec"]["backoffLimit"] == 2
    assert job["spec"]["activeDeadlineSeconds"] == 60
    template = job["spec"]["template"]
    assert template["spec"]["restartPolicy"] == "Never"
    names = [c["name"] for c in template["spec"]["containers"]]
    assert names == ["polyaxon-main", "polyaxon-sidecar"]
    labels = template["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == run_uuid_of(obj)


FINAL_UNLESS_5 = """
termination:
  maxRetries: 2
  podFailurePolicy:
    rules:
      - action: FailJob
        onExitCodes: {containerName: polyaxon-main, operator: NotIn, values: [5]}
"""
"""The training component's policy, shortened: retried only on exit code 5."""


def test_the_batch_job_keeps_the_pod_failure_policy() -> None:
    obj = polyaxon_object(COMPONENT + FINAL_UNLESS_5)
    obj["metadata"]["uid"] = "u-1"
    job = job_manifest(obj)
    assert job["spec"]["backoffLimit"] == 2
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"] == {
        "containerName": "polyaxon-main", "operator": "NotIn", "values": [5]}  # fmt: skip


# -- against the API server ------------------------------------------------------------------


@pytest.mark.kube
def test_the_crds_accept_what_polyaxons_agent_creates(api: client.ApiClient, crds) -> None:
    assert crds == ["jobs.polyaxon.com", "services.polyaxon.com", "kfjobs.polyaxon.com"]
    obj = polyaxon_object()
    name = create(api, obj)
    stored = read(api, name)
    assert stored["batchJobSpec"]["template"] == obj["batchJobSpec"]["template"]
    assert stored["syncStatuses"] is True and stored["collectLogs"] is True
    delete(api, name)


@pytest.mark.kube
def test_a_run_goes_starting_running_succeeded_and_is_cleaned_up(
    api: client.ApiClient, controller: Controller, sink: RecordingSink
) -> None:
    obj = polyaxon_object()
    run_uuid = run_uuid_of(obj)
    name = create(api, obj)

    job = wait_for("the batch Job", lambda: batch_job(api, name))
    assert job.metadata.owner_references[0].kind == "Job"
    assert job.metadata.owner_references[0].api_version == "polyaxon.com/v1"
    assert set(FINALIZERS) <= set(read(api, name)["metadata"]["finalizers"])
    wait_for("Starting", lambda: conditions(api, name) == ["Starting"])
    pod = wait_for("the Job controller's pod", lambda: the_pod(api, name))
    assert pod.metadata.labels["app.kubernetes.io/instance"] == run_uuid

    kubelet_reports(api, pod, "Running")
    wait_for("Running", lambda: conditions(api, name) == ["Starting", "Running"])
    kubelet_reports(api, the_pod(api, name), "Succeeded")

    # Done: the Job controller completes the Job, the stand-in records it and deletes the
    # object; the garbage collector takes the Job and its pod.
    wait_for("the object deleted", lambda: read(api, name) is None, timeout=30)
    wait_for("the Job collected", lambda: batch_job(api, name) is None, timeout=30)
    assert sink.types(run_uuid) == ["Starting", "Running", "Succeeded"]
    assert all(p[:2] == ("acme", "demo") for p in sink.posts)


@pytest.mark.kube
def test_a_failed_container_fails_the_run(
    api: client.ApiClient, controller: Controller, sink: RecordingSink
) -> None:
    obj = polyaxon_object()
    run_uuid = run_uuid_of(obj)
    name = create(api, obj)
    pod = wait_for("the pod", lambda: the_pod(api, name))
    kubelet_reports(api, pod, "Failed", exit_code=3)
    wait_for("the object deleted", lambda: read(api, name) is None, timeout=30)
    assert sink.types(run_uuid)[-1] == "Failed"
    assert "Stopped" not in sink.types(run_uuid)


@pytest.mark.kube
def test_deleting_the_object_stops_the_run(
    api: client.ApiClient, controller: Controller, sink: RecordingSink
) -> None:
    obj = polyaxon_object()
    run_uuid = run_uuid_of(obj)
    name = create(api, obj)
    pod = wait_for("the pod", lambda: the_pod(api, name))
    kubelet_reports(api, pod, "Running")
    wait_for("Running", lambda: "Running" in conditions(api, name))

    # What the agent's stop does (executor.stop): delete the custom object.
    delete(api, name)
    wait_for("the object gone", lambda: read(api, name) is None, timeout=30)
    wait_for("the Job gone", lambda: batch_job(api, name) is None, timeout=30)
    assert sink.types(run_uuid)[-1] == "Stopped"


@pytest.mark.kube
def test_an_unschedulable_pod_is_a_warning(
    api: client.ApiClient, controller: Controller, sink: RecordingSink
) -> None:
    obj = polyaxon_object()
    run_uuid = run_uuid_of(obj)
    name = create(api, obj)
    pod = wait_for("the pod", lambda: the_pod(api, name))
    client.CoreV1Api(api).patch_namespaced_pod_status(
        pod.metadata.name,
        NAMESPACE,
        {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes are available",
                    }
                ]
            }
        },
    )
    wait_for("Warning", lambda: conditions(api, name)[-1:] == ["Warning"])
    last = read(api, name)["status"]["conditions"][-1]
    assert (last["reason"], last["message"]) == ("Unschedulable", "0/1 nodes are available")
    assert sink.types(run_uuid)[-1] == "Warning"
    delete(api, name)
    wait_for("the object gone", lambda: read(api, name) is None, timeout=30)


@pytest.mark.kube
def test_a_pod_template_the_api_refuses_fails_the_run(
    api: client.ApiClient, controller: Controller, sink: RecordingSink
) -> None:
    obj = polyaxon_object()
    run_uuid = run_uuid_of(obj)
    obj["batchJobSpec"]["template"]["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    name = create(api, obj)
    wait_for("the object deleted", lambda: read(api, name) is None, timeout=30)
    assert sink.types(run_uuid)[-1] == "Failed"
    assert batch_job(api, name) is None


@pytest.mark.kube
def test_a_ttl_keeps_the_done_object_until_it_passes(
    api: client.ApiClient, controller: Controller
) -> None:
    obj = polyaxon_object()
    obj["termination"] = {"ttlSecondsAfterFinished": 4}
    name = create(api, obj)
    pod = wait_for("the pod", lambda: the_pod(api, name))
    kubelet_reports(api, pod, "Succeeded")
    wait_for("Succeeded", lambda: conditions(api, name)[-1:] == ["Succeeded"], timeout=30)
    assert read(api, name) is not None
    wait_for("the object deleted after its TTL", lambda: read(api, name) is None, timeout=30)


@pytest.mark.kube
def test_a_final_exit_code_fails_the_run_without_another_pod(
    api: client.ApiClient, controller: Controller, sink: RecordingSink
) -> None:
    obj = polyaxon_object(COMPONENT + FINAL_UNLESS_5)
    run_uuid = run_uuid_of(obj)
    name = create(api, obj)
    job = wait_for("the batch Job", lambda: batch_job(api, name))
    assert job.spec.pod_failure_policy.rules[0].action == "FailJob"  # the API server took it
    pod = wait_for("the pod", lambda: the_pod(api, name))
    kubelet_reports(api, pod, "Failed", exit_code=3)
    wait_for("the object deleted", lambda: read(api, name) is None, timeout=30)
    assert sink.types(run_uuid)[-1] == "Failed"
    pods = client.CoreV1Api(api).list_namespaced_pod(
        NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={name}"
    )
    assert len(pods.items) <= 1, [p.metadata.name for p in pods.items]  # no retry
