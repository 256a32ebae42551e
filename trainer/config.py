"""The trainer's configuration, validated once so the loop can trust it."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from checkpoint_storage_bench.units import parse_size
from trainer.errors import CheckpointDirError, ConfigError

FORMATS = ("raw", "torch")
DURABILITY = ("fsync", "none")
DEVICES = ("auto", "cpu", "cuda")
# Many ranks (issue 16): how the model is spread over torchrun's processes.
Parallel = Literal["none", "ddp", "fsdp"]
PARALLEL: tuple[str, ...] = get_args(Parallel)


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
        format: raw (our direct writer) or torch (``torch.save``, the reference).
        async_checkpoint: Write in the background; block only while staging.
        durability: fsync (file and directory) or none.
        parallel: none, or ddp / fsdp under torchrun (issue 16).
        checkpoint_timeout: Seconds a sharded checkpoint waits for the slowest rank.
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
    batch_size: int = 8
    seq_len: int = 64
    lr: float = 3e-4
    log_every: int = 10

    # -- many ranks (issue 16); used only under torchrun with more than one process
    parallel: Parallel = "none"
    """Under torchrun with several processes: ddp (replicated model, the checkpoint split
    across ranks) or fsdp (FSDP2 fully_shard, each rank writes its local shards); none for
    one process. A world of one process always runs the single-process path."""

    checkpoint_timeout: float = 600.0
    """Under torchrun: seconds rank 0 waits for every rank to report its checkpoint shard
    durable (and a rank for rank 0's answer); past it nothing is committed and the run
    fails (exit 7)."""

    def __post_init__(self) -> None:
        self.checkpoint_dir = Path(self.checkpoint_dir)
        for name in ("steps", "checkpoint_every", "batch_size", "seq_len", "log_every"):
            if getattr(self, name) <= 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}"
                )
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
        if self.parallel not in PARALLEL:
            raise ConfigError(
                f"unknown --parallel {self.parallel!r}; choose from {', '.join(PARALLEL)}"
            )
        if not self.checkpoint_timeout > 0:
            raise ConfigError(
                f"--checkpoint-timeout must be positive, got {self.checkpoint_timeout}"
            )

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
