"""The trainer's settings, in one place: :class:`TrainConfig`.

Each field is typed (a ``Literal`` is a closed set of choices), documented by the string
right below it, and validated in ``__post_init__``. Everything else is derived from it:
the click options of ``python -m trainer`` (:func:`checkpoint_storage_bench.config_cli.config_options`, help text
= the field's docstring), the record stored in every checkpoint, and the bundle test that
fails when the component's inputs drift from these defaults and choices
(tests/bundle/test_trainer_config.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from checkpoint_storage_bench.claim_dir import ensure_writable_dir
from checkpoint_storage_bench.config_cli import cli, flag
from checkpoint_storage_bench.contract import PARALLEL_MODES
from checkpoint_storage_bench.units import parse_size
from trainer.errors import CheckpointDirError, ConfigError
from trainer.shape import smallest_model_bytes

Device = Literal["auto", "cpu", "cuda"]
Format = Literal["raw", "torch", "dcp", "safetensors"]
Durability = Literal["fsync", "none"]
Resume = Literal["never", "auto", "always"]
# How the model is spread over torchrun's processes, in the contract's names: the run
# logs the mode as an input that the verdict reads.
Parallel = Literal[PARALLEL_MODES]  # type: ignore[valid-type]

DEVICES: tuple[str, ...] = get_args(Device)
FORMATS: tuple[str, ...] = get_args(Format)
DURABILITY: tuple[str, ...] = get_args(Durability)
RESUME: tuple[str, ...] = get_args(Resume)
PARALLEL: tuple[str, ...] = get_args(Parallel)

RUN_ARTIFACTS_TARGETS = {"run-artifacts": False, "run-artifacts-store": True}
"""``--upload-to`` names for the tracked run's own outputs → whether the upload goes straight
to the artifacts store (True) or into the local outputs directory Polyaxon syncs (False)."""

MAX_IO_STREAMS = 64
MAX_CHECKPOINT_TIMEOUT_S = 7 * 24 * 3600
"""A week: a bound far above any checkpoint's wait, and one the process group's timeout
(a ``timedelta``, then milliseconds) can hold; ``inf`` would overflow it on every rank."""
MAX_TOKENS_PER_STEP = 2**28
"""Sequences x tokens of one step: its logits alone (256 fp32 values a token) would take
256 GiB, more than any one accelerator holds; far beyond, sizes overflow torch's tensors."""
SEED_RANGE = (-(2**63), 2**64 - 1)
"""The seeds torch's generators take."""


