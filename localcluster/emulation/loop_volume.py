"""Loop-device volumes: a file in RAM as a block device with a real ext4 file system, the
block device a volume class is emulated on.

The kernel's block throttle only makes a volume behave like its class while the throttle is
the bottleneck. A shared machine's disk often is not (another job writing to it takes its
spare bandwidth), so an emulated class on that disk lands below its figure at random. A loop
device over a preallocated file in ``/dev/shm`` is several times faster than any class
emulated here and is used by nothing else; the throttle on that device decides, whatever
else the machine's disk is doing.

The API: :func:`create` (idempotent: the volume of that name at that mount point is reused),
:func:`apply_limits` / :func:`read_limits` (the class's block-I/O limits for one cgroup on
the volume's device, read back from the kernel), :func:`remove` (idempotent), and
:func:`sweep`, which removes whatever a killed run left behind (mounts, loop devices,
backing files, cgroups) by a name prefix: every backing file is ``/dev/shm/csb-<name>.img``
and every cgroup ``checkpoint-storage-bench/<name>``, so nothing else on the machine is
ever touched. :func:`write_speed` measures a directory's unthrottled O_DIRECT write speed.

Everything needs root (``losetup``, ``mount``); a refusal raises :class:`VolumeUnavailable`
(a :class:`~localcluster.emulation.io_limits.ThrottleUnavailable`: where no volume can be
made, the class cannot be emulated either).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from checkpoint_storage_bench.fio import extract_json, run_fio
from localcluster.emulation.io_limits import (
    MIB,
    PARENT,
    BlockDevice,
    Cgroup,
    IoLimits,
    ThrottleUnavailable,
    find_hierarchy,
    read_mounts,
)

PREFIX = "csb-"
"""Every backing file this project creates starts with this (``csb-<name>.img``)."""
BACKING_DIR = Path("/dev/shm")
SYS_BLOCK = Path("/sys/block")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TIMEOUT_S = 60


class VolumeUnavailable(ThrottleUnavailable):
    """No loop volume can be made or removed here; the message says why."""


@dataclass(frozen=True)
class LoopVolume:
    """A loop device over a file, with ext4 mounted at ``mount_point``.

    Attributes:
        name: Its name (``csb-<name>.img`` is the backing file).
        mount_point: Where its file system is mounted.
        backing_file: The file the loop device reads and writes.
        device: The loop device (``major:minor``, the device the throttle applies to).
        direct_io: Whether the loop device writes to its file with direct I/O.
        size: The backing file's size in bytes.
    """

    name: str
    mount_point: Path
    backing_file: Path
    device: BlockDevice
    direct_io: bool
    size: int

    @property
    def dev_path(self) -> Path:
        return Path("/dev") / self.device.name

    def describe(self) -> str:
        """One line: the device, its file and its size."""
        return (
            f"{self.dev_path} ({self.device.id}, ext4, {self.size / MIB:g} MiB over "
            f"{self.backing_file}, direct I/O {'on' if self.direct_io else 'off'})"
        )


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"volume name {name!r} must be letters, digits, '.', '_' or '-'")
    return name


def backing_file(name: str, backing_dir: Path = BACKING_DIR) -> Path:
    """Where the volume ``name`` keeps its blocks."""
    return backing_dir / f"{PREFIX}{_check_name(name)}.img"


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except FileNotFoundError as exc:
        raise VolumeUnavailable(f"{argv[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise VolumeUnavailable(f"{' '.join(argv)} did not finish in {_TIMEOUT_S}s") from exc
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise VolumeUnavailable(
            f"{' '.join(argv)} failed (exit {done.returncode}): {why[-1] if why else ''}"
        )
    return done.stdout


def loop_devices(sys_block: Path = SYS_BLOCK) -> dict[Path, BlockDevice]:
    """Every attached loop device's backing file → the device, read from the kernel."""
    found = {}
    for entry in sorted(sys_block.glob("loop*")):
        try:
            text = (entry / "loop" / "backing_file").read_text().strip()
            major, minor = (int(x) for x in (entry / "dev").read_text().split(":"))
        except (OSError, ValueError):
            continue  # not attached (no loop/ directory) or gone meanwhile
        found[Path(text.removesuffix(" (deleted)"))] = BlockDevice(major, minor, entry.name)
    return found


