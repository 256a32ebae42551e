"""Fast tests of the sandbox's pieces: mount mapping, command localisation, pipeline twins,
config loading, the comparison text, and start-up errors."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from polyaxon._local_process.process_types import V1Container
from polyaxon.polyaxonfile import check_polyaxonfile

from sandbox import claim as claim_module
from sandbox.agent import localize, map_mounts
from sandbox.commands import demo_params, stop
from sandbox.components import find_components, pipeline_twin
from sandbox.config import REPO_ROOT, SandboxPaths, load_agent_settings, prepare_media
from sandbox.errors import ConfigError, PortInUseError, ServerStartError
from sandbox.local import LocalRuntime
from sandbox.pipeline import comparison, runs_table_url
from sandbox.server import Sandbox

from .conftest import emulated_profiles, write_profiles

_PREPARE_VOLUMES = claim_module.prepare_volumes


@pytest.fixture(autouse=True)
def _no_loop_volumes(monkeypatch):
    """Unit tests make no loop-device volume (root, RAM): test_io_limits.py makes real ones."""
    monkeypatch.setattr(claim_module, "prepare_volumes", lambda profiles, size=0: [])


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
    from polyaxon.schemas import V1Run

    ops = [
        V1Run(name="fio-baseline", outputs={"fio_seqwrite_bw_mbps": 120.5}),
        V1Run(name="train-baseline", inputs={"storage_profile": "checkpoint-baseline"},
              outputs={"ckpt_pause_s_total": 1.5, "ckpt_pause_s_median": 0.5,
                       "ckpt_write_s_median": 0.4, "runtime_s": 10.0, "final_loss": 2.5}),
        V1Run(name="train-throughput", inputs={"storage_profile": "checkpoint-throughput"},
              outputs={"ckpt_pause_s_total": 0.5, "runtime_s": 9.0}),
    ]  # fmt: skip
    text = comparison(ops)
    assert "profile checkpoint-baseline (train-baseline)" in text
    assert "fio_seqwrite_bw_mbps = 120.5 MB/s" in text
    assert "write 0.400s" in text and "final loss:       2.5000" in text
    assert "profile checkpoint-throughput" in text
    assert comparison([V1Run(name="x", outputs={})]).startswith("no training run")


def test_runs_table_url_selects_columns_and_pipeline():
    url = runs_table_url("http://h:1", "default", "p", "abc")
    token = url.split("search=")[1].replace("%3D", "=")
    search = json.loads(base64.b64decode(token))
    assert search["query"] == "controller:abc, kind:job"  # every job, however deeply nested
    assert "in.storage_profile" in search["columns"].split(",")
    url = runs_table_url("http://h:1", "default", "p", "abc", name="train")
    search = json.loads(base64.b64decode(url.split("search=")[1].replace("%3D", "=")))
    assert search["query"] == "controller:abc, kind:job, name:train"


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
        [sys.executable, "-m", "sandbox", "status", "--root", str(tmp_path), "--output", "json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 6
    assert json.loads(done.stdout)["server_healthy"] is False


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


# -- the agent ---------------------------------------------------------------------------


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


# -- hosts, clients, processes ---------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_are_accepted(tmp_path, host):
    assert Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path), host=host).host == host


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.com"])
def test_a_non_loopback_host_is_refused(tmp_path, host):
    with pytest.raises(ConfigError, match="not a loopback address"):
        Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path), host=host)


def test_the_cli_refuses_a_non_loopback_host_with_exit_3(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sandbox", "start", "--root", str(tmp_path), "--host", "0.0.0.0"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == ConfigError.exit_code == 3
    assert "0.0.0.0 is not a loopback address" in done.stderr
    assert not (tmp_path / ".sandbox" / "server.pid").exists()


def test_api_client_sends_no_token_and_skips_tls_only_for_the_local_sandbox(monkeypatch):
    from polyaxon import settings as plx_settings
    from polyaxon._schemas.authentication import AccessTokenConfig

    from sandbox.components import api_client

    monkeypatch.setattr(plx_settings, "AUTH_CONFIG", AccessTokenConfig(token="users-secret"))
    local = api_client("http://127.0.0.1:8000").config
    assert local.token is None and local.verify_ssl is False
    remote = api_client("https://polyaxon.example.com").config
    assert remote.token == "users-secret" and remote.verify_ssl is True
    # Plain http to another machine is not the sandbox either.
    assert api_client("http://10.0.0.5:8000").config.verify_ssl is True


def test_the_agent_command_carries_the_agent_file(tmp_path):
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text((REPO_ROOT / "connections" / "sandbox-agent.yaml").read_text())
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path, agent_file=agent_file))
    cmd = LocalRuntime().agent_command(sb)
    assert cmd[cmd.index("--agent-file") + 1] == str(agent_file)


def _orphaned_group(cwd: Path) -> tuple[int, int]:
    """A process group whose leader has exited while a child lives on: (pgid, child pid)."""
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!"], cwd=cwd, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    child = int(leader.stdout.readline())
    leader.wait()
    assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE
    return leader.pid, child


def test_stop_ends_a_group_whose_leader_is_gone(tmp_path):
    from checkpoint_storage_bench.processes import stop_group

    pgid, child = _orphaned_group(tmp_path)
    stop_group(pgid, grace=5)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    stop_group(pgid, grace=1)  # nothing left: no error


def test_sandbox_stop_ends_its_leftovers_but_not_a_stranger_group(tmp_path):
    paths = SandboxPaths(tmp_path / "root")
    paths.state.mkdir(parents=True)
    sb = Sandbox(paths, load_agent_settings(paths.root))
    ours, our_child = _orphaned_group(paths.state)
    paths.agent_pid.write_text(str(ours))
    stranger, strangers_child = _orphaned_group(tmp_path)  # not under the sandbox root
    paths.server_pid.write_text(str(stranger))
    try:
        assert stop(sb) == [f"agent's leftover processes (group {ours})"]
        assert not psutil.pid_exists(our_child) or (
            psutil.Process(our_child).status() == psutil.STATUS_ZOMBIE
        )
        assert psutil.Process(strangers_child).is_running()
        assert not paths.agent_pid.exists() and not paths.server_pid.exists()
    finally:
        os.killpg(stranger, signal.SIGKILL)


# -- server availability and timeouts --------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["submit", "-f", str(MINI)], ["register-components", "--components-dir",
                                    str(HERE / "polyaxonfiles" / "components")]],
)  # fmt: skip
def test_commands_need_a_running_server_and_say_so_with_exit_6(tmp_path, args):
    from sandbox.server import free_port

    done = subprocess.run(
        [sys.executable, "-m", "sandbox", *args, "--root", str(tmp_path),
         "--port", str(free_port())],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 6, done.stderr
    assert done.stderr.startswith("sandbox: error: no sandbox server answers at http://127.0.0.1:")
    assert "Traceback" not in done.stderr


def test_follow_stops_a_pipeline_that_outlives_its_timeout(monkeypatch):
    from polyaxon.schemas import V1Run

    from sandbox import pipeline
    from sandbox.errors import FollowTimeoutError

    stopped = []
    monkeypatch.setattr(pipeline, "get_run", lambda c, o, p, uuid: V1Run(
        uuid=uuid, name="p", status="running"))  # fmt: skip
    monkeypatch.setattr(pipeline, "pipeline_ops", lambda *_: [
        V1Run(uuid="1" * 32, name="train", status="running")])  # fmt: skip
    monkeypatch.setattr(pipeline, "stop_run", lambda c, o, p, uuid: stopped.append(uuid))
    with pytest.raises(FollowTimeoutError, match="still running after 0s; stopped it") as err:
        pipeline.follow(None, "default", "p", "a" * 32, 0.05, echo=lambda _: None, every=0.02)
    assert stopped == ["a" * 32]
    assert err.value.exit_code == 7


def test_start_agent_fails_with_the_agent_log_when_it_cannot_poll(tmp_path, monkeypatch):
    from localcluster.emulation.io_limits import Cgroup, ThrottleUnavailable, probe
    from sandbox.server import free_port

    try:  # emulated where it can be: then the failed start must not leave a cgroup
        probe(tmp_path, "probe-only")
        profiles = emulated_profiles(tmp_path)
    except ThrottleUnavailable:
        profiles = write_profiles(tmp_path, tmp_path / "shm")
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path, profiles_file=profiles),
                 port=free_port())  # fmt: skip
    sb.paths.state.mkdir(parents=True)
    # The health check passes, yet no server is there: the agent's polls all fail.
    monkeypatch.setattr(Sandbox, "healthy", lambda self: True)
    with pytest.raises(ServerStartError, match="did not poll the server within 30s") as err:
        LocalRuntime().start_agent(sb, poll=0.2, timeout=30)
    assert "poll failed" in str(err.value)
    assert LocalRuntime().agent_pid(sb) is None and not sb.paths.agent_ready.exists()
    # Where the claim's class was emulated, its cgroup does not outlive the failed start.
    if sb.agent.profiles.emulated:
        assert not Cgroup.find(sb.agent.profiles.cgroup_name).exists()


# -- the profiles file (one parser: checkpoint_storage_bench.contract) -------------------

BAD_PROFILES = [
    ({"claim": "c", "namespace": "n", "claimPath": "x"}, "profiles must be a non-empty mapping"),
    ({"claim": "c", "namespace": "n", "claimPath": "x", "profiles": {"a": {}}},
     "profile a needs a path"),
    ({"claim": "c", "namespace": "n", "claimPath": "x", "profiles": {"a": {"path": "p",
     "class": "gp3"}}}, "profile a: unknown keys ['class']"),
    ({"claim": "", "namespace": "n", "claimPath": "x", "profiles": {"a": {"path": "p"}}},
     "claim must be a non-empty string"),
    (["not", "a", "mapping"], "expected a mapping"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "message"), BAD_PROFILES)
def test_a_malformed_profiles_file_is_a_config_error(tmp_path, data, message):
    bad = tmp_path / "profiles.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_agent_settings(tmp_path, profiles_file=bad)
    assert err.value.exit_code == 3 and str(bad) in str(err.value)


# -- emulated classes: which ops run in the claim's cgroup, and the honest fallback ------


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


def _cannot_throttle(path, name):
    from localcluster.emulation.io_limits import ThrottleUnavailable

    raise ThrottleUnavailable("no block-I/O controller: made up for this test")


def test_where_the_kernel_cannot_throttle_the_default_falls_back_and_says_so(tmp_path, monkeypatch):
    from sandbox import local

    monkeypatch.setattr(local, "probe", _cannot_throttle)
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path))  # the default file
    assert sb.agent.profiles.emulated
    said = []
    media = local.emulation_or_media(sb, echo=said.append)
    assert media.agent.profiles_file.name == "sandbox-profiles-media.yaml"
    assert not media.agent.profiles.emulated
    assert "cannot emulate the volume classes on this machine: no block-I/O" in said[0]
    assert said[1].startswith("sandbox: NOT AN EMULATION: falling back to")


def _slow_volume(monkeypatch, tmp_path, removed: list[str]):
    """The claim's volume made up (no kernel): it writes 700 MB/s unthrottled."""
    from localcluster.emulation import loop_volume
    from localcluster.emulation.io_limits import BlockDevice

    monkeypatch.setattr(claim_module, "prepare_volumes", _PREPARE_VOLUMES)
    monkeypatch.setattr(loop_volume, "find", lambda name, path: None)

    def create(name, path, size):
        (tmp_path / f"csb-{name}.img").write_bytes(b"")
        return loop_volume.LoopVolume(
            name, path, tmp_path / f"csb-{name}.img", BlockDevice(7, 9, "loop9"), True, size
        )

    monkeypatch.setattr(loop_volume, "create", create)
    monkeypatch.setattr(loop_volume, "write_speed", lambda path, **_: 700.0)
    monkeypatch.setattr(loop_volume, "remove", lambda volume: removed.append(volume.name) or [])
    monkeypatch.setattr(loop_volume, "sweep", lambda *_, **__: pytest.fail("swept"))


