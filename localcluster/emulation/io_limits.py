"""Block-I/O limits through a cgroup: how the sandbox emulates a volume class on a local disk.

A VolumeAttributesClass provisions IOPS and throughput (EBS gp3: ``iops``, ``throughput`` in
MiB/s). The kernel's block-I/O throttle caps the same two figures for the processes of one
cgroup on one block device: cgroup v1 ``blkio.throttle.{read,write}_{bps,iops}_device``,
cgroup v2 ``io.max`` (``rbps wbps riops wiops``). This module finds the block device that
holds a directory, creates a cgroup, writes the limits, reads them back from the kernel, and
removes the cgroup again (its processes first).

What it is not (docs/sandbox.md): a token bucket per 100 ms slice, not EBS's burst credits or
its latency; read and write are capped separately (EBS caps their sum); only I/O the kernel
attributes to the cgroup is capped, and cgroup v1 does not attribute buffered writeback
(page-cache flushes run in the kernel's own threads), so the I/O must be ``O_DIRECT``; and
it only slows a device down, never beyond what the device itself can do.

Everything raises :class:`ThrottleUnavailable` with the reason when the kernel cannot
throttle here (no controller, not allowed, no block device behind the path).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024
PARENT = "checkpoint-storage-bench"
"""Every cgroup this project creates lives under this one, in the hierarchy's root."""

_V1_FILES = {
    "read_bps": "blkio.throttle.read_bps_device",
    "write_bps": "blkio.throttle.write_bps_device",
    "read_iops": "blkio.throttle.read_iops_device",
    "write_iops": "blkio.throttle.write_iops_device",
}
_V2_KEYS = {"read_bps": "rbps", "write_bps": "wbps", "read_iops": "riops", "write_iops": "wiops"}
# The class parameters are read as the node's CSI driver reads them (its Go regexp and
# strconv; the table both check: localcluster/throttle_vectors.json): ASCII digits only, the
# throughput's blanks ASCII ones (Go's \s), the iops trimmed of Unicode white space (Go's
# strings.TrimSpace) and within a signed 64-bit integer.
_THROUGHPUT = re.compile(r"[ \t\n\f\r]*([0-9]+(?:\.[0-9]+)?)[ \t\n\f\r]*(Mi)?[ \t\n\f\r]*")
_IOPS = re.compile(r"[+-]?[0-9]+")
_WHITE_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_INT64_MAX = 2**63 - 1


def io_max_line(device: str, limits: IoLimits) -> str:
    """The cgroup v2 ``io.max`` line that sets ``limits`` on ``device`` (``max``: none).

    >>> io_max_line("7:0", IoLimits(write_bps=131072000))
    '7:0 rbps=max wbps=131072000 riops=max wiops=max\\n'
    """
    values = limits.as_dict()
    pairs = " ".join(f"{_V2_KEYS[k]}={'max' if v is None else v}" for k, v in values.items())
    return f"{device} {pairs}\n"


def blkio_lines(device: str, limits: IoLimits) -> dict[str, str]:
    """The cgroup v1 ``blkio.throttle.*`` file → the line that sets ``limits`` on ``device``
    (0 removes a limit)."""
    values = limits.as_dict()
    return {name: f"{device} {values[key] or 0}\n" for key, name in _V1_FILES.items()}


class ThrottleUnavailable(Exception):
    """The kernel cannot throttle block I/O for this path here; the message says why."""


