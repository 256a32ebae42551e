"""`polyaxon run --queue` on the local node: Polyaxon's own agent compiles the run into a
``polyaxon.com/v1`` Job, the operator stand-in runs it as a batch Job, Polyaxon's init and
sidecar containers run in the pod, and the server shows the run's phases, logs and outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from localcluster.node import Node
from operator_standin import crd
from sandbox.pipeline import log_lines
from sandbox.server import Sandbox
from tests.agent_node.runs import (
    OWNER,
    PROJECT,
    pods_of,
    polyaxon,
    polyaxon_run,
    status,
    statuses,
    wait_done,
)
from tests.kube.cluster import NAMESPACE, wait_for

POLYAXONFILES = Path(__file__).parent / "polyaxonfiles"


def custom_object(node: Node, uuid: str) -> dict[str, Any] | None:
    try:
        return client.CustomObjectsApi(node.cluster.api).get_namespaced_custom_object(
            crd.GROUP, crd.VERSION, NAMESPACE, crd.JOB_PLURAL, f"plx-operation-{uuid}"
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_a_job_runs_through_polyaxons_agent_with_logs_and_outputs(
    node: Node, sandbox_on_node: Sandbox
) -> None:
    sb = sandbox_on_node
    uuid = polyaxon_run(sb, POLYAXONFILES / "hello.yaml")

    assert wait_done(sb, uuid) == "succeeded", (statuses(sb, uuid), sb.paths.state)
    # The operator's phases reached the server, between the server's own and the end.
    seen = statuses(sb, uuid)
    assert seen.index("scheduled") < seen.index("starting") < seen.index("running"), seen
    assert seen[-1] == "succeeded", seen
    # The log came from the pod (its hostname is the Job's pod) through Polyaxon's sidecar.
    lines = wait_for("the run's logs", lambda: log_lines(sb.client, OWNER, PROJECT, uuid))
    (hello,) = [line for line in lines if line.startswith("hello from")]
    assert hello.startswith(f"hello from plx-operation-{uuid}-"), hello
    assert hello.endswith(f"run {OWNER}.{PROJECT}.runs.{uuid}"), hello
    # The sidecar synced the outputs into the artifacts store, where the server reads them.
    answer = sb.paths.server_data / uuid / "outputs" / "answer.txt"
    assert wait_for("the synced output", answer.exists), answer
    assert answer.read_text() == "42\n"
    # Done: the stand-in removed the object, the garbage collector the Job and its pod.
    wait_for("the object removed", lambda: custom_object(node, uuid) is None, timeout=60)
    wait_for("the pods removed", lambda: not pods_of(node, uuid), timeout=60)


def test_a_failing_job_fails_the_run_with_its_log(node: Node, sandbox_on_node: Sandbox) -> None:
    sb = sandbox_on_node
    uuid = polyaxon_run(sb, POLYAXONFILES / "fails.yaml")
    assert wait_done(sb, uuid) == "failed", statuses(sb, uuid)
    lines = wait_for("the run's logs", lambda: log_lines(sb.client, OWNER, PROJECT, uuid))
    assert "about to fail" in lines


def test_stopping_a_run_stops_its_pod(node: Node, sandbox_on_node: Sandbox) -> None:
    sb = sandbox_on_node
    uuid = polyaxon_run(sb, POLYAXONFILES / "sleeps.yaml")
    wait_for("running", lambda: status(sb, uuid) == "running", timeout=180, interval=1.0)
    done = polyaxon(sb, "ops", "stop", "-p", f"{OWNER}/{PROJECT}", "-uid", uuid, "-y")
    assert done.returncode == 0, done.stdout + done.stderr
    assert wait_done(sb, uuid, timeout=120) == "stopped", statuses(sb, uuid)
    wait_for("the object removed", lambda: custom_object(node, uuid) is None, timeout=60)
    wait_for("the pods removed", lambda: not pods_of(node, uuid), timeout=90)


@pytest.mark.parametrize("name", ["plx-agent", "operator"])
def test_the_processes_run_until_stop(sandbox_on_node: Sandbox, name: str) -> None:
    from sandbox.processes import read_pid

    assert read_pid(sandbox_on_node.paths.state / f"{name}.pid")
