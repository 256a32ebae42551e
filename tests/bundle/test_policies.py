"""How each component behaves as a Polyaxon job on a cluster: caching, retries, deadlines, env.

Everything is read from the compiled job (Polyaxon's converter, the agent config in
``connections/``), i.e. what the operator would hand to Kubernetes, not from the YAML text.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest

from tests.bundle.bundle import (
    COMPONENTS,
    Pod,
    check,
    compile_component,
    current,
    load_yaml_documents,
)
from tests.bundle.params import PLACEMENT, REAL_PARAMS

IMAGE = "registry.example.com/ml/checkpoint-storage-bench:9.9.9"
FIXED_UUID = "0123456789abcdef0123456789abcdef"

# The trainer's exit codes (docs/contracts.md) and whether another try can fix them.
TRAINER_FINAL = {
    1: "unexpected error (a bug)",
    2: "bad arguments",
    3: "checkpoint dir missing or unwritable",
    4: "no space left",
    6: "no usable checkpoint / corrupt data",
    137: "killed: out of memory",
}
TRAINER_RETRYABLE = {5: "upload failed after the uploader's own retries"}


def pod_failure_action(
    policy: dict[str, Any], container: str, exit_code: int | None, conditions: tuple[str, ...] = ()
) -> str:
    """The action Kubernetes' Job controller takes for a failed pod (batch/v1 podFailurePolicy).

    The rules are tried in order and the first that matches decides; with none matching the
    failure counts against backoffLimit (``Count``).
    """
    for rule in policy["rules"]:
        on_codes, on_conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if on_codes is not None and exit_code is not None:
            if on_codes.get("containerName") in (None, container):
                inside = exit_code in on_codes["values"]
                if inside == (on_codes["operator"] == "In"):
                    return rule["action"]
        if on_conditions is not None:
            for condition in on_conditions:
                if condition["type"] in conditions and condition.get("status", "True") == "True":
                    return rule["action"]
    return "Count"


def retried(pod: Pod, exit_code: int | None, conditions: tuple[str, ...] = ()) -> bool:
    """Whether the Job makes another pod after this failure (first failure, backoffLimit > 0)."""
    policy = pod.termination.get("podFailurePolicy") or {"rules": []}
    action = pod_failure_action(policy, pod.main["name"], exit_code, conditions)
    return action in ("Count", "Ignore") and pod.termination.get("backoffLimit", 6) > 0


def test_the_policy_reader_follows_kubernetes_order() -> None:
    # First match wins: a disrupted pod whose container was SIGKILLed is a disruption.
    policy = {
        "rules": [
            {
                "action": "Count",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [5]}},
        ]
    }
    assert pod_failure_action(policy, "main", 137, ("DisruptionTarget",)) == "Count"
    assert pod_failure_action(policy, "main", 137) == "FailJob"
    assert pod_failure_action(policy, "main", 5) == "Count"
    other_container = {"rules": [{**policy["rules"][1], "onExitCodes": {
        "containerName": "sidecar", "operator": "In", "values": [3]}}]}  # fmt: skip
    assert pod_failure_action(other_container, "main", 3) == "Count"


@pytest.fixture(scope="module")
def training() -> Pod:
    return compile_component(
        current("checkpoint-training"),
        {"storage_profile": "checkpoint-baseline", "image": IMAGE},
        run_uuid=FIXED_UUID,
    )


@pytest.fixture(scope="module")
def hook() -> Pod:
    return compile_component(
        current("storage-profile"), {"target_class": "checkpoint-throughput", "timeout": 1800}
    )


@pytest.mark.parametrize("code", sorted(TRAINER_FINAL), ids=lambda c: f"exit-{c}")
def test_training_fails_at_once_on_what_a_retry_cannot_fix(training: Pod, code: int) -> None:
    assert not retried(training, code), TRAINER_FINAL[code]


@pytest.mark.parametrize("code", sorted(TRAINER_RETRYABLE), ids=lambda c: f"exit-{c}")
def test_training_retries_a_failed_upload(training: Pod, code: int) -> None:
    assert retried(training, code), TRAINER_RETRYABLE[code]


def test_training_retries_the_loss_of_its_node(training: Pod) -> None:
    # Drain, preemption or node failure: the kubelet's SIGKILL (137) is not the trainer's.
    assert retried(training, 137, ("DisruptionTarget",))
    assert retried(training, None, ("DisruptionTarget",))
    assert 1 <= training.termination["backoffLimit"] <= 3


@pytest.fixture(scope="module")
def plan() -> Pod:
    return compile_component(current("storage-profile-plan"), {"profiles": ["a", "b"]})


@pytest.fixture(scope="module")
def release() -> Pod:
    return compile_component(current("storage-profile-release"), {"holder": FIXED_UUID})


@pytest.mark.parametrize("fixture", ["training", "hook", "plan", "release"])
def test_pod_failure_policy_is_valid_on_a_kubernetes_job(fixture: str, request) -> None:
    pod: Pod = request.getfixturevalue(fixture)
    policy = pod.termination["podFailurePolicy"]
    # Kubernetes refuses a podFailurePolicy unless the pod template never restarts in place.
    assert pod.spec["restartPolicy"] == "Never"
    for rule in policy["rules"]:
        if "onExitCodes" in rule:
            assert rule["onExitCodes"]["containerName"] == pod.main["name"]
        for condition in rule.get("onPodConditions") or []:
            assert condition["status"] == "True"  # a string, not YAML's boolean
    assert kubernetes_validate.validate(pod.as_job(), "1.34.0", strict=True)


def test_a_misspelled_policy_is_refused_by_the_validation(training: Pod) -> None:
    # The validation above must be able to fail.
    job = training.as_job()
    job["spec"]["podFailurePolicy"]["rules"][0]["onPodCondition"] = [{"type": "X"}]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.34.0", strict=True)


def test_the_hook_is_never_retried_on_failure(hook: Pod) -> None:
    # Each switch is a volume modification counted against the provider's limit.
    for code in (1, 2, 3, 4, 5):
        assert not retried(hook, code), code
    assert retried(hook, None, ("DisruptionTarget",))


def test_a_refused_plan_is_final(plan: Pod) -> None:
    # Exit 3: the modifications do not fit the window now; trying again at once cannot help.
    for code in (1, 2, 3):
        assert not retried(plan, code), code
    assert plan.termination["activeDeadlineSeconds"] > 0


def test_the_release_is_tried_again(release: Pod) -> None:
    # Idempotent, and a lease left behind blocks the claim until it expires.
    assert retried(release, 1)
    assert not retried(release, 2)  # bad arguments stay bad


@pytest.mark.parametrize("timeout", [60, 1800, 7200])
def test_the_hook_has_a_backstop_above_its_own_deadline(timeout: int) -> None:
    pod = compile_component(current("storage-profile"), {"target_class": "x", "timeout": timeout})
    argv = pod.argv
    assert argv[argv.index("--timeout") + 1] == str(timeout)
    # Room above the hook's own deadline for pulling the image and starting the pod.
    assert pod.termination["activeDeadlineSeconds"] >= timeout + 600


def test_every_component_disables_caching_itself() -> None:
    # A measurement must never come from cache, even when an op runs on its own (without the
    # pipeline's cache settings).
    for path in sorted(COMPONENTS.glob("*/latest.yaml")):
        (doc,) = load_yaml_documents(path)
        assert doc.get("cache") == {"disable": True}, path
        # Polyaxon reads it as the component's own cache policy.
        assert check(path, REAL_PARAMS[path.parent.name][0]).component.cache.disable is True


KIND_PARAMS = {
    "checkpoint-training": {"storage_profile": "x"},
    "storage-profile": {"target_class": "x"},
    "fio-sweep": {},
    "checkpoint-compare": {"pipeline": "0" * 32},
}


@pytest.mark.parametrize("name", ["checkpoint-training", "fio-sweep"])
def test_measuring_jobs_record_their_node_and_image(name: str) -> None:
    pod = compile_component(current(name), {**KIND_PARAMS[name], "image": IMAGE})
    assert pod.main["image"] == IMAGE
    # The node comes from the downward API: only the kubelet knows it.
    assert pod.field_ref("NODE_NAME") == "spec.nodeName"
    if name == "checkpoint-training":
        # The image reference the run was started with, as the trainer's provenance.
        assert pod.env["IMAGE_REF"] == IMAGE


@pytest.mark.parametrize("name", ["checkpoint-training", "fio-sweep"])
def test_placement_inputs_reach_the_pod(name: str) -> None:
    pod = compile_component(current(name), {**KIND_PARAMS[name], **PLACEMENT})
    assert pod.spec["nodeSelector"] == PLACEMENT["node_selector"]
    assert pod.spec["tolerations"] == PLACEMENT["tolerations"]
    assert pod.spec["affinity"] == PLACEMENT["affinity"]
    assert kubernetes_validate.validate(pod.as_pod(), "1.34.0", strict=True)
    unplaced = compile_component(current(name), KIND_PARAMS[name])
    assert not {"nodeSelector", "tolerations", "affinity"} & set(unplaced.spec)


SMALL_NODE = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "6Gi"}}
DEFAULT_RESOURCES = {
    "checkpoint-training": {
        "requests": {"cpu": "4", "memory": "8Gi"},
        "limits": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "1"},
    },
    "fio-sweep": {
        "requests": {"cpu": "2", "memory": "2Gi"},
        "limits": {"cpu": "4", "memory": "4Gi"},
    },
    "data-workload": {
        "requests": {"cpu": "4", "memory": "8Gi"},
        "limits": {"cpu": "8", "memory": "16Gi"},
    },
}


@pytest.mark.parametrize("name", list(DEFAULT_RESOURCES))
def test_resources_default_to_a_training_node_and_are_an_input(name: str) -> None:
    params = KIND_PARAMS.get(name, {"storage_profile": "checkpoint-baseline"})
    assert compile_component(current(name), params).main["resources"] == DEFAULT_RESOURCES[name]
    sized = compile_component(current(name), {**params, "resources": SMALL_NODE})
    assert sized.main["resources"] == SMALL_NODE
    assert kubernetes_validate.validate(sized.as_pod(), "1.34.0", strict=True)


def test_the_gpu_limit_follows_the_ranks() -> None:
    pod = compile_component(
        current("checkpoint-training"),
        {"storage_profile": "checkpoint-baseline", "nproc_per_node": 4, "parallel": "ddp"},
    )
    assert pod.main["resources"]["limits"]["nvidia.com/gpu"] == "4"


# ---- the command lines: Polyaxon's idioms (argFormat, isFlag, toEnv) render the same argv
# as the hand-built "{{ '--x' if x else '' }}" strings of the first v1.1 files did.

TRAIN_DIR = "/checkpoints/throughput-resumed"
COMMAND_LINES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "checkpoint-training",
        {"storage_profile": "checkpoint-baseline"},
        [
            *["python", "-m", "trainer"],
            *["--checkpoint-dir", f"/checkpoints/checkpoint-baseline-{FIXED_UUID}"],
            *["--summary-json", f"/checkpoints/checkpoint-baseline-{FIXED_UUID}/summary.json"],
            *["--storage-profile", "checkpoint-baseline", "--steps", "200"],
            *["--checkpoint-every", "50", "--keep", "2", "--model-size", "1GiB", "--seed", "0"],
            *["--format", "raw", "--durability", "fsync", "--sync", "--device", "auto"],
            *["--batch-size", "8", "--seq-len", "64", "--lr", "0.0003", "--log-every", "10"],
            *["--resume", "auto", "--io-streams", "1", "--parallel", "none"],
            *["--checkpoint-timeout", "600.0"],
        ],
    ),
    (
        "checkpoint-training",
        {
            "storage_profile": "checkpoint-throughput",
            "checkpoint_dir": TRAIN_DIR,
            "resume": "always",
            "upload_to": "s3://acme-ml-checkpoints/run-1",
            "async_checkpoint": True,
            "track": False,
            "checkpoint_format": "dcp",
            "io_streams": 4,
            "no_overlap": True,
            "nproc_per_node": 1,
            "parallel": "fsdp",
        },
        [
            *["python", "-m", "trainer", "--checkpoint-dir", TRAIN_DIR],
            *["--summary-json", f"{TRAIN_DIR}/summary.json"],
            *["--storage-profile", "checkpoint-throughput", "--steps", "200"],
            *["--checkpoint-every", "50", "--keep", "2", "--model-size", "1GiB", "--seed", "0"],
            *["--format", "dcp", "--durability", "fsync", "--async", "--device", "auto"],
            *["--batch-size", "8", "--seq-len", "64", "--lr", "0.0003", "--log-every", "10"],
            *["--resume", "always", "--io-streams", "4", "--parallel", "fsdp"],
            *["--checkpoint-timeout", "600.0"],
            *["--no-overlap", "--upload-to=s3://acme-ml-checkpoints/run-1", "--no-track"],
        ],
    ),
    (
        "storage-profile",
        {"target_class": "checkpoint-throughput"},
        [
            *["python", "-m", "hooks.storage_profile", "switch", "--namespace", "ml-team"],
            *["--claim", "training-checkpoints", "--to", "checkpoint-throughput"],
            *["--timeout", "14400", "--pending-grace", "120", "--settle", "provider"],
            *["--on-infeasible", "fail", "--lease-duration", "21600", "--backend", "kubernetes"],
        ],
    ),
    (
        "storage-profile",
        {
            "target_class": "checkpoint-baseline",
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "dry_run": True,
            "force": True,
        },
        [
            *["python", "-m", "hooks.storage_profile", "switch", "--namespace", "ml-team"],
            *["--claim", "training-checkpoints", "--to", "checkpoint-baseline"],
            *["--timeout", "14400", "--pending-grace", "120", "--settle", "provider"],
            *["--on-infeasible", "fail", "--lease-duration", "21600", "--backend", "local"],
            *["--profiles-file=connections/sandbox-profiles.yaml", "--dry-run", "--force"],
        ],
    ),
    (
        "fio-sweep",
        {},
        ["python", "-m", "fio_sweep", "--mount", "/checkpoints", "--size-scale", "1.0"],
    ),
    (
        "fio-sweep",
        {
            "target": "/checkpoints/fio-smoke",
            "spec": "checkpoint-matrix",
            "runtime": 5,
            "reference_dir": "/tmp/fio-reference",
            "track": False,
        },
        [
            *["python", "-m", "fio_sweep", "--mount", "/checkpoints", "--size-scale", "1.0"],
            *["--target=/checkpoints/fio-smoke", "--spec=checkpoint-matrix", "--runtime=5"],
            *["--reference-dir=/tmp/fio-reference", "--no-track"],
        ],
    ),
]


@pytest.mark.parametrize(
    ("name", "params", "argv"),
    COMMAND_LINES,
    ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(COMMAND_LINES)],
)
def test_the_command_line_is_exactly(name: str, params: dict, argv: list[str]) -> None:
    assert compile_component(current(name), params, run_uuid=FIXED_UUID).argv == argv


def test_the_profile_label_reaches_the_env(training: Pod) -> None:
    assert training.env["STORAGE_PROFILE"] == "checkpoint-baseline"
    fio = compile_component(current("fio-sweep"), {})
    assert fio.env["STORAGE_PROFILE"] == ""  # unset: no label, never the string "null"


# "{{ '--x=' ~ x if x else '' }}", "{{ '--x' if x else '' }}": a flag built by hand.
HAND_BUILT_FLAG = re.compile(r"'--[^']*'[^{}]*\bif\b[^{}]*\belse\s+''")


def test_no_hand_built_optional_flags_are_left() -> None:
    # Polyaxon's own idioms (argFormat/isFlag with params.X.as_arg) instead.
    for path in sorted(COMPONENTS.glob("*/latest.yaml")):
        (doc,) = load_yaml_documents(path)
        for arg in _container_args(doc):
            assert not HAND_BUILT_FLAG.search(arg), f"{path}: {arg}"
    # The check must be able to fail: the released v1.0 files still build flags by hand.
    (released,) = load_yaml_documents(COMPONENTS / "checkpoint-training" / "v1.0.yaml")
    assert any(HAND_BUILT_FLAG.search(arg) for arg in _container_args(released))


def _container_args(doc: dict[str, Any]) -> list[str]:
    """The args of every container of a job component (one template string counts as one)."""
    run = doc["run"]
    if run["kind"] == "dag":
        return []
    replicas = [run[r] for r in ("master", "worker") if r in run] or [run]
    found = []
    for replica in replicas:
        args = replica["container"].get("args") or []
        found += [args] if isinstance(args, str) else [a for a in args if isinstance(a, str)]
    return found