@dataclass(frozen=True)
class IoLimits:
    """Block-I/O limits of one cgroup on one device; None is "no limit".

    >>> IoLimits.from_class_parameters({"type": "gp3", "iops": "3000", "throughput": "125"})
    IoLimits(read_bps=131072000, write_bps=131072000, read_iops=3000, write_iops=3000)
    >>> IoLimits.from_class_parameters({"iops": "6000", "throughput": "290Mi"}).describe()
    '290 MiB/s and 6000 IOPS, each for reads and for writes'
    """

    read_bps: int | None = None
    write_bps: int | None = None
    read_iops: int | None = None
    write_iops: int | None = None

    @classmethod
    def from_class_parameters(cls, parameters: Mapping[str, object]) -> IoLimits:
        """The limits a VolumeAttributesClass provisions: ``throughput`` in MiB/s (a bare
        number as on EBS, or with GKE's ``Mi`` suffix) and ``iops``.

        Raises:
            ValueError: Neither is there, or one is not a positive number.
        """
        bps = iops = None
        if parameters.get("throughput") is not None:
            match = _THROUGHPUT.fullmatch(str(parameters["throughput"]))
            # Beyond int64 bytes/s no cgroup takes it (and the driver's conversion would wrap).
            if not match or not 0 < float(match.group(1)) * MIB < _INT64_MAX:
                raise ValueError(f"throughput {parameters['throughput']!r} is not MiB/s")
            bps = int(float(match.group(1)) * MIB)
        if parameters.get("iops") is not None:
            figure = str(parameters["iops"]).strip(_WHITE_SPACE)
            iops = int(figure) if _IOPS.fullmatch(figure) else 0
            if not 0 < iops <= _INT64_MAX:
                raise ValueError(f"iops {parameters['iops']!r} is not a positive integer")
        if bps is None and iops is None:
            raise ValueError("the class has neither a throughput nor an iops parameter")
        return cls(read_bps=bps, write_bps=bps, read_iops=iops, write_iops=iops)

    @property
    def unlimited(self) -> bool:
        return all(v is None for v in self.as_dict().values())

    def as_dict(self) -> dict[str, int | None]:
        return {
            "read_bps": self.read_bps,
            "write_bps": self.write_bps,
            "read_iops": self.read_iops,
            "write_iops": self.write_iops,
        }

    def describe(self) -> str:
        """One line a person reads.

        >>> IoLimits().describe()
        'no limit'
        >>> IoLimits(write_bps=131072000).describe()
        'writes 125 MiB/s'
        """
        if self.unlimited:
            return "no limit"
        if self.read_bps == self.write_bps and self.read_iops == self.write_iops:
            parts = []
            if self.write_bps is not None:
                parts.append(f"{self.write_bps / MIB:g} MiB/s")
            if self.write_iops is not None:
                parts.append(f"{self.write_iops} IOPS")
            return " and ".join(parts) + ", each for reads and for writes"
        out = []
        for name, value in self.as_dict().items():
            if value is not None:
                kind, unit = name.split("_")
                figure = f"{value / MIB:g} MiB/s" if unit == "bps" else f"{value} IOPS"
                out.append(f"{kind}s {figure}")
        return ", ".join(out)


# --------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class BlockDevice:
    """The whole block device the kernel throttles (``major:minor`` and its name)."""

    major: int
    minor: int
    name: str

    @property
    def id(self) -> str:
        return f"{self.major}:{self.minor}"


@dataclass(frozen=True)
class _Mount:
    major: int
    minor: int
    mount_point: str
    fstype: str
    source: str
    super_options: str


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(mountinfo: Path) -> list[_Mount]:
    mounts = []
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        try:
            sep = fields.index("-")
            major, minor = (int(x) for x in fields[2].split(":"))
        except ValueError:
            continue
        mounts.append(
            _Mount(
                major=major,
                minor=minor,
                mount_point=_unescape(fields[4]),
                fstype=fields[sep + 1],
                source=_unescape(fields[sep + 2]),
                super_options=fields[sep + 3] if len(fields) > sep + 3 else "",
            )
        )
    return mounts


def read_mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[_Mount]:
    """Every mount the kernel lists: its device, mount point, type, source and options."""
    return _mounts(mountinfo)


