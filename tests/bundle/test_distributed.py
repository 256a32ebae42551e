"""Many ranks, one checkpoint: torchrun inside the training pod, and the PyTorchJob variant.

The command lines are read back with torchrun's own argument parser
(``torch.distributed.run.get_args_parser``), after expanding ``$(VAR)`` the way the kubelet
does with the env the Kubeflow operator sets in every pod.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest

from checkpoint_storage_bench.contract import TRAINING_OUTPUTS
from tests.bundle.bundle import (
    CONNECTIONS,
    DROP_TO_IMAGE_USER,
    Pod,
    check,
    compile_component,
    current,
    load_yaml_documents,
    manifests,
)
from tests.bundle.params import PLACEMENT

FIXED_UUID = "0123456789abcdef0123456789abcdef"
SINGLE = current("checkpoint-training")
PYTORCHJOB = current("checkpoint-training-pytorchjob")
PROFILE = {"storage_profile": "checkpoint-throughput"}


def expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """``$(VAR)`` replaced from the container's env, as the kubelet does for command/args."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m[1]], arg) for arg in argv]


def torchrun(argv: list[str]) -> Any:
    """The options torchrun parses from a command line (its own parser)."""
    from torch.distributed.run import get_args_parser

    assert argv[0] == "torchrun", argv
    return get_args_parser().parse_args(argv[1:])


def single(params: dict) -> Pod:
    return compile_component(SINGLE, {**PROFILE, **params}, run_uuid=FIXED_UUID)


def test_one_process_runs_the_trainer_directly() -> None:
    pod = single({})
    assert pod.argv[:3] == ["python", "-m", "trainer"]
    assert pod.main["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")


@pytest.mark.parametrize("n", [2, 8])
def test_n_processes_run_under_torchrun_with_n_gpus(n: int) -> None:
    pod, one = single({"nproc_per_node": n}), single({})
    options = torchrun(pod.argv)
    assert options.nproc_per_node == str(n)
    assert options.standalone  # one pod: a local rendezvous on a free port
    assert options.module and options.training_script == "trainer"
    # The trainer gets exactly the arguments the single process gets.
    assert options.training_script_args == one.argv[3:]
    assert pod.main["resources"]["limits"]["nvidia.com/gpu"] == str(n)
    assert kubernetes_validate.validate(pod.as_pod(), "1.34.0", strict=True)


def test_the_process_count_is_bounded() -> None:
    from polyaxon.exceptions import PolyaxonfileError

    for bad in (0, 17):
        with pytest.raises(PolyaxonfileError):
            check(SINGLE, {**PROFILE, "nproc_per_node": bad})


# ---- the PyTorchJob variant ----


def pytorchjob(params: dict) -> Pod:
    return compile_component(PYTORCHJOB, {**PROFILE, **params}, run_uuid=FIXED_UUID)


def operator_env(replica: str, index: int) -> dict[str, str]:
    """What the Kubeflow operator sets in a replica's pod (RANK: the pod's index)."""
    rank = index + (1 if replica == "Worker" else 0)
    return {"MASTER_ADDR": "train-master-0", "MASTER_PORT": "23456", "RANK": str(rank)}


@pytest.mark.parametrize(("workers", "n"), [(1, 1), (3, 8)])
def test_every_pod_runs_the_same_trainer_under_torchrun(workers: int, n: int) -> None:
    job = pytorchjob({"workers": workers, "nproc_per_node": n})
    replicas = job.replicas()
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"].replica_count == 1
    assert replicas["Worker"].replica_count == workers
    # The single-pod job with the PyTorchJob's default mode (always several ranks: ddp).
    one = single({"parallel": "ddp"})
    for name, pod in replicas.items():
        for index in range(pod.replica_count):
            options = torchrun(expand(pod.argv, operator_env(name, index)))
            assert options.nnodes == str(workers + 1)
            assert options.node_rank == index + (1 if name == "Worker" else 0)
            assert (options.master_addr, options.master_port) == ("train-master-0", 23456)
            assert options.nproc_per_node == str(n)
            assert options.module and options.training_script == "trainer"
            # Same arguments as the single-pod job (same run uuid: the same checkpoint dir).
            assert options.training_script_args == one.argv[3:]
        assert pod.main["resources"]["limits"]["nvidia.com/gpu"] == str(n)
        assert pod.main["image"] == one.main["image"]


def test_every_replica_gives_the_claim_its_group_as_root_then_runs_torchrun_as_the_image_user() -> (
    None
):
    # Polyaxon 2.18 cannot compile an init container on a Kubeflow replica, nor set an
    # fsGroup: the main container starts as root, fixes the claim's group and mode, and execs
    # torchrun's argv (the kubelet's $(VAR) expansion intact) as 1000:1000.
    (doc,) = load_yaml_documents(current("checkpoint-training"))
    (init,) = doc["run"]["init"]
    fix = init["container"]["args"][0]
    for name, pod in pytorchjob({}).replicas().items():
        assert pod.main["securityContext"] == {"runAsUser": 0, "runAsNonRoot": False}, name
        line = pod.command_line
        assert line[:2] == ["sh", "-c"] and line[3] == "claim-permissions", line[:4]
        script = line[2]
        for step in ("chgrp -R 1000 /checkpoints", "chmod -R g+rwX /checkpoints", "chmod g+s"):
            assert step in fix and step in script, step  # the single-pod job's step
        assert script.startswith("set -e;")  # a failed step stops the pod before torchrun
        assert script.endswith(DROP_TO_IMAGE_USER)
        assert line[4:] == pod.argv and pod.argv[0] == "torchrun"
        assert "$(RANK)" in pod.argv and "$(RANK)" not in script
        assert kubernetes_validate.validate(pod.as_pod(), "1.34.0", strict=True)