def test_a_claim_volume_slower_than_twice_the_fastest_class_falls_back_and_says_so(
    tmp_path, monkeypatch
):
    from sandbox import local

    removed: list[str] = []
    _slow_volume(monkeypatch, tmp_path, removed)
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path))  # the default file
    said = []
    media = local.emulation_or_media(sb, echo=said.append)
    assert not media.agent.profiles.emulated
    assert said[0] == (
        "sandbox: cannot emulate the volume classes on this machine: the claim's volume "
        "/dev/loop9 writes 700 MB/s unthrottled, less than 2x the fastest class "
        "(checkpoint-gp3-500, 524 MB/s): the throttle would not be what limits it"
    )
    assert said[1].startswith("sandbox: NOT AN EMULATION: falling back to")
    # The volume it made, and nothing else (no sweep: the cgroup may be a running one's).
    assert removed == [claim_module.volume_name(sb.agent.profiles, sb.agent.profiles.profiles[
        "checkpoint-baseline"].path)]  # fmt: skip


def test_a_named_file_is_refused_where_the_claim_volume_is_too_slow(tmp_path, monkeypatch):
    removed: list[str] = []
    _slow_volume(monkeypatch, tmp_path, removed)
    sb = Sandbox(SandboxPaths(tmp_path),
                 load_agent_settings(tmp_path, profiles_file=emulated_profiles(tmp_path)))  # fmt: skip
    with pytest.raises(ConfigError, match="writes 700 MB/s unthrottled, less than 2x") as err:
        LocalRuntime().start(sb, "default", "p", echo=lambda _: None)
    assert err.value.exit_code == 3
    assert not sb.paths.server_pid.exists()  # refused before anything started
    assert len(removed) == 1 and removed[0].startswith(sb.agent.profiles.cgroup_name)


