"""SIGTERM (how Polyaxon stops a run) and SIGINT during a sweep: fio stopped, files removed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpoint_storage_bench.tracking import offline_root

from .helpers import needs_fio, tree, write_spec

pytestmark = needs_fio
REPO = Path(__file__).resolve().parents[2]


def fio_pids(mount: Path) -> set[int]:
    """Live fio processes working in ``mount`` (found by their command line)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if Path(cmdline[0].decode()).name == "fio" and str(mount).encode() in b" ".join(cmdline):
            if state != "Z":
                pids.add(int(proc.name))
    return pids


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_fio_and_removes_its_files(tmp_path: Path, mount: Path, sig):
    spec = write_spec(
        tmp_path,
        [{"name": "long", "rw": "write", "size": "64M", "runtime": 60, "time_based": True}],
    )
    out = tmp_path / "summary.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fio_sweep", "--mount", str(mount), "--spec", str(spec),
         "--summary-json", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        # Wait until fio is writing its job file inside the claim, then stop the sweep.
        wait_for(lambda: any(p.is_file() for p in mount.rglob("long.*")) and fio_pids(mount))
        running = fio_pids(mount)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig
    assert stderr.strip().splitlines()[-1] == f"fio-sweep: error: interrupted by {sig.name}"
    assert tree(mount) == []
    assert not out.exists()
    assert running and not (running & fio_pids(mount))
    (run,) = (offline_root() / "runs").iterdir()
    assert json.loads((run / "run.plx.json").read_text())["status"] == "failed"
