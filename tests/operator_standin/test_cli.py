"""`python -m operator_standin`: its options, generated from OperatorConfig, each also taken
from the environment variable the agent's tooling sets; bad usage exits 2 (no cluster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from operator_standin import cli

REPO = Path(__file__).resolve().parents[2]
ENV_VARS = ("POLYAXON_K8S_NAMESPACE", "KUBECONFIG", "POLYAXON_HOST")


def _run(*args: str, **env: str) -> Result:
    unset: dict[str, str | None] = dict.fromkeys(ENV_VARS)
    return CliRunner().invoke(
        cli.main, list(args), env={**unset, **env}, prog_name="python -m operator_standin"
    )


def test_help_lists_each_option_with_its_environment_variable_and_the_exit_codes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "operator_standin", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: python -m operator_standin [OPTIONS]")
    for option, envvar in [
        ("--namespace TEXT", "POLYAXON_K8S_NAMESPACE"),
        ("--kubeconfig PATH", "KUBECONFIG"),
        ("--api-host URL", "POLYAXON_HOST"),
    ]:
        assert option in done.stdout
        assert f"env var: {envvar}" in " ".join(done.stdout.split())
    assert "--install-crds" in done.stdout and "-v, --verbose" in done.stdout
    assert "2  bad arguments" in done.stdout


@pytest.mark.parametrize(
    ("args", "env", "missing"),
    [
        ((), {"KUBECONFIG": "k"}, "'--namespace' (env var: 'POLYAXON_K8S_NAMESPACE')"),
        (("--namespace", "ml-team"), {}, "'--kubeconfig' (env var: 'KUBECONFIG')"),
    ],
)
def test_a_namespace_and_a_kubeconfig_are_required(
    args: tuple[str, ...], env: dict[str, str], missing: str
) -> None:
    done = _run(*args, **env)
    assert done.exit_code == 2
    assert f"Missing option {missing}" in done.stderr


def test_an_empty_namespace_is_a_usage_error() -> None:
    done = _run("--namespace", "", "--kubeconfig", "k")
    assert done.exit_code == 2
    assert "--namespace is empty" in done.stderr


def test_an_unknown_option_is_a_usage_error() -> None:
    assert _run("--namespace", "ml-team", "--kubeconfig", "k", "--watch").exit_code == 2


def test_the_environment_supplies_the_namespace_and_the_kubeconfig(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded: list[str] = []

    def refuse(config_file: str) -> None:
        loaded.append(config_file)
        raise RuntimeError("no cluster here")

    monkeypatch.setattr(cli.config, "new_client_from_config", refuse)
    done = _run(POLYAXON_K8S_NAMESPACE="ml-team", KUBECONFIG="/tmp/admin.kubeconfig")
    assert isinstance(done.exception, RuntimeError), done.output
    assert loaded == ["/tmp/admin.kubeconfig"]
