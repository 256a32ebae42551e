"""Compile every component and every pipeline op to Kubernetes with Polyaxon's own converter.

The agent configuration is the one in ``connections/``; the generated pods are then checked
against the Kubernetes 1.34 API schema, strictly.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.bundle.bundle import (
    AGENT_CONFIGS,
    COMPONENTS,
    PIPELINE_UUID,
    Pod,
    compile_component,
    current,
    current_versions,
    load_dag,
    op_uuid,
    package_version,
)

HOOK_SERVICE_ACCOUNT = "storage-profile-hook"
CLAIM = {"/checkpoints": "training-checkpoints"}

SWITCH = ["python", "-m", "hooks.storage_profile", "switch"]
CLAIM_ARGS = ["--namespace", "ml-team", "--claim", "training-checkpoints"]
WAIT_ARGS = ["--timeout", "1800", "--pending-grace", "120", "--settle", "provider"]
SWITCH_TAIL = [*WAIT_ARGS, "--on-infeasible", "fail", "--backend", "kubernetes"]


def switch_argv(target: str) -> list[str]:
    return [*SWITCH, *CLAIM_ARGS, "--to", target, *SWITCH_TAIL]


FIO = ["python", "-m", "fio_sweep", "--mount", "/checkpoints", "--size-scale", "1.0"]


def train_argv(op: str, profile: str) -> list[str]:
    ckpt = f"/checkpoints/{profile}-{op_uuid(op)}"
    return [
        *["python", "-m", "trainer", "--checkpoint-dir", ckpt],
        *["--summary-json", f"{ckpt}/summary.json", "--storage-profile", profile],
        *["--steps", "200", "--checkpoint-every", "50", "--keep", "2", "--model-size", "1GiB"],
        *["--seed", "0", "--format", "raw", "--durability", "fsync", "--sync"],
        *["--device", "auto", "--batch-size", "8", "--seq-len", "64", "--lr", "0.0003"],
        *["--log-every", "10"],
    ]


# What each op of the pipeline runs with the pipeline's defaults: the exact command line.
PIPELINE_ARGV = {
    "switch-baseline": switch_argv("checkpoint-baseline"),
    "fio-baseline": FIO,
    "train-baseline": train_argv("train-baseline", "checkpoint-baseline"),
    "switch-throughput": switch_argv("checkpoint-throughput"),
    "fio-throughput": FIO,
    "train-throughput": train_argv("train-throughput", "checkpoint-throughput"),
    "compare": [
        *["python", "-m", "checkpoint_compare"],
        *["--project", "acme/checkpoint-storage", "--pipeline", PIPELINE_UUID],
        *["--html", "verdict.html", "--json", "verdict.json"],
        *["--baseline=checkpoint-baseline", "--expect=checkpoint-baseline"],
        "--expect=checkpoint-throughput",
    ],
    "restore": switch_argv("checkpoint-baseline"),
}


def assert_valid_pod(pod: Pod) -> None:
    """The pod the agent would create is valid Kubernetes 1.34, unknown fields included."""
    assert kubernetes_validate.validate(pod.as_pod(), "1.34.0", strict=True)


def assert_kind_of_op(pod: Pod, kind: str) -> None:
    """What matters for each kind of op: claim, GPU, service account, labels."""
    limits = pod.main["resources"]["limits"]
    requests = pod.main["resources"]["requests"]
    service_account = pod.spec.get("serviceAccountName")
    for resource in ("cpu", "memory"):
        assert resource in limits and resource in requests, (kind, resource)
    if kind == "switch":
        assert service_account == HOOK_SERVICE_ACCOUNT
        assert pod.mounts() == {}  # talks to the API; never holds the ReadWriteOnce claim
    else:
        # Only the hook may patch the claim: its account must not leak into other jobs.
        assert service_account != HOOK_SERVICE_ACCOUNT
    if kind in ("fio", "train"):
        assert pod.mounts() == CLAIM
    if kind == "train":
        assert limits["nvidia.com/gpu"] in (1, "1")
        assert "NVIDIA_VISIBLE_DEVICES" not in pod.env
        profile = pod.env["STORAGE_PROFILE"]
        assert pod.argv[pod.argv.index("--storage-profile") + 1] == profile
        checkpoint_dir = pod.argv[pod.argv.index("--checkpoint-dir") + 1]
        assert checkpoint_dir.startswith(f"/checkpoints/{profile}-")
    else:
        assert "nvidia.com/gpu" not in limits
        assert pod.env.get("NVIDIA_VISIBLE_DEVICES") == "none"  # Polyaxon hides the GPUs


KIND_OF_COMPONENT = {
    "checkpoint-training": ("train", {"storage_profile": "checkpoint-baseline"}),
    "storage-profile": ("switch", {"target_class": "checkpoint-throughput"}),
    "fio-sweep": ("fio", {}),
    "checkpoint-compare": ("compare", {"pipeline": "0" * 32}),
}


@pytest.mark.parametrize("agent_config", AGENT_CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize(
    "path", sorted(COMPONENTS.glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_component_compiles_to_a_valid_pod(path: Path, agent_config: Path) -> None:
    kind, params = KIND_OF_COMPONENT[path.parent.name]
    pod = compile_component(path, params, agent_config=agent_config)
    assert pod.manifest["metadata"]["namespace"] == "ml-team"
    image = "registry.example.com/ml/checkpoint-storage-bench"
    if path.name == "latest.yaml" or path in current_versions():
        assert pod.main["image"] == f"{image}:{package_version()}"
    else:
        assert pod.main["image"].startswith(f"{image}:")
    assert_kind_of_op(pod, kind)
    assert_valid_pod(pod)


@pytest.fixture(scope="module")
def dag():
    return load_dag()


@pytest.mark.parametrize("agent_config", AGENT_CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("op", list(PIPELINE_ARGV))
def test_pipeline_op_compiles_to_the_expected_command(dag, op: str, agent_config: Path) -> None:
    pod = dag.compile_op(op, agent_config=agent_config)
    assert pod.argv == PIPELINE_ARGV[op]
    assert_kind_of_op(pod, "switch" if op == "restore" else op.split("-")[0])
    assert_valid_pod(pod)


def test_the_env_labels_the_profile_the_switch_applied(dag) -> None:
    for profile in ("baseline", "throughput"):
        for op in (f"fio-{profile}", f"train-{profile}"):
            assert dag.compile_op(op).env["STORAGE_PROFILE"] == f"checkpoint-{profile}"


def test_small_pipeline_inputs_reach_the_ops() -> None:
    small = load_dag(
        params={
            "model_size": "4MiB",
            "steps": 6,
            "checkpoint_every": 2,
            "size_scale": 0.001,
            "fio_runtime": 2,
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "throughput_class": "checkpoint-tmpfs",
            "gpu_hourly": 2.5,
            "api_host": "http://127.0.0.1:8000",
        }
    )
    train = small.compile_op("train-throughput").argv
    assert train[train.index("--model-size") + 1] == "4MiB"
    assert train[train.index("--steps") + 1] == "6"
    assert train[train.index("--checkpoint-every") + 1] == "2"
    assert train[train.index("--checkpoint-dir") + 1].startswith("/checkpoints/checkpoint-tmpfs-")
    fio = small.compile_op("fio-baseline").argv
    assert fio[-2:] == ["0.001", "--runtime=2"]
    for op in ("switch-baseline", "switch-throughput"):
        switch = small.compile_op(op).argv
        assert switch[-3:] == [
            "--backend",
            "local",
            "--profiles-file=connections/sandbox-profiles.yaml",
        ]
    assert small.compile_op("switch-throughput").argv[9] == "checkpoint-tmpfs"
    compare = small.compile_op("compare").argv
    assert {"--api-host=http://127.0.0.1:8000", "--gpu-hourly=2.5"} <= set(compare)
    assert compare[-1] == "--expect=checkpoint-tmpfs"


def test_an_unknown_connection_fails_to_compile(tmp_path: Path) -> None:
    # The checkpoints connection must come from the agent config: without it, no pod.
    config = yaml.safe_load(AGENT_CONFIGS[0].read_text())
    config["connections"] = [c for c in config["connections"] if c["name"] != "checkpoints"]
    agent = tmp_path / "agent.yaml"
    agent.write_text(yaml.safe_dump(config))
    with pytest.raises(Exception, match="checkpoints"):
        compile_component(current("fio-sweep"), {}, agent_config=agent)