@dataclass
class TrainConfig:
    """Everything a training run needs; ``__post_init__`` rejects bad values (exit 2)."""

    checkpoint_dir: Path
    """Directory on the mounted claim for this run's checkpoints. Created when missing, but
    its parent must exist: a missing parent means the claim is not mounted."""

    steps: int = 200
    """Training steps in total; a resumed run continues up to this step."""

    checkpoint_every: int = 50
    """Save a checkpoint every N steps."""

    keep: int = 2
    """Complete, verified checkpoints to keep; older ones are deleted only once a newer one
    is durable."""

    resume: Resume = field(default="never", metadata=cli(flag_value="always"))
    """never: refuse a directory that holds checkpoints; always (also a bare --resume):
    continue from the newest complete, verified checkpoint; auto: continue from this
    Polyaxon run's own newest verified checkpoint (a retried or resumed run keeps its uuid),
    start fresh in an empty directory, refuse another run's checkpoints."""

    upload_to: str | None = field(default=None, metadata=cli(metavar="URL"))
    """Also upload every checkpoint, timed as the upload stage: an fsspec URL (file://,
    s3://, gs://, memory://); run-artifacts: into this Polyaxon run's outputs, which
    Polyaxon syncs to its artifacts store; run-artifacts-store: straight into the same place
    in the artifacts store."""

    storage_profile: str = field(default="unlabelled", metadata=cli(envvar="STORAGE_PROFILE"))
    """Record label of the volume profile (the claim's VolumeAttributesClass); it does not
    change the volume."""

    summary_json: Path | None = None
    """Write the run's figures and per-checkpoint timeline to this JSON file."""

    model_size: int | str = field(default="16MiB", metadata=cli(click_type=str, metavar="SIZE"))
    """fp32 parameter bytes (e.g. 2MiB, 1GiB), an upper bound the model fits (fewer layers
    below about 280KB); a checkpoint is about three times this."""

    seed: int = 0
    """Seed of the model initialisation and the synthetic dataset."""

    device: Device = "auto"
    """auto (CUDA when available), cpu or cuda."""

    format: Format = "raw"
    """raw: the direct, checksummed writer; references: torch (torch.save), dcp
    (torch.distributed.checkpoint; async_save with --async), safetensors (save_file + fsync)."""

    async_checkpoint: bool = field(default=False, metadata=cli(flag="--async/--sync"))
    """Write checkpoints in the background; training is blocked only while the state is
    staged."""

    durability: Durability = "fsync"
    """fsync: a checkpoint counts once its files and directory are fsynced; none: skip the
    fsyncs."""

    io_streams: int = 1
    """Files (and parallel writers) a checkpoint is spread over, 1 to 64, for volumes that
    cap the throughput of one stream."""

    no_overlap: bool = field(default=False, metadata=cli(flag="--no-overlap/--overlap"))
    """raw: copy the whole state, then write it (the strict stage split); by default chunk k
    is written while chunk k+1 is copied, so serialize + write can exceed the pause."""

    batch_size: int = 8
    """Sequences per training step."""

    seq_len: int = 64
    """Tokens per sequence of the synthetic dataset."""

    lr: float = 3e-4
    """AdamW learning rate."""

    log_every: int = 10
    """Record the loss every N steps."""

    track: bool = True
    """Record the run with Polyaxon tracking (the current run inside Polyaxon, else an
    offline run)."""

    restore_check: bool = False
    """At the end of the run, load the newest checkpoint back and verify it, timed as the
    restore figure (a resumed run measures its restore anyway)."""

    # -- many ranks: used only under torchrun with more than one process
    parallel: Parallel = "none"
    """Under torchrun with several processes: ddp (replicated model, the checkpoint split
    across ranks) or fsdp (FSDP2 fully_shard, each rank writes its local shards); none for
    one process. A world of one process always runs the single-process path."""

    checkpoint_timeout: float = 600.0
    """Under torchrun: seconds rank 0 waits for every rank to report its checkpoint shard
    durable (and a rank for rank 0's answer); past it nothing is committed and the run
    fails (exit 7). At most 604800 (a week); the process group counts whole
    milliseconds, so less than one is one."""

    def __post_init__(self) -> None:
        self.checkpoint_dir = Path(self.checkpoint_dir)
        if self.summary_json is not None:
            self.summary_json = Path(self.summary_json)
        for name in (
            "steps",
            "checkpoint_every",
            "batch_size",
            "seq_len",
            "log_every",
            "io_streams",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{flag(name)} must be positive, got {getattr(self, name)}")
        if self.batch_size * self.seq_len > MAX_TOKENS_PER_STEP:
            raise ConfigError(
                f"--batch-size {self.batch_size} x --seq-len {self.seq_len} tokens a step is more "
                f"than {MAX_TOKENS_PER_STEP:,}: its logits alone would not fit any accelerator"
            )
        if not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ConfigError(
                f"--seed must be between {SEED_RANGE[0]} and {SEED_RANGE[1]} (torch's "
                f"generators), got {self.seed}"
            )
        if self.io_streams > MAX_IO_STREAMS:
            raise ConfigError(
                f"--io-streams must be at most {MAX_IO_STREAMS}, got {self.io_streams}"
            )
        if self.keep < 1:
            raise ConfigError(f"--keep must be at least 1, got {self.keep}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"--lr must be a positive number, got {self.lr}")
        try:
            self.model_size = parse_size(self.model_size)
        except ValueError as exc:
            raise ConfigError(f"--model-size: {exc}") from None
        if self.model_size < (smallest := smallest_model_bytes(self.seq_len)):
            raise ConfigError(
                f"--model-size must be at least {smallest} bytes at --seq-len {self.seq_len} "
                f"(the smallest model: one layer of width 32), got {self.model_size} bytes"
            )
        for name, allowed in (
            ("device", DEVICES),
            ("format", FORMATS),
            ("durability", DURABILITY),
            ("resume", RESUME),
            ("parallel", PARALLEL),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"unknown {flag(name)} {getattr(self, name)!r}; choose from {', '.join(allowed)}"
                )
        if not self.storage_profile:
            raise ConfigError("--storage-profile must not be empty")
        if not 0 < self.checkpoint_timeout <= MAX_CHECKPOINT_TIMEOUT_S:
            raise ConfigError(
                f"--checkpoint-timeout must be positive and at most {MAX_CHECKPOINT_TIMEOUT_S} "
                f"seconds (a week), got {self.checkpoint_timeout}"
            )

    def check_checkpoint_dir(self) -> None:
        """Fail early, before any training, when the checkpoint directory is unusable."""
        ensure_writable_dir(self.checkpoint_dir, "checkpoint dir", CheckpointDirError)

    def record(self) -> dict[str, Any]:
        """The config as plain JSON values (stored in every checkpoint)."""
        data = asdict(self)
        data["checkpoint_dir"] = str(self.checkpoint_dir)
        data["summary_json"] = None if self.summary_json is None else str(self.summary_json)
        return data
