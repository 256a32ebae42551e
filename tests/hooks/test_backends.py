"""The commands act only through the backend interface: one per ``--backend`` name, each
with every operation, and a command reads the same whichever does the work."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from hooks.storage_profile import commands
from hooks.storage_profile.backends import Backend, KubernetesBackend, LocalBackend, make_backend
from hooks.storage_profile.config import BACKENDS, ReleaseConfig, StatusConfig, SwitchConfig
from hooks.storage_profile.errors import EXIT_INFEASIBLE, Infeasible
from hooks.storage_profile.report import Report


class Recording:
    """A backend that records what the commands asked of it."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail

    def settle(self, cfg: SwitchConfig) -> str:
        return "recorded"

    def switch(self, cfg: SwitchConfig, report: Report, echo) -> None:
        self.calls.append(f"switch {cfg.target}")
        if self.fail is not None:
            raise self.fail
        report.outcome = "settled"

    def release(self, cfg: ReleaseConfig) -> str:
        self.calls.append("release")
        return "released"

    def renew(self, cfg) -> str:
        self.calls.append("renew")
        return "renewed"

    def status(self, cfg: StatusConfig) -> dict:
        self.calls.append("status")
        return {"claim": cfg.claim}

    def render(self, data: dict) -> str:
        return f"block of {data['claim']}"

    def plan(self, cfg, now: datetime):
        raise NotImplementedError


def test_each_backend_name_has_an_implementation_of_every_operation() -> None:
    made = {name: make_backend(name) for name in BACKENDS}
    assert isinstance(made["kubernetes"], KubernetesBackend)
    assert isinstance(made["local"], LocalBackend)
    assert all(isinstance(b, Backend) for b in made.values())
    assert isinstance(Recording(), Backend)


def test_the_kubernetes_backend_asks_the_provider_lookup_it_was_given() -> None:
    def lookup(driver: str, pv: dict) -> None:
        return None

    assert make_backend("kubernetes", provider_for=lookup).provider_for is lookup  # type: ignore[attr-defined]


def test_a_switch_reports_what_its_backend_settles_and_its_failure(tmp_path: Path) -> None:
    cfg = SwitchConfig(
        namespace="ns", claim="c", target="fast", summary_json=tmp_path / "s.json", dry_run=True
    )
    backend = Recording(fail=Infeasible("the class is infeasible"))
    with pytest.raises(Infeasible):
        commands.run_switch(cfg, backend, echo=lambda line: None)
    assert backend.calls == ["switch fast"]
    written = json.loads((tmp_path / "s.json").read_text())
    assert written["settle"] == "recorded"
    assert written["exit_code"] == EXIT_INFEASIBLE
    assert "the class is infeasible" in written["error"]


def test_status_prints_the_backends_block_or_its_data_as_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    backend = Recording()
    commands.run_status(StatusConfig(namespace="ns", claim="c"), backend)
    assert capsys.readouterr().out == "block of c\n"
    commands.run_status(StatusConfig(namespace="ns", claim="c", output="json"), backend)
    assert json.loads(capsys.readouterr().out) == {"claim": "c"}


def test_release_prints_the_backends_note(capsys: pytest.CaptureFixture[str]) -> None:
    backend = Recording()
    assert commands.run_release(ReleaseConfig(namespace="ns", claim="c"), backend) == "released"
    assert capsys.readouterr().out == "released\n"
    assert backend.calls == ["release"]