def _mount_of(path: Path, dev: int, mounts: Iterable[_Mount]) -> _Mount | None:
    """The mount that holds ``path``: the longest mount point above it with its device."""
    best = None
    text = str(path)
    for m in mounts:
        inside = text == m.mount_point or text.startswith(m.mount_point.rstrip("/") + "/")
        same = (m.major, m.minor) == (os.major(dev), os.minor(dev))
        if inside and same and (best is None or len(m.mount_point) >= len(best.mount_point)):
            best = m
    return best


def _whole_disk(major: int, minor: int, sys_block: Path) -> BlockDevice | None:
    """The device itself, or the disk a partition belongs to (the throttle is per disk)."""
    entry = sys_block / f"{major}:{minor}"
    if not entry.exists():
        return None
    real = entry.resolve()
    if (real / "partition").exists():
        real = real.parent
        major, minor = (int(x) for x in (real / "dev").read_text().split(":"))
    return BlockDevice(major, minor, real.name)


def block_device(
    path: Path,
    mountinfo: Path = Path("/proc/self/mountinfo"),
    sys_block: Path = Path("/sys/dev/block"),
) -> BlockDevice:
    """The block device whose I/O limits apply to files written under ``path`` (or, while
    ``path`` does not exist yet, under its nearest existing parent).

    A partition resolves to its disk (the kernel throttles per disk; device-mapper and
    virtio disks are disks of their own). A file system without a block device of its own
    (``st_dev`` major 0) is looked up in ``mountinfo``: overlay resolves through its
    ``upperdir`` (where writes land), btrfs through its source device; tmpfs, NFS, FUSE
    and the like have no block device to throttle.

    Raises:
        ThrottleUnavailable: No block device holds ``path``.
    """
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent  # not made yet: it will be made on its parent's file system
    seen: set[Path] = set()
    while True:
        try:
            dev = os.stat(path).st_dev
        except OSError as exc:
            raise ThrottleUnavailable(f"cannot stat {path}: {exc.strerror}") from exc
        found = _whole_disk(os.major(dev), os.minor(dev), sys_block)
        if found:
            return found
        try:
            mount = _mount_of(path, dev, _mounts(mountinfo))
        except OSError as exc:
            raise ThrottleUnavailable(f"cannot read {mountinfo}: {exc.strerror}") from exc
        if mount is None:
            raise ThrottleUnavailable(
                f"{path} is on device {os.major(dev)}:{os.minor(dev)}, which is neither a block "
                f"device nor a mount listed in {mountinfo}"
            )
        options = dict((o.split("=", 1) + [""])[:2] for o in mount.super_options.split(",") if o)
        if mount.fstype == "overlay" and options.get("upperdir"):
            upper = Path(options["upperdir"])
            if upper in seen:
                break
            seen.add(upper)
            path = upper  # the overlay's writes land in its upper layer
            continue
        if mount.source.startswith("/dev/"):
            try:
                rdev = os.stat(mount.source).st_rdev
            except OSError:
                rdev = 0
            found = _whole_disk(os.major(rdev), os.minor(rdev), sys_block) if rdev else None
            if found:
                return found
        raise ThrottleUnavailable(
            f"{path} is on {mount.fstype} ({mount.source} at {mount.mount_point}): no block "
            "device the kernel could throttle"
        )
    raise ThrottleUnavailable(f"{path}: overlay layers loop back on themselves")


# --------------------------------------------------------------------------- cgroups


@dataclass(frozen=True)
class Hierarchy:
    """The cgroup hierarchy with the block-I/O controller: v1 ``blkio`` or v2 ``io``."""

    version: int
    mount_point: Path

    def files(self, cgroup: Path) -> list[Path]:
        if self.version == 1:
            return [cgroup / name for name in _V1_FILES.values()]
        return [cgroup / "io.max"]


