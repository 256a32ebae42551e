"""Every name a data workload writes is the contract's: its outputs, its metrics, its
summary's keys and the details fields the verdict reads back; and the component declares
the contract's outputs. A writer that emits a name of its own fails here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from checkpoint_storage_bench.contract import (
    DATA_COMPARABLE_INPUTS,
    DATA_REQUIRED_INPUTS,
    DATA_SUMMARY_CONFIG,
    DATA_SUMMARY_DETAILS,
    DATA_SUMMARY_EPOCH,
    DATA_SUMMARY_EPOCHS,
    DATA_SUMMARY_KEYS,
    DATA_SUMMARY_OUTPUTS,
    DATA_SUMMARY_ROUNDS,
    DATA_WORKLOAD_METRICS,
    DATA_WORKLOAD_OUTPUTS,
    DATA_WORKLOADS,
    SCAN_EPOCH_METRICS,
    WORKLOAD_INPUT,
    WORKSPACE_SAVE_P99_MS,
)
from checkpoint_storage_bench.tracking import Tracker

from .helpers import TINY, run_cli

REPO = Path(__file__).resolve().parents[2]
ARGS = {
    "scan": [*TINY, "--epochs", "2", "--num-workers", "1"],
    "materialize": TINY,
    "workspace": ["--files", "5", "--rounds", "2"],
}


@pytest.fixture
def logged(monkeypatch) -> dict[str, Any]:
    """What the run hands to tracking: metric names by step, output names."""
    seen: dict[str, Any] = {"metrics": {}, "outputs": set(), "inputs": set()}

    def log_metrics(self, step: int, values: dict[str, float | None]) -> None:
        seen["metrics"].setdefault(step, {}).update(values)

    def log_outputs(self, **values: Any) -> None:
        seen["outputs"] |= set(values)

    def log_inputs(self, **values: Any) -> None:
        seen["inputs"] |= set(values)

    monkeypatch.setattr(Tracker, "log_inputs", log_inputs)
    monkeypatch.setattr(Tracker, "log_metrics", log_metrics)
    monkeypatch.setattr(Tracker, "log_outputs", log_outputs)
    return seen


@pytest.mark.parametrize("workload", DATA_WORKLOADS)
def test_every_name_a_workload_writes_is_the_contracts(
    data_dir: Path, workload: str, logged: dict[str, Any]
) -> None:
    summary_path = data_dir / "summary.json"
    result = run_cli(
        workload, "--data-dir", data_dir, "--no-track", "--summary-json", summary_path,
        *ARGS[workload],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(summary_path.read_text())
    assert tuple(summary) == DATA_SUMMARY_KEYS
    assert set(summary[DATA_SUMMARY_OUTPUTS]) == set(DATA_WORKLOAD_OUTPUTS[workload])
    assert logged["outputs"] == set(DATA_WORKLOAD_OUTPUTS[workload])
    # What the verdict compares and requires of a run, the run records.
    wanted = {*DATA_COMPARABLE_INPUTS[workload], *DATA_REQUIRED_INPUTS[workload]}
    assert wanted <= logged["inputs"], wanted - logged["inputs"]
    assert wanted - {WORKLOAD_INPUT} <= set(summary[DATA_SUMMARY_CONFIG])
    names = {name for values in logged["metrics"].values() for name in values}
    assert names == set(DATA_WORKLOAD_METRICS[workload])
    details = summary[DATA_SUMMARY_DETAILS]
    # The verdict rebuilds the metrics from the summary's details: the two must agree.
    if workload == "scan":
        rebuilt = {
            e[DATA_SUMMARY_EPOCH]: {m: e[f] for f, m in SCAN_EPOCH_METRICS.items()}
            for e in details[DATA_SUMMARY_EPOCHS]
        }
        assert rebuilt == logged["metrics"] and sorted(rebuilt) == [0, 1]
    elif workload == "workspace":
        rounds = details[DATA_SUMMARY_ROUNDS]
        assert len(rounds) == 2
        assert {i: {WORKSPACE_SAVE_P99_MS: v} for i, v in enumerate(rounds)} == logged["metrics"]
    else:
        assert logged["metrics"] == {}


def test_the_component_declares_the_contracts_outputs() -> None:
    doc = yaml.safe_load((REPO / "components" / "data-workload" / "latest.yaml").read_text())
    declared = [o["name"] for o in doc["outputs"]]
    assert len(declared) == len(set(declared))
    assert set(declared) == {o for outputs in DATA_WORKLOAD_OUTPUTS.values() for o in outputs}
