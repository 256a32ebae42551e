"""The sandbox's settings (sandbox/config.py): the agent config, the one profiles parser,
and the hosts the server may listen on."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from sandbox.config import REPO_ROOT, SandboxPaths, load_agent_settings, prepare_media
from sandbox.errors import ConfigError
from sandbox.server import Sandbox

from .conftest import write_profiles


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
