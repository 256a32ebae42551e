"""Stopping a process group we started with pipes (how the fio runner stops fio)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from checkpoint_storage_bench.processes import group_members, stop_group

# A leader that answers SIGTERM by printing 1 MiB (more than a pipe holds) and exiting,
# like fio printing its results, with a child that ignores SIGTERM.
LEADER = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)", sys.argv[1]])
def on_term(*_):
    sys.stdout.write("x" * (1 << 20)); sys.stdout.flush()
    open(sys.argv[1] + ".bye", "w").close(); sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("started", flush=True)
time.sleep(60)
"""


def start(ready: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LEADER, str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 30
    while not ready.exists():  # the child ignores SIGTERM from now on
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def test_drains_the_leaders_pipes_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    proc = start(tmp_path / "ready")
    child = next(p for p in group_members(proc.pid) if p.pid != proc.pid)
    began = time.monotonic()
    stop_group(proc.pid, grace=2.0, popen=proc)
    elapsed = time.monotonic() - began
    # The leader exited on SIGTERM (0), not SIGKILL: its 1 MiB goodbye did not block on the
    # pipe. The child ignored SIGTERM and was killed after the grace period.
    assert proc.returncode == 0 and (tmp_path / "ready.bye").exists()
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
    assert group_members(proc.pid) == []
    assert 1.5 <= elapsed < 10


def test_a_group_already_gone_is_fine() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "pass"], stdout=subprocess.PIPE, start_new_session=True
    )
    proc.communicate()
    stop_group(proc.pid, grace=0.5, popen=proc)
    assert proc.returncode == 0
