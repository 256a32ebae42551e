"""Run the training and fio components' compiled command lines for real, tiny, on a local dir.

The argv is exactly what the pod would run, with the claim's mount path /checkpoints pointed
at a temporary directory (as the sandbox's agent does). The runs log offline; every output
a component declares must be one its CLI really logs, or the pipeline's `ref: ops.X,
value: outputs.Y` params would have nothing to resolve.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_storage_bench.contract import (
    DATA_WORKLOAD_OUTPUTS,
    DATA_WORKLOADS,
    DISTRIBUTED_OUTPUTS,
    WORLD_SIZE,
)
from tests.bundle.bundle import ROOT, check, compile_component, current

MOUNT = "/checkpoints"


def localized(argv: list[str], mount: Path) -> list[str]:
    """The argv with the claim's mount path replaced by a local directory."""
    return [sys.executable if arg == "python" else arg.replace(MOUNT, str(mount)) for arg in argv]


def offline_runs() -> list[dict]:
    root = Path(os.environ["POLYAXON_OFFLINE_ROOT"])
    return [json.loads(p.read_text()) for p in sorted(root.glob("runs/*/run.plx.json"))]


def declared_outputs(name: str, params: dict) -> set[str]:
    component = check(current(name), params).component
    return {io.name for io in component.outputs}


def run_component(name: str, params: dict, mount: Path) -> dict:
    """Compile the component, run its command and return its one offline run's record."""
    pod = compile_component(current(name), params)
    # The component's own env; Polyaxon's (POLYAXON_RUN_INSTANCE...) would mean a live run.
    own_env = {k: v for k, v in pod.env.items() if v is not None and "POLYAXON" not in k}
    result = subprocess.run(
        localized(pod.argv, mount),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **own_env},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = offline_runs()
    return run


@pytest.mark.slow
def test_training_command_runs_and_logs_every_declared_output(tmp_path: Path) -> None:
    params = {
        "storage_profile": "checkpoint-baseline",
        "checkpoint_dir": f"{MOUNT}/checkpoint-baseline-test",
        "model_size": "1MiB",
        "steps": 4,
        "checkpoint_every": 2,
        "batch_size": 2,
        "seq_len": 16,
        "device": "cpu",
        # An upload target, so the upload stage (and its outputs) are measured too.
        "upload_to": f"file://{tmp_path}/uploads",
        # The restore figures are measured on resume or by the end-of-run restore check.
        "restore_check": True,
    }
    mount = tmp_path / "claim"
    (mount / "checkpoint-baseline-test").mkdir(parents=True)
    run = run_component("checkpoint-training", params, mount)
    outputs = run["outputs"]
    # The aggregate and slowest-rank medians exist only when several ranks wrote.
    several_ranks_only = set(DISTRIBUTED_OUTPUTS) - {WORLD_SIZE}
    # The read-back checksum is a stage of the library formats only (raw checks as it writes).
    library_formats_only = {"ckpt_checksum_s_median"}
    missing = (
        declared_outputs("checkpoint-training", params)
        - set(outputs)
        - several_ranks_only
        - library_formats_only
    )
    assert not missing, f"declared but not logged: {missing}"
    assert not several_ranks_only & set(outputs), "one process logged a many-ranks figure"
    assert outputs[WORLD_SIZE] == 1
    assert outputs["checkpoint_count"] == 2
    assert outputs["ckpt_upload_s_median"] > 0
    assert outputs["restore_s"] > 0 and outputs["restore_bytes"] > 0
    assert len(list((tmp_path / "uploads").iterdir())) >= 1
    assert run["inputs"]["storage_profile"] == "checkpoint-baseline"
    summary = json.loads((mount / "checkpoint-baseline-test" / "summary.json").read_text())
    assert summary["storage_profile"] == "checkpoint-baseline"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_fio_command_runs_and_logs_every_declared_output(tmp_path: Path) -> None:
    mount = tmp_path / "claim"
    mount.mkdir()
    reference = tmp_path / "reference"
    reference.mkdir()
    params = {
        "storage_profile": "checkpoint-throughput",
        "size_scale": 0.002,
        "runtime": 1,
        "reference_dir": str(reference),
    }
    run = run_component("fio-sweep", params, mount)
    missing = declared_outputs("fio-sweep", params) - set(run["outputs"])
    assert not missing, f"declared but not logged: {missing}"
    assert run["inputs"]["storage_profile"] == "checkpoint-throughput"
    assert list(mount.iterdir()) == []  # fio cleaned up after itself


@pytest.mark.slow
@pytest.mark.parametrize("workload", DATA_WORKLOADS)
def test_data_workload_command_runs_and_logs_its_outputs(tmp_path: Path, workload: str) -> None:
    mount = tmp_path / "claim"
    mount.mkdir()
    params = {
        "storage_profile": "checkpoint-throughput",
        "workload": workload,
        "dataset_size": "256KiB",
        "record_size": "4KiB",
        "shard_size": "64KiB",
        "output_shard_size": "64KiB",
        "epochs": 1,
        "num_workers": 1,
        "compute_ms": 1.0,
        "files": 5,
        "rounds": 1,
    }
    run = run_component("data-workload", params, mount)
    declared = declared_outputs("data-workload", params)
    assert set(DATA_WORKLOAD_OUTPUTS[workload]) <= declared
    missing = set(DATA_WORKLOAD_OUTPUTS[workload]) - set(run["outputs"])
    assert not missing, f"declared but not logged: {missing}"
    assert run["inputs"]["storage_profile"] == "checkpoint-throughput"
    assert run["inputs"]["workload"] == workload
    # Only the data dir on the claim; in it the reusable dataset and the summary.
    assert [p.name for p in mount.iterdir()] == ["datasets"]
    (summary,) = (mount / "datasets").glob(f".summary-{workload}-*.json")
    assert json.loads(summary.read_text())["storage_profile"] == "checkpoint-throughput"