def _mount_points_of(device: BlockDevice) -> list[Path]:
    dev = f"/dev/{device.name}"
    return [
        Path(m.mount_point)
        for m in read_mounts()
        if m.source == dev or (m.major, m.minor) == (device.major, device.minor)
    ]


def find(name: str, mount_point: Path, backing_dir: Path = BACKING_DIR) -> LoopVolume | None:
    """The volume ``name`` if its loop device is attached and mounted at ``mount_point``."""
    file = backing_file(name, backing_dir)
    device = loop_devices().get(file)
    if device is None or Path(mount_point).resolve() not in _mount_points_of(device):
        return None
    return _volume(name, Path(mount_point).resolve(), file, device)


def _volume(name: str, mount_point: Path, file: Path, device: BlockDevice) -> LoopVolume:
    try:
        dio = (SYS_BLOCK / device.name / "loop" / "dio").read_text().strip() == "1"
    except OSError:
        dio = False
    size = file.stat().st_size if file.exists() else 0
    return LoopVolume(name, mount_point, file, device, dio, size)


def create(name: str, mount_point: Path, size: int, backing_dir: Path = BACKING_DIR) -> LoopVolume:
    """The volume ``name`` mounted at ``mount_point``: the existing one, else a new one (a
    preallocated file of ``size`` bytes, a loop device over it, ext4, mounted).

    The file is preallocated because a tmpfs page written for the first time is allocated
    and zeroed on the way, which halves the loop device's speed. Direct I/O from the loop
    device to its file is asked for (no second copy in the page cache) and done without
    where the kernel refuses it. Partial leftovers of the same name (a killed run) are
    removed first.

    Raises:
        VolumeUnavailable: Not root, a tool is missing, the kernel refused, or something
            else is mounted at ``mount_point``.
    """
    mount_point = Path(mount_point).resolve()
    existing = find(name, mount_point, backing_dir)
    if existing is not None:
        return existing
    if os.path.ismount(mount_point):
        raise VolumeUnavailable(f"something else is mounted at {mount_point}")
    if os.geteuid() != 0:
        raise VolumeUnavailable("making a loop-device volume needs root (losetup, mount)")
    sweep(name, backing_dir, cgroups=False, exact=True)
    file = backing_file(name, backing_dir)
    mount_point.mkdir(parents=True, exist_ok=True)
    if any(mount_point.iterdir()):
        raise VolumeUnavailable(f"{mount_point} is not empty; a volume is only mounted on an "
                                "empty directory (nothing there is ever hidden)")  # fmt: skip
    try:
        backing_dir.mkdir(parents=True, exist_ok=True)
        with open(file, "wb") as out:
            os.posix_fallocate(out.fileno(), 0, size)
    except OSError as exc:
        file.unlink(missing_ok=True)
        raise VolumeUnavailable(f"cannot allocate {size / MIB:g} MiB for {file}: {exc}") from exc
    try:
        try:
            dev = _run(["losetup", "--find", "--show", "--direct-io=on", str(file)]).strip()
        except VolumeUnavailable:
            dev = _run(["losetup", "--find", "--show", str(file)]).strip()
        # Initialised now, not by a background thread that would write during a measurement.
        _run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev])
        _run(["mount", "-t", "ext4", "-o", "noatime", dev, str(mount_point)])
    except VolumeUnavailable:
        sweep(name, backing_dir, cgroups=False, exact=True)
        raise
    found = find(name, mount_point, backing_dir)
    if found is None:
        raise VolumeUnavailable(f"{dev} over {file} is not mounted at {mount_point} after mount")
    return found


def apply_limits(volume: LoopVolume, cgroup: Cgroup, limits: IoLimits) -> IoLimits:
    """Set ``limits`` for ``cgroup`` on the volume's device; what the kernel reports back."""
    return cgroup.set_limits(volume.device, limits)


def read_limits(volume: LoopVolume, cgroup: Cgroup) -> IoLimits:
    """The limits in force for ``cgroup`` on the volume's device, read from the kernel."""
    return cgroup.limits().get(volume.device.id, IoLimits())


def remove(volume: LoopVolume) -> list[str]:
    """Unmount, detach and delete the volume; what was removed (nothing when it is gone)."""
    return sweep(volume.name, volume.backing_file.parent, cgroups=False, exact=True)


