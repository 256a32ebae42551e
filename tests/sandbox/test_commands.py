"""The demo's pipeline inputs (sandbox/commands.py: demo_params): only the declared ones,
the profiles' claim, every profile of an operation file's component, a data workload's."""

from __future__ import annotations

import json

import yaml

from sandbox.commands import demo_params
from sandbox.config import SandboxPaths, load_agent_settings
from sandbox.server import Sandbox

from .conftest import write_profiles


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
    assert values["min_au"] == DATA_DEMO_PARAMS["min_au"]
    assert "workload" not in demo_params(sb, DEFAULT_PIPELINE, {})
    # The node's place (--on-node) overrides the defaults, undeclared keys are dropped, and
    # the user's -P params win over both.
    place = {"backend": "kubernetes", "profiles": '["a", "b"]', "not_an_input": "x"}
    values = demo_params(sb, DEFAULT_PIPELINE, {"profiles": '["c"]'}, "scan", place=place)
    assert values["backend"] == "kubernetes" and values["profiles"] == '["c"]'
    assert "not_an_input" not in values and values["workload"] == "scan"
