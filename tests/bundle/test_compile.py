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
    JOB_FILES,
    Pod,
    compile_component,
    current,
    current_versions,
    is_dag,
    load_dag,
    op_uuid,
    package_version,
    pipeline_jobs,
)
from tests.bundle.params import KIND_OF_COMPONENT

HOOK_SERVICE_ACCOUNT = "storage-profile-hook"
CLAIM = {"/checkpoints": "training-checkpoints"}

HOOK = ["python", "-m", "hooks.storage_profile"]
CLAIM_ARGS = ["--namespace", "ml-team", "--claim", "training-checkpoints"]
WAIT_ARGS = ["--timeout", "14400", "--pending-grace", "120", "--settle", "provider"]
SWITCH_TAIL = [
    *WAIT_ARGS, "--on-infeasible", "fail", "--lease-duration", "21600", "--backend", "kubernetes",
]  # fmt: skip

# The two-profile pipeline nests the general one (a mapping of one run), which maps the
# stage over the profiles: stand-in uuids follow each run's place in that tree.
GENERAL = "pipeline/comparison[0]"
HOLDER = op_uuid(GENERAL)  # the general pipeline's own uuid: the lease holder of its switches


def switch_argv(target: str, *flags: str) -> list[str]:
    return [*HOOK, "switch", *CLAIM_ARGS, "--to", target, *SWITCH_TAIL, f"--holder={HOLDER}",
            *flags]  # fmt: skip


FIO = ["python", "-m", "fio_sweep", "--mount", "/checkpoints", "--size-scale", "1.0"]
# Between a stage's fio sweep and its training runs: the Lease the switch took, renewed.
RENEW = [*HOOK, "renew", *CLAIM_ARGS, "--lease-duration", "21600", "--backend", "kubernetes",
         f"--holder={HOLDER}"]  # fmt: skip


def train_argv(run: str, profile: str) -> list[str]:
    ckpt = f"/checkpoints/{profile}-{op_uuid(run)}"
    return [
        *["python", "-m", "trainer", "--checkpoint-dir", ckpt],
        *["--summary-json", f"{ckpt}/summary.json", "--storage-profile", profile],
        *["--steps", "200", "--checkpoint-every", "25", "--keep", "2", "--model-size", "1GiB"],
        *["--seed", "0", "--format", "raw", "--durability", "fsync", "--sync"],
        *["--device", "auto", "--batch-size", "8", "--seq-len", "64", "--lr", "0.0003"],
        *["--log-every", "10", "--resume", "auto", "--io-streams", "1", "--parallel", "none"],
        *["--checkpoint-timeout", "600.0"],
    ]


def stage_argv(i: int, profile: str) -> dict[str, list[str]]:
    stage = f"{GENERAL}/stages[{i}]"
    return {
        f"{stage}/switch": switch_argv(profile, "--stop-after-failure"),
        f"{stage}/fio": FIO,
        f"{stage}/renew": RENEW,
        # The default repeats: two training runs a stage, the fewest the verdict compares.
        **{f"{stage}/train[{r}]": train_argv(f"{stage}/train[{r}]", profile) for r in (0, 1)},
    }


