"""The bundle's pods on the real node, as Polyaxon's converter compiles them, one after another
on the shipped claim (``WaitForFirstConsumer``, bound by the scheduler) in ``ml-team``
(PodSecurity ``baseline``), from the project's own image built from its Dockerfile:

fio on the baseline class, a training run, the switch to the throughput class (the hook in its
pod, as its ServiceAccount, through the ``kubernetes`` Service), fio again, a training run, a
second one resuming from its checkpoints, and the verdict over the runs the parts tracked.

Polyaxon's own init and sidecar containers are left out of these pods, with the agent's
``POLYAXON_*`` variables: they talk to a Polyaxon server (``tests/agent_node`` runs the pipeline
with them, through Polyaxon's agent). Without them each part tracks offline, as it does outside
a Polyaxon run, and the offline runs are put on the claim, where the verdict pod reads them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from localcluster.controlplane import NODE_NAME
from localcluster.node import Node
from sandbox.on_node import NODE_RESOURCES
from tests.bundle.bundle import compile_component, current, op_uuid
from tests.kube.cluster import (
    CLAIM,
    NAMESPACE,
    RBAC_FILE,
    REPO,
)
from tests.node.conftest import limits_written, platform_namespace

MIB = 2**20
OFFLINE_ROOT = "/checkpoints/plx-offline"
MOUNT = "/checkpoints"
BASELINE, FAST = "checkpoint-baseline", "checkpoint-throughput"
# The classes' figures as the driver writes them into a pod's cgroup (connections/
# vac-hostpath.yaml), and how far above its class a measurement may land: a throttle never lets
# a run go faster. How close a class gets to its figure is tests/node/test_volumes.py's (the
# best of three runs): one sweep's run on a loaded two-core machine lands anywhere below it.
LIMITS = {BASELINE: "125 MiB/s, 3000 IOPS", FAST: "250 MiB/s, 6000 IOPS"}
THROUGHPUT_MIBS = {BASELINE: 125, FAST: 250}
TOLERANCE = 0.15
TRAINING = {"steps": 40, "checkpoint_every": 10, "model_size": "32MiB", "device": "cpu"}


def image_name() -> str:
    return subprocess.run(
        [str(REPO / "scripts" / "image.sh"), "name"], capture_output=True, text=True, check=True
    ).stdout.strip()


def image_archive() -> Path:
    """The project's image, built from the Dockerfile (cached: built once per tree)."""
    done = subprocess.run(
        [str(REPO / "scripts" / "image.sh"), "build"],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def bundle_pod(
    component: str, name: str, params: dict[str, Any], offline_root: str = OFFLINE_ROOT
) -> dict[str, Any]:
    """The component compiled by Polyaxon's converter, minus Polyaxon's own containers; the
    part's offline runs go to ``offline_root`` on the claim."""
    # The components ask for a training node (4-8 CPUs, a GPU); this node is the 2-core
    # machine, so the pods are sized for it through the components' `resources` input.
    if component in ("fio-sweep", "checkpoint-training", "data-workload"):
        params = {**params, "resources": NODE_RESOURCES}
    pod = compile_component(current(component), params, run_uuid=op_uuid(name)).as_pod()
    pod["metadata"] = {"name": name, "namespace": NAMESPACE, "labels": pod["metadata"]["labels"]}
    spec = pod["spec"]
    # A job's pod that restarts in place never completes (and re-runs a measurement).
    assert spec.get("restartPolicy") == "Never", (component, spec.get("restartPolicy"))
    spec["initContainers"] = [
        c for c in spec.get("initContainers") or [] if not c["name"].startswith("polyaxon-")
    ]
    spec["containers"] = [c for c in spec["containers"] if c["name"] == "polyaxon-main"]
    (main,) = spec["containers"]
    main["env"] = [e for e in main.get("env") or [] if not e["name"].startswith("POLYAXON_")]
    main["env"].append({"name": "POLYAXON_OFFLINE_ROOT", "value": offline_root})
    for container in [*spec["initContainers"], main]:
        assert container["image"] == image_name(), container["image"]
        container["imagePullPolicy"] = "Never"  # imported, never pulled
    return pod


def run(node: Node, pod: dict[str, Any], timeout: float = 600) -> str:
    return run_pod(node, pod, timeout)[1]


def run_pod(node: Node, pod: dict[str, Any], timeout: float = 600) -> tuple[dict[str, Any], str]:
    """The pod run to completion on the node: its last state and its log."""
    done, log = node.run_pod(pod, timeout=timeout)
    name = pod["metadata"]["name"]
    assert done["spec"]["nodeName"] == NODE_NAME
    assert done["status"]["phase"] == "Succeeded", (name, done["status"], log[-3000:])
    print(f"--- {name}\n{log[-1500:]}")
    return done, log


def run_throttled(node: Node, pod: dict[str, Any], cls: str) -> None:
    """Run the pod; the driver must have set the class's limits in its cgroup."""
    done, _ = run_pod(node, pod)
    written = limits_written(node, done["metadata"]["uid"])
    assert written and all(line.endswith(f": {LIMITS[cls]}") for line in written), (cls, written)


def reader_pod(name: str, script: str) -> dict[str, Any]:
    """A pod of the project's image that runs a Python script on the claim, as the job's user."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": image_name(),
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", script],
                    "volumeMounts": [{"name": "checkpoints", "mountPath": MOUNT}],
                }
            ],
            "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": CLAIM}}],
        },
    }


# Every offline run (name, profile, outputs, in the order they ran), and how the claim is
# mounted, as one JSON line.
READ_RUNS = f"""
import json, pathlib
runs = []
for path in pathlib.Path({MOUNT!r}).glob("plx-offline*/runs/*/run.plx.json"):
    run = json.loads(path.read_text())
    runs.append({{"name": run.get("name"), "created_at": run.get("created_at"),
                 "inputs": run.get("inputs") or {{}}, "outputs": run.get("outputs") or {{}}}})
runs.sort(key=lambda r: r["created_at"] or "")
mounts = [line.split() for line in open("/proc/self/mountinfo")]
(mount,) = [m for m in mounts if m[4] == {MOUNT!r}]
sep = mount.index("-")
print(json.dumps({{"runs": runs, "fstype": mount[sep + 1], "source": mount[sep + 2]}}))
"""


def read_claim(node: Node, name: str) -> dict[str, Any]:
    log = run(node, reader_pod(name, READ_RUNS))
    return json.loads(log.strip().splitlines()[-1])


def fio_mibs(outputs: dict[str, Any]) -> float:
    """The sweep's checkpoint-like sequential write (direct I/O), MiB/s."""
    return outputs["fio_seqwrite_1m_bw_mbps"] * 1e6 / MIB


@pytest.fixture(scope="module")
def bundle_node(node: Node) -> Node:
    """The node with the project's image imported and the platform's objects applied."""
    node.import_image(image_archive(), image_name().rsplit(":", 1)[0])
    cluster = node.cluster
    platform_namespace(node)
    cluster.apply_file(RBAC_FILE)
    cluster.apply(cluster.shipped_claim())
    return node


def test_the_bundle_runs_on_the_node_and_the_class_sets_the_speed(bundle_node: Node) -> None:
    node, cluster = bundle_node, bundle_node.cluster
    fio = {"size_scale": 0.25, "runtime": 8}

    baseline_fio = bundle_pod("fio-sweep", "fio-baseline", {"storage_profile": BASELINE, **fio})
    run_throttled(node, baseline_fio, BASELINE)
    train = {**TRAINING, "checkpoint_dir": f"{MOUNT}/run-baseline"}
    run(
        node,
        bundle_pod("checkpoint-training", "train-baseline", {"storage_profile": BASELINE, **train}),
    )

    claim = cluster.claim()
    assert claim["status"]["phase"] == "Bound"  # by the scheduler, for the first pod
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == NODE_NAME

    switch = {"target_class": FAST, "settle": "kubernetes", "timeout": 300}
    log = run(node, bundle_pod("storage-profile", "switch-throughput", switch))
    settled = cluster.settled(FAST)
    assert settled is not None, (cluster.claim()["status"], log[-2000:])

    run_throttled(
        node, bundle_pod("fio-sweep", "fio-throughput", {"storage_profile": FAST, **fio}), FAST
    )
    fast = {**TRAINING, "checkpoint_dir": f"{MOUNT}/run-throughput"}
    run(
        node,
        bundle_pod("checkpoint-training", "train-throughput", {"storage_profile": FAST, **fast}),
    )
    # The same run continued from its checkpoints (resume=always) to step 60. Its offline run
    # goes beside the others: a resumed run is not compared with whole ones.
    resumed = {**fast, "steps": 60, "resume": "always"}
    pod = bundle_pod(
        "checkpoint-training",
        "train-resumed",
        {"storage_profile": FAST, **resumed},
        offline_root=f"{OFFLINE_ROOT}-resumed",
    )
    run(node, pod)

    claim_view = read_claim(node, "read-runs")
    print(json.dumps(claim_view, indent=1)[:4000])
    # On the volume's own file system (ext4 on the driver's loop device), not a host directory.
    assert claim_view["fstype"] == "ext4" and claim_view["source"].startswith("/dev/loop")
    runs = claim_view["runs"]
    fio_runs = [r["outputs"] for r in runs if "fio_seqwrite_1m_bw_mbps" in r["outputs"]]
    train_runs = [r["outputs"] for r in runs if "checkpoint_count" in r["outputs"]]
    assert len(fio_runs) == 2 and len(train_runs) == 3, [r["name"] for r in runs]

    measured = {BASELINE: fio_mibs(fio_runs[0]), FAST: fio_mibs(fio_runs[1])}
    print(f"fio sequential write in the pod, MiB/s: {measured}")
    for cls, got in measured.items():
        cap = THROUGHPUT_MIBS[cls]
        assert got <= cap * (1 + TOLERANCE), f"{cls}: {got:.1f} MiB/s, above the class's {cap}"

    assert [r["checkpoint_count"] for r in train_runs[:2]] == [4, 4]
    assert not train_runs[1].get("resumed_from_step")
    assert train_runs[2]["resumed_from_step"] == 40

    verdict = bundle_pod("checkpoint-compare", "verdict", {"profiles": [BASELINE, FAST]})
    # The compiled verdict reads its runs from the Polyaxon server; here they are the offline
    # runs on the claim, so the verdict gets those instead (same command, same image).
    (main,) = verdict["spec"]["containers"]
    main["args"] = [
        "--offline-root",
        OFFLINE_ROOT,
        "--baseline",
        BASELINE,
        "--json",
        f"{MOUNT}/verdict.json",
        "--no-track",
    ]
    main["volumeMounts"] = [
        *main.get("volumeMounts", []),
        {"name": "checkpoints", "mountPath": MOUNT},
    ]
    verdict["spec"]["volumes"] = [
        *verdict["spec"].get("volumes", []),
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": CLAIM}},
    ]
    log = run(node, verdict)
    assert BASELINE in log and FAST in log
