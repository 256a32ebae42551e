"""The on-node mode's cluster objects (localcluster/manifests/sandbox-runs.yaml), as filled in
for an agent config, without a node."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import on_node
from sandbox.errors import ConfigError
from sandbox.on_node import NODE_AGENT_FILE, RUNS_ROLE, agent_config, runs_manifests


def _by_kind(docs: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in docs}


def test_the_objects_are_filled_in_from_the_agent_config(tmp_path: Path) -> None:
    config = agent_config(NODE_AGENT_FILE)
    store = tmp_path / "odd $dir: with 'quotes'"
    docs = runs_manifests(config, store)
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "Namespace"  # applied before the CRDs and what lives in it
    assert set(kinds) >= {"PersistentVolume", "PersistentVolumeClaim", "Role", "RoleBinding"}
    assert "$" not in repr([d for d in docs if d["kind"] != "PersistentVolume"])
    ns, claim = config["namespace"], config["artifactsStore"]["schema"]["volumeClaim"]
    objs = _by_kind(docs)
    assert objs["Namespace"]["metadata"] == {
        "name": ns,
        "labels": {"pod-security.kubernetes.io/enforce": "baseline"},
    }
    pv = objs["PersistentVolume"]
    assert pv["metadata"]["name"] == f"{ns}-{claim}"
    assert pv["spec"]["hostPath"] == {"path": str(store), "type": "Directory"}
    assert pv["spec"]["claimRef"] == {"namespace": ns, "name": claim}
    pvc = objs["PersistentVolumeClaim"]
    assert pvc["metadata"] == {"name": claim, "namespace": ns}
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pvc["spec"]["storageClassName"] == pv["spec"]["storageClassName"] == ""
    assert objs["Role"]["metadata"] == {"name": RUNS_ROLE, "namespace": ns}
    assert {"apiGroups": [""], "resources": ["pods/log", "pods/status"], "verbs": ["get"]} in (
        objs["Role"]["rules"]
    )
    binding = objs["RoleBinding"]
    assert binding["roleRef"]["name"] == RUNS_ROLE
    assert binding["subjects"][0]["name"] == f"system:serviceaccounts:{ns}"
    if config.get("runsSa"):
        assert objs["ServiceAccount"]["metadata"] == {"name": config["runsSa"], "namespace": ns}


def test_no_service_account_when_the_config_names_none(tmp_path: Path) -> None:
    config = {k: v for k, v in agent_config(NODE_AGENT_FILE).items() if k != "runsSa"}
    assert "ServiceAccount" not in _by_kind(runs_manifests(config, tmp_path))
    named = dict(config, runsSa="runner")
    assert _by_kind(runs_manifests(named, tmp_path))["ServiceAccount"]["metadata"]["name"] == (
        "runner"
    )


def test_a_placeholder_the_mode_does_not_fill_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    template = tmp_path / "runs.yaml"
    template.write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: $nmespace\n")
    monkeypatch.setattr(on_node, "RUNS_FILE", template)
    with pytest.raises(ConfigError, match="nmespace"):
        runs_manifests(agent_config(NODE_AGENT_FILE), tmp_path)
