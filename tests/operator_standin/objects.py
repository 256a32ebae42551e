"""What the operator stand-in's tests hand it and read back: Polyaxon's custom objects as its
agent makes them, a sink for the phases the stand-in reports, and the custom objects (Polyaxon's
and the training operator's PyTorchJob) created, read and deleted in the test namespace."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from operator_standin import crd
from tests.kube.cluster import NAMESPACE

PYTORCHJOBS = "pytorchjobs"
"""The training operator's plural (``kubeflow.org/v1``); every other plural is Polyaxon's."""

COMPONENT = """
kind: component
name: hello
run:
  kind: job
  container:
    image: localhost/csb-debian-base:bookworm
    command: [python3, -c, "print('hello')"]
"""


def polyaxon_object(component: str = COMPONENT, **plugins: bool) -> dict[str, Any]:
    """A ``polyaxon.com/v1`` Job as Polyaxon's agent makes it: its converter, an agent config
    with the namespace and a host-path artifacts store."""
    from kubernetes.client import ApiClient
    from polyaxon import settings
    from polyaxon._schemas.agent import AgentConfig
    from polyaxon.k8s import Executor
    from polyaxon.polyaxonfile import check_polyaxonfile

    previous = settings.AGENT_CONFIG
    settings.AGENT_CONFIG = AgentConfig.read(
        {
            "namespace": NAMESPACE,
            "artifactsStore": {
                "name": "artifacts-store",
                "kind": "host_path",
                "schema": {"hostPath": "/tmp/plx-store", "mountPath": "/plx-store"},
            },
            "connections": [],
        }
    )
    settings.AGENT_CONFIG.set_artifacts_store_name()
    spec = yaml.safe_load(component)
    if plugins:
        spec["plugins"] = plugins
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "component.yaml"
            path.write_text(yaml.safe_dump(spec))
            op = check_polyaxonfile(polyaxonfile=str(path), is_cli=False, verbose=False)
        obj = Executor.make_and_convert(
            owner_name="acme",
            project_name="demo",
            run_uuid=uuid.uuid4().hex,
            run_name="hello",
            content=op.to_json(),
            default_auth=False,
        )
    finally:
        settings.AGENT_CONFIG = previous
    return ApiClient().sanitize_for_serialization(obj)


class RecordingSink:
    """Stands for the Polyaxon API's status endpoint: what would have been posted."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, str, str, str]] = []

    def report(self, owner: str, project: str, uuid: str, condition: dict[str, Any]) -> None:
        self.posts.append((owner, project, uuid, condition["type"], condition.get("reason", "")))

    def types(self, run_uuid: str) -> list[str]:
        return [p[3] for p in self.posts if p[2] == run_uuid]


def run_uuid_of(obj: dict[str, Any]) -> str:
    """The run an object of Polyaxon's agent stands for (the label its pods carry too)."""
    return obj["metadata"]["labels"]["app.kubernetes.io/instance"]


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def _group_version(plural: str) -> tuple[str, str]:
    return ("kubeflow.org", "v1") if plural == PYTORCHJOBS else (crd.GROUP, crd.VERSION)


def create(api: client.ApiClient, obj: dict[str, Any], plural: str = crd.JOB_PLURAL) -> str:
    """Create ``obj`` as Polyaxon's agent does; its name."""
    custom(api).create_namespaced_custom_object(*_group_version(plural), NAMESPACE, plural, obj)
    return obj["metadata"]["name"]


def read(api: client.ApiClient, name: str, plural: str = crd.JOB_PLURAL) -> dict[str, Any] | None:
    """The object, or None when there is none."""
    try:
        return custom(api).get_namespaced_custom_object(
            *_group_version(plural), NAMESPACE, plural, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def delete(api: client.ApiClient, name: str, plural: str = crd.JOB_PLURAL) -> None:
    """Delete the object, as the agent's stop does."""
    custom(api).delete_namespaced_custom_object(*_group_version(plural), NAMESPACE, plural, name)
