"""The operator stand-in against a real API server and controller manager (no kubelet).

A control plane of the kube tier (localcluster/controlplane.py) with the Job controller and the
garbage collector (``node=True``), on loopback; the tests play the kubelet's part by writing
pod statuses, so that the Job controller, not the test, decides the Job's outcome. Skips
(one line) when the control plane's binaries are not built, like the kube tier.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from localcluster.client import AdminClient
from localcluster.controlplane import ControlPlane
from operator_standin import crd
from tests.kube.cluster import NAMESPACE
from tests.operator_standin.objects import RecordingSink
from tests.tiers import missing, started_plane


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    tier = [item for item in items if here in item.path.parents and "kube" in item.keywords]
    if not tier or os.environ.get("CI"):
        return
    reason = missing(tier="operator_standin tier")
    if reason is None:
        return
    for item in tier:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with started_plane(f"op{os.getpid()}", tier="operator_standin tier", node=True) as plane:
        yield plane


@pytest.fixture(scope="module")
def api(plane: ControlPlane) -> client.ApiClient:
    """The admin's client, with ``ml-team`` and its default ServiceAccount."""
    admin = AdminClient(plane)
    admin.core.create_namespace({"metadata": {"name": NAMESPACE}})
    admin.wait_for_default_service_account(NAMESPACE)
    return admin.api


@pytest.fixture(scope="module")
def crds(api: client.ApiClient) -> list[str]:
    """Polyaxon's CRDs, as the stand-in installs them."""
    return crd.install(api)


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()
