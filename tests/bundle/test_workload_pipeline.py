"""The profiles pipeline's workload choice: one input, the same plan/stage/verdict structure;
each stage runs the data-workload job instead of the training for a data workload."""

from __future__ import annotations

import pytest

from checkpoint_compare.intervals import values_for_interval
from checkpoint_storage_bench.contract import (
    DATA_WORKLOADS,
    VERDICT_CONFIDENCE,
    VERDICT_WARMUP,
    WORKLOADS,
)
from tests.bundle.bundle import PIPELINE_UUID, PROFILES_PIPELINE, check, load_dag
from tests.bundle.params import SMALL_THREE

THREE = SMALL_THREE["profiles"]


def test_the_workload_input_offers_the_contracts_workloads() -> None:
    (io,) = [i for i in check(PROFILES_PIPELINE).component.inputs if i.name == "workload"]
    assert io.value == "checkpoint" and io.validation.options == list(WORKLOADS)


@pytest.mark.parametrize("workload", DATA_WORKLOADS)
def test_a_data_workload_runs_in_every_stage_instead_of_the_training(workload: str) -> None:
    dag = load_dag(
        PROFILES_PIPELINE,
        {
            **SMALL_THREE,
            "workload": workload,
            "dataset_size": "8MiB",
            "num_workers": 4,
            "epochs": 5,
            "codec": "zlib",
        },
    )
    jobs = dag.jobs()
    names = [path.split("/", 2)[-1] for path in jobs]
    assert not [n for n in names if n.split("/")[-1].startswith("train")]
    for i, profile in enumerate([*THREE, THREE[0]]):
        stage = [p for p in jobs if f"/stages[{i}]/" in p]
        runs = [p.rsplit("/", 1)[1] for p in stage]
        # The Lease is renewed after the sweep for the data workload's runs as for training.
        assert runs == ["switch", "fio", "renew", "data[0]", "data[1]"], runs
        for path in stage[3:]:
            pod = jobs[path]
            assert pod.argv[:4] == ["python", "-m", "data_workloads", workload]
            assert pod.env["STORAGE_PROFILE"] == profile  # the class the switch applied
            assert "--data-dir" in pod.argv
            assert pod.argv[pod.argv.index("--data-dir") + 1] == "/checkpoints/datasets"
            if workload == "scan":
                assert "--num-workers=4" in pod.argv and "--dataset-size=8MiB" in pod.argv
                assert "--epochs=5" in pod.argv
            if workload != "workspace":
                assert "--codec=zlib" in pod.argv
    # The verdict's join gathers the data runs with the switches and fio sweeps.
    runs, _figures, _fio = dag.joins("compare")
    assert runs.query == f"controller: {PIPELINE_UUID}, kind: job, name: switch|fio|train|data"


def test_the_workload_budget_reaches_the_verdicts_command_line() -> None:
    dag = load_dag(PROFILES_PIPELINE, {**SMALL_THREE, "workload": "scan", "min_au": 0.9})
    argv = dag.compile_op("compare", extra={"runs": ["0" * 32]}).argv
    assert "--min-au=0.9" in argv and not any(a.startswith("--max-p99-ms") for a in argv)
    dag = load_dag(PROFILES_PIPELINE, {**SMALL_THREE, "workload": "workspace", "max_p99_ms": 20})
    argv = dag.compile_op("compare", extra={"runs": ["0" * 32]}).argv
    assert "--max-p99-ms=20.0" in argv or "--max-p99-ms=20" in argv


def test_a_scan_run_gives_the_verdict_several_epochs_by_default() -> None:
    """The pipeline's default epochs reach every data op: after the verdict's warm-up, enough
    samples from one run per profile for the verdict's 95 % interval."""
    (io,) = [i for i in check(PROFILES_PIPELINE).component.inputs if i.name == "epochs"]
    assert io.value - VERDICT_WARMUP >= values_for_interval(VERDICT_CONFIDENCE)
    dag = load_dag(PROFILES_PIPELINE, {**SMALL_THREE, "workload": "scan"})
    data = [pod for path, pod in dag.jobs().items() if path.rsplit("/", 1)[1].startswith("data")]
    assert data and all(f"--epochs={io.value}" in pod.argv for pod in data)
    assert all("--codec=none" in pod.argv for pod in data)


def test_the_workspace_the_pipeline_saves_is_the_calibrated_one_unless_asked_otherwise() -> None:
    """The workspace's files, their size and the rounds reach every data op, by default the
    workspace the calibration measured (docs/compare.md: 40 x 1 MiB, 5 rounds; notebooks of
    16 KiB never reach a class's limits, so their saves cannot tell the classes apart)."""
    defaults = {i.name: i.value for i in check(PROFILES_PIPELINE).component.inputs}
    assert (defaults["files"], defaults["file_size"], defaults["rounds"]) == (40, "1MiB", 5)
    for given, expected in (
        ({}, ["--files=40", "--file-size=1MiB", "--rounds=5"]),
        ({"files": 7, "file_size": "64KiB", "rounds": 3}, ["--files=7", "--file-size=64KiB", "--rounds=3"]),
    ):  # fmt: skip
        dag = load_dag(PROFILES_PIPELINE, {**SMALL_THREE, "workload": "workspace", **given})
        data = [
            pod for path, pod in dag.jobs().items() if path.rsplit("/", 1)[1].startswith("data")
        ]
        assert data and all(set(expected) <= set(pod.argv) for pod in data), data[0].argv
    scan = load_dag(PROFILES_PIPELINE, {**SMALL_THREE, "workload": "scan"}).jobs()
    assert not any("--files=40" in pod.argv for pod in scan.values())  # a workspace's only
