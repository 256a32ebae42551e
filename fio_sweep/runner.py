"""Where fio may write, and running it there safely.

Safety rules: the target directory lies strictly inside the mount and on the same
filesystem; raw devices only with ``allow_raw_device``; enough free space before anything
is written; fio's files live in a fresh scratch directory that is removed afterwards, also
when the sweep is interrupted (the CLI turns SIGTERM/SIGINT into :class:`Interrupted`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from checkpoint_storage_bench.interrupts import deferred_signals
from checkpoint_storage_bench.units import format_bytes
from fio_sweep.errors import FioMissingError, NoSpaceError, UnsafeTargetError

# Space kept free beyond the largest case, so the sweep never fills a claim to the brim.
SPACE_RESERVE = 64 * 1024**2


@dataclass(frozen=True)
class Target:
    """A checked place to run fio.

    Attributes:
        path: The directory fio's scratch directory goes into, or the raw device itself.
        raw_device: True when ``path`` is a block or character device.
    """

    path: Path
    raw_device: bool = False


def is_device(path: Path) -> bool:
    """Whether the path is a block or character device (following symlinks)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISBLK(mode) or stat.S_ISCHR(mode)


def resolve_target(mount: Path, target: Path | None, allow_raw_device: bool = False) -> Target:
    """Check that fio may write to ``target`` (default ``mount/fio-sweep``).

    Raises:
        UnsafeTargetError: The mount is missing, the target is outside it or on another
            filesystem, or either is a raw device without ``allow_raw_device``.
    """
    device = mount if is_device(mount) else target if target and is_device(target) else None
    if device is not None:
        if not allow_raw_device:
            raise UnsafeTargetError(
                f"{device} is a raw device; fio would overwrite its data "
                "(pass --allow-raw-device to test it anyway)"
            )
        if device is not mount or (target is not None and target.resolve() != mount.resolve()):
            raise UnsafeTargetError(f"give the raw device {device} as --mount, without --target")
        return Target(mount.resolve(), raw_device=True)
    if not mount.is_dir():
        raise UnsafeTargetError(f"mount {mount} is not an existing directory")
    mount_real = mount.resolve()
    target_real = (target if target is not None else mount / "fio-sweep").resolve()
    if mount_real not in target_real.parents:
        raise UnsafeTargetError(f"target {target_real} is not strictly inside mount {mount_real}")
    if ":" in str(target_real):
        # fio splits --directory at ':' (several directories); refuse rather than escape.
        raise UnsafeTargetError(f"target {target_real} contains ':', which fio cannot use")
    if target_real.exists() and not target_real.is_dir():
        raise UnsafeTargetError(f"target {target_real} exists and is not a directory")
    existing = _nearest_existing(target_real)
    if existing.stat().st_dev != mount_real.stat().st_dev:
        raise UnsafeTargetError(
            f"target {target_real} is on another filesystem than mount {mount_real}"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UnsafeTargetError(f"{existing} is not writable")
    return Target(target_real)


def check_directory(path: Path, what: str = "reference dir") -> Target:
    """Check a directory fio may write a scratch directory into (e.g. --reference-dir)."""
    if is_device(path):
        raise UnsafeTargetError(f"{what} {path} is a device, not a directory")
    if not path.is_dir():
        raise UnsafeTargetError(f"{what} {path} is not an existing directory")
    if ":" in str(path.resolve()):
        raise UnsafeTargetError(f"{what} {path} contains ':', which fio cannot use")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UnsafeTargetError(f"{what} {path} is not writable")
    return Target(path.resolve())


def free_bytes(target: Target) -> int:
    """Space fio can use at the target: free bytes of its filesystem, or the device size."""
    if target.raw_device:
        fd = os.open(target.path, os.O_RDONLY)
        try:
            return os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)
    return shutil.disk_usage(_nearest_existing(target.path)).free


def check_space(target: Target, needed: int) -> None:
    """Refuse to start when the target cannot hold the largest case plus a reserve.

    Cases run one after another and each one's files are removed before the next, so the
    largest case decides. Character devices (size 0, e.g. /dev/zero) are not checked.

    Raises:
        NoSpaceError: Not enough free space.
    """
    free = free_bytes(target)
    if target.raw_device:
        if free and free < needed:
            raise NoSpaceError(
                f"device {target.path} holds {format_bytes(free)}, the sweep needs "
                f"{format_bytes(needed)} (lower --size-scale)"
            )
        return
    if free < needed + SPACE_RESERVE:
        raise NoSpaceError(
            f"{target.path}: {format_bytes(free)} free, the sweep needs "
            f"{format_bytes(needed)} + {format_bytes(SPACE_RESERVE)} reserve (lower --size-scale)"
        )


@contextlib.contextmanager
def scratch_dir(target: Target) -> Iterator[Path]:
    """A fresh directory for fio's files inside the target, removed with everything in it.

    Directories created on the way to the target are removed too, if they end up empty.
    """
    created = _missing_parents(target.path)
    target.path.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=".fio-sweep-", dir=target.path))
    try:
        yield path
    finally:
        with deferred_signals():
            shutil.rmtree(path, ignore_errors=True)
            for folder in created:
                with contextlib.suppress(OSError):
                    folder.rmdir()


def supports_direct_io(directory: Path) -> bool:
    """Whether files in ``directory`` can be opened with O_DIRECT (tmpfs often refuses)."""
    probe = directory / ".odirect-probe"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise
    os.close(fd)
    probe.unlink()
    return True


def device_supports_direct_io(device: Path) -> bool:
    """Whether a raw device can be opened with O_DIRECT (character devices cannot)."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    return True


def find_fio() -> tuple[str, str]:
    """The fio binary on PATH and its version (e.g. ``fio-3.33``).

    Raises:
        FioMissingError: No fio, or it does not run.
    """
    fio = shutil.which("fio")
    if fio is None:
        raise FioMissingError("fio not found on PATH (install it: apt-get install fio)")
    try:
        done = subprocess.run(
            [fio, "--version"], capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise FioMissingError(f"{fio} does not run: {exc}") from exc
    return fio, done.stdout.strip()


def _nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _missing_parents(path: Path) -> list[Path]:
    """The directories on the way to ``path`` (itself included) that do not exist yet,
    deepest first."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    return missing
