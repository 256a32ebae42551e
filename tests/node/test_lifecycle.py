"""The node starts, runs a pod as the platform would, and leaves nothing behind: after a
clean stop, and after the process that started it was killed with SIGKILL while a pod had a
claim's volume mounted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from localcluster.controlplane import NODE_NAME, stop_recorded
from localcluster.node import BRIDGE_IP, Node, leftovers, sweep
from tests.kube.cluster import REPO
from tests.node.conftest import done_with, state_dir
from tests.node.pods import NAMESPACE, job_pod, prepare


def machine_state() -> dict:
    """What the node may change on the machine, read the same way before and after."""

    def out(*argv: str) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        return "\n".join(line for line in done.splitlines() if not line.startswith("#"))

    return {
        "iptables": out("iptables-save").splitlines(),
        "ip6tables": out("ip6tables-save").splitlines(),
        "nftables": out("nft", "list", "ruleset").splitlines(),
        "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text(),
        "sysctls": {
            k: Path(f"/proc/sys/{k}").read_text()
            for k in ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
        },
        "links": sorted(p.name for p in Path("/sys/class/net").iterdir()),
        "dirs": {
            d: Path(d).exists()
            for d in (
                "/run/containerd",
                "/var/lib/cni",
                "/var/lib/kubelet",
                "/var/log/containers",
                "/var/log/pods",
            )
        },
        "cgroup_dirs": sorted(str(p) for p in Path("/sys/fs/cgroup/pids").iterdir() if p.is_dir()),
    }


def nothing_left(report_left: dict) -> dict:
    return {k: v for k, v in report_left.items() if v}


# An address off the machine (TEST-NET-2): without a default route, the connect fails at once.
NETWORK_CHECK = (
    "busybox ip route; echo --; "
    "busybox nc -w 5 10.0.0.1 443 </dev/null && echo service:open || echo service:closed; "
    "busybox nc -w 5 198.51.100.1 80 </dev/null 2>/dev/null"
    " && echo outside:reachable || echo outside:unreachable"
)


def test_start_run_a_pod_stop_clean(bin_dir: Path) -> None:
    before = machine_state()
    state = state_dir("life")
    node = Node(bin_dir, state, die_with_parent=True)
    node.start()
    try:
        found = node.cluster.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        addresses = {a["type"]: a["address"] for a in found["status"]["addresses"]}
        assert addresses["InternalIP"] == BRIDGE_IP
        prepare(node)
        pod, log = node.run_pod(
            job_pod(
                "smoke",
                "id -u; echo written > /scratch/f && cat /scratch/f; "
                "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; "
                "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT",
            )
        )
        assert pod["status"]["phase"] == "Succeeded", (pod["status"], log)
        assert pod["spec"]["nodeName"] == NODE_NAME  # placed by the real scheduler
        (status,) = pod["status"]["containerStatuses"]
        assert status["state"]["terminated"]["exitCode"] == 0
        assert log.split() == ["1000", "written", NAMESPACE, "10.0.0.1:443"], log
        # In-cluster clients reach the API server through the Service (kube-proxy's DNAT to
        # the bridge address); nothing routes off the machine.
        pod, log = node.run_pod(job_pod("network", NETWORK_CHECK))
        assert pod["status"]["phase"] == "Succeeded", (pod["status"], log)
        routes, verdicts = log.split("--\n")
        assert "default" not in routes, routes
        assert verdicts.split() == ["service:open", "outside:unreachable"], log
        during = leftovers()
        # The checks below can see a node: they are not vacuous.
        assert during["cgroups"] and during["processes"] and during["bridge"] and during["chains"]
        assert during["mounts"] == []  # the node's mounts stay in its own mount namespace
        assert machine_state()["sysctls"] == before["sysctls"]
    finally:
        report = node.stop()
    assert nothing_left(report["left"]) == {}, report
    assert machine_state() == before
    done_with(state)


CHILD = """
import sys, time
from pathlib import Path
from tests.kube.cluster import CLASSES_FILE, STORAGE_CLASS_FILE, Cluster
from localcluster.node import Node
from tests.node.pods import job_pod, prepare
node = Node(Path(sys.argv[1]), Path(sys.argv[2]), die_with_parent=True, client_class=Cluster).start()
prepare(node)
node.cluster.apply_file(STORAGE_CLASS_FILE)
node.cluster.apply_file(CLASSES_FILE)
node.cluster.apply(node.cluster.shipped_claim("sleeper-claim", "node-smoke"))
pod = job_pod("sleeper", "sleep 3600", claim="sleeper-claim", mount="/claim")
node.cluster.request("POST", "/api/v1/namespaces/node-smoke/pods", pod)
while node.cluster.request("GET", "/api/v1/namespaces/node-smoke/pods/sleeper")["status"].get("phase") != "Running":
    time.sleep(0.5)
print("running", flush=True)
time.sleep(3600)
"""


def test_killed_run_is_swept(bin_dir: Path) -> None:
    before = machine_state()
    state = state_dir("killed")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(bin_dir), str(state)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "running"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    time.sleep(1)
    # What outlives a SIGKILL of the starter: containerd's shim and the pod's processes
    # (they are not its children), and the claim's loop device and backing file (the pod
    # still has it mounted), hence the sweep.
    left = leftovers()
    try:
        assert left["processes"] and left["cgroups"], left
        assert left["loop_devices"] and left["backing_files"], left
    finally:
        report = sweep(state, bin_dir)
        stop_recorded(state)
    assert nothing_left(report["left"]) == {}, report
    assert machine_state() == before
    done_with(state)
