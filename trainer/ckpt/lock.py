"""One trainer per checkpoint directory: an exclusive ``flock`` on a file in it.

Two trainers in one directory would resume from each other's checkpoints, replace them
and delete them by retention. The lock is the kernel's (``flock``; on NFS the kernel maps
it to a byte-range lock the server keeps), so a trainer that is killed, or whose pod
dies, holds nothing: its file descriptor closes and the lock is gone. The file names its
holder (run, host, pid) for the refusal a second trainer gets.

The file is removed when the lock is released, safely: a trainer that locked a file which
the holder removed meanwhile sees that the path no longer names its file and tries again.
A killed trainer leaves the file (unlocked) behind; the next one takes it and removes it.
Under torchrun rank 0 holds the lock for the job (every rank writes into one directory).
"""

from __future__ import annotations

import errno
import fcntl
import os
from datetime import UTC, datetime
from pathlib import Path

from trainer.ckpt.store import Owner
from trainer.errors import CheckpointDirError

LOCK_NAME = ".trainer.lock"


class DirLock:
    """The lock on ``directory``; :meth:`acquire` takes it, :meth:`release` gives it back."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or refuse: another trainer holds it.

        Raises:
            CheckpointDirError: Another process holds it (exit 3, naming it), or the file
                cannot be made.
        """
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError as exc:
                raise CheckpointDirError(f"cannot lock {self.path.parent}: {exc}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise CheckpointDirError(f"cannot lock {self.path.parent}: {exc}") from None
                raise CheckpointDirError(
                    f"{self.path.parent} is in use by another trainer ({self._holder()}): two "
                    "trainers in one checkpoint directory would resume, replace and delete "
                    "each other's checkpoints; wait for it to end, or use another directory"
                ) from None
            if self._still_the_file(fd):
                break
            os.close(fd)  # its holder removed it while we waited: lock the new one
        owner = Owner.current()
        since = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        record = f"run {owner.run}, host {owner.host}, pid {owner.pid}, since {since}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Remove the file and give the lock back (nothing when not held)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            # Removed while still locked: a waiter that opened it sees the change.
            self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def _still_the_file(self, fd: int) -> bool:
        try:
            on_disk = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)

    def _holder(self) -> str:
        try:
            text = self.path.read_text().strip()
        except OSError:
            text = ""
        return text or "it has not said who it is yet"
