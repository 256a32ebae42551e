"""The sweep's settings, in one place: :class:`Config`.

Each field is typed, documented by the string right below it (the option's ``--help`` text)
and defaulted here alone; ``python -m fio_sweep``'s options are generated from these fields
(:func:`checkpoint_storage_bench.config_cli.config_options`), as the trainer's and the data
workloads' are. ``__post_init__`` refuses bad values (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from checkpoint_storage_bench.config_cli import cli
from fio_sweep.spec import MAX_WRITERS, WRITERS_CASE, check_scale, shipped_specs, writers_case


def _shipped() -> dict[str, Any]:
    return {"shipped": ", ".join(sorted(shipped_specs()))}


def _writers_case() -> dict[str, Any]:
    return {"case": repr(WRITERS_CASE)}


@dataclass(kw_only=True)
class Config:
    """The sweep's options, as the CLI takes them (see docs/fio-sweep.md)."""

    mount: Path
    """Where the claim is mounted; fio writes only strictly inside it."""

    target: Path | None = None
    """Directory inside the mount for fio's files [default: MOUNT/fio-sweep]."""

    spec: str | None = field(default=None, metadata=cli(help_values=_shipped))
    """Sweep spec: a YAML path or a shipped name ({shipped}) [default: default]."""

    size_scale: float = 1.0
    """Multiply every case's size (whole blocks, at least one)."""

    runtime: int | None = None
    """Cap every case at this many seconds."""

    writers: int | None = field(
        default=None,
        metadata=cli(click_type=click.IntRange(1, MAX_WRITERS), help_values=_writers_case),
    )
    """Add the case {case}: N parallel checkpoint writers (numjobs=N, one file each,
    O_DIRECT, fsync at the end, 2 GiB in all before --size-scale), to match a job whose N
    ranks write their shards at once."""

    reference_dir: Path | None = None
    """Run the spec's overhead case here too (e.g. the node's local disk) and report how much
    slower the mount is."""

    summary_json: Path | None = None
    """Write the summary here."""

    allow_raw_device: bool = field(default=False, metadata=cli(flag="--allow-raw-device"))
    """Allow --mount to be a block device (destructive)."""

    track: bool = True
    """Log each case with Polyaxon tracking (offline outside a run)."""

    def __post_init__(self) -> None:
        check_scale(self.size_scale, self.runtime)
        if self.writers is not None:
            writers_case(self.writers)  # validates the count
