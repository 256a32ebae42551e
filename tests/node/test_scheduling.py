"""WaitForFirstConsumer done by the real scheduler: the shipped claim, a pod that uses it,
and no test setting ``volume.kubernetes.io/selected-node``."""

from __future__ import annotations

from localcluster.controlplane import NODE_NAME
from localcluster.node import Node
from tests.kube.cluster import CLAIM, CLASSES_FILE, NAMESPACE, STORAGE_CLASS_FILE, wait_for
from tests.node.pods import IMAGE


def test_the_scheduler_selects_the_node_and_the_claim_is_provisioned(node: Node) -> None:
    cluster = node.cluster
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    cluster.apply_file(STORAGE_CLASS_FILE)
    cluster.apply_file(CLASSES_FILE)
    cluster.apply(cluster.shipped_claim())
    cluster.wait_for_default_service_account(NAMESPACE)
    claim = cluster.claim()
    assert claim["status"]["phase"] == "Pending"
    assert "volume.kubernetes.io/selected-node" not in claim["metadata"].get("annotations", {})

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "consumer", "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "df /data"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
        },
    }
    cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    def bound() -> dict | None:
        got = cluster.claim()
        return got if got["status"].get("phase") == "Bound" else None

    claim = wait_for("the claim bound", bound, timeout=90)
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == NODE_NAME
    # The scheduler binds the claim's volume (PreBind), then the pod.
    placed = wait_for(
        "the pod bound to the node",
        lambda: cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/consumer")["spec"].get(
            "nodeName"
        ),
    )
    assert placed == NODE_NAME
    pv = cluster.pv(claim["spec"]["volumeName"])
    assert pv["spec"]["csi"]["driver"] == "hostpath.csi.k8s.io"
    assert pv["spec"]["volumeAttributesClassName"] == "checkpoint-baseline"
    reasons = [e["reason"] for e in cluster.events(CLAIM)]
    assert "WaitForFirstConsumer" in reasons and "ProvisioningSucceeded" in reasons, reasons
