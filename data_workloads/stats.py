"""Small statistics shared by the workloads: percentiles and block-read accounting."""

from __future__ import annotations

import math
import os
import resource
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


def device_read_bytes() -> int:
    """Bytes this process and its waited-for children (DataLoader workers) have read from a
    block device so far: what the page cache did not serve."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_inblock
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock
    return (own + children) * BLOCK


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its waited-for children so far: what
    the loader costs, whatever share of the cores it got on a shared machine."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def block_reads_counted(path: Path) -> bool:
    """Whether reads of ``path`` after dropping its cache show up as block reads (not on
    tmpfs, nor on some network or FUSE file systems): else the cache check cannot tell."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_inblock
        while os.read(fd, 1024**2):
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_inblock > before
    finally:
        os.close(fd)
