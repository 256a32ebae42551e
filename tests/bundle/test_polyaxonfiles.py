"""Every component, operation and pipeline file passes Polyaxon's own checks."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from polyaxon.exceptions import PolyaxonfileError

from tests.bundle.bundle import (
    COMPONENTS,
    PIPELINE,
    POLYAXONFILES,
    PROFILES_PIPELINE,
    ROOT,
    all_polyaxonfiles,
    check,
    component_names,
    current,
    load_dag,
)

POLYAXON = [sys.executable, "-m", "polyaxon"]
FILES = all_polyaxonfiles()


def polyaxon_check(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``polyaxon check`` CLI, as an author or CI would."""
    return subprocess.run(
        [*POLYAXON, "check", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


# One interpreter runs the real `polyaxon` command (polyaxon.cli:cli) once per file: a
# process per file would spend most of the time importing polyaxon again.
LINT_ALL = """
import json, sys
from click.testing import CliRunner
from polyaxon.cli import cli
results = {}
for path in sys.argv[1:]:
    r = CliRunner().invoke(cli, ["check", "--lint", "-f", path])
    results[path] = {"exit_code": r.exit_code, "output": r.output}
print(json.dumps(results))
"""


def lint(paths: list[Path]) -> dict[str, dict]:
    """``polyaxon check --lint -f FILE`` for each file: exit code and output by path."""
    result = subprocess.run(
        [sys.executable, "-c", LINT_ALL, *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def lint_results() -> dict[str, dict]:
    return lint(FILES)


def test_the_bundle_has_every_kind_of_file() -> None:
    assert {"checkpoint-training", "storage-profile", "fio-sweep"} <= set(component_names())
    assert PIPELINE in FILES
    assert len(list(POLYAXONFILES.glob("*.yaml"))) >= 3


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_polyaxon_check_lint(path: Path, lint_results) -> None:
    result = lint_results[str(path)]
    assert result["exit_code"] == 0, result["output"]
    assert "Polyaxonfile valid" in result["output"]


GENERAL = COMPONENTS / "checkpoint-storage-profiles" / "v1.1.yaml"


@pytest.mark.parametrize(
    ("old", "new", "lint_only", "message"),
    [
        # A schema error: lint catches it.
        ("trigger: all_done", "trigger: whenever", True, "whenever"),
        # A dependency on an op that does not exist: only the full check builds the DAG.
        ("dependencies: [stages]", "dependencies: [stages-typo]", False, "stages-typo"),
    ],
)
def test_polyaxon_check_fails_on_a_broken_pipeline(
    tmp_path: Path, old: str, new: str, lint_only: bool, message: str
) -> None:
    # The checks above must be able to fail: the general pipeline, broken.
    shutil.copytree(COMPONENTS, tmp_path / "components")
    shutil.copytree(POLYAXONFILES, tmp_path / "polyaxonfiles")
    broken = tmp_path / "components" / GENERAL.parent.name / GENERAL.name
    assert old in GENERAL.read_text()
    broken.write_text(GENERAL.read_text().replace(old, new, 1))
    result = polyaxon_check(*(["--lint"] if lint_only else []), "-f", str(broken))
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    if lint_only:
        assert lint([broken])[str(broken)]["exit_code"] != 0
    with pytest.raises(PolyaxonfileError):
        check(broken)
    # Through the two-profile pipeline that nests it: Polyaxon reads the nested component's
    # schema, but builds a nested DAG's graph only when the server runs it, so `polyaxon
    # check` passes an orphan dependency there. The bundle's tests build every nested DAG.
    wrapper = tmp_path / "polyaxonfiles" / PIPELINE.name
    if lint_only:
        with pytest.raises(PolyaxonfileError):
            check(wrapper)
    else:
        check(wrapper)  # passes: the nested graph is not built here
        (nested,) = load_dag(wrapper).children("comparison")
        with pytest.raises(Exception, match=message):
            nested.order()


def test_polyaxon_check_with_params_cli() -> None:
    result = polyaxon_check(
        "-f", str(POLYAXONFILES / "switch-throughput.yaml"), "-P", "settle=kubernetes"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    bad = polyaxon_check("-f", str(POLYAXONFILES / "switch-throughput.yaml"), "-P", "settle=soon")
    assert bad.returncode != 0
    assert "soon" in bad.stdout + bad.stderr


# Real params for every file: what the README, the sandbox and CI pass.
PLACEMENT = {
    "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": ["us-east-1a"],
                            }
                        ]
                    }
                ]
            }
        }
    },
}
THREE_PROFILES = ["checkpoint-baseline", "checkpoint-throughput", "checkpoint-io2"]
REAL_PARAMS: dict[str, list[dict]] = {
    "checkpoint-training": [
        {"storage_profile": "checkpoint-baseline"},
        {
            "storage_profile": "checkpoint-throughput",
            "checkpoint_dir": "/checkpoints/throughput-resumed",
            "resume": "always",
            "upload_to": "s3://acme-ml-checkpoints/run-1",
            "model_size": "16MiB",
            "steps": 20,
            "checkpoint_every": 5,
            "checkpoint_format": "raw",
            "durability": "none",
            "async_checkpoint": True,
            "device": "cpu",
            "track": False,
            "repeat": 2,
            **PLACEMENT,
        },
        {
            "storage_profile": "checkpoint-throughput",
            "nproc_per_node": 4,
            "parallel": "fsdp",
            "checkpoint_format": "dcp",
            "io_streams": 4,
            "no_overlap": True,
            "resume": "never",
        },
    ],
    "checkpoint-training-pytorchjob": [
        {"storage_profile": "checkpoint-baseline"},
        {
            "storage_profile": "checkpoint-throughput",
            "claim": "efs-checkpoints",
            "workers": 3,
            "nproc_per_node": 8,
            "parallel": "ddp",
            "checkpoint_format": "safetensors",
            "model_size": "16MiB",
            "steps": 20,
            "checkpoint_every": 5,
            "device": "cpu",
            "track": False,
            **PLACEMENT,
        },
    ],
    "storage-profile": [
        {"target_class": "checkpoint-throughput"},
        {
            "target_class": "checkpoint-baseline",
            "settle": "kubernetes",
            "on_infeasible": "rollback",
            "timeout": 7200,
            "dry_run": True,
            "force": True,
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "holder": "0123456789abcdef0123456789abcdef",
        },
    ],
    "storage-profile-plan": [
        {"profiles": ["checkpoint-baseline", "checkpoint-throughput"]},
        {
            "profiles": THREE_PROFILES,
            "return_to_first": True,
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "claim": "training-checkpoints",
            "namespace": "sandbox",
        },
    ],
    "storage-profile-release": [
        {"holder": "0123456789abcdef0123456789abcdef"},
        {
            "holder": "0123456789abcdef0123456789abcdef",
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "namespace": "sandbox",
        },
    ],
    "storage-profile-renew": [
        {},
        {
            "holder": "0123456789abcdef0123456789abcdef",
            "lease_duration": 7200,
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "namespace": "sandbox",
        },
    ],
    "fio-sweep": [
        {},
        {
            "size_scale": 0.01,
            "runtime": 5,
            "target": "/checkpoints/fio-smoke",
            "reference_dir": "/tmp/fio-reference",
            "spec": "checkpoint-matrix",
            "storage_profile": "checkpoint-throughput",
            "track": False,
            **PLACEMENT,
        },
    ],
    "data-workload": [
        {"storage_profile": "checkpoint-baseline"},
        {
            "storage_profile": "checkpoint-throughput",
            "workload": "materialize",
            "data_dir": "/checkpoints/datasets/imagenet-like",
            "dataset_format": "files",
            "dataset_size": "1GiB",
            "generate": False,
            "track": False,
            "repeat": 1,
            **PLACEMENT,
        },
        {"storage_profile": "checkpoint-baseline", "workload": "workspace", "files": 50},
        {"storage_profile": "checkpoint-baseline", "num_workers": 8, "compute_ms": 25.5},
    ],
    "checkpoint-compare": [
        {"pipeline": "0" * 32},
        {
            "runs": ["1" * 32, "2" * 32, "3" * 32],
            "profiles": THREE_PROFILES,
            "api_host": "http://127.0.0.1:8000",
            "project": "acme/checkpoint-storage",
            "pricing": "connections/pricing.yaml",
            "gpu_hourly": 4.5,
            "html": "/tmp/verdict.html",
            "json": "/tmp/verdict.json",
            "train_profiles": THREE_PROFILES,
            "runtime_s": [100.0, 90.5, 88.0],
            "ckpt_pause_s_median": [2.0, 1.1, 0.9],
            "ckpt_write_gbps_median": [0.12, 0.24, 0.5],
            "final_loss": [3.1, 3.1, 3.1],
            "fio_profiles": THREE_PROFILES,
            "fio_seqwrite_1m_bw_mbps": [125.0, 250.0, 1000.0],
            "max_pause_s": 2.0,
            "max_pause_share": 0.05,
            "checkpoints_per_month": 3000,
            "warmup": 1,
            "practical_floor_s": 0.1,
            "allow_resumed": True,
        },
    ],
    "checkpoint-stage": [
        {"profile": "checkpoint-baseline"},
        {
            "profile": "checkpoint-io2",
            "stage": 2,
            "repeats": 3,
            "holder": "0123456789abcdef0123456789abcdef",
            "backend": "local",
            "profiles_file": "connections/sandbox-profiles.yaml",
            "upload_to": "s3://acme-ml-checkpoints/comparison",
            **PLACEMENT,
        },
    ],
    "checkpoint-storage-profiles": [
        {},
        {
            "profiles": THREE_PROFILES,
            "repeats": 2,
            "return_to_first": True,
            "upload_to": "s3://acme-ml-checkpoints/comparison",
            "nproc_per_node": 8,
            "parallel": "fsdp",
            "max_pause_s": 2.0,
            "max_pause_share": 0.05,
            "checkpoints_per_month": 3000,
            **PLACEMENT,
        },
    ],
}
SMALL_PIPELINE = {
    "backend": "local",
    "profiles_file": "connections/sandbox-profiles.yaml",
    "model_size": "4MiB",
    "steps": 6,
    "checkpoint_every": 2,
    "size_scale": 0.001,
    "fio_runtime": 2,
    "restore_after": True,
    "api_host": "http://127.0.0.1:8000",
}
"""The sandbox's demo of the two-profile pipeline."""
SMALL_THREE = {
    **SMALL_PIPELINE,
    "profiles": ["checkpoint-baseline", "checkpoint-throughput", "checkpoint-throttled"],
    "repeats": 2,
    "return_to_first": True,
    "upload_to": "file:///tmp/checkpoint-uploads",
    "max_pause_s": 1.0,
    "checkpoints_per_month": 720,
}
"""The three-profile pipeline, small, with repeats and the return to the first profile."""