def find_hierarchy(mountinfo: Path = Path("/proc/self/mountinfo")) -> Hierarchy:
    """Where the block-I/O controller is mounted.

    cgroup v1's ``blkio`` comes first: on a hybrid host (v1 controllers plus an empty v2
    tree) it is the one that holds the controller.

    Raises:
        ThrottleUnavailable: Neither a v1 ``blkio`` with the throttle files nor a v2 tree
            with ``io`` among its controllers.
    """
    try:
        mounts = _mounts(mountinfo)
    except OSError as exc:
        raise ThrottleUnavailable(f"cannot read {mountinfo}: {exc.strerror}") from exc
    for m in mounts:
        if m.fstype == "cgroup" and "blkio" in m.super_options.split(","):
            point = Path(m.mount_point)
            if (point / _V1_FILES["write_bps"]).exists():
                return Hierarchy(1, point)
    for m in mounts:
        if m.fstype == "cgroup2":
            point = Path(m.mount_point)
            try:
                controllers = (point / "cgroup.controllers").read_text().split()
            except OSError:
                continue
            if "io" in controllers:
                return Hierarchy(2, point)
    raise ThrottleUnavailable(
        "no block-I/O controller: neither a cgroup v1 blkio hierarchy with the throttle files "
        "nor a cgroup v2 tree with the io controller is mounted"
    )


@dataclass(frozen=True)
class Cgroup:
    """One cgroup under :data:`PARENT` in the block-I/O hierarchy.

    Attributes:
        name: Its name below :data:`PARENT` (one path component).
        hierarchy: Where the controller is mounted.
    """

    name: str
    hierarchy: Hierarchy

    @classmethod
    def find(cls, name: str) -> Cgroup:
        """The cgroup ``name`` in this machine's block-I/O hierarchy (created or not).

        Raises:
            ThrottleUnavailable: No controller, or this process may not create cgroups.
        """
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"cgroup name {name!r} is not one path component")
        hierarchy = find_hierarchy()
        if not os.access(hierarchy.mount_point, os.W_OK):
            raise ThrottleUnavailable(
                f"may not create cgroups under {hierarchy.mount_point} (setting block-I/O "
                "limits needs root)"
            )
        return cls(name, hierarchy)

    @property
    def path(self) -> Path:
        return self.hierarchy.mount_point / PARENT / self.name

    @property
    def procs_file(self) -> Path:
        """Write a pid here to move that process (and its future children) into the cgroup."""
        return self.path / "cgroup.procs"

    def exists(self) -> bool:
        return self.path.is_dir()

    def create(self) -> None:
        """Create the cgroup (and :data:`PARENT`); on v2, enable ``io`` for their children."""
        parent = self.path.parent
        if self.hierarchy.version == 2:
            # A v2 controller works in a cgroup only when its parent enables it for its
            # children; the root and PARENT hold no processes, so both may.
            _enable_io(self.hierarchy.mount_point)
            parent.mkdir(exist_ok=True)
            _enable_io(parent)
        else:
            parent.mkdir(exist_ok=True)
        self.path.mkdir(exist_ok=True)

    def set_limits(self, device: BlockDevice, limits: IoLimits) -> IoLimits:
        """Replace every limit of the cgroup with ``limits`` on ``device``; return what the
        kernel reports in force afterwards (other devices' limits are cleared)."""
        self.create()
        for other in self.limits():
            if other != device.id:
                self._write(other, IoLimits())
        self._write(device.id, limits)
        return self.limits().get(device.id, IoLimits())

    def clear(self) -> None:
        """Remove every limit (the cgroup stays)."""
        for dev in self.limits():
            self._write(dev, IoLimits())

    def limits(self) -> dict[str, IoLimits]:
        """The limits in force, read back from the kernel: ``major:minor`` → limits."""
        if not self.exists():
            return {}
        found: dict[str, dict[str, int | None]] = {}
        if self.hierarchy.version == 1:
            for key, name in _V1_FILES.items():
                for line in (self.path / name).read_text().splitlines():
                    dev, _, value = line.partition(" ")
                    if value.strip() and int(value) > 0:
                        found.setdefault(dev, {})[key] = int(value)
        else:
            for line in (self.path / "io.max").read_text().splitlines():
                dev, *pairs = line.split()
                for pair in pairs:
                    key, _, value = pair.partition("=")
                    name = next((k for k, v in _V2_KEYS.items() if v == key), None)
                    if name and value != "max":
                        found.setdefault(dev, {})[name] = int(value)
        return {dev: IoLimits(**values) for dev, values in found.items()}

    def _write(self, device: str, limits: IoLimits) -> None:
        try:
            if self.hierarchy.version == 1:
                for name, line in blkio_lines(device, limits).items():
                    (self.path / name).write_text(line)
            else:
                (self.path / "io.max").write_text(io_max_line(device, limits))
        except OSError as exc:
            raise ThrottleUnavailable(
                f"the kernel refused block-I/O limits for device {device} in {self.path}: "
                f"{exc.strerror}"
            ) from exc

    def pids(self) -> list[int]:
        """The processes in the cgroup now."""
        try:
            return [int(p) for p in self.procs_file.read_text().split()]
        except FileNotFoundError:
            return []

    def remove(self, timeout: float = 10.0) -> list[int]:
        """Kill what is left in the cgroup, then remove it (and :data:`PARENT` when empty).

        Only processes this project put there can be in it (the sandbox agent moves a run
        into it right after the fork), so whatever is left is a run that outlived its
        agent. Returns the pids it had to kill.

        Raises:
            ThrottleUnavailable: The cgroup could not be emptied within ``timeout``.
        """
        killed: list[int] = []
        deadline = time.monotonic() + timeout
        while self.exists():
            pids = [p for p in self.pids() if p != os.getpid()]
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise ThrottleUnavailable(f"cannot remove cgroup {self.path}: {exc}") from exc
                time.sleep(0.05)
        try:
            self.path.parent.rmdir()
        except OSError:
            pass  # other sandboxes' cgroups are still in it, or it is gone
        return sorted(set(killed))


