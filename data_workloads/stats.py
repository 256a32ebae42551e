"""Small statistics shared by the workloads: percentiles, and the CPU and block-read
accounting of this process and of the DataLoader's workers."""

from __future__ import annotations

import ctypes
import math
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

BLOCK = 512
"""``ru_inblock`` counts 512-byte blocks read from a device."""


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear between the closest ranks; None when empty.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    >>> percentile([5.0], 99)
    5.0
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: list[float]) -> float | None:
    return percentile(values, 50)


_LIBC = ctypes.CDLL(None, use_errno=True)


def write_back(fd: int) -> None:
    """Write back the dirty pages of the file system that holds ``fd`` (``syncfs``), so
    that ``posix_fadvise(DONTNEED)`` can drop them: it drops clean pages only, and the
    pages of a dataset just copied in (or written by a generator that was killed before
    its fsync) are dirty for up to half a minute. One ``syncfs`` per drop, not an fsync per
    file: every fsync of a clean file still sends the device a cache flush.

    Raises:
        OSError: The write-back failed (an I/O error of the volume).
    """
    syncfs = getattr(_LIBC, "syncfs", None)
    if syncfs is None:  # not glibc: this file's pages at least
        os.fsync(fd)
    elif syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")


def block_reads_counted(path: Path) -> bool:
    """Whether reads of ``path`` after dropping its cache show up as block reads (not on
    tmpfs, nor on some network or FUSE file systems): else the cache check cannot tell."""
    fd = os.open(path, os.O_RDONLY)
    try:
        write_back(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_inblock
        while os.read(fd, 1024**2):
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_inblock > before
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Usage:
    """What a set of processes has cost so far: CPU seconds (user + system, and of that
    system) and bytes read from a block device (None: not counted here)."""

    cpu_s: float
    sys_s: float
    read_bytes: int | None

    def __sub__(self, other: Usage) -> Usage:
        read = (
            None
            if self.read_bytes is None or other.read_bytes is None
            else self.read_bytes - other.read_bytes
        )
        return Usage(self.cpu_s - other.cpu_s, self.sys_s - other.sys_s, read)

    def __add__(self, other: Usage) -> Usage:
        read = (
            None
            if self.read_bytes is None or other.read_bytes is None
            else self.read_bytes + other.read_bytes
        )
        return Usage(self.cpu_s + other.cpu_s, self.sys_s + other.sys_s, read)


NOTHING = Usage(0.0, 0.0, 0)


def own_usage() -> Usage:
    """This process (all its threads), from ``getrusage``; not its children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return Usage(own.ru_utime + own.ru_stime, own.ru_stime, own.ru_inblock * BLOCK)


def process_usage(pid: int) -> Usage:
    """Another live process of ours (a persistent DataLoader worker), read while it runs:
    its CPU clock (``clock_gettime`` of the process's CPU-time clock: user + system of all
    its threads, to the nanosecond, where ``/proc/<pid>/stat`` counts 10 ms ticks), the
    system share from ``/proc/<pid>/stat``, and ``read_bytes`` of ``/proc/<pid>/io`` (bytes
    it had read from a block device; None where the kernel does not count them).

    Raises:
        ProcessLookupError: The process is gone.
    """
    # The process's CPU clock id, as glibc's clock_getcpuclockid builds it (CPUCLOCK_SCHED).
    clock = (~pid << 3) | 2
    try:
        cpu = time.clock_gettime(clock)
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError as exc:
        raise ProcessLookupError(f"process {pid} is gone: {exc}") from None
    sys_s = int(fields[12]) / os.sysconf("SC_CLK_TCK")  # stime: the 15th field
    read: int | None = None
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            for line in f:
                if line.startswith(b"read_bytes:"):
                    read = int(line.split()[1])
    except OSError:  # no task I/O accounting in this kernel, or not ours to read
        read = None
    return Usage(cpu, min(sys_s, cpu), read)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _stat_field(path: str, name: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def memory_available() -> int | None:
    """Bytes of memory this process may still take: the least of what the kernel says is
    available (``MemAvailable``) and what is left under the container's limit (cgroup v2
    ``memory.max``, or v1 ``memory.limit_in_bytes``; the page cache it counts is
    reclaimable, so not used); None where neither can be read."""
    candidates = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    candidates.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for base, limit, usage, cache in (
        ("/sys/fs/cgroup", "memory.max", "memory.current", "file"),
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "cache"),
    ):
        cap, used = _read_int(f"{base}/{limit}"), _read_int(f"{base}/{usage}")
        if cap is None or used is None or cap >= 1 << 60:  # v1's "no limit" is about 2**63
            continue
        used -= _stat_field(f"{base}/memory.stat", cache)
        candidates.append(max(0, cap - max(0, used)))
    return min(candidates) if candidates else None