def test_a_named_emulating_file_is_refused_where_the_kernel_cannot_throttle(tmp_path, monkeypatch):
    from sandbox import claim

    monkeypatch.setattr(claim, "probe", _cannot_throttle)
    sb = Sandbox(SandboxPaths(tmp_path),
                 load_agent_settings(tmp_path, profiles_file=emulated_profiles(tmp_path)))  # fmt: skip
    with pytest.raises(ConfigError, match="the kernel cannot throttle here") as err:
        LocalRuntime().start(sb, "default", "p", echo=lambda _: None)
    assert err.value.exit_code == 3
    assert "sandbox-profiles-media.yaml" in str(err.value)
    assert not sb.paths.server_pid.exists()  # refused before anything started


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


# -- nested pipelines: follow, labels, the verdict ------------------------------------------


def U(key: str) -> str:
    """A run uuid for a short test name (the SDK checks that uuids are uuids)."""
    import uuid

    return uuid.uuid5(uuid.NAMESPACE_URL, key).hex


def _run(key, name, kind, parent=None, **kw):
    from polyaxon.schemas import V1Run

    pipeline = {"uuid": U(parent), "name": "x"} if parent else None
    return V1Run(uuid=U(key), name=name, kind=kind, pipeline=pipeline, **kw)


T0 = 1_700_000_000  # started_at, seconds: the order the runs ran in