def _enable_io(cgroup: Path) -> None:
    control = cgroup / "cgroup.subtree_control"
    if "io" not in control.read_text().split():
        try:
            control.write_text("+io\n")
        except OSError as exc:
            raise ThrottleUnavailable(
                f"cannot enable the io controller in {control}: {exc.strerror}"
            ) from exc


def probe(path: Path, name: str) -> tuple[Cgroup, BlockDevice]:
    """Whether the kernel can throttle writes under ``path`` in cgroup ``name``: the cgroup
    (not created) and the device, or :class:`ThrottleUnavailable` with the reason."""
    return Cgroup.find(name), block_device(path)


JOIN_SCRIPT = 'echo $$ > "$0" || { echo "cannot join the cgroup of $0" >&2; exit 126; }; exec "$@"'
"""``sh -c JOIN_SCRIPT PROCS_FILE ARGV...`` moves the shell into the cgroup, then execs ARGV
in its place: the command and every child it forks run in the cgroup from their first
instruction (a pid written by the parent after the fork would race the child's first I/O,
and ``preexec_fn`` is unsafe in a threaded parent). The command's arguments are passed as
arguments, never through the script."""


def in_cgroup(argv: list[str], cgroup: Cgroup) -> list[str]:
    """``argv`` wrapped so that it runs inside ``cgroup`` (see :data:`JOIN_SCRIPT`).

    >>> hierarchy = Hierarchy(1, Path("/sys/fs/cgroup/blkio"))
    >>> in_cgroup(["fio", "--name=x"], Cgroup("claim-1", hierarchy))[3:]
    ['/sys/fs/cgroup/blkio/checkpoint-storage-bench/claim-1/cgroup.procs', 'fio', '--name=x']
    """
    return ["/bin/sh", "-c", JOIN_SCRIPT, str(cgroup.procs_file), *argv]
