"""Where the local cluster keeps its state, where its binaries are, and what is running.

One state directory per user and kind (the control plane alone, or the plane with a node),
short because the CSI driver's unix socket lives in it. It holds the certificates, etcd's
data, the logs, the kubeconfigs and the pid files ``stop`` and ``status`` read.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from localcluster.controlplane import ADMIN_KUBECONFIG, PIDS_FILE, _alive
from localcluster.node import NODE_PIDS_FILE, _read_json

REPO = Path(__file__).resolve().parents[1]
# Builds the binaries from localcluster/go and knows their cache (docs/controlplane.md).
BUILD_SCRIPT = REPO / "scripts" / "controlplane.sh"


class SetupError(RuntimeError):
    """What the command needs is not here (the build script, the binary cache)."""


def default_state_dir(node: bool = False) -> Path:
    """The state directory ``start`` uses unless told another (``scripts/controlplane.sh``
    uses the control plane's too, under ``CONTROLPLANE_STATE_DIR``)."""
    kind = "node" if node else "controlplane"
    return Path(tempfile.gettempdir()) / f"csb-{kind}-{os.getuid()}"


def default_bin_dir() -> Path:
    """The binary cache the build script fills (``CONTROLPLANE_BIN_DIR`` or its default)."""
    if not BUILD_SCRIPT.is_file():
        raise SetupError(f"no {BUILD_SCRIPT} (a source checkout has it); pass --bin-dir")
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "bin-dir"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise SetupError(f"{BUILD_SCRIPT} bin-dir failed: {done.stderr.strip()}")
    return Path(done.stdout.strip())


@dataclass(frozen=True)
class Recorded:
    """One process a pid file of the state directory lists."""

    part: str  # "controlplane" or "node"
    name: str
    pid: int
    running: bool


def recorded(state_dir: Path) -> list[Recorded]:
    """Every process the state directory's pid files list, checked against its start time
    (a later process reusing the pid is not it)."""
    found = []
    for part, file in (("controlplane", PIDS_FILE), ("node", NODE_PIDS_FILE)):
        for rec in _read_json(state_dir / file).get("procs", []):
            alive = _alive(rec["pid"], rec.get("start_time"))
            found.append(Recorded(part, rec["name"], rec["pid"], alive))
    return found


def server(state_dir: Path) -> str:
    """The API server's address a started control plane recorded ('' when none)."""
    return _read_json(state_dir / PIDS_FILE).get("server", "")


def admin_kubeconfig(state_dir: Path) -> Path:
    return state_dir / ADMIN_KUBECONFIG
