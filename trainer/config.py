"""The trainer's configuration, validated once so the loop can trust it."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from checkpoint_storage_bench.units import parse_size
from trainer.errors import CheckpointDirError, ConfigError

FORMATS = ("raw", "torch", "dcp", "safetensors")
DURABILITY = ("fsync", "none")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class TrainConfig:
    """Everything a training run needs; ``__post_init__`` rejects bad values.

    Attributes:
        checkpoint_dir: Directory on the mounted claim; must exist and be writable.
        steps: Training steps to run in total (a resumed run continues up to this).
        checkpoint_every: Save after every this many steps.
        keep: Complete checkpoints to retain; older ones go once a newer one is durable.
        resume: Continue from the newest complete, verified checkpoint.
        upload_to: fsspec URL of the artifact store, or None.
        storage_profile: The record label for the volume profile (does not change it).
        model_size: fp32 parameter bytes; the checkpoint is about three times this.
        seed: Dataset and initialisation seed.
        device: auto, cpu or cuda.
        format: raw (our direct writer), or a reference: torch (``torch.save``), dcp
            (``torch.distributed.checkpoint``, ``async_save`` with ``--async``) or
            safetensors (``save_file`` + fsync).
        async_checkpoint: Write in the background; block only while staging.
        durability: fsync (file and directory) or none.
        io_streams: Files (and parallel writers) a checkpoint is spread over, for volumes
            that cap the throughput of one stream.
        no_overlap: raw: copy the whole state, then write it (the strict stage split);
            by default chunk k is written while chunk k+1 is being copied.
    """

    checkpoint_dir: Path
    steps: int = 200
    checkpoint_every: int = 50
    keep: int = 2
    resume: bool = False
    upload_to: str | None = None
    storage_profile: str = "unlabelled"
    model_size: int | str = "16MiB"
    seed: int = 0
    device: str = "auto"
    format: str = "raw"
    async_checkpoint: bool = False
    durability: str = "fsync"
    io_streams: int = 1
    no_overlap: bool = False
    batch_size: int = 8
    seq_len: int = 64
    lr: float = 3e-4
    log_every: int = 10

    def __post_init__(self) -> None:
        self.checkpoint_dir = Path(self.checkpoint_dir)
        for name in (
            "steps",
            "checkpoint_every",
            "batch_size",
            "seq_len",
            "log_every",
            "io_streams",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}"
                )
        if self.io_streams > 64:
            raise ConfigError(f"--io-streams must be at most 64, got {self.io_streams}")
        if self.keep < 1:
            raise ConfigError(f"--keep must be at least 1, got {self.keep}")
        if not self.lr > 0:
            raise ConfigError(f"--lr must be positive, got {self.lr}")
        try:
            self.model_size = parse_size(self.model_size)
        except ValueError as exc:
            raise ConfigError(f"--model-size: {exc}") from None
        if self.model_size < 64 * 1024:
            raise ConfigError(f"--model-size must be at least 64KiB, got {self.model_size} bytes")
        for name, allowed in (("device", DEVICES), ("format", FORMATS), ("durability", DURABILITY)):
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"unknown --{name} {getattr(self, name)!r}; choose from {', '.join(allowed)}"
                )
        if not self.storage_profile:
            raise ConfigError("--storage-profile must not be empty")

    def check_checkpoint_dir(self) -> None:
        """Fail early, before any training, when the checkpoint directory is unusable."""
        path = self.checkpoint_dir
        if not path.exists():
            # A run's own directory is created inside the mount; a missing mount is an error.
            if not path.parent.is_dir():
                raise CheckpointDirError(
                    f"checkpoint dir {path} does not exist and neither does {path.parent} "
                    "(is the claim mounted?)"
                )
            try:
                path.mkdir(exist_ok=True)
            except OSError as exc:
                raise CheckpointDirError(
                    f"cannot create checkpoint dir {path}: {exc.strerror}"
                ) from None
        if not path.is_dir():
            raise CheckpointDirError(f"checkpoint dir {path} is not a directory")
        # A real probe: os.access() says yes to root even on a read-only mount.
        probe = path / f".write-probe-{os.getpid()}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise CheckpointDirError(
                f"checkpoint dir {path} is not writable: {exc.strerror}"
            ) from None

    def record(self) -> dict[str, Any]:
        """The config as plain JSON values (stored in every checkpoint)."""
        data = asdict(self)
        data["checkpoint_dir"] = str(self.checkpoint_dir)
        return data
