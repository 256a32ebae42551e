"""The hook's options: generated from the settings dataclasses, so each default, choice and
help text is declared once (hooks/storage_profile/config.py), under the names it always had;
a bad value is a usage error (exit 2) before any request."""

from __future__ import annotations

from dataclasses import MISSING, fields

import click
import pytest
from click.testing import CliRunner

from hooks.storage_profile import config
from hooks.storage_profile.cli import main
from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import run_hook
from tests.hooks.kube_state import make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"

TARGET = ["--namespace", "-n", "--claim", "--kubeconfig", "--backend", "--profiles-file"]
OPTIONS = {
    "switch": [
        *TARGET, "--to", "--timeout", "--pending-grace", "--settle", "--on-infeasible",
        "--dry-run", "--force", "--stop-after-failure", "--only-if-switched",
        "--summary-json", "--holder", "--lease-duration",
    ],
    "release": [*TARGET, "--holder", "--timeout"],
    "renew": [*TARGET, "--holder", "--lease-duration", "--timeout"],
    "status": [*TARGET, "-o", "--output", "--timeout"],
    "plan": [
        *TARGET, "--profiles", "--return-to-first", "--restore-after", "--restore-class",
        "--summary-json", "--repeats", "--workload", "--steps", "--checkpoint-every",
        "--warmup", "--max-pause-s", "--max-pause-share", "--min-au", "--max-p99-ms",
        "--timeout",
    ],
}  # fmt: skip
SETTINGS = {
    "switch": config.SwitchConfig,
    "release": config.ReleaseConfig,
    "renew": config.RenewConfig,
    "status": config.StatusConfig,
    "plan": config.PlanConfig,
}
ON_SWITCHES = {"--dry-run", "--force", "--stop-after-failure", "--only-if-switched"}
ON_SWITCHES |= {"--return-to-first", "--restore-after"}


def _options(name: str) -> list[click.Option]:
    return [
        p for p in main.commands[name].params if isinstance(p, click.Option) and p.name != "help"
    ]


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_subcommand_takes_its_options_in_their_order(name: str) -> None:
    assert [o for p in _options(name) for o in p.opts] == OPTIONS[name]


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_is_a_field_of_the_settings_with_its_default(name: str) -> None:
    settings = {f.name: f for f in fields(SETTINGS[name])}
    for option in _options(name):
        f = settings[option.name]
        assert option.required == (f.default is MISSING and f.default_factory is MISSING)
        if not option.required:
            assert option.default == f.default, option.name


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_a_yes_no_option_is_a_switch_without_a_value(name: str) -> None:
    for option in _options(name):
        assert option.is_flag == (option.opts[0] in ON_SWITCHES), option.opts


def test_switch_help_quotes_the_default_deadline_of_each_settle_mode() -> None:
    result = CliRunner().invoke(main, ["switch", "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    kubernetes, provider = config.DEFAULT_TIMEOUT["kubernetes"], config.DEFAULT_TIMEOUT["provider"]
    assert f"[default: {kubernetes:g} with --settle kubernetes, {provider:g} with" in result.output


def test_the_holder_comes_from_its_environment_variable() -> None:
    (holder,) = [o for o in _options("release") if o.name == "holder"]
    assert holder.envvar == "STORAGE_PROFILE_HOLDER"


def test_a_bad_profiles_list_is_a_usage_error_naming_the_option() -> None:
    result = CliRunner().invoke(main, ["plan", "-n", "ns", "--claim", "c", "--profiles", "a,,b"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--profiles'" in result.output
    assert "--profiles must be class names separated by commas" in result.output


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
