"""Helpers for the fio sweep tests: tiny specs and running the CLI in-process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from fio_sweep.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")

# Small enough for a 2-core CI machine: a few MiB per case, one second at most.
TINY_DEFAULTS = {"ioengine": "libaio", "direct": True, "runtime": 1, "size": "4M", "bs": "64k"}


def write_spec(folder: Path, cases: list[dict[str, Any]], **top: Any) -> Path:
    """Write a sweep spec with tiny defaults and return its path."""
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump({"defaults": TINY_DEFAULTS, **top, "cases": cases}))
    return path


def run_cli(*args: str | Path) -> Result:
    """Run ``python -m fio_sweep`` in-process; SystemExit becomes ``exit_code``."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def tree(path: Path) -> list[str]:
    """Every file and directory below ``path``, relative, for "nothing left behind" checks."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def read_summary(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