def _at(minute: int) -> dict:
    from datetime import UTC, datetime

    return {"started_at": datetime.fromtimestamp(T0 + 60 * minute, tz=UTC)}


# The tree the CE server makes for checkpoint-storage-profiles with two profiles and two
# repeats: plan, stages (a mapping of stage DAGs), each with switch, fio and a mapping of
# training runs; compare and release. "r" is the submitted pipeline (the controller). In
# creation order: the server creates every stage's switch and fio ahead of running them.
NESTED = [
    _run("p", "plan", "job", "r", **_at(0)),
    _run("m", "stages", "matrix", "r"),
    _run("s0", "stages", "dag", "m", inputs={"profile": "checkpoint-baseline", "stage": 0}),
    _run("w0", "switch", "job", "s0", **_at(1)),
    _run("f0", "fio", "job", "s0", outputs={"fio_seqwrite_1m_bw_mbps": 131.0}, **_at(2)),
    _run("s1", "stages", "dag", "m", inputs={"profile": "checkpoint-throughput", "stage": 1}),
    _run("w1", "switch", "job", "s1", **_at(5)),
    _run("f1", "fio", "job", "s1", outputs={"fio_seqwrite_1m_bw_mbps": 262.0}, **_at(6)),
    _run("t0", "train", "matrix", "s0"),
    _run("t00", "train", "job", "t0", inputs={"repeat": 0, "storage_profile": "checkpoint-baseline"},
         outputs={"ckpt_pause_s_total": 6.0, "ckpt_pause_s_median": 0.7}, **_at(3)),
    _run("t01", "train", "job", "t0", inputs={"repeat": 1, "storage_profile": "checkpoint-baseline"},
         outputs={"ckpt_pause_s_total": 6.2, "ckpt_pause_s_median": 0.72}, **_at(4)),
    _run("t1", "train", "matrix", "s1"),
    _run("t10", "train", "job", "t1", inputs={"repeat": 0, "storage_profile": "checkpoint-throughput"},
         outputs={"ckpt_pause_s_total": 3.0, "ckpt_pause_s_median": 0.4}, **_at(7)),
    _run("c", "compare", "job", "r", **_at(8)),
    _run("l", "release", "job", "r", **_at(9)),
]  # fmt: skip


