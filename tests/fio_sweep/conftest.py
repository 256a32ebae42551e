"""Fixtures for the fio sweep tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    """An empty directory standing in for the mounted claim."""
    folder = tmp_path / "claim"
    folder.mkdir()
    return folder
