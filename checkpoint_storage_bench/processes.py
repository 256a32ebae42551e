"""Process groups: every sandbox process (server, agent, each run) leads its own session,
so its group id is its pid, and the whole group is signalled by that id."""

from __future__ import annotations

import os
import signal

import psutil

STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL of a process group


def group_members(pgid: int) -> list[psutil.Process]:
    """Every live process in process group ``pgid``."""
    return [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]


def stop_group(pid: int, grace: float = STOP_GRACE) -> None:
    """SIGTERM the process group ``pid`` leads, SIGKILL what is left after ``grace``.

    Every sandbox process is started in its own session, so its group id is its pid; the
    group is signalled by that id even when the leader itself has already died.
    """
    members = group_members(pid)
    signal_group(pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(members, timeout=grace)
    if alive or group_members(pid):
        signal_group(pid, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace)


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group; one that is already gone (or not ours) is left alone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
