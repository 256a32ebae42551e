"""The storage seam: every file-system call a checkpoint makes goes through ``LocalFS``.

Tests subclass it to inject faults (ENOSPC after N bytes, EIO on fsync) without needing
a full disk; production uses it as is.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from trainer.errors import StorageFullError

_FULL = (errno.ENOSPC, errno.EDQUOT)


def raise_if_full(exc: OSError, what: str) -> None:
    """Turn ENOSPC/EDQUOT into the trainer's StorageFullError (exit code 4)."""
    if exc.errno in _FULL:
        raise StorageFullError(f"no space left on the checkpoint volume while {what}") from exc


class LocalFS:
    """POSIX file operations on the mounted volume."""

    def open_write(self, path: Path, direct: bool) -> int:
        """Create ``path`` for writing; with ``direct`` bypass the page cache (O_DIRECT).

        Raises:
            OSError: EINVAL when the file system does not support O_DIRECT.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        if direct:
            flags |= os.O_DIRECT
        return os.open(path, flags, 0o644)

    def open_read(self, path: Path, direct: bool) -> int:
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        if direct:
            flags |= os.O_DIRECT
        return os.open(path, flags)

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def preadinto(self, fd: int, buf: memoryview, offset: int) -> int:
        return os.preadv(fd, [buf], offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_small(self, path: Path, data: bytes, durable: bool = True) -> None:
        """Write a small file (a manifest), fsynced when ``durable``."""
        fd = self.open_write(path, direct=False)
        try:
            view = memoryview(data)
            while view:
                view = view[self.pwrite(fd, view, len(data) - len(view)) :]
            if durable:
                self.fsync(fd)
        finally:
            self.close(fd)

    def mkdir(self, path: Path) -> None:
        path.mkdir(parents=False, exist_ok=False)

    def rename(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)

    def rmtree(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
