"""The operator stand-in against a real API server and controller manager (no kubelet).

A control plane of the kube tier (localcluster/controlplane.py) with the Job controller and the
garbage collector (``node=True``), on loopback; the tests play the kubelet's part by writing
pod statuses, so that the Job controller, not the test, decides the Job's outcome. Skips
(one line) when the control plane's binaries are not built, like the kube tier.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from localcluster.client import AdminClient
from localcluster.controlplane import ControlPlane, ControlPlaneError
from operator_standin import crd
from tests.kube.cluster import NAMESPACE
from tests.kube.conftest import STATE_ROOT, _binaries, _missing
from tests.operator_standin.objects import RecordingSink


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    tier = [item for item in items if here in item.path.parents and "kube" in item.keywords]
    if not tier or os.environ.get("CI"):
        return
    reason = _missing()
    if reason is None:
        return
    for item in tier:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    bin_dir = _binaries()
    state = STATE_ROOT / f"op{os.getpid()}"
    shutil.rmtree(state, ignore_errors=True)
    plane = ControlPlane(bin_dir, state, die_with_parent=True, node=True)
    try:
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"operator stand-in: the control plane did not start: {exc}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()
        if not os.environ.get("KUBE_TIER_KEEP_STATE"):
            shutil.rmtree(state, ignore_errors=True)


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
