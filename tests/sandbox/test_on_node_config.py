"""The on-node mode's configuration, without a node: Polyaxon's own settings read the agent
config from the environment the mode gives ``polyaxon agent start``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sandbox.errors import ConfigError
from sandbox.on_node import NODE_AGENT_FILE, agent_config, agent_env, server_settings

PROBE = """
import json
from polyaxon import settings
c = settings.AGENT_CONFIG
print(json.dumps({
    "namespace": c.namespace,
    "store": [c.artifacts_store.name, c.artifacts_store.kind],
    "connections": [x.name for x in c.connections],
    "init": c.init.get_image(),
    "sidecar": c.sidecar.get_image(),
    "sidecar_requests": c.sidecar.get_resources()["requests"],
    "runs_sa": c.runs_sa,
    "host": settings.CLIENT_CONFIG.host,
}))
"""


def test_polyaxons_settings_read_the_node_agent_config_from_the_env(tmp_path: Path) -> None:
    env = agent_env(
        agent_config(NODE_AGENT_FILE), "http://10.244.0.1:8123", tmp_path / "kc", tmp_path
    )
    assert env["POLYAXON_SERVICE"] == "agent"
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "namespace": "ml-team",
        "store": ["artifacts-store", "volume_claim"],
        "connections": ["checkpoints"],
        "init": "localhost/csb-polyaxon-aux:init-2.18.0",
        "sidecar": "localhost/csb-polyaxon-aux:sidecar-2.18.0",
        "sidecar_requests": {"cpu": "0", "memory": "60Mi"},
        "runs_sa": "polyaxon-runs",
        "host": "http://10.244.0.1:8123",
    }


def test_the_server_reads_the_store_on_the_host_side(tmp_path: Path) -> None:
    settings = server_settings(tmp_path)
    data = str(tmp_path.resolve() / ".sandbox" / "server")
    assert settings.artifacts_store == {
        "name": "artifacts-store",
        "kind": "host_path",
        "schema": {"hostPath": data, "mountPath": data},
    }
    assert [c["name"] for c in settings.connections] == ["checkpoints"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"artifactsStore": {"name": "s", "kind": "host_path", "schema": {"hostPath": "/x"}}},
         "must be a volume_claim"),
        ({"namespace": None}, "namespace is required"),
    ],
)  # fmt: skip
def test_a_node_agent_config_the_mode_cannot_serve_is_refused(
    tmp_path: Path, change: dict, message: str
) -> None:
    config = yaml.safe_load(NODE_AGENT_FILE.read_text())
    config.update(change)
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=message):
        agent_config(path)


def test_a_key_the_env_cannot_carry_is_refused(tmp_path: Path) -> None:
    config = agent_config(NODE_AGENT_FILE)
    config["notifier"] = {"image": "x"}
    with pytest.raises(ConfigError, match="not handled here: \\['notifier'\\]"):
        agent_env(config, "http://10.244.0.1:1", tmp_path, tmp_path)
