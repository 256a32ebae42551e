"""A part's own directory on the mounted claim, checked before anything is measured."""

from __future__ import annotations

import os
from pathlib import Path

from checkpoint_storage_bench.errors import BenchError


def ensure_writable_dir(path: Path, what: str, error: type[BenchError]) -> None:
    """Create ``path`` when missing (its parent must exist: a missing parent means the claim
    is not mounted) and prove that it is a writable directory.

    Args:
        path: The directory.
        what: How messages name it ("checkpoint dir", "data dir").
        error: The part's error (its class carries the exit code).

    Raises:
        error: The directory cannot be created, is not a directory, or is not writable.
    """
    if not path.exists():
        if not path.parent.is_dir():
            raise error(
                f"{what} {path} does not exist and neither does {path.parent} "
                "(is the claim mounted?)"
            )
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            raise error(f"cannot create {what} {path}: {exc.strerror}") from None
    if not path.is_dir():
        raise error(f"{what} {path} is not a directory")
    # A real probe: os.access() says yes to root even on a read-only mount.
    probe = path / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise error(f"{what} {path} is not writable: {exc.strerror}") from None
