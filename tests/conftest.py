"""Shared pytest fixtures."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _isolated_polyaxon(tmp_path, monkeypatch):
    """Keep every test's Polyaxon state (offline runs, ~/.polyaxon) inside its tmp dir."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("POLYAXON_OFFLINE_ROOT", str(tmp_path / "plx-offline"))
    for var in [
        v for v in os.environ if v.startswith("POLYAXON_RUN") or v == "POLYAXON_IS_OFFLINE"
    ]:
        monkeypatch.delenv(var, raising=False)
