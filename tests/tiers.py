"""What the tiers that run the local cluster (kube, node, agent_node, operator_standin, the
CSI conformance run) share: its binaries, built by scripts/controlplane.sh into a cache outside
the repo, and the root of their state directories.

Off CI a tier whose binaries are not built skips with one line saying what is missing; with
``CI`` set the first test that needs them builds them (once per session per set asked for) or
fails::

    bin_dir = binaries("--node")          # the node's binaries too
    reason = missing(DRIVER_BINARY)       # None when the EBS driver is built
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from localcluster.controlplane import ControlPlane, ControlPlaneError

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "controlplane.sh"
# Per-session state dirs live under here (short: the CSI sockets are in them).
STATE_ROOT = Path("/tmp") / f"csb-kube-{os.getuid()}"
BUILD_TIMEOUT = 3600
# The binary cache is under HOME, and every test gets a HOME of its own (tests/conftest.py):
# the user's, read at import (before any test), is where scripts/controlplane.sh built them.
USER_ENV = dict(os.environ)


def script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """scripts/controlplane.sh with ``args``, in the user's environment."""
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=REPO,
        env=USER_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _go_available() -> bool:
    return bool(USER_ENV.get("GO") or shutil.which("go") or Path("/usr/local/go/bin/go").exists())


def missing(*options: str, tier: str = "kube tier") -> str | None:
    """Why ``tier`` cannot run here (one line), or None when what it needs is built.
    ``options``: scripts/controlplane.sh's names (``--node`` for the node's binaries too,
    a binary such as the EBS driver)."""
    check = script("check", *options)
    if check.returncode == 0:
        return None
    last = check.stderr.strip().splitlines()[-1] if check.stderr.strip() else "?"
    if not _go_available():
        return f"{tier}: no Go toolchain (go, GO=) to build the control plane; {last}"
    return f"{tier}: {last}"


# A failed CI build, per what was asked for (the tier's binaries, one extra binary such as
# the EBS driver), so that each is tried once per session and one failing extra binary does
# not fail the tests that do not need it.
_build_failure: dict[tuple[str, ...], str] = {}


def binaries(*options: str, tier: str = "kube tier") -> Path:
    """The binary directory with ``options`` built; skips (or, under CI, builds or fails)."""
    if options in _build_failure:
        pytest.fail(_build_failure[options], pytrace=False)
    reason = missing(*options, tier=tier)
    if reason is not None:
        if not os.environ.get("CI"):
            pytest.skip(reason)
        build = script("build", *options, timeout=BUILD_TIMEOUT)
        if build.returncode != 0:
            _build_failure[options] = (
                f"{tier} (CI): scripts/controlplane.sh build failed:\n" + build.stderr[-4000:]
            )
            pytest.fail(_build_failure[options], pytrace=False)
    return Path(script("bin-dir").stdout.strip())


@contextmanager
def started_plane(name: str, *, tier: str = "kube tier", **options: Any) -> Iterator[ControlPlane]:
    """A control plane of this session's, state under ``STATE_ROOT/name``, stopped (and its
    state removed unless ``KUBE_TIER_KEEP_STATE``) on exit. ``options``: more of
    :class:`ControlPlane`'s (``node=True`` for a node to register)."""
    state = STATE_ROOT / name
    shutil.rmtree(state, ignore_errors=True)
    plane = ControlPlane(binaries(tier=tier), state, die_with_parent=True, **options)
    try:
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"{tier}: the control plane did not start: {exc}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()
        if not os.environ.get("KUBE_TIER_KEEP_STATE"):
            shutil.rmtree(state, ignore_errors=True)