def test_labels_follow_the_nesting_and_name_each_mapping_run():
    from sandbox.pipeline import labels

    names = labels(NESTED, U("r"))
    assert names[U("p")] == "plan" and names[U("c")] == "compare"
    assert names[U("s0")] == "stages[0] checkpoint-baseline"
    assert names[U("s1")] == "stages[1] checkpoint-throughput"
    assert names[U("f1")] == "stages[1]/fio"
    assert names[U("t01")] == "stages[0]/train[1]"
    assert names[U("t10")] == "stages[1]/train[0]"
    # A run whose parent is not in the list (or the root itself) is named by itself.
    assert labels([_run("x", "switch", "job", "elsewhere")], U("r")) == {U("x"): "switch"}


def test_follow_prints_every_nested_run_once_per_status_and_no_matrix_line(monkeypatch):
    from polyaxon.schemas import V1Run

    from sandbox import pipeline

    states = iter(["running", "succeeded"])
    monkeypatch.setattr(pipeline, "get_run", lambda c, o, p, uuid: V1Run(
        uuid=uuid, name="checkpoint-storage-profiles", status=next(states)))  # fmt: skip
    queries = []

    def runs(c, o, p, query=None):
        queries.append(query)
        return [r.model_copy(update={"status": "succeeded"}) for r in NESTED]

    monkeypatch.setattr(pipeline, "list_runs", runs)
    lines: list[str] = []
    ops = pipeline.follow(None, "default", "p", U("r"), 60, echo=lines.append, every=0.01)
    assert queries == [f"controller:{U('r')}"] * 2  # the whole tree, not the children
    assert len(ops) == len(NESTED)
    assert len(lines) == len(NESTED) - 3  # one line per run, none for the three matrices
    assert any(line.split() == ["stages[0]/train[1]", "succeeded"] for line in lines)


def test_the_comparison_pairs_each_training_run_with_its_stages_fio_sweep():
    text = comparison(NESTED)
    blocks = text.split("profile ")[1:]
    assert len(blocks) == 3  # every training run, repeats included
    assert blocks[0].startswith("checkpoint-baseline") and "131.0 MB/s" in blocks[0]
    assert "131.0 MB/s" in blocks[1]  # the second repeat: the same stage's sweep
    assert blocks[2].startswith("checkpoint-throughput") and "262.0 MB/s" in blocks[2]


