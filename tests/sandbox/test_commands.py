"""The demo's pipeline inputs (sandbox/commands.py: demo_params): only the declared ones,
the profiles' claim, every profile of an operation file's component, a data workload's."""

from __future__ import annotations

import json

import pytest
import yaml

from checkpoint_storage_bench.contract import (
    CADENCE_INPUT,
    DATA_WORKLOADS,
    WORKLOAD_BUDGETS,
)
from hooks.storage_profile.config import answerability
from sandbox.commands import demo_params
from sandbox.config import REPO_ROOT, SandboxPaths, load_agent_settings
from sandbox.server import Sandbox

from .conftest import write_profiles

ALL_BUDGETS = {n for names in WORKLOAD_BUDGETS.values() for n in names}


def test_demo_params_pass_only_declared_inputs(tmp_path):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump({"kind": "component", "inputs": [
        {"name": "backend", "type": "str"}, {"name": "steps", "type": "int"},
        {"name": "profiles_file", "type": "str"}, {"name": "namespace", "type": "str"},
        {"name": "api_host", "type": "str"}]}))  # fmt: skip
    profiles = write_profiles(tmp_path, tmp_path / "shm")
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path, profiles_file=profiles),
                 port=8123)  # fmt: skip
    values = demo_params(sb, pipeline, {"steps": "7"})
    assert values == {
        "backend": "local",
        "steps": "7",
        "profiles_file": str(profiles),
        "namespace": "sandbox",
        "api_host": "http://127.0.0.1:8123",
    }


def test_demo_params_pass_the_profiles_claim_when_declared(tmp_path):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump({"kind": "component", "inputs": [
        {"name": "claim", "type": "str"}, {"name": "namespace", "type": "str"}]}))  # fmt: skip
    profiles = write_profiles(tmp_path, tmp_path / "shm")
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path, profiles_file=profiles))
    assert demo_params(sb, pipeline, {}) == {
        "claim": "training-checkpoints",
        "namespace": "sandbox",
    }


def test_demo_params_read_an_operation_files_component_and_list_every_profile(tmp_path):
    from sandbox.commands import DEFAULT_PIPELINE

    profiles = write_profiles(tmp_path, tmp_path / "shm", extra={
        "checkpoint-third": {"path": ".sandbox/media/third", "description": "third"}})  # fmt: skip
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path, profiles_file=profiles))
    values = demo_params(sb, DEFAULT_PIPELINE, {})  # kind: operation, pathRef: its component
    # In the profiles file's order (write_profiles sorts its keys).
    assert json.loads(values["profiles"]) == list(sb.agent.profiles.profiles) == [
        "checkpoint-baseline", "checkpoint-third", "checkpoint-throughput"]  # fmt: skip
    assert values["backend"] == "local" and values["max_pause_s"] == "0.6"
    assert "baseline_class" not in values


def test_demo_params_of_a_data_workload(tmp_path):
    # demo --workload scan: the real pipeline's inputs, the data workload and its small sizes.
    from sandbox.commands import DATA_DEMO_PARAMS, DEFAULT_PIPELINE

    profiles = write_profiles(tmp_path, tmp_path / "shm")
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path, profiles_file=profiles))
    values = demo_params(sb, DEFAULT_PIPELINE, {"dataset_size": "8MiB"}, workload="scan")
    assert values["workload"] == "scan" and values["dataset_size"] == "8MiB"
    assert values["min_au"] == DATA_DEMO_PARAMS["min_au"] and "max_pause_s" not in values
    assert "workload" not in demo_params(sb, DEFAULT_PIPELINE, {})
    # The node's place (--on-node) overrides the defaults, undeclared keys are dropped, and
    # the user's -P params win over both.
    place = {"backend": "kubernetes", "profiles": '["a", "b"]', "not_an_input": "x"}
    values = demo_params(sb, DEFAULT_PIPELINE, {"profiles": '["c"]'}, "scan", place=place)
    assert values["backend"] == "kubernetes" and values["profiles"] == '["c"]'
    assert "not_an_input" not in values and values["workload"] == "scan"


@pytest.mark.parametrize("workload", DATA_WORKLOADS)
def test_a_data_workloads_demo_is_one_the_plan_says_can_answer(tmp_path, workload):
    # demo --workload materialize|workspace ran profiles once over, 2 runs each: fewer runs a
    # side than their calibration needed, so the plan stopped the demo before any switch.
    from sandbox.commands import DEFAULT_PIPELINE

    profiles = write_profiles(tmp_path, tmp_path / "shm")
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path, profiles_file=profiles))
    values = demo_params(sb, DEFAULT_PIPELINE, {}, workload=workload)
    order = json.loads(values["profiles"])
    assert set(order) == set(sb.agent.profiles.profiles)
    budgets = {n: float(values[n]) for n in ALL_BUDGETS if n in values}
    # Only the workload's own budget and no cadence: another's answers nothing for it.
    assert set(budgets) <= set(WORKLOAD_BUDGETS[workload]) and CADENCE_INPUT not in values
    component = yaml.safe_load(
        (REPO_ROOT / "components/checkpoint-storage-profiles/latest.yaml").read_text()
    )
    (repeats,) = [i["value"] for i in component["inputs"] if i["name"] == "repeats"]
    answer = answerability(order, False, int(values.get("repeats", repeats)), workload, budgets)
    assert answer.limits == () and set(answer.differences) == set(order) - {order[0]}
    # The design that showed the calibration's goals: nothing left to say about it.
    assert not [n for n in answer.notes if n.startswith(f"the {workload} workload")]