@pytest.mark.parametrize(
    ("path", "params"),
    [
        (p, params)
        for p in sorted(COMPONENTS.glob("*/*.yaml"))
        # Released history takes the plain params of its time; the current version all.
        for params in REAL_PARAMS[p.parent.name][: 1 if p.name == "v1.0.yaml" else None]
    ]
    + [(p, {}) for p in sorted(POLYAXONFILES.glob("*.yaml"))]
    + [(PIPELINE, SMALL_PIPELINE), (PROFILES_PIPELINE, SMALL_THREE)],
    ids=lambda x: str(x.relative_to(ROOT)) if isinstance(x, Path) else ",".join(x) or "defaults",
)
def test_check_polyaxonfile_with_real_params(path: Path, params: dict) -> None:
    operation = check(path, params)
    passed = {k: p.value for k, p in (operation.params or {}).items()}
    assert passed.items() >= params.items()


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("checkpoint-training", {}, "non optional inputs"),
        ("checkpoint-training", {"storage_profile": "x", "checkpoint_dir": "/tmp/x"}, "regex"),
        ("checkpoint-training", {"storage_profile": "x", "device": "gpu"}, "gpu"),
        ("checkpoint-training", {"storage_profile": "x", "steps": 0}, "greater than"),
        ("storage-profile", {"target_class": "x", "backend": "docker"}, "docker"),
        ("storage-profile", {"target_class": "x", "on_infeasible": "retry"}, "retry"),
        ("fio-sweep", {"mount": "/data"}, "regex"),
        ("fio-sweep", {"size_scale": 0}, "greater than"),
        ("storage-profile-plan", {}, "non optional inputs"),
        ("storage-profile-release", {}, "non optional inputs"),
        ("storage-profile-renew", {"lease_duration": 0}, "greater than"),
        ("storage-profile-renew", {"backend": "docker"}, "docker"),
        ("checkpoint-stage", {"profile": "x", "repeats": 0}, "greater than"),
        ("checkpoint-storage-profiles", {"repeats": 21}, "less than"),
        ("checkpoint-storage-profiles", {"backend": "docker"}, "docker"),
    ],
)
def test_bad_params_are_refused(name: str, params: dict, message: str) -> None:
    with pytest.raises(PolyaxonfileError) as error:
        check(current(name), params)
    assert re.search(message, str(error.value.__cause__ or error.value))


def test_every_component_input_has_a_type_and_a_description() -> None:
    for path in sorted(COMPONENTS.glob("*/v*.yaml")):
        component = check(path, REAL_PARAMS[path.parent.name][0]).component
        assert re.fullmatch(r"[-a-zA-Z0-9_]+", component.name), path
        assert component.name == path.parent.name, path
        assert component.description, path
        for io in [*component.inputs, *(component.outputs or [])]:
            assert io.type and io.description, f"{path}: {io.name}"
    for path in (PIPELINE,):
        component = check(path).component
        assert component.description, path
        for io in component.inputs:
            assert io.type and io.description, f"{path}: {io.name}"
