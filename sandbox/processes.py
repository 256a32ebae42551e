"""The sandbox's processes: each one the server or a runtime starts leads its own session
(process group), with its pid in ``.sandbox/<name>.pid`` and its output in
``.sandbox/<name>.log``, so that ``stop`` ends each whole group, children included, and
nothing is left behind.

Shared by the server (:mod:`sandbox.server`) and both runtimes (:mod:`sandbox.local`,
:mod:`sandbox.on_node`): each starts and stops its processes the same way.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import psutil

from checkpoint_storage_bench.processes import group_members, stop_group

LOG_TAIL_LINES = 40


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file ('' when it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def pid_in(path: Path) -> int | None:
    """The pid written in ``path``, alive or not."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def read_pid(path: Path) -> int | None:
    """The pid in ``path`` if that process is still alive (zombies count as dead)."""
    pid = pid_in(path)
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return pid
    except psutil.Error:
        return None


def spawn(args: Sequence[str], env: dict[str, str], log: Path, cwd: Path) -> int:
    """Start ``args`` in a session of its own, its output appended to ``log``; its pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(args),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop ends it and its children
        )
    return proc.pid


def owned_by(root: Path, pgid: int) -> bool:
    """Whether group ``pgid`` still has members that belong to the sandbox at ``root`` (a
    stale pid file must never end someone else's processes)."""
    for proc in group_members(pgid):
        try:
            if str(root) in " ".join(proc.cmdline()) or str(root) in proc.cwd():
                return True
        except psutil.Error:
            continue
    return False


def stop_recorded(root: Path, name: str, pid_file: Path) -> str | None:
    """Stop the process group recorded in ``pid_file`` and remove the file; what was stopped
    (None: nothing ran). A group whose leader died is stopped only while members of this
    sandbox live on in it."""
    pid = pid_in(pid_file)
    stopped = None
    if pid and read_pid(pid_file):
        stop_group(pid)
        stopped = f"{name} (pid {pid})"
    elif pid and owned_by(root, pid):
        stop_group(pid)  # the leader died but its children live on in its group
        stopped = f"{name}'s leftover processes (group {pid})"
    pid_file.unlink(missing_ok=True)
    return stopped
