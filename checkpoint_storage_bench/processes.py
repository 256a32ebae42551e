"""Process groups: every process we start to stop as a whole (the sandbox's server, agent
and runs, fio and its job processes) leads its own session, so its group id is its pid, and
the whole group is signalled by that id."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil

STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL of a process group


def group_members(pgid: int) -> list[psutil.Process]:
    """Every live process in process group ``pgid``."""
    return [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]


def stop_group(pid: int, grace: float = STOP_GRACE, popen: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group ``pid`` leads, SIGKILL what is left after ``grace``.

    The group is signalled by its id even when the leader itself has already died.

    Args:
        pid: The group's id (its leader's pid).
        grace: Seconds between SIGTERM and SIGKILL.
        popen: The leader, when it is our child with pipes: it is reaped through ``popen``
            (so its return code is known) and its pipes are drained meanwhile, so a leader
            that writes its last output on SIGTERM (fio prints its results) cannot block
            on a full pipe until the SIGKILL.
    """
    leader = popen.pid if popen is not None else None
    members = [p for p in group_members(pid) if p.pid != leader]
    signal_group(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    if popen is not None:
        _reap(popen, grace)
    _, alive = psutil.wait_procs(members, timeout=max(0.0, end - time.monotonic()))
    if alive or group_members(pid) or (popen is not None and popen.returncode is None):
        signal_group(pid, signal.SIGKILL)
        if popen is not None:
            _reap(popen, grace)
        psutil.wait_procs(alive, timeout=grace)


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group; one that is already gone (or not ours) is left alone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(popen: subprocess.Popen, timeout: float) -> None:
    """Wait for our child, reading and dropping what it still writes to its pipes."""
    with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
        # ValueError: its pipes were already read to the end and closed.
        popen.communicate(timeout=timeout)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
