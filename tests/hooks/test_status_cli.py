"""``status`` (against the in-memory fake of the client wrapper), argument errors, and on
the wire: the real ``python -m`` entry point, TLS, RBAC for events."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import click
import pytest

from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import hook_command, run_hook, write_kubeconfig
from tests.hooks.kube_double import KubeDouble
from tests.hooks.kube_state import Rbac, make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"
ROOT = Path(__file__).resolve().parents[2]


def test_status_shows_desired_current_status_conditions_and_events(fake: FakeKube):
    make_volume(fake)
    make_class(fake, "fast", iops="6000")
    fake.resizer.results["fast"] = ["InvalidArgument"]
    assert run_hook("switch", "-n", NS, "--claim", CLAIM, "--to", "fast").exit_code == 4

    text = run_hook("status", "-n", NS, "--claim", CLAIM)
    assert text.exit_code == 0, text.output
    assert "desired class  fast" in text.stdout
    assert "current class  baseline" in text.stdout
    assert "modify status  Infeasible (target fast)" in text.stdout
    assert "ModifyVolumeError=True InvalidArgument: rpc error" in text.stdout
    assert "Warning VolumeModifyFailed" in text.stdout and "Normal VolumeModify:" in text.stdout

    raw = run_hook("status", "-n", NS, "--claim", CLAIM, "-o", "json")
    data = json.loads(raw.stdout)
    assert (data["desiredClass"], data["currentClass"]) == ("fast", "baseline")
    assert data["modifyVolumeStatus"] == {
        "status": "Infeasible",
        "targetVolumeAttributesClassName": "fast",
    }
    assert data["driver"] == "ebs.csi.aws.com" and data["volume"] == "pvc-0001"
    assert [e["reason"] for e in data["events"]] == ["VolumeModify", "VolumeModifyFailed"]
    assert fake.claim_writes()[-1].verb == "patch"  # status itself wrote nothing
    assert len(fake.claim_writes()) == 1


def test_status_of_a_missing_claim(fake: FakeKube):
    result = run_hook("status", "-n", NS, "--claim", "nope")
    assert result.exit_code == 3
    assert "claim ml-team/nope not found" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["switch", "-n", NS, "--claim", CLAIM],  # no --to
        ["switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--settle", "eventually"],
        ["switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--timeout", "0"],
        ["switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--on-infeasible", "retry"],
        ["switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--kubeconfig", "/nonexistent"],
        ["switch", "-n", "", "--claim", CLAIM, "--to", "x"],
        ["status", "--claim", CLAIM],
        ["switch", "-n", NS, "--claim", "..", "--to", "x"],
        ["switch", "-n", NS, "--claim", "Training", "--to", "x"],
        ["switch", "-n", "ml_team", "--claim", CLAIM, "--to", "x"],
        ["switch", "-n", NS, "--claim", CLAIM, "--to", "../../x"],
        ["switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--timeout", "nan"],
        ["switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--timeout", "inf"],
        ["switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--pending-grace", "nan"],
        ["status", "-n", NS, "--claim", CLAIM, "--timeout", "nan"],
        ["status", "-n", NS, "--claim", "a/b"],
    ],
    ids=[
        "no-target",
        "bad-settle",
        "zero-timeout",
        "bad-action",
        "missing-kubeconfig",
        "empty-namespace",
        "status-no-namespace",
        "claim-dotdot",
        "claim-uppercase",
        "namespace-underscore",
        "class-path",
        "timeout-nan",
        "timeout-inf",
        "grace-nan",
        "status-timeout-nan",
        "status-claim-slash",
    ],
)
def test_bad_arguments_exit_2(args: list[str]):
    result = run_hook(*args)
    assert result.exit_code == 2, result.output


def test_help_documents_exit_codes():
    result = run_hook("switch", "--help")
    assert result.exit_code == 0
    for line in (
        "0  settled",
        "2  bad arguments",
        "3  preflight refused",
        "4  infeasible",
        "5  deadline",
    ):
        assert line in result.stdout


def test_no_cluster_configuration_is_a_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = run_hook("switch", "-n", NS, "--claim", CLAIM, "--to", "fast")
    assert result.exit_code == 3, result.output
    assert "no usable Kubernetes configuration" in result.stderr


def test_python_dash_m_entry_point(double: KubeDouble, kubeconfig: Path, tmp_path: Path):
    make_volume(double)
    make_class(double, "fast", iops="6000")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = hook_command(
        "switch", "-n", NS, "--claim", CLAIM, "--to", "fast", "--kubeconfig", str(kubeconfig),
        "--settle", "kubernetes", "--summary-json", str(tmp_path / "s.json"),
    )  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "s.json").read_text())["applied_class"] == "fast"
    cmd[cmd.index("--to") + 1] = "missing-class"
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert "error: VolumeAttributesClass missing-class not found" in done.stderr


def test_docs_list_every_exit_code_of_the_one_table():
    from hooks.storage_profile.errors import EXIT_CODES

    docs = (ROOT / "docs" / "storage-profile.md").read_text()
    table = docs.split("### Exit codes", 1)[1].split("###", 1)[0]
    documented = {int(code) for code in re.findall(r"^\| (\d) \|", table, re.MULTILINE)}
    assert documented == set(EXIT_CODES)
    help_text = run_hook("status", "--help").stdout
    for code in EXIT_CODES:
        assert f"\n    {code}  " in help_text


def test_a_broken_kubeconfig_is_a_refusal(tmp_path: Path):
    config = tmp_path / "kubeconfig"
    config.write_text("{{:: not yaml")
    result = run_hook(
        "switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--kubeconfig", str(config)
    )
    assert result.exit_code == 3, result.output
    assert f"no usable Kubernetes configuration in {config}" in result.stderr


def test_connection_refused_is_a_fast_refusal_naming_the_cause(tmp_path: Path):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    result = run_hook(
        "switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--kubeconfig", str(config),
        "--timeout", "30",
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert time.monotonic() - started < 5
    assert "Connection refused" in result.stderr and f"127.0.0.1:{port}" in result.stderr


def test_tls_failure_is_a_fast_refusal_naming_the_cause(double: KubeDouble, tmp_path: Path):
    # TLS to a server that speaks plain HTTP.
    config = write_kubeconfig(
        tmp_path / "kubeconfig", double.url.replace("http:", "https:"),
        **{"insecure-skip-tls-verify": True},
    )  # fmt: skip
    started = time.monotonic()
    result = run_hook(
        "status", "-n", NS, "--claim", CLAIM, "--kubeconfig", str(config), "--timeout", "30"
    )
    assert result.exit_code == 3, result.output
    assert time.monotonic() - started < 5
    assert "TLS with the API server failed" in result.stderr


@pytest.mark.parametrize("module", ["heartbeat", "kube"])
def test_doctests(module: str):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"hooks.storage_profile.{module}"))
    assert result.attempted > 0 and result.failed == 0


def test_every_option_has_help_text():
    from hooks.storage_profile.cli import main

    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"{name} {param.opts}"


@pytest.mark.parametrize(
    "args",
    [
        ["switch", "-n", f"{NS}\n", "--claim", CLAIM, "--to", "fast"],
        ["switch", "-n", NS, "--claim", f"{CLAIM}\n", "--to", "fast"],
        ["switch", "-n", NS, "--claim", CLAIM, "--to", "fast\n"],
        ["status", "-n", NS, "--claim", f"{CLAIM}\n"],
        ["plan", "-n", NS, "--claim", f"{CLAIM}\n", "--profiles", "fast"],
    ],
    ids=["namespace", "claim", "class", "status-claim", "plan-claim"],
)
def test_a_name_with_a_trailing_newline_is_refused_before_any_request(
    fake: FakeKube, args: list[str]
):
    make_volume(fake)
    make_class(fake, "fast", iops="6000")
    result = run_hook(*args)
    assert result.exit_code == 2, result.output
    assert "is not a valid" in result.stderr and "\\n'" in result.stderr
    assert fake.calls == []


def test_status_without_permission_to_list_events_shows_the_claim_and_says_so(
    double: KubeDouble, kubeconfig: Path
):
    make_volume(double)
    double.rbac = Rbac.from_manifests(
        ROOT / "connections" / "rbac-storage-profile.yaml", "ml-team:storage-profile-hook"
    )
    for rules in double.rbac.namespaced.values():
        rules[:] = [r for r in rules if "events" not in r["resources"]]
    target = ("-n", NS, "--claim", CLAIM, "--kubeconfig", str(kubeconfig))
    text = run_hook("status", *target)
    assert text.exit_code == 0, text.output
    assert "current class  baseline" in text.stdout
    [line] = [ln for ln in text.stdout.splitlines() if ln.startswith("  events")]
    assert line.startswith("  events         not shown: cannot list events of claim ml-team/")
    assert 'cannot list resource "events"' in line
    assert "HTTP response headers" not in text.output
    data = json.loads(run_hook("status", *target, "--output", "json").stdout)
    assert data["events"] == [] and data["currentClass"] == "baseline"
    assert 'cannot list resource "events"' in data["eventsError"]


def kubeconfig_doc(server: object = "http://127.0.0.1:1", user: object = None) -> dict:
    cluster = {} if server is None else {"server": server}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "t"} if user is None else user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (kubeconfig_doc(user="bob"), "users[u].user must be a mapping, not str"),
        (
            kubeconfig_doc(server=None),
            "clusters[].cluster.server of the current context is missing",
        ),
        (kubeconfig_doc(server="http://[::1"), "'http://[::1' is not a URL"),
        (kubeconfig_doc(server="http://host:abc"), "'http://host:abc' is not a URL"),
        (kubeconfig_doc(server="ftp://host"), "is not an http:// or https:// URL"),
        (kubeconfig_doc(server=6443), "clusters[c].cluster.server must be a string"),
    ],
    ids=["user-string", "no-server", "bad-ipv6", "bad-port", "not-http", "server-number"],
)
@pytest.mark.parametrize("command", ["switch", "status"])
def test_an_unusable_kubeconfig_is_refused_at_once_naming_the_field(
    tmp_path: Path, doc: dict, field: str, command: str
):
    import yaml

    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump(doc))
    extra = ("--to", "fast") if command == "switch" else ()
    result = run_hook(
        command, "-n", NS, "--claim", CLAIM, *extra, "--kubeconfig", str(config), "--timeout", "3"
    )
    assert result.exit_code == 3, result.output
    assert f"no usable Kubernetes configuration in {config}" in result.stderr
    assert field in result.stderr


def test_an_api_error_nothing_judged_is_one_line_without_the_clients_dump():
    from kubernetes.client.rest import ApiException

    from hooks.storage_profile.errors import EXIT_UNEXPECTED, as_hook_error

    exc = ApiException(status=400, reason="Bad Request")
    exc.body = json.dumps({"kind": "Status", "message": "the server rejected the request"})
    exc.headers = {"Content-Type": "application/json"}
    error = as_hook_error(exc)
    assert error.exit_code == EXIT_UNEXPECTED
    assert error.format_message() == "the API server answered 400: the server rejected the request"
    assert "\n" not in error.format_message() and "HTTP response headers" not in str(error)
