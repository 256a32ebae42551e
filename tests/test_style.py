"""The code stays as ruff wants it (lint and format), so a newcomer's diff is only theirs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    return subprocess.run([ruff, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_ruff_check():
    done = _ruff("check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format():
    done = _ruff("format", "--check", ".")
    assert done.returncode == 0, done.stdout + done.stderr