def sweep(
    prefix: str,
    backing_dir: Path = BACKING_DIR,
    cgroups: bool = True,
    exact: bool = False,
    release_s: float = 0.0,
) -> list[str]:
    """Remove what volumes and cgroups whose name starts with ``prefix`` left behind: their
    mounts, loop devices and backing files, and (with ``cgroups``) the cgroups
    ``checkpoint-storage-bench/<prefix>*`` with whatever still runs in them. With ``exact``
    only the name ``prefix`` itself. Returns one line per thing removed.

    A device whose file system a dying process still holds is unmounted lazily and detached
    by the kernel only when that process is gone (its backing file's RAM with it): with
    ``release_s``, wait that long for every such device to go.

    Raises:
        VolumeUnavailable: Something of ours could not be removed, or a device was still
            held after ``release_s``.
    """
    _check_name(prefix)
    ours = f"{PREFIX}{prefix}"

    def matches(file_name: str) -> bool:
        stem = file_name.removesuffix(".img")
        return stem == ours if exact else stem.startswith(ours) and file_name.endswith(".img")

    def held() -> dict[Path, BlockDevice]:
        return {
            f: d for f, d in loop_devices().items() if f.parent == backing_dir and matches(f.name)
        }

    removed = _sweep_once(held(), backing_dir, matches)
    if cgroups and not exact:
        removed += _sweep_cgroups(prefix)  # kills what may still hold a device
    deadline = time.monotonic() + release_s
    while left := held():
        if time.monotonic() >= deadline:
            if release_s:
                names = ", ".join(f"/dev/{d.name}" for d in left.values())
                raise VolumeUnavailable(
                    f"{names} still held after {release_s:g} s: the kernel detaches it when "
                    "the process using its file system exits"
                )
            break
        time.sleep(0.1)
    return removed


def _sweep_once(
    devices: dict[Path, BlockDevice], backing_dir: Path, matches: Callable[[str], bool]
) -> list[str]:
    """One pass: unmount and detach ``devices``, delete the matching backing files."""
    removed: list[str] = []
    for _file, device in devices.items():
        for point in _mount_points_of(device):
            try:
                _run(["umount", str(point)])
            except VolumeUnavailable:
                _run(["umount", "--lazy", str(point)])  # released once its last user goes
            removed.append(f"mount {point}")
        # On a device still held (a lazy unmount), the kernel detaches it when released.
        _run(["losetup", "--detach", f"/dev/{device.name}"])
        removed.append(f"loop device /dev/{device.name}")
    if backing_dir.is_dir():
        for file in sorted(backing_dir.iterdir()):
            if matches(file.name) and file.is_file():
                file.unlink(missing_ok=True)
                removed.append(f"backing file {file}")
    return removed


def _sweep_cgroups(prefix: str) -> list[str]:
    try:
        hierarchy = find_hierarchy()
    except ThrottleUnavailable:
        return []  # no controller: no cgroup of ours can exist
    parent = hierarchy.mount_point / PARENT
    removed = []
    for entry in sorted(parent.iterdir()) if parent.is_dir() else []:
        if entry.is_dir() and entry.name.startswith(prefix):
            killed = Cgroup(entry.name, hierarchy).remove()
            left = f" and {len(killed)} process(es) left in it" if killed else ""
            removed.append(f"cgroup {entry}{left}")
    return removed


def write_speed(
    directory: Path, size: int = 256 * MIB, attempts: int = 3, enough: float | None = None
) -> float:
    """The unthrottled sequential O_DIRECT write speed under ``directory`` in MB/s (1e6
    bytes): fio, 1 MiB blocks, queue depth 4, the best of ``attempts`` runs (a shared CPU
    only ever makes a run slower), stopping early once one reaches ``enough``.

    Raises:
        VolumeUnavailable: fio failed.
    """
    best = 0.0
    scratch = Path(tempfile.mkdtemp(prefix=".write-speed-", dir=directory))
    try:
        for _ in range(attempts):
            done = run_fio(["fio", "--name=speed", "--rw=write", "--bs=1M",
                            f"--size={size // MIB}M", "--iodepth=4", "--ioengine=libaio",
                            "--direct=1", "--end_fsync=1", f"--directory={scratch}",
                            "--output-format=json"])  # fmt: skip
            if done.returncode != 0:
                raise VolumeUnavailable(f"fio could not measure {directory}: {done.message}")
            job = extract_json(done.stdout)["jobs"][0]
            best = max(best, job["write"]["bw_bytes"] / 1e6)
            if enough is not None and best >= enough:
                break
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return best
