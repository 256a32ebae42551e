"""Chunk checksums: which algorithm a manifest names, and the fastest implementation of it.

The algorithm is CRC32 (zlib's polynomial and values), named by every manifest's
``checksum`` field. Intel ISA-L's ``crc32`` (the ``isal`` package) computes it several
times faster than zlib (about 5-7 GB/s vs 0.9-2.3 GB/s on our 2-core build VM,
i.e. faster than the disk) and, like zlib, releases the GIL while it runs, so writer and
reader threads checksum in parallel with the training loop's Python thread. Where ``isal``
is not installed, zlib computes the same values, only slower.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

try:
    from isal import isal_zlib as _isal
except ImportError:  # the values are the same; only the speed differs
    _isal = None

CRC32 = "crc32"
DEFAULT = CRC32

Checksum = Callable[[memoryview], int]

_ALGORITHMS: dict[str, Checksum] = {CRC32: _isal.crc32 if _isal is not None else zlib.crc32}


def implementation(name: str) -> str:
    """Which library computes ``name`` here (for the benchmark's notes)."""
    if name == CRC32:
        return "isal" if _isal is not None else "zlib"
    return "unknown"


def get(name: str) -> Checksum:
    """The function computing checksum ``name`` over a buffer.

    Raises:
        ValueError: ``name`` is not an algorithm this build knows.
    """
    try:
        return _ALGORITHMS[name]
    except KeyError:
        raise ValueError(
            f"unknown checksum algorithm {name!r}; this build knows {', '.join(_ALGORITHMS)}"
        ) from None


def names() -> tuple[str, ...]:
    return tuple(_ALGORITHMS)
