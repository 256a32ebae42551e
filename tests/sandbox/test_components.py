"""Component versions and pipeline twins (sandbox/components.py), and the API client's
token and TLS rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from polyaxon.polyaxonfile import check_polyaxonfile

from sandbox.components import find_components, pipeline_twin
from sandbox.errors import ConfigError

HERE = Path(__file__).parent

MINI = HERE / "polyaxonfiles" / "mini-pipeline.yaml"


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
