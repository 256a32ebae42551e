"""The workloads' hidden working directories inside the data dir, and who may remove them.

A claim can be shared by several pods, and a container's PIDs repeat (the first process of
every pod is PID 1), so a directory named after the PID alone can be another pod's work in
progress. Each scratch directory is therefore named after the host, the PID and a random
token (:func:`scratch_tag`), and its creator holds an ``flock`` on the ``.owner`` file
inside it for as long as it lives. The kernel releases a process's locks when it dies, so a
directory whose ``.owner`` lock can be taken is provably abandoned, and the next run
removes it (:func:`remove_stale`); one whose lock is held is left alone.

The owner file is locked under a temporary name and then renamed to ``.owner``, so a
``.owner`` is never seen unlocked while its creator lives. A directory without one is in
the microseconds between its ``mkdir`` and that rename, or its creator died there: it is
removed only once it has not changed for :data:`GRACE_S`.

Imports nothing heavy (no torch): the data dir is cleaned before anything is measured.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import socket
import time
from pathlib import Path

from checkpoint_storage_bench.interrupts import deferred_signals

OWNER = ".owner"
GRACE_S = 60.0
"""A scratch directory without an owner file is abandoned once unchanged this long (its
creator takes the lock microseconds after the ``mkdir``)."""

_TAG = r"[A-Za-z0-9_.-]+-\d+-[0-9a-f]{8}"
SCRATCH_NAME = re.compile(rf"^\.[A-Za-z0-9_.-]+-{_TAG}$")
"""Names :class:`ScratchDir` makes: ``.<what>-<host>-<pid>-<token>``."""


def scratch_tag() -> str:
    """``<host>-<pid>-<token>``: unique across the pods sharing a claim (a PID alone is not:
    every container has a PID 1), so no run ever takes another's scratch name."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:63] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


def remove_tree(path: Path) -> None:
    """Remove a directory of ours (bottom up; never follows a link out)."""
    if not path.exists() or path.is_symlink():
        return
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                os.unlink(full)
            else:
                os.rmdir(full)
    os.rmdir(path)


class ScratchDir:
    """A fresh hidden directory ``<parent>/.<what>-<tag>``, held (its ``.owner`` locked)
    from :meth:`create` until :meth:`remove` or :meth:`release`."""

    def __init__(self, parent: Path, what: str) -> None:
        self.path = parent / f".{what}-{scratch_tag()}"
        self._fd: int | None = None
        self._made = False

    def create(self) -> Path:
        """Make the directory and take its lock.

        Raises:
            OSError: It cannot be made (the caller maps ENOSPC and the like).
        """
        # An interruption between the mkdir and the end would leave a directory that no
        # ``with`` block owns yet: it is held until the directory is made and owned.
        with deferred_signals():
            self.path.mkdir()
            self._made = True
            try:
                pending = self.path / f"{OWNER}.new"
                fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except BaseException:
                remove_tree(self.path)
                self._made = False
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                owner = {"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
                os.write(fd, json.dumps(owner).encode())
                os.rename(pending, self.path / OWNER)
            except BaseException:
                os.close(fd)
                remove_tree(self.path)
                self._made = False
                raise
            self._fd = fd
            return self.path

    def disown(self) -> None:
        """Drop the owner file (before the directory is renamed into place as something
        else); the lock stays held until :meth:`release`."""
        (self.path / OWNER).unlink(missing_ok=True)

    def release(self) -> None:
        """Let go of the lock (the directory is gone, or renamed into place)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        """Remove the directory if this run made it (a name taken already is someone
        else's), the lock held until it is gone. An interruption waits until it is gone:
        half a removal would leave scratch behind."""
        with deferred_signals():
            try:
                if self._made:
                    remove_tree(self.path)
                    self._made = False
            finally:
                self.release()

    def __enter__(self) -> Path:
        # An interruption held during create() is raised as it ends, inside __enter__, where
        # __exit__ will not run: remove here what create() made.
        try:
            return self.create()
        except BaseException:
            self.remove()
            raise

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _abandoned(path: Path) -> bool:
    """Whether the scratch directory ``path`` has no live owner (see the module's text)."""
    try:
        fd = os.open(path / OWNER, os.O_RDWR)
    except FileNotFoundError:
        try:
            return time.time() - path.stat().st_mtime > GRACE_S
        except FileNotFoundError:
            return False  # removed meanwhile by its owner
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False  # its owner lives
            raise
        return True
    finally:
        os.close(fd)


def remove_stale(data_dir: Path) -> list[Path]:
    """Remove the scratch directories in ``data_dir`` whose creators are gone (killed,
    or stopped before they could clean up); returns them. Anything else is left alone:
    names :class:`ScratchDir` does not make, links, and directories whose owner lives."""
    removed = []
    try:
        entries = list(data_dir.iterdir())
    except FileNotFoundError:
        return removed
    for path in entries:
        if not SCRATCH_NAME.match(path.name) or path.is_symlink() or not path.is_dir():
            continue
        if _abandoned(path):
            try:
                remove_tree(path)
            except FileNotFoundError:
                continue  # another run removed it at the same time
            removed.append(path)
    return removed
