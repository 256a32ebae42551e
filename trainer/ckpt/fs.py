"""The storage seam: every file-system call a checkpoint makes goes through ``LocalFS``.

Tests subclass it to inject faults (ENOSPC after N bytes, EIO on fsync) without needing
a full disk; production uses it as is.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

from trainer.errors import CheckpointDirError, StorageFullError, TrainerError

_FULL = (errno.ENOSPC, errno.EDQUOT)
_REFUSED = (errno.EACCES, errno.EPERM)
# How libraries that do not raise OSError still name the errno: Python's own text
# ("[Errno 28] ...", kept in re-raised messages) and Rust's io::Error, displayed
# ("No space left on device (os error 28)": safetensors) or debug-printed
# ("Os { code: 28, kind: StorageFull, ... }").
_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\]|\(os error (\d+)\)|\bOs \{ code: (\d+)")
FULL_SLACK_BYTES = 4 * 2**20
"""Free space under which a volume counts as full when a writer's error names no errno."""


def os_errno(exc: BaseException) -> int | None:
    """The errno behind a failed checkpoint write, whatever the writer raised.

    The raw writer raises OSError; torch.distributed.checkpoint wraps it (its
    CheckpointException keeps each rank's failure in ``failures``: an (exception,
    traceback) pair, or in older releases a WrappedException holding it in ``exc``),
    safetensors turns it into its own error whose text names the code. The cause and
    context chains are followed too.
    """
    chain: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop(0)
        if any(current is e for e in chain):
            continue
        chain.append(current)
        if isinstance(current, OSError) and current.errno is not None:
            return current.errno
        failures = getattr(current, "failures", None)
        nested: list[object] = []
        for failure in failures.values() if isinstance(failures, dict) else ():
            nested += failure if isinstance(failure, tuple) else [failure]
        nested += [getattr(current, "exc", None), current.__cause__, current.__context__]
        todo += [e for e in nested if isinstance(e, BaseException)]
    for current in chain:
        if match := _ERRNO_IN_TEXT.search(str(current)):
            return int(next(g for g in match.groups() if g))
    return None


def storage_error(
    exc: BaseException, what: str, fs: LocalFS | None = None, directory: Path | None = None
) -> TrainerError | None:
    """The trainer error a failed checkpoint write stands for, whichever format or path
    wrote it: a full volume (exit 4), a read-only one or refused access (exit 3); None for
    any other failure.

    torch.save inside torch.distributed.checkpoint loses the errno of a full volume (it
    fails later with "unexpected pos"): an error that names none counts as a full volume
    when ``directory``, looked at through ``fs`` before the half-written checkpoint is
    deleted, has less than :data:`FULL_SLACK_BYTES` free.
    """
    code = os_errno(exc)
    if code is None and fs is not None and directory is not None:
        try:
            if fs.free_bytes(directory) < FULL_SLACK_BYTES:
                code = errno.ENOSPC
        except OSError:
            pass  # nothing to tell: the write's own error stands
    if code in _FULL:
        return StorageFullError(f"no space left on the checkpoint volume while {what}")
    if code == errno.EROFS:
        return CheckpointDirError(f"checkpoint volume became read-only while {what}: {exc}")
    if code in _REFUSED:
        return CheckpointDirError(f"access refused while {what}: {exc}")
    return None


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

    def library_write(self) -> None:
        """A library (safetensors, torch.distributed.checkpoint) is about to write its
        files, on the thread that writes them: its bytes do not pass through
        :meth:`pwrite`, so this is where a test's seam acts on them. Nothing here."""

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

    def free_bytes(self, path: Path) -> int:
        """Bytes an unprivileged writer may still use on the file system of ``path``."""
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    def mkdir(self, path: Path) -> None:
        path.mkdir(parents=False, exist_ok=False)

    def rename(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)

    def rmtree(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def drop_cached(self, path: Path) -> None:
        """Evict a file's pages from the page cache, so its next read comes from the device.

        fsync first: dirty pages cannot be dropped (a checkpoint written with
        ``--durability none``, or one just copied in).
        """
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
