"""The examples in the hook's docstrings run."""

from __future__ import annotations

from pathlib import Path

import pytest

NS, CLAIM = "ml-team", "training-checkpoints"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["heartbeat", "kube"])
def test_doctests(module: str):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"hooks.storage_profile.{module}"))
    assert result.attempted > 0 and result.failed == 0
