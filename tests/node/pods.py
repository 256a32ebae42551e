"""Small pods the node tier's smoke tests run: busybox as a platform team runs jobs (non-root,
fsGroup, no privilege) in a namespace of their own under PodSecurity ``baseline``."""

from __future__ import annotations

from localcluster.node import Node, busybox_image

IMAGE = "localhost/csb-busybox:1"
NAMESPACE = "node-smoke"


def smoke_pod(name: str, command: str) -> dict:
    """A pod as a platform team runs jobs: non-root, fsGroup, no privilege, baseline PSA."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "fsGroup": 1000,
                "runAsNonRoot": True,
            },
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", command],
                    "securityContext": {"allowPrivilegeEscalation": False},
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }


def prepare(node: Node) -> None:
    node.import_image(
        busybox_image(node.state_dir / "images", "1", ["/bin/sh"]), "localhost/csb-busybox"
    )
    node.cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": NAMESPACE,
                "labels": {"pod-security.kubernetes.io/enforce": "baseline"},
            },
        }
    )
    node.cluster.wait_for_default_service_account(NAMESPACE)
