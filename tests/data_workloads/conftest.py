"""Fixtures of the data-workload tests: a claim directory with real files."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data dir on the claim (its parent, the mount, exists; the data dir does not yet)."""
    return tmp_path / "claim" / "data"


@pytest.fixture(autouse=True)
def _mount(data_dir: Path) -> None:
    data_dir.parent.mkdir()
