"""The admin's client of a started control plane, on the shared object layer
(checkpoint_storage_bench/kube.py): raw JSON calls and server-side apply go through its one
request path, so an answer is named once (:class:`checkpoint_storage_bench.kube.KubeError`)
and throttling is retried there.

Objects are handled as the API's JSON (camelCase dicts), like the hook does. The node
applies its ``CSIDriver`` and polls its own readiness with it; the test tiers subclass it
with their helpers (tests/kube/cluster.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import client, config

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.retry import Deadline

if TYPE_CHECKING:
    from localcluster.controlplane import ControlPlane

FIELD_MANAGER = "checkpoint-storage-bench-localcluster"


class AdminClient:
    """A system:masters client of ``plane`` (its admin kubeconfig).

    Attributes:
        kube: The object layer on the admin's credentials (field manager
            :data:`FIELD_MANAGER`).
    """

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.api = config.new_client_from_config(str(plane.admin_kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.kube = kube.Client(self.api, field_manager=FIELD_MANAGER)

    def request(self, method: str, path: str, body: Any = None, **query: str) -> Any:
        """One API call as the admin (a PATCH is a JSON merge patch); the decoded JSON body.

        Raises:
            checkpoint_storage_bench.kube.KubeError: The server's answer, named by status.
        """
        content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
        return self.kube.request(method, path, body, query=query, content_type=content_type)

    def apply(self, doc: dict, *, dry_run: bool = False, strict: bool = True) -> dict:
        """Server-side apply one object (fieldValidation=Strict: unknown fields are errors)."""
        return self.kube.apply(doc, dry_run=dry_run, strict=strict)

    def apply_file(self, path: Path, **kwargs: Any) -> list[dict]:
        """Server-side apply every object of a YAML file."""
        return self.kube.apply_file(path, **kwargs)

    def service_account_token(self, name: str, namespace: str, expiration_s: int = 3600) -> str:
        """A TokenRequest token for the ServiceAccount (what a pod's projected token is)."""
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_s},
            },
        )
        return answer["status"]["token"]

    def wait_for_default_service_account(self, namespace: str, timeout: float = 30) -> None:
        """Until the namespace's ``default`` ServiceAccount exists: the ServiceAccount
        admission refuses a pod in the namespace before it (a dry run too)."""
        self.kube.wait(
            kube.SERVICE_ACCOUNT, "default", bool, Deadline(timeout), namespace=namespace
        )
