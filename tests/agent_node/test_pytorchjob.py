"""The PyTorchJob component through Polyaxon's agent on the local node: ``polyaxon run -f
components/checkpoint-training-pytorchjob/latest.yaml`` with a master and one worker (one CPU
rank each, gloo) becomes the agent's ``KfJob``, the operator stand-in's PyTorchJob and the pods
of Kubeflow's real training operator (localcluster/training_operator.py); the worker finds the
master through the node's cluster DNS; both ranks write their shards of every checkpoint to the
claim; a run on a second class is compared with the first by the verdict; a third run resumes.

What it exercises of the claim: ReadWriteOnce on ONE node. The access mode is per node, so
both pods of the job mount the claim here; a job whose pods land on several nodes needs a
ReadWriteMany claim (EFS, Filestore, an NFS class), which this test does not exercise
(docs/agent-on-node.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from checkpoint_storage_bench import kube
from localcluster import training_operator
from localcluster.node import Node
from sandbox.on_node import NODE_RESOURCES, import_image, project_image
from sandbox.pipeline import get_run, run_client
from sandbox.server import Sandbox
from tests.agent_node.runs import OWNER, PROJECT, pods_of, polyaxon_run, wait_done
from tests.kube.cluster import CLASSES_FILE, NAMESPACE, wait_for
from tests.node.conftest import platform_namespace, started_node
from tests.tiers import binaries

# The node's start, the images' import and three PyTorchJob runs in the module's fixtures.
pytestmark = pytest.mark.timeout(1800)

COMPONENT = Path(__file__).parents[2] / "components/checkpoint-training-pytorchjob/latest.yaml"
CLAIM = "training-checkpoints-shared"
"""The component's default claim name; here a ReadWriteOnce claim of the shipped StorageClass."""
# Two checkpoints a run (the first is the verdict's warm-up), on a small batch: the runs'
# time is CI's.
STEPS, EVERY, KEEP = 10, 5, 2
WORLD = 2
"""A master and one worker, one rank each."""


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    yield from started_node("pytorchjob", tier="agent_node", cluster_dns=True)


@pytest.fixture(scope="module")
def operator(node: Node) -> Iterator[training_operator.TrainingOperator]:
    # A one-line skip when the operator is not built; under CI it builds or fails.
    binaries(training_operator.BINARY, tier="agent_node tier")
    started = training_operator.start(node)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def image(node: Node, request: pytest.FixtureRequest) -> str:
    """The project's image, built (cached) and imported into the node's containerd; the
    sandbox starts while it imports (the import is most of this module's set-up)."""
    name, archive = project_image()
    t0 = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        imported = pool.submit(import_image, node.state_dir, archive, name.rsplit(":", 1)[0])
        request.getfixturevalue("sandbox_on_node")
        imported.result()
    print(f"project image imported, sandbox started: {time.monotonic() - t0:.0f} s")
    return name


@pytest.fixture(scope="module")
def classes(node: Node, sandbox_on_node: Sandbox) -> list[str]:
    """``ml-team`` at PodSecurity ``baseline`` (the replicas start as root for the claim's
    permissions: baseline admits it), the shipped StorageClass and classes, and the shared
    claim, ReadWriteOnce, on the first class; the first two classes."""
    platform_namespace(node)
    claim = node.cluster.shipped_claim(CLAIM)
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    node.cluster.apply(claim)
    names = [c["metadata"]["name"] for c in kube.load_manifests(CLASSES_FILE)]
    assert claim["spec"]["volumeAttributesClassName"] == names[0]
    return names[:2]


def submit(
    sb: Sandbox, image: str, profile: str, checkpoint_dir: str, steps: int, resume: str
) -> str:
    params = {
        "image": image,
        "storage_profile": profile,
        "claim": CLAIM,
        "checkpoint_dir": checkpoint_dir,
        "workers": "1",
        "nproc_per_node": "1",
        "device": "cpu",
        "model_size": "1MiB",
        "batch_size": "2",
        "seq_len": "16",
        "steps": str(steps),
        "resume": resume,
        "checkpoint_every": str(EVERY),
        "keep": str(KEEP),
        "resources": json.dumps(NODE_RESOURCES),
    }
    return polyaxon_run(sb, COMPONENT, params)


