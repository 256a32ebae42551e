"""Reaching the API server: no, a broken or an unusable kubeconfig, a refused connection and a
failed TLS handshake are fast refusals naming the cause (exit 3); an API error is one line;
the real ``python -m`` entry point switches on the wire."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.hooks.helpers import hook_command, run_hook, write_kubeconfig
from tests.hooks.kube_double import KubeDouble
from tests.hooks.kube_state import make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"
ROOT = Path(__file__).resolve().parents[2]


def test_no_cluster_configuration_is_a_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = run_hook("switch", "-n", NS, "--claim", CLAIM, "--to", "fast")
    assert result.exit_code == 3, result.output
    assert "no usable Kubernetes configuration" in result.stderr


def test_a_broken_kubeconfig_is_a_refusal(tmp_path: Path):
    config = tmp_path / "kubeconfig"
    config.write_text("{{:: not yaml")
    result = run_hook(
        "switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--kubeconfig", str(config)
    )
    assert result.exit_code == 3, result.output
    assert f"no usable Kubernetes configuration in {config}" in result.stderr


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
