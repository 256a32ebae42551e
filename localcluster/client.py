"""The admin's client of a started control plane: raw JSON calls and server-side apply.

Objects are handled as the API's JSON (camelCase dicts), like the hook does. The node
applies its ``CSIDriver`` and polls its own readiness with it; the test tiers subclass it
with their helpers (tests/kube/cluster.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kubernetes import client, config
from kubernetes.dynamic import DynamicClient

if TYPE_CHECKING:
    from localcluster.controlplane import ControlPlane

FIELD_MANAGER = "checkpoint-storage-bench-localcluster"


class AdminClient:
    """A system:masters client of ``plane`` (its admin kubeconfig)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.api = config.new_client_from_config(str(plane.admin_kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.storage = client.StorageV1Api(self.api)
        self.dynamic = DynamicClient(self.api)

    def request(self, method: str, path: str, body: Any = None, **query: str) -> Any:
        """One API call as the admin; returns the decoded JSON body (raises ApiException)."""
        headers = {"Accept": "application/json"}
        if method == "PATCH":
            headers["Content-Type"] = "application/merge-patch+json"
        elif body is not None:
            headers["Content-Type"] = "application/json"
        resp = self.api.call_api(
            path,
            method,
            query_params=list(query.items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        data = resp.data
        return json.loads(data) if data else None

    def apply(self, doc: dict, *, dry_run: bool = False, strict: bool = True) -> dict:
        """Server-side apply one object (fieldValidation=Strict: unknown fields are errors)."""
        resource = self.dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        kwargs: dict[str, Any] = {
            "field_manager": FIELD_MANAGER,
            "force_conflicts": True,
            "query_params": [("fieldValidation", "Strict" if strict else "Ignore")],
        }
        if dry_run:
            kwargs["dry_run"] = "All"
        return self.dynamic.server_side_apply(resource, body=doc, **kwargs).to_dict()
