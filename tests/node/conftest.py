"""The `node` tier: a real kubelet, containerd and the bundle's pods (localcluster/node.py).

Needs root, the binaries of scripts/controlplane.sh (kubelet, kube-scheduler and kube-proxy
among them) and Debian's containerd, runc, containernetworking-plugins, umoci and
busybox-static. It changes the machine (a bridge, cgroups, iptables chains: all swept at the
end), so it runs only when asked: ``CSB_NODE_TIER=1``. Without it, or off CI without what it
needs, the tier is one SKIPPED line; with ``CI`` and ``CSB_NODE_TIER=1`` it never skips.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.controlplane import stop_recorded
from localcluster.node import Node, NodeError, sweep
from tests.kube.cluster import CLASSES_FILE, NAMESPACE, STORAGE_CLASS_FILE, Cluster
from tests.tiers import STATE_ROOT, binaries, missing

TOOLS = (
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "umoci",
    "mmdebstrap",
    "unshare",
    "nsenter",
    "nft",
)
FILES = ("/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", "/bin/busybox")


def missing_here() -> str | None:
    """Why the node tier cannot run on this machine (one line), or None."""
    if not os.environ.get("CSB_NODE_TIER"):
        return "node tier: not requested (set CSB_NODE_TIER=1; it changes the machine, then sweeps)"
    if os.geteuid() != 0:
        return "node tier: needs root (kubelet, containerd, mounts, cgroups)"
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    absent = [t for t in TOOLS if not shutil.which(t, path=path)]
    absent += [f for f in FILES if not Path(f).exists()]
    if absent:
        return f"node tier: missing {' '.join(absent)} (scripts/setup.sh installs them)"
    return None


def skip_tier_unless_ready(items: list[pytest.Item], here: Path, tier_name: str) -> None:
    """Mark the items under ``here`` skipped, with one reason, when the tier cannot run."""
    tier = [item for item in items if here in item.path.parents]
    if not tier:
        return
    reason = missing_here()
    if reason is None and not os.environ.get("CI"):
        reason = missing("--node", tier="node tier")
    if reason is None:
        return
    if os.environ.get("CI") and os.environ.get("CSB_NODE_TIER"):
        return  # asked for on CI: fail in the fixture rather than skip
    for item in tier:
        item.add_marker(pytest.mark.skip(reason=reason.replace("node tier", f"{tier_name} tier")))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_tier_unless_ready(items, Path(__file__).parent, "node")


def clean_stale_sessions() -> None:
    """Sweep what node sessions killed earlier left (their pytest pid is gone)."""
    if not STATE_ROOT.exists():
        return
    for session in STATE_ROOT.iterdir():
        pid = session.name[1:].split("-")[0]
        if session.name.startswith("n") and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                sweep(session)
            except NodeError:
                continue  # another live node has the machine; its own stop sweeps
            stop_recorded(session)
            shutil.rmtree(session, ignore_errors=True)


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    reason = missing_here()
    if reason is not None:
        pytest.fail(reason, pytrace=False)
    found = binaries("--node", tier="node tier")
    clean_stale_sessions()
    return found


def state_dir(name: str) -> Path:
    """This session's state dir for one node (short: unix sockets live in it)."""
    path = STATE_ROOT / f"n{os.getpid()}-{name}"
    shutil.rmtree(path, ignore_errors=True)
    return path


def done_with(path: Path) -> None:
    if not os.environ.get("KUBE_TIER_KEEP_STATE"):
        shutil.rmtree(path, ignore_errors=True)


def started_node(name: str, tier: str = "node", **options: Any) -> Iterator[Node]:
    """Start a node for a tier's fixture, yield it, stop it and prove nothing was left.
    ``options``: more of :class:`Node`'s fields (``cluster_dns``)."""
    reason = missing_here()
    if reason is not None:
        pytest.fail(reason.replace("node tier", f"{tier} tier"), pytrace=False)
    bin_dir = binaries("--node", tier=f"{tier} tier")
    clean_stale_sessions()
    state = state_dir(name)
    node = Node(bin_dir, state, die_with_parent=True, client_class=Cluster, **options)
    try:
        node.start()
    except NodeError as exc:
        pytest.fail(f"{tier} tier: the node did not start: {exc}", pytrace=False)
    try:
        yield node
    finally:
        report = node.stop()
        left = {k: v for k, v in report["left"].items() if v}
        assert not left, f"the node left: {left}"
        done_with(state)


def platform_namespace(node: Node) -> None:
    """What a platform team applies before the bundle: ``ml-team`` with PodSecurity
    ``baseline``, the shipped StorageClass and classes; waits for the default ServiceAccount."""
    cluster = node.cluster
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": NAMESPACE,
                "labels": {"pod-security.kubernetes.io/enforce": "baseline"},
            },
        }
    )
    cluster.apply_file(STORAGE_CLASS_FILE)
    cluster.apply_file(CLASSES_FILE)
    cluster.wait_for_default_service_account(NAMESPACE)


@pytest.fixture(scope="module")
def node(bin_dir: Path) -> Iterator[Node]:
    """A started node for one test module (tests that check the stop itself start their own)."""
    yield from started_node("mod")


def limits_written(node: Node, pod_uid: str) -> list[str]:
    """The driver's log lines that set limits in a container cgroup of that pod."""
    log = (node.state_dir / "logs" / "csi-hostpath-lite.log").read_text()
    return [
        line.split("throttle: ", 1)[1]
        for line in log.splitlines()
        if "throttle: " in line and f"/pod{pod_uid}/" in line
    ]
