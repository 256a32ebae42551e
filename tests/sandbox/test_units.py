"""Fast tests of the sandbox's pieces: mount mapping, command localisation, pipeline twins,
config loading, the comparison text, and start-up errors."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from polyaxon._local_process.process_types import V1Container
from polyaxon.polyaxonfile import check_polyaxonfile

from sandbox.agent import localize, map_mounts
from sandbox.components import find_components, pipeline_twin
from sandbox.config import REPO_ROOT, SandboxPaths, load_agent_settings, prepare_media
from sandbox.errors import ConfigError, PortInUseError, ServerStartError
from sandbox.pipeline import comparison, runs_table_url
from sandbox.server import Sandbox

from .conftest import write_profiles

HERE = Path(__file__).parent
MINI = HERE / "polyaxonfiles" / "mini-pipeline.yaml"


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


def test_hub_twin_rewrites_path_refs_and_disables_cache(tmp_path):
    out = pipeline_twin(MINI, tmp_path / "twin.yaml", hub_owner="acme")
    spec = yaml.safe_load(out.read_text())
    ops = {op["name"]: op for op in spec["run"]["operations"]}
    assert ops["prepare"]["hubRef"] == "acme/mkdirs:v1.0"
    assert ops["train-a"]["hubRef"] == ops["train-b"]["hubRef"] == "acme/train:v1.0"
    assert all("pathRef" not in op and op["cache"] == {"disable": True} for op in ops.values())
    assert "Generated from" in out.read_text().splitlines()[0]


def test_path_twin_resolves_offline(tmp_path):
    out = pipeline_twin(MINI, tmp_path / "elsewhere" / "twin.yaml", hub_owner=None)
    # The twin lives in another directory, yet Polyaxon's own checker resolves its refs.
    op = check_polyaxonfile(polyaxonfile=str(out), is_cli=False, to_op=False)
    assert op is not None
    refs = [o["pathRef"] for o in yaml.safe_load(out.read_text())["run"]["operations"]]
    assert all(Path(r).is_absolute() and Path(r).exists() for r in refs)


def test_hub_twin_rejects_an_unversioned_path_ref(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"kind": "component", "run": {"kind": "dag", "operations": [
        {"name": "x", "pathRef": "component.txt"}]}}))  # fmt: skip
    with pytest.raises(ConfigError, match="not <name>/<version>.yaml"):
        pipeline_twin(bad, tmp_path / "out.yaml", hub_owner="acme")


def test_find_components_lists_name_and_version():
    comps = find_components(HERE / "polyaxonfiles" / "components")
    assert {(c.name, c.version) for c in comps} == {("mkdirs", "v1.0"), ("train", "v1.0")}
    assert comps[0].hub_ref("acme") == f"acme/{comps[0].name}:v1.0"


def test_agent_settings_map_the_claim_to_the_profiles_claim_path(tmp_path):
    profiles = write_profiles(tmp_path, tmp_path / "shm")
    settings = load_agent_settings(tmp_path, profiles_file=profiles)
    claim = tmp_path / ".sandbox" / "claims" / "training-checkpoints"
    assert settings.local_mounts == {"/checkpoints": claim}
    store = settings.artifacts_store
    assert store["name"] == "artifacts-store"
    assert store["schema"]["hostPath"] == str(tmp_path / ".sandbox" / "server")
    env = settings.server_env()
    assert json.loads(env["POLYAXON_AGENT_CONNECTIONS"])[0]["name"] == "checkpoints"
    made = prepare_media(settings.profiles)
    assert made == [tmp_path / ".sandbox/media/disk", tmp_path / "shm"]
    assert claim.is_symlink() and claim.resolve() == (tmp_path / ".sandbox/media/disk")


def test_agent_settings_reject_duplicate_connections(tmp_path):
    agent = tmp_path / "agent.yaml"
    conn = {"name": "x", "kind": "host_path", "schema": {"hostPath": "/a", "mountPath": "/a"}}
    agent.write_text(yaml.safe_dump({"artifactsStore": {"name": "s", "kind": "host_path"},
                                     "connections": [conn, conn]}))  # fmt: skip
    with pytest.raises(ConfigError, match="unique"):
        load_agent_settings(tmp_path, agent_file=agent)


def test_comparison_lists_each_profile_with_its_fio_headline():
    ops = [
        {"name": "fio-baseline", "outputs": {"fio_seqwrite_bw_mbps": 120.5}},
        {"name": "train-baseline", "inputs": {"storage_profile": "checkpoint-baseline"},
         "outputs": {"ckpt_pause_s_total": 1.5, "ckpt_pause_s_median": 0.5,
                     "ckpt_write_s_median": 0.4, "runtime_s": 10.0, "final_loss": 2.5}},
        {"name": "train-throughput", "inputs": {"storage_profile": "checkpoint-throughput"},
         "outputs": {"ckpt_pause_s_total": 0.5, "runtime_s": 9.0}},
    ]  # fmt: skip
    text = comparison(ops)
    assert "profile checkpoint-baseline (train-baseline)" in text
    assert "fio_seqwrite_bw_mbps = 120.5 MB/s" in text
    assert "write 0.400s" in text and "final loss:       2.5000" in text
    assert "profile checkpoint-throughput" in text
    assert comparison([{"name": "x", "outputs": {}}]).startswith("no training run")


def test_runs_table_url_selects_columns_and_pipeline():
    url = runs_table_url("http://h:1", "default", "p", "abc")
    token = url.split("search=")[1].replace("%3D", "=")
    search = json.loads(base64.b64decode(token))
    assert search["query"] == "pipeline.uuid:abc"
    assert "in.storage_profile" in search["columns"].split(",")


def test_start_refuses_a_taken_port(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path), port=port)
        with pytest.raises(PortInUseError, match=f"port {port} .* already in use"):
            sb.start_server()
        # The CLI says it in one line, with its own exit code.
        done = subprocess.run(
            [sys.executable, "-m", "sandbox", "start", "--root", str(tmp_path),
             "--port", str(port)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == PortInUseError.exit_code
        assert "already in use" in done.stderr


@pytest.mark.slow
def test_a_server_that_cannot_start_shows_its_log(tmp_path):
    from sandbox.server import free_port

    paths = SandboxPaths(tmp_path)
    # The server must create .polyaxon/ in its data dir: a file there makes it fail.
    paths.server_data.mkdir(parents=True)
    (paths.server_data / ".polyaxon").write_text("not a directory")
    sb = Sandbox(paths, load_agent_settings(tmp_path), port=free_port())
    with pytest.raises(ServerStartError, match="last lines of") as err:
        sb.start_server(timeout=60)
    assert str(paths.server_log) in str(err.value)
    assert sb.server_pid() is None


def test_status_exits_6_when_nothing_runs(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sandbox", "status", "--root", str(tmp_path), "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 6
    assert json.loads(done.stdout)["server_healthy"] is False


def test_demo_params_pass_only_declared_inputs(tmp_path):
    from sandbox.cli import demo_params

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
