"""The local cluster's command line as a user runs it: `scripts/controlplane.sh start`
(which runs `python -m localcluster start`), `python -m localcluster status`, then `stop`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.controlplane import PROCESSES, ControlPlane
from tests.kube.cluster import REPO
from tests.tiers import STATE_ROOT

pytestmark = pytest.mark.kube


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = STATE_ROOT / f"cli{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    yield path
    # Whatever the test did, nothing it started outlives it.
    _run([sys.executable, "-m", "localcluster", "stop", "--state-dir", str(path)], dict(os.environ))
    shutil.rmtree(path, ignore_errors=True)


def test_script_start_status_and_stop_go_through_the_one_command_line(
    control_plane: ControlPlane, state_dir: Path
) -> None:
    # The session's plane only lends its binary cache (each test has a HOME of its own).
    env = {
        **os.environ,
        "CONTROLPLANE_BIN_DIR": str(control_plane.bin_dir),
        "CONTROLPLANE_STATE_DIR": str(state_dir),
        "PYTHON": sys.executable,
    }
    env.pop("KUBECONFIG", None)
    status = [sys.executable, "-m", "localcluster", "status", "--state-dir", str(state_dir)]

    started = _run(["bash", "scripts/controlplane.sh", "start"], env)
    assert started.returncode == 0, started.stderr
    assert f"export KUBECONFIG={state_dir / 'admin.kubeconfig'}" in started.stdout

    running = _run(status, env)
    assert running.returncode == 0, running.stdout + running.stderr
    lines = running.stdout.splitlines()
    assert [line.split()[1] for line in lines[: len(PROCESSES)]] == list(PROCESSES)
    assert all(line.endswith("running") for line in lines[: len(PROCESSES)])
    assert any(line.startswith("server: https://127.0.0.1:") for line in lines)

    stopped = _run(["bash", "scripts/controlplane.sh", "stop"], env)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("stopped: ") and "etcd" in stopped.stdout

    after = _run(status, env)
    assert after.returncode == 1
    assert "not started" in after.stdout
