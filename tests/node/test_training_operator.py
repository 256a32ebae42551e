"""Kubeflow's training operator on the node (localcluster/training_operator.py): the API server
reaches its webhook on loopback, and a PyTorchJob of a master and a worker runs as two pods
whose env is what the component's torchrun line reads, the worker finding the master's
Service by name through the node's cluster DNS (localcluster/cluster_dns.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from localcluster import training_operator
from localcluster.node import Node
from tests.kube.cluster import wait_for
from tests.node.conftest import started_node
from tests.node.pods import IMAGE, NAMESPACE, prepare
from tests.tiers import binaries

PORT = 23456


@pytest.fixture(scope="module")
def node(bin_dir) -> Iterator[Node]:
    yield from started_node("pytorch", cluster_dns=True)


@pytest.fixture(scope="module")
def operator(node: Node) -> Iterator[training_operator.TrainingOperator]:
    # Skips with one line when the operator is not built; under CI builds it or fails.
    binaries(training_operator.BINARY, tier="node tier")
    prepare(node)
    cert_dir_before = training_operator.CERT_DIR.exists()
    started = training_operator.start(node)
    try:
        yield started
    finally:
        started.stop()
    assert training_operator.CERT_DIR.exists() == cert_dir_before, "the cert dir was left"


def pytorchjob(name: str, command: str, *, masters: int = 1, workers: int = 1) -> dict:
    def replica(count: int) -> dict:
        return {
            "replicas": count,
            "restartPolicy": "Never",
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "pytorch",
                            "image": IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", command],
                            "ports": [{"name": "pytorchjob-port", "containerPort": PORT}],
                        }
                    ]
                }
            },
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nprocPerNode": "1",
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {"Master": replica(masters), "Worker": replica(workers)},
        },
    }


def create(node: Node, doc: dict) -> dict:
    return client.CustomObjectsApi(node.cluster.api).create_namespaced_custom_object(
        "kubeflow.org", "v1", NAMESPACE, "pytorchjobs", doc
    )


def condition(node: Node, name: str) -> str | None:
    job = client.CustomObjectsApi(node.cluster.api).get_namespaced_custom_object(
        "kubeflow.org", "v1", NAMESPACE, "pytorchjobs", name
    )
    types = [
        c["type"] for c in job.get("status", {}).get("conditions", []) if c["status"] == "True"
    ]
    return next((t for t in ("Succeeded", "Failed") if t in types), None)


def test_the_webhook_refuses_what_only_it_checks(node: Node, operator) -> None:
    # Two masters pass the CRD's schema; only the operator's validator refuses them, so the
    # refusal proves the API server called the webhook (TLS to 127.0.0.1 verified).
    with pytest.raises(ApiException) as refused:
        create(node, pytorchjob("two-masters", "true", masters=2))
    assert refused.value.status == 403, refused.value.body
    assert "denied the request" in refused.value.body
    assert "validator.pytorchjob.training-operator.kubeflow.org" in refused.value.body
    assert "must be 1" in refused.value.body


def pod_log(node: Node, name: str) -> dict[str, str]:
    log = node.cluster.core.read_namespaced_pod_log(
        name, NAMESPACE, _preload_content=False
    ).data.decode()
    return dict(line.split("=", 1) for line in log.split() if "=" in line)


def pod_phase(node: Node, name: str) -> str | None:
    phase = node.cluster.core.read_namespaced_pod(name, NAMESPACE).status.phase
    return phase if phase in ("Succeeded", "Failed") else None


# The master listens on its port; the worker resolves the master's Service (its full name:
# busybox's nslookup does not walk the search list) and connects: what torchrun's workers do.
REACH = (
    'if [ "$RANK" = 0 ]; then busybox nc -l -p "$MASTER_PORT" </dev/null; else '
    "ns=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace); "
    'ip=$(busybox nslookup "$MASTER_ADDR.$ns.svc.cluster.local" '
    "| busybox awk '/^Address:[ \t]+[0-9.]+$/{a=$2} END{print a}'); "
    'echo MASTER_IP=$ip; busybox nc -w 10 "$ip" "$MASTER_PORT" </dev/null && echo REACHED=yes; fi'
)


def test_a_master_and_a_worker_get_the_env_torchrun_reads(node: Node, operator) -> None:
    keys = "MASTER_ADDR MASTER_PORT RANK WORLD_SIZE PET_NNODES PET_NODE_RANK PET_NPROC_PER_NODE"
    command = f"for k in {keys}; do eval echo $k=\\${{$k}}; done; {REACH}"
    create(node, pytorchjob("envcheck", command))
    try:
        outcome = wait_for("the PyTorchJob's end", lambda: condition(node, "envcheck"), timeout=120)
        # The worker starts once its init container resolved the master's name (the
        # operator's init container, through the cluster DNS), then runs to its end.
        worker_end = wait_for(
            "the worker's end", lambda: pod_phase(node, "envcheck-worker-0"), timeout=120
        )
        master, worker = pod_log(node, "envcheck-master-0"), pod_log(node, "envcheck-worker-0")
        assert (outcome, worker_end) == ("Succeeded", "Succeeded"), (master, worker)
        master_pod = node.cluster.core.read_namespaced_pod("envcheck-master-0", NAMESPACE)
        assert worker.pop("MASTER_IP") == master_pod.status.pod_ip, worker
        assert worker.pop("REACHED") == "yes", worker
        for env, rank in ((master, "0"), (worker, "1")):
            assert env == {
                "MASTER_ADDR": "envcheck-master-0",
                "MASTER_PORT": str(PORT),
                "RANK": rank,
                "WORLD_SIZE": "2",
                "PET_NNODES": "2",
                "PET_NODE_RANK": rank,
                "PET_NPROC_PER_NODE": "1",
            }, rank
        core = node.cluster.core
        service = core.read_namespaced_service("envcheck-master-0", NAMESPACE)
        assert service.spec.cluster_ip == "None"  # headless: only a DNS resolves it
        worker_pod = core.read_namespaced_pod("envcheck-worker-0", NAMESPACE)
        (init,) = worker_pod.spec.init_containers
        assert "nslookup envcheck-master-0." in " ".join(init.command)
        (init_status,) = worker_pod.status.init_container_statuses
        assert init_status.state.terminated.exit_code == 0
    finally:
        client.CustomObjectsApi(node.cluster.api).delete_namespaced_custom_object(
            "kubeflow.org", "v1", NAMESPACE, "pytorchjobs", "envcheck"
        )