def diagnosis(node: Node, uuid: str) -> str:
    """The job's pods (their containers' states, the last lines of each training log) and the
    PyTorchJob's conditions: what a failed run's assertion shows."""
    lines = []
    for pod in pods_of(node, uuid):
        states = [
            (c.name, c.state.to_dict())
            for c in (pod.status.init_container_statuses or [])
            + (pod.status.container_statuses or [])
        ]
        lines.append(f"{pod.metadata.name} {pod.status.phase} {states}")
        try:
            log = node.cluster.core.read_namespaced_pod_log(
                pod.metadata.name, NAMESPACE, container="pytorch", tail_lines=30,
                _preload_content=False,
            ).data.decode()  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a pod that never started has no log
            log = f"(no log: {exc})"
        lines.append(log)
    path = f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/pytorchjobs/plx-operation-{uuid}"
    try:
        job = node.cluster.request("GET", path)
        lines.append(json.dumps((job.get("status") or {}).get("conditions")))
    except kube.NotFound:
        lines.append("(the PyTorchJob is gone)")
    return "\n".join(lines)


def status_lines(sb: Sandbox, uuid: str) -> str:
    """The run's conditions in the server, each with its reason and message (a failed run's
    message is the trainer's own error)."""
    _, conditions = run_client(sb.client, OWNER, PROJECT, uuid).get_statuses()
    return "\n".join(f"{c.type} {c.reason}: {c.message}" for c in conditions or [])


def train(
    sb: Sandbox,
    node: Node,
    image: str,
    profile: str,
    directory: str,
    steps: int,
    resume: str = "never",
) -> tuple[str, dict[str, Any]]:
    """One PyTorchJob run to its end; its uuid and outputs (asserted succeeded)."""
    t0 = time.monotonic()
    uuid = submit(sb, image, profile, directory, steps, resume)
    done = wait_done(sb, uuid, timeout=600)
    assert done == "succeeded", f"{status_lines(sb, uuid)}\n{diagnosis(node, uuid)}"
    outputs = wait_for(
        "the run's outputs",
        lambda: get_run(sb.client, OWNER, PROJECT, uuid).outputs or None,
    )
    print(f"pytorchjob run {uuid} on {profile}: {time.monotonic() - t0:.0f} s")
    return uuid, outputs


def switch_claim(node: Node, target: str) -> None:
    """Move the bound claim to another class and wait until the driver applied it."""
    node.cluster.patch_claim({"spec": {"volumeAttributesClassName": target}}, CLAIM)
    wait_for("the claim on " + target, lambda: node.cluster.settled(target, CLAIM), timeout=120)


def directory(profile: str) -> str:
    return f"/checkpoints/pytorchjob-{profile}"


@pytest.fixture(scope="module")
def runs(
    node: Node, image: str, operator, sandbox_on_node: Sandbox, classes: list[str]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """One run on each of two classes of the one claim, each in its own fresh directory."""
    done = {}
    for i, profile in enumerate(classes):
        if i:
            switch_claim(node, profile)
        done[profile] = train(sandbox_on_node, node, image, profile, directory(profile), STEPS)
    return done


# Every file under the runs' directories on the claim, with its owner, as one JSON line.
LIST_CLAIM = """
import json, os, pathlib
files = {str(p): p.stat().st_uid for p in pathlib.Path("/checkpoints").glob("pytorchjob-*/**/*")
         if p.is_file()}
print(json.dumps(files))
"""


def claim_files(node: Node, image: str) -> dict[str, int]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "list-shared-claim", "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", LIST_CLAIM],
                    "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"}],
                }
            ],
            "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": CLAIM}}],
        },
    }
    done, log = node.run_pod(pod, timeout=180)
    assert done["status"]["phase"] == "Succeeded", (done["status"], log[-2000:])
    node.cluster.kube.delete(kube.POD, "list-shared-claim", NAMESPACE)
    return json.loads(log.strip().splitlines()[-1])