# What each job of the two-profile pipeline runs with its defaults: the exact command line.
# (compare's --run flags come from its join, which only the server resolves.)
PIPELINE_ARGV = {
    f"{GENERAL}/plan": [
        *HOOK,
        *["plan", *CLAIM_ARGS, "--profiles", "checkpoint-baseline,checkpoint-throughput"],
        # The restore's class; counted only with --restore-after (restore_after is off).
        *["--backend", "kubernetes", "--restore-class=checkpoint-baseline"],
        # What the verdict can answer: the run's settings as its stages and compare get them.
        *["--repeats=2", "--workload=checkpoint", "--steps=200", "--checkpoint-every=25"],
    ],
    **stage_argv(0, "checkpoint-baseline"),
    **stage_argv(1, "checkpoint-throughput"),
    f"{GENERAL}/compare": [
        *["python", "-m", "checkpoint_compare"],
        *["--project", "acme/checkpoint-storage"],
        *["--html", "verdict.html", "--json", "verdict.json"],
        *["--baseline=checkpoint-baseline", "--expect=checkpoint-baseline"],
        "--expect=checkpoint-throughput",
    ],
    f"{GENERAL}/restore": switch_argv("checkpoint-baseline", "--only-if-switched"),
    f"{GENERAL}/release": [
        *[*HOOK, "release", *CLAIM_ARGS, "--holder", HOLDER, "--backend", "kubernetes"],
    ],
}
KIND_OF_RUN = {
    "switch": "switch",
    "restore": "switch",
    "plan": "hook",
    "renew": "hook",
    "release": "hook",
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
    if kind in ("switch", "hook"):
        assert service_account == HOOK_SERVICE_ACCOUNT
        assert pod.mounts() == {}  # talks to the API; never holds the ReadWriteOnce claim
    else:
        # Only the hook may patch the claim: its account must not leak into other jobs.
        assert service_account != HOOK_SERVICE_ACCOUNT
    if kind in ("fio", "train", "data"):
        assert pod.mounts() == CLAIM
    else:
        assert pod.mounts() == {}
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


@pytest.mark.parametrize("agent_config", AGENT_CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_component_compiles_to_a_valid_pod(path: Path, agent_config: Path) -> None:
    kind, params = KIND_OF_COMPONENT[path.parent.name]
    job = compile_component(path, params, agent_config=agent_config)
    assert job.manifest["metadata"]["namespace"] == "ml-team"
    image = "registry.example.com/ml/checkpoint-storage-bench"
    # A PyTorchJob makes pods of each replica type (test_distributed.py looks closer).
    pods = list(job.replicas().values()) if kind == "pytorchjob" else [job]
    for pod in pods:
        if path.name == "latest.yaml" or path in current_versions():
            assert pod.main["image"] == f"{image}:{package_version()}"
        else:
            assert pod.main["image"].startswith(f"{image}:")
        if kind == "pytorchjob":
            assert pod.mounts() == {"/checkpoints": "training-checkpoints-shared"}
            assert pod.spec.get("serviceAccountName") != HOOK_SERVICE_ACCOUNT
        else:
            assert_kind_of_op(pod, kind)
        assert_valid_pod(pod)


def test_dag_components_have_no_pod_of_their_own() -> None:
    # A DAG is scheduled by the server; only its ops become pods (compiled below).
    dags = {p.parent.name for p in COMPONENTS.glob("*/latest.yaml") if is_dag(p)}
    assert dags == {"checkpoint-stage", "checkpoint-storage-profiles"}


@pytest.fixture(scope="module", params=AGENT_CONFIGS, ids=lambda p: p.stem)
def two_profile_jobs(request) -> dict[str, Pod]:
    """Every job of the two-profile pipeline with its defaults, compiled with one agent config."""
    return pipeline_jobs(agent_config=request.param)


def test_pipeline_runs_exactly_these_jobs(two_profile_jobs) -> None:
    assert list(two_profile_jobs) == list(PIPELINE_ARGV)


@pytest.mark.parametrize("job", list(PIPELINE_ARGV))
def test_pipeline_job_compiles_to_the_expected_command(two_profile_jobs, job: str) -> None:
    pod = two_profile_jobs[job]
    assert pod.argv == PIPELINE_ARGV[job]
    name = job.rsplit("/", 1)[1].split("[")[0]
    assert_kind_of_op(pod, KIND_OF_RUN.get(name, name))
    assert_valid_pod(pod)


def test_the_env_labels_the_profile_the_switch_applied(two_profile_jobs) -> None:
    for i, profile in enumerate(("checkpoint-baseline", "checkpoint-throughput")):
        for run in ("fio", "train[0]"):
            assert (
                two_profile_jobs[f"{GENERAL}/stages[{i}]/{run}"].env["STORAGE_PROFILE"] == profile
            )


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
    (general,) = small.children("comparison")
    baseline, tmpfs = general.children("stages")
    train = tmpfs.compile_op("train", extra={"repeat": 0}, index=0).argv
    assert train[train.index("--model-size") + 1] == "4MiB"
    assert train[train.index("--steps") + 1] == "6"
    assert train[train.index("--checkpoint-every") + 1] == "2"
    assert train[train.index("--checkpoint-dir") + 1].startswith("/checkpoints/checkpoint-tmpfs-")
    fio = baseline.compile_op("fio").argv
    assert fio[-2:] == ["0.001", "--runtime=2"]
    for stage in (baseline, tmpfs):
        switch = stage.compile_op("switch").argv
        assert switch[-5:-2] == [
            "--backend",
            "local",
            "--profiles-file=connections/sandbox-profiles.yaml",
        ]
    assert tmpfs.compile_op("switch").argv[9] == "checkpoint-tmpfs"
    for op in ("plan", "release"):
        argv = [a for a in general.compile_op(op).argv if not a.startswith("--restore-class")]
        at = argv.index("--backend")
        assert argv[at : at + 3] == [
            "--backend",
            "local",
            "--profiles-file=connections/sandbox-profiles.yaml",
        ]
    # The plan judges the checkpoints a run makes from the stages' own settings.
    assert {"--steps=6", "--checkpoint-every=2"} <= set(general.compile_op("plan").argv)
    compare = general.compile_op("compare").argv
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


def test_the_lease_duration_reaches_every_switch_of_the_pipeline() -> None:
    # The Lease must outlast a stage (its fio sweep and training runs until the next
    # switch renews it): the pipeline's input is what every switch, the restore included,
    # takes the Lease for.
    params = {"lease_duration": 43200, "restore_after": True}
    switches = {
        name: pod.argv
        for name, pod in pipeline_jobs(params=params).items()
        if name.endswith(("/switch", "/restore"))
    }
    assert len(switches) == 3, sorted(switches)
    for name, argv in switches.items():
        assert argv[argv.index("--lease-duration") + 1] == "43200", name