def test_the_verdict_is_rerun_with_the_compare_ops_joined_runs_and_budget():
    from sandbox.commands import compare_op, recommendation_lines, verdict_args

    compare = _run("c", "compare", "job", "r", inputs={
        "runs": [U("w0"), U("f0"), U("t00")], "profiles": ["a", "b", "c", "a"], "max_pause_s": 0.6,
        "checkpoints_per_month": 2000.0, "gpu_hourly": None, "allow_resumed": False},
        outputs={"verdict": "c is faster", "recommended_profile": "b",
                 "recommendation_reason": "b meets the budget and is the cheapest"})  # fmt: skip
    assert compare_op([*NESTED[:-2], compare, NESTED[-1]]) is compare
    assert compare_op(NESTED[:3]) is None
    assert verdict_args(compare) == [
        f"--run={U('w0')}", f"--run={U('f0')}", f"--run={U('t00')}", "--baseline=a", "--expect=a", "--expect=b",
        "--expect=c", "--max-pause-s=0.6", "--checkpoints-per-month=2000.0",
    ]  # fmt: skip
    assert verdict_args(_run("c", "compare", "job", "r", inputs={})) is None
    # Once it ran, the verdict records the profiles it compared as one string in the input.
    for recorded in ("a,b,c", '["a", "b", "c"]'):
        ran = compare.model_copy(update={"inputs": {"runs": ["x"], "profiles": recorded}})
        assert verdict_args(ran)[1:] == ["--baseline=a", "--expect=a", "--expect=b", "--expect=c"]
    lines = recommendation_lines(compare)
    assert "  recommended profile: b" in lines and any("cheapest" in line for line in lines)
    assert recommendation_lines(None) == ["the pipeline's compare op left no verdict"]


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


def test_classes_may_come_from_several_files_but_never_twice(tmp_path):
    from localcluster.emulation.sandbox_profiles import ProfilesFileError, load_sandbox_profiles

    shipped = load_sandbox_profiles(REPO_ROOT / "connections" / "sandbox-profiles.yaml", tmp_path)
    assert [p.limits.write_bps for p in shipped.profiles.values()] == [
        125 * 2**20, 250 * 2**20, 500 * 2**20]  # fmt: skip
    spec = yaml.safe_load((REPO_ROOT / "connections" / "sandbox-profiles.yaml").read_text())
    spec["classesFile"] = [str(REPO_ROOT / "connections" / "vac-ebs-gp3.yaml")] * 2
    twice = tmp_path / "twice.yaml"
    twice.write_text(yaml.safe_dump(spec))
    with pytest.raises(ProfilesFileError, match="checkpoint-baseline is in both"):
        load_sandbox_profiles(twice, tmp_path)
    spec["classesFile"] = []
    twice.write_text(yaml.safe_dump(spec))
    with pytest.raises(ProfilesFileError, match="non-empty list"):
        load_sandbox_profiles(twice, tmp_path)


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


def test_the_nodes_bridge_address_is_accepted_only_once_the_machine_has_it(tmp_path, monkeypatch):
    from sandbox import config as sandbox_config

    bridge = sandbox_config.NODE_BRIDGE_ADDRESS
    monkeypatch.setattr(sandbox_config, "local_addresses", lambda: {"127.0.0.1"})
    with pytest.raises(ConfigError, match="no interface of this machine has it"):
        Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path), host=bridge)
    monkeypatch.setattr(sandbox_config, "local_addresses", lambda: {"127.0.0.1", bridge})
    assert (
        Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path), host=bridge).host == bridge
    )
    # Any other address of the machine stays refused, even one it has.
    monkeypatch.setattr(sandbox_config, "local_addresses", lambda: {"127.0.0.1", "10.244.0.7"})
    with pytest.raises(ConfigError, match="not a loopback address"):
        Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path), host="10.244.0.7")


def test_local_addresses_include_loopback():
    from sandbox.config import local_addresses

    assert "127.0.0.1" in local_addresses()