def test_the_pytorchjob_runs_data_parallel_by_default_and_refuses_one_process_mode() -> None:
    # Every PyTorchJob runs at least two ranks, and the trainer refuses --parallel none under
    # a torchrun of several processes: the default must be a mode it runs.
    from polyaxon.exceptions import PolyaxonfileError

    for pod in pytorchjob({}).replicas().values():
        assert pod.argv[pod.argv.index("--parallel") + 1] == "ddp"
    assert "fsdp" in pytorchjob({"parallel": "fsdp"}).replicas()["Worker"].argv
    with pytest.raises(PolyaxonfileError):
        check(PYTORCHJOB, {**PROFILE, "parallel": "none"})


def test_every_replica_mounts_the_shared_claim() -> None:
    job = pytorchjob({"claim": "efs-checkpoints"})
    for name, pod in job.replicas().items():
        assert pod.mounts() == {"/checkpoints": "efs-checkpoints"}, name
        assert pod.field_ref("NODE_NAME") == "spec.nodeName"
        assert pod.env["STORAGE_PROFILE"] == "checkpoint-throughput"
        assert pod.env["IMAGE_REF"] == pod.main["image"]
        assert kubernetes_validate.validate(pod.as_pod(), "1.34.0", strict=True)


def read_write_once_claims() -> list[str]:
    return [
        doc["metadata"]["name"]
        for doc in manifests("PersistentVolumeClaim")
        if doc["spec"]["accessModes"] == ["ReadWriteOnce"]
    ]


def test_a_read_write_once_claim_is_refused() -> None:
    # Pods on several nodes cannot share a ReadWriteOnce volume: the bundle's own claim
    # (connections/) is refused before anything is scheduled.
    from polyaxon.exceptions import PolyaxonfileError

    claims = read_write_once_claims()
    assert claims, f"no ReadWriteOnce claim in {CONNECTIONS}"
    for claim in claims:
        with pytest.raises(PolyaxonfileError) as error:
            check(PYTORCHJOB, {**PROFILE, "claim": claim})
        assert "regex" in str(error.value.__cause__ or error.value)
    default = {io.name: io.value for io in check(PYTORCHJOB, PROFILE).component.inputs}
    assert default["claim"] not in claims
    # And it never uses the `checkpoints` connection (that is the ReadWriteOnce claim).
    for pod in pytorchjob({}).replicas().values():
        claims_mounted = {
            v["persistentVolumeClaim"]["claimName"]
            for v in pod.spec["volumes"]
            if "persistentVolumeClaim" in v
        }
        assert claims_mounted == {default["claim"]}


def test_retries_are_for_signals_only() -> None:
    # Kubeflow has no podFailurePolicy; ExitCode restarts a pod killed by a signal (128+N:
    # node loss, preemption) and fails the job on the trainer's own exit codes (1-127).
    job = pytorchjob({})
    assert job.termination["backoffLimit"] == 2
    for name, spec in job.manifest["pytorchJobSpec"]["replicaSpecs"].items():
        assert spec["restartPolicy"] == "ExitCode", name
        assert Pod(job.manifest, name).as_pod()["spec"]["restartPolicy"] == "Never"


def test_placement_reaches_every_replica() -> None:
    job = pytorchjob(PLACEMENT)
    for pod in job.replicas().values():
        assert pod.spec["nodeSelector"] == PLACEMENT["node_selector"]
        assert pod.spec["tolerations"] == PLACEMENT["tolerations"]
        assert pod.spec["affinity"] == PLACEMENT["affinity"]


def test_it_declares_the_training_jobs_outputs() -> None:
    component = check(PYTORCHJOB, PROFILE).component
    assert {io.name for io in component.outputs} == set(TRAINING_OUTPUTS)
    # Same inputs as the single-pod job, plus where the ranks run.
    single_inputs = {io.name for io in check(SINGLE, PROFILE).component.inputs}
    assert {io.name for io in component.inputs} == single_inputs | {"workers", "claim"}


# A valid class name may have 253 characters (a DNS-1123 subdomain); a name component of a
# file system at most 255 bytes.
LONG_CLASS = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 48])


@pytest.mark.parametrize("make", [single, pytorchjob], ids=["job", "pytorchjob"])
def test_the_checkpoint_directory_of_a_long_class_name_can_be_made(make, tmp_path) -> None:
    assert len(LONG_CLASS) == 240
    params = {"storage_profile": LONG_CLASS}
    if make is pytorchjob:
        params["claim"] = "efs-checkpoints"
    pod = make(params)
    argv = pod.argv if make is single else pod.replicas()["Master"].argv
    ckpt = argv[argv.index("--checkpoint-dir") + 1]
    name = ckpt.removeprefix("/checkpoints/")
    assert "/" not in name and name.endswith(f"-{FIXED_UUID}")
    assert name.startswith(LONG_CLASS[:200]) and len(name.encode()) <= 255
    (tmp_path / name).mkdir()  # the trainer's own first step: errno 36 if it does not fit
    assert argv[argv.index("--summary-json") + 1] == f"{ckpt}/summary.json"
    assert argv[argv.index("--storage-profile") + 1] == LONG_CLASS  # the label is whole
    # A usual name is used whole.
    short = make({**params, "storage_profile": "checkpoint-throughput"})
    argv = short.argv if make is single else short.replicas()["Master"].argv
    assert (
        argv[argv.index("--checkpoint-dir") + 1]
        == f"/checkpoints/checkpoint-throughput-{FIXED_UUID}"
    )
