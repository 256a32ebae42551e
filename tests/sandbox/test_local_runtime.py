"""The local runtime (sandbox/local.py): the agent's command and start, and the
emulation's honest fallback to plain media (or refusal) where the kernel cannot throttle
or the claim's volume is too slow."""

from __future__ import annotations

import pytest

from sandbox import claim as claim_module
from sandbox.config import REPO_ROOT, SandboxPaths, load_agent_settings
from sandbox.errors import ConfigError, ServerStartError
from sandbox.local import LocalRuntime
from sandbox.server import Sandbox

from .conftest import emulated_profiles, write_profiles

_PREPARE_VOLUMES = claim_module.prepare_volumes


@pytest.fixture(autouse=True)
def _no_loop_volumes(monkeypatch):
    """Unit tests make no loop-device volume (root, RAM): test_io_limits.py makes real ones."""
    monkeypatch.setattr(claim_module, "prepare_volumes", lambda profiles, size=0: [])


def test_the_agent_command_carries_the_agent_file(tmp_path):
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text((REPO_ROOT / "connections" / "sandbox-agent.yaml").read_text())
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path, agent_file=agent_file))
    cmd = LocalRuntime().agent_command(sb)
    assert cmd[cmd.index("--agent-file") + 1] == str(agent_file)


def test_start_agent_fails_with_the_agent_log_when_it_cannot_poll(tmp_path, monkeypatch):
    from checkpoint_storage_bench.ports import free_port
    from localcluster.emulation.io_limits import Cgroup, ThrottleUnavailable, probe

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
