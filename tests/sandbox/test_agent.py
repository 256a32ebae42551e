"""The local agent (sandbox/agent.py): mount mapping, command localisation, runs stopped
before they start, one op at a time, which ops run in the claim's cgroup, and the
downward-API variables it answers itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from polyaxon._local_process.process_types import V1Container

from sandbox.agent import localize, map_mounts
from sandbox.config import REPO_ROOT, SandboxPaths, load_agent_settings, prepare_media

from .conftest import emulated_profiles, write_profiles


def test_map_mounts_rewrites_whole_path_components_only():
    mounts = {"/checkpoints": Path("/tmp/claim")}
    assert map_mounts("/checkpoints", mounts) == "/tmp/claim"
    assert map_mounts("/checkpoints/base-run", mounts) == "/tmp/claim/base-run"
    assert map_mounts("--dir=/checkpoints/x", mounts) == "--dir=/tmp/claim/x"
    assert map_mounts("open('/checkpoints/x')", mounts) == "open('/tmp/claim/x')"
    assert map_mounts("/checkpoints-old/x", mounts) == "/checkpoints-old/x"
    assert map_mounts("/data/checkpoints/x", mounts) == "/data/checkpoints/x"


def test_localize_uses_venv_python_own_home_and_mapped_env(tmp_path):
    container = V1Container(
        name="polyaxon-main",
        command=["python", "-m", "trainer"],
        args=["--checkpoint-dir", "/checkpoints/baseline-run"],
        env=[("CKPT", "/checkpoints"), ("POLYAXON_RUN_INSTANCE", "default.p.runs.u")],
    )
    cmd = localize(
        container,
        {"/checkpoints": tmp_path / "claim"},
        home=tmp_path / "home",
        context_root=tmp_path / "ctx",
        base_env={"PATH": "/usr/bin", "POLYAXON_RUN_UUID": "stale", "HOME": "/root"},
    )
    assert cmd.argv == [sys.executable, "-m", "trainer", "--checkpoint-dir",
                        str(tmp_path / "claim" / "baseline-run")]  # fmt: skip
    assert cmd.env["CKPT"] == str(tmp_path / "claim")
    assert cmd.env["HOME"] == str(tmp_path / "home")
    assert cmd.env["POLYAXON_CONTEXT_ROOT"] == str(tmp_path / "ctx")
    assert cmd.env["POLYAXON_RUN_INSTANCE"] == "default.p.runs.u"
    assert "POLYAXON_RUN_UUID" not in cmd.env  # the agent's own POLYAXON_* never leak
    assert cmd.env["PYTHONPATH"].split(":")[0] == str(REPO_ROOT)
    assert cmd.cwd == tmp_path  # the run's own dir: relative outputs stay out of the repo
    assert cmd.env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_localize_refuses_an_empty_command(tmp_path):
    with pytest.raises(ValueError, match="no command"):
        localize(V1Container(name="polyaxon-main"), {}, tmp_path, tmp_path, base_env={})


def _agent(tmp_path, monkeypatch, command: list[str]):
    """A LocalAgent whose server calls are recorded and whose runs execute ``command``."""
    from sandbox.agent import LocalAgent

    settings = load_agent_settings(
        tmp_path, profiles_file=write_profiles(tmp_path, tmp_path / "shm")
    )
    prepare_media(settings.profiles)
    agent = LocalAgent(SandboxPaths(tmp_path), settings, "http://127.0.0.1:9")
    agent.reported = []
    agent.converted = []
    monkeypatch.setattr(agent, "_status", lambda o, p, u, status, *_: agent.reported.append(status))

    def convert(run_data):
        agent.converted.append(run_data[0])
        return V1Container(name="polyaxon-main", command=command)

    monkeypatch.setattr(agent, "convert", convert)
    return agent


UUID = "0123456789abcdef0123456789abcdef"


RUN = (f"default.p.runs.{UUID}", "job", "slow", "{}")


def test_a_run_stopped_while_queued_never_starts(tmp_path, monkeypatch):
    agent = _agent(tmp_path, monkeypatch, ["sleep", "30"])
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("the run was started"))
    agent.stop_run(RUN[0])  # arrives while the run waits in the pool's queue
    assert agent.reported == ["stopped"]
    agent.execute(RUN)
    assert agent.reported == ["stopped", "stopped"] and not agent.converted
    assert not agent._cancelled and not agent._running


def test_a_run_stopped_while_being_prepared_never_starts(tmp_path, monkeypatch):
    agent = _agent(tmp_path, monkeypatch, ["sleep", "30"])
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("the run was started"))
    prepare = agent.prepare_dirs

    def prepare_then_stop(uuid):
        agent.stop_run(RUN[0])  # the stop request lands between convert and Popen
        return prepare(uuid)

    monkeypatch.setattr(agent, "prepare_dirs", prepare_then_stop)
    agent.execute(RUN)
    assert agent.converted and agent.reported == ["stopped", "stopped"]
    assert "running" not in agent.reported and not agent._running


def test_a_failing_log_upload_leaves_no_process_behind(tmp_path, monkeypatch):
    from sandbox.agent import LocalAgent

    agent = _agent(tmp_path, monkeypatch, ["sh", "-c", "echo started; sleep 30"])

    def broken_upload(*_):
        raise OSError("disk full")

    monkeypatch.setattr(agent, "upload_logs", broken_upload)
    with pytest.raises(OSError, match="disk full"):
        agent.execute(RUN)
    home = str(agent.paths.runs / UUID / "home")
    assert not [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get(
        "HOME") == home]  # fmt: skip
    assert not agent._running
    # upload_logs itself never raises: a write failure is logged and counts as not uploaded.
    lines = [object()]
    assert LocalAgent.upload_logs(agent, "o", "p", UUID, lines, tmp_path / "missing") == 0


def test_the_agent_runs_one_op_at_a_time_by_default():
    from sandbox.agent import LocalAgent
    from sandbox.cli import agent

    assert LocalAgent.__dataclass_fields__["max_parallel"].default == 1
    assert next(p for p in agent.params if p.name == "max_parallel").default == 1


def test_only_ops_that_mount_the_claim_run_in_its_cgroup(tmp_path):
    from sandbox.agent import mounts_claim

    settings = load_agent_settings(tmp_path, profiles_file=emulated_profiles(tmp_path))
    assert settings.claim_connections == {"checkpoints"}
    train = json.dumps({"kind": "compiled_operation", "run": {"kind": "job",
                        "connections": ["checkpoints"]}})  # fmt: skip
    switch = json.dumps({"kind": "compiled_operation", "run": {"kind": "job"}})
    copy = {"run": {"kind": "job", "init": [{"connection": "checkpoints"}]}}
    assert mounts_claim(train, settings.claim_connections)
    assert not mounts_claim(switch, settings.claim_connections)
    assert not mounts_claim(copy, settings.claim_connections)  # a copy, not a mount


def test_downward_api_variables_are_answered_for_this_machine():
    import socket

    from sandbox.agent import downward_api_env

    content = json.dumps({"run": {"kind": "job", "container": {"env": [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "PLAIN", "value": "x"}]}}})  # fmt: skip
    assert downward_api_env(content) == {"NODE_NAME": socket.gethostname(), "POD_UID": None}


def test_polyaxons_converter_gets_the_op_without_its_downward_api_variables(monkeypatch):
    # Polyaxon's local converter refuses a container whose env mixes plain values with
    # valueFrom (the fio sweep's STORAGE_PROFILE and NODE_NAME): the whole run would fail
    # to convert. The agent hands it the op without them and answers them itself.
    from polyaxon import settings
    from polyaxon._connections import V1Connection
    from polyaxon._local_process.executor import Executor
    from polyaxon._schemas.agent import AgentConfig
    from polyaxon.exceptions import PolyaxonConverterError

    from sandbox.agent import downward_api_env, without_downward_api

    store = {"name": "store", "kind": "host_path",
             "schema": {"hostPath": "/tmp/x", "mountPath": "/tmp/x"}}  # fmt: skip
    agent = AgentConfig(artifacts_store=V1Connection.from_dict(store), namespace="sandbox")
    monkeypatch.setattr(settings, "AGENT_CONFIG", agent)  # as LocalAgent sets it
    content = json.dumps({"version": 1.1, "kind": "compiled_operation", "run": {
        "kind": "job", "container": {"name": "polyaxon-main", "image": "x",
        "command": ["python", "-m", "fio_sweep"], "env": [
            {"name": "STORAGE_PROFILE", "value": "checkpoint-baseline"},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}}})  # fmt: skip

    def convert(op: str):
        return Executor().convert(
            owner_name="default", project_name="p", run_name="fio", run_uuid="a" * 32,
            content=op, default_auth=False, agent_content=agent.to_json(),
        )  # fmt: skip

    with pytest.raises(PolyaxonConverterError, match="valueFrom"):
        convert(content)
    main = next(c for c in convert(without_downward_api(content)) if c.name == "polyaxon-main")
    env = dict(item.root for item in main.env)
    assert env["STORAGE_PROFILE"] == "checkpoint-baseline" and "NODE_NAME" not in env
    assert set(downward_api_env(content)) == {"NODE_NAME"}  # answered by the agent instead