def test_every_rank_of_a_pytorchjob_writes_its_shard_of_every_checkpoint_to_the_claim(
    node: Node, image: str, runs: dict[str, tuple[str, dict[str, Any]]]
) -> None:
    for profile, (_, out) in runs.items():
        assert out.get("world_size") == WORLD, (profile, out)  # rank 0 committed every shard
        assert out.get("checkpoint_count") == STEPS // EVERY, (profile, out)
        assert not out.get("resumed_from_step"), (profile, out)
    files = claim_files(node, image)
    for profile in runs:
        shards = sorted(
            path.removeprefix(directory(profile) + "/")
            for path in files
            if path.startswith(directory(profile) + "/") and "/shard-" in path
        )
        checkpoints = sorted({shard.split("/")[0] for shard in shards})
        assert len(checkpoints) == KEEP, (profile, sorted(files))  # older ones deleted
        for checkpoint in checkpoints:
            ranks = [s.split("/")[1].split(".")[0] for s in shards if s.startswith(checkpoint)]
            assert ranks == [f"shard-{r:05d}-of-{WORLD:05d}" for r in range(WORLD)], shards
    # Written as the image's user: the root step gave the claim its group and dropped.
    assert set(files.values()) == {1000}, files
    # What this test exercises: ReadWriteOnce, every pod on the one node.
    claim = node.cluster.claim(CLAIM)
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert len(node.cluster.kube.list(kube.NODE)[0]) == 1


def test_the_verdict_compares_two_classes_of_pytorchjob_runs(
    sandbox_on_node: Sandbox, runs: dict[str, tuple[str, dict[str, Any]]], tmp_path: Path
) -> None:
    sb = sandbox_on_node
    report = tmp_path / "compare.json"
    argv = [sys.executable, "-m", "checkpoint_compare", "--api-host", sb.url]
    argv += ["--project", f"{OWNER}/{PROJECT}", "--json", str(report), "--no-track"]
    for profile, (uuid, _) in runs.items():
        argv += ["--run", f"{profile}={uuid}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYAXON_")}
    env["HOME"] = str(tmp_path)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = json.loads(report.read_text())
    baseline, candidate = runs
    assert verdict["baseline"] == baseline
    assert set(verdict["profiles"]) == {baseline, candidate}
    assert verdict["profiles"][candidate]["difference"]["runs"] == {"profile": 1, "baseline": 1}
    # The job's ranks as the verdict read them: both wrote, the pause is the slowest rank's.
    for profile, (uuid, _) in runs.items():
        (run,) = verdict["profiles"][profile]["training_runs"]
        assert run["uuid"] == uuid
        assert (run["world_size"], run["pause_is_slowest_rank"]) == (WORLD, True), run
        assert run["aggregate_gbps_median"] > 0, run
    print(done.stdout)


def test_a_second_pytorchjob_run_resumes_from_the_ranks_shards(
    node: Node, sandbox_on_node: Sandbox, image: str, runs: dict[str, tuple[str, dict[str, Any]]]
) -> None:
    # A new run pointed at the last run's directory: `always` continues another run's
    # checkpoints (`auto` only a retried run's own, the same uuid).
    profile = list(runs)[-1]  # the class the claim is on now
    sb, where = sandbox_on_node, directory(profile)
    _, out = train(sb, node, image, profile, where, STEPS + EVERY, resume="always")
    assert out.get("resumed_from_step") == STEPS, out
    assert out.get("world_size") == WORLD, out
    assert out.get("checkpoint_count") == 1, out  # its own: the step after the resume
