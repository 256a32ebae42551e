"""The `kube` tier: one real control plane on 127.0.0.1 for the whole session.

Binaries come from scripts/controlplane.sh's cache. When they are not built the tier skips
with one line saying what is missing, unless ``CI`` is set: then the fixture builds them
(``scripts/controlplane.sh build``) or fails.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.controlplane import ControlPlane, ControlPlaneError, stop_recorded
from localcluster.ebs import DRIVER_BINARY, EbsChain
from tests.kube.cluster import BASELINE, CLAIM, NAMESPACE, REPO, Cluster, wait_for
from tests.kube.ebs_cluster import EbsCluster
from tests.tiers import STATE_ROOT, binaries, missing, started_plane

# The EBS chain's session dirs: ebs-<pytest pid> (its own control plane and driver chain).
EBS_PREFIX = "ebs-"


class _TierSkipped(pytest.Item):
    """Stands for the whole tier when it cannot run: one SKIPPED line instead of one per test."""

    def __init__(self, *, reason: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.reason = reason
        self.add_marker(pytest.mark.kube)

    def runtest(self) -> None:
        pytest.skip(self.reason)

    def reportinfo(self):
        return self.path, None, "kube tier"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the stand-in is marked `kube` too
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    tier = [item for item in items if here in item.path.parents]
    if not tier or os.environ.get("CI"):
        return  # under CI the fixture builds (or fails) instead of skipping
    reason = missing()
    name = "kube-tier"
    if reason is None:
        # The tier runs; the EBS chain's tests stand aside together when its driver is missing.
        ebs = [item for item in tier if "ebs" in getattr(item, "fixturenames", ())]
        reason = missing(DRIVER_BINARY) if ebs else None
        if reason is None:
            return
        tier, name = ebs, "ebs-chain"
    parent = tier[0].parent
    while parent is not None and parent.path != here:
        parent = parent.parent
    stand_in = _TierSkipped.from_parent(parent or tier[0].parent, name=name, reason=reason)
    items[items.index(tier[0])] = stand_in
    for item in tier[1:]:
        items.remove(item)
    config.hook.pytest_deselected(items=tier)


def _clean_stale_sessions() -> None:
    """Stop what earlier, killed sessions left (their pytest pid is gone)."""
    if not STATE_ROOT.exists():
        return
    for session in STATE_ROOT.iterdir():
        if session.name.isdigit() and not Path(f"/proc/{session.name}").exists():
            stop_recorded(session)
            shutil.rmtree(session, ignore_errors=True)
        pid = session.name.removeprefix(EBS_PREFIX)
        if pid != session.name and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stop_recorded(session / "ebs")
            stop_recorded(session / "plane")
            shutil.rmtree(session, ignore_errors=True)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    binaries()
    _clean_stale_sessions()
    with started_plane(str(os.getpid())) as plane:
        yield plane


@pytest.fixture(scope="session")
def cluster(control_plane: ControlPlane) -> Cluster:
    """The admin client, with the namespace, node, StorageClass, classes and RBAC applied."""
    cluster = Cluster(control_plane)
    cluster.bootstrap()
    cluster.wait_for_default_service_account(NAMESPACE)
    return cluster


@pytest.fixture(scope="session")
def hook_kubeconfig(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig with a TokenRequest token of the shipped storage-profile-hook account."""
    return cluster.service_account_kubeconfig(tmp_path_factory.mktemp("sa") / "kubeconfig")


@pytest.fixture
def claim(cluster: Cluster) -> dict:
    """training-checkpoints in ml-team: Bound and settled on checkpoint-baseline.

    Reused when a previous test left it so; otherwise deleted and created again.
    """
    settled = cluster.settled(BASELINE)
    if settled is not None:
        return settled
    cluster.delete_claim(CLAIM, NAMESPACE)
    cluster.create_bound_claim(CLAIM, NAMESPACE)
    return wait_for("the claim settled on checkpoint-baseline", lambda: cluster.settled(BASELINE))


@pytest.fixture(scope="session")
def ebs() -> Iterator[EbsCluster]:
    """A control plane of its own with the real AWS EBS CSI driver against moto's EC2 (IAM
    enforced), the shipped EBS StorageClass, classes and the hook's RBAC applied.

    Its own plane: the shipped EBS classes have the names of the host-path ones.
    """
    bin_dir = binaries()
    binaries(DRIVER_BINARY)
    _clean_stale_sessions()
    state = STATE_ROOT / f"{EBS_PREFIX}{os.getpid()}"
    shutil.rmtree(state, ignore_errors=True)
    plane = ControlPlane(bin_dir, state / "plane", die_with_parent=True)
    chain = EbsChain(
        plane,
        state / "ebs",
        controller_rbac=REPO / "connections" / "rbac-ebs-csi-controller.yaml",
        die_with_parent=True,
    )
    try:
        plane.start()
        chain.start()
    except BaseException as exc:
        chain.stop()
        plane.stop()
        if isinstance(exc, ControlPlaneError):
            pytest.fail(f"kube tier: the EBS chain did not start: {exc}", pytrace=False)
        raise
    try:
        cluster = EbsCluster(plane, chain)
        cluster.bootstrap()
        yield cluster
    finally:
        chain.stop()
        plane.stop()
        if not os.environ.get("KUBE_TIER_KEEP_STATE"):
            shutil.rmtree(state, ignore_errors=True)
