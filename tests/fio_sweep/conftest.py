"""Fixtures for the fio sweep tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

OWN_FS_SIZE = 128 * 1024**2
"""Above the sweep's 64 MiB reserve; tmpfs allocates only what is written, so it costs nothing."""


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    """An empty directory standing in for the mounted claim."""
    folder = tmp_path / "claim"
    folder.mkdir()
    return folder


@pytest.fixture
def own_filesystem(tmp_path: Path) -> Path:
    """An empty directory on a small tmpfs of this test's own: its free space changes only
    by what the test writes (the shared disk's changes whenever anything else writes or
    deletes). Mounting needs root: elsewhere the test skips with the reason (fails under CI,
    which runs as root)."""
    point = tmp_path / "own-fs"
    point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={OWN_FS_SIZE},mode=0700",
         f"csb-test-{os.getpid()}", str(point)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        why = f"needs a tmpfs of its own (root): {done.stderr.strip() or 'mount failed'}"
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to mount a tmpfs: {why}")
        pytest.skip(why)
    try:
        folder = point / "claim"
        folder.mkdir()
        yield folder
    finally:
        subprocess.run(["umount", str(point)], capture_output=True, check=False)
