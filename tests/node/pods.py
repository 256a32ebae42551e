"""Small pods the node tier's smoke tests run: busybox as a platform team runs jobs (non-root,
fsGroup, no privilege) in a namespace of their own under PodSecurity ``baseline``."""

from __future__ import annotations

from localcluster.node import Node, busybox_image

IMAGE = "localhost/csb-busybox:1"
NAMESPACE = "node-smoke"


def job_pod(
    name: str,
    command: str,
    *args: str,
    image: str = IMAGE,
    namespace: str = NAMESPACE,
    claim: str | None = None,
    mount: str = "/scratch",
) -> dict:
    """A pod as a platform team runs jobs: non-root, fsGroup, no privilege (PodSecurity
    ``baseline``); ``sh -c command args…``, with the claim, or a scratch emptyDir, at ``mount``."""
    source = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
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
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", command, *args],
                    "securityContext": {"allowPrivilegeEscalation": False},
                    "volumeMounts": [{"name": "data", "mountPath": mount}],
                }
            ],
            "volumes": [{"name": "data", **source}],
        },
    }


def baseline_namespace(node: Node, name: str = NAMESPACE) -> None:
    """The namespace under PodSecurity ``baseline``, ready for pods."""
    node.cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "labels": {"pod-security.kubernetes.io/enforce": "baseline"},
            },
        }
    )
    node.cluster.wait_for_default_service_account(name)


def prepare(node: Node) -> None:
    """The busybox image imported and the smoke namespace made."""
    node.import_image(
        busybox_image(node.state_dir / "images", "1", ["/bin/sh"]), "localhost/csb-busybox"
    )
    baseline_namespace(node)
