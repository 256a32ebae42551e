"""The trainer's errors: each carries its exit code; click maps them to the exit.

:data:`EXIT_CODES` is the one table of the trainer's exit codes: ``--help`` prints it, and
docs/contracts.md lists the same.
"""

from __future__ import annotations

from checkpoint_storage_bench.errors import EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, BenchError

EXIT_CHECKPOINT_DIR = 3
EXIT_STORAGE_FULL = 4
EXIT_UPLOAD = 5
EXIT_CORRUPT = 6
EXIT_RANK_FAILED = 7

EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_UNEXPECTED: "unexpected error",
    EXIT_USAGE: "bad arguments",
    EXIT_CHECKPOINT_DIR: "checkpoint dir missing or not writable, access refused mid-run "
    "(EACCES/EPERM/EROFS), holding another run's checkpoints, or in use by another trainer",
    EXIT_STORAGE_FULL: "no space left on the checkpoint volume (ENOSPC/EDQUOT)",
    EXIT_UPLOAD: "upload to the artifact store failed after retries (local checkpoint kept)",
    EXIT_CORRUPT: "no usable checkpoint to resume, or corrupt data",
    EXIT_RANK_FAILED: "under torchrun: another rank failed, died or timed out during a "
    "checkpoint; nothing committed",
}


class TrainerError(BenchError):
    """Base class of the trainer's errors; the message is one line."""

    prog = "trainer"


class ConfigError(TrainerError):
    """Invalid options (non-positive steps, unknown device, bad size, …)."""

    exit_code = EXIT_USAGE


class CheckpointDirError(TrainerError):
    """The checkpoint directory (or the mount it belongs in) is missing, not writable, or
    refuses access mid-run."""

    exit_code = EXIT_CHECKPOINT_DIR


class StorageFullError(TrainerError):
    """The volume ran out of space (ENOSPC/EDQUOT) while writing a checkpoint."""

    exit_code = EXIT_STORAGE_FULL


class UploadError(TrainerError):
    """Uploading to the artifact store failed after every retry; the local copy is kept."""

    exit_code = EXIT_UPLOAD


class CheckpointCorruptError(TrainerError):
    """A checkpoint is incomplete or fails its checksum, or none is usable for resuming."""

    exit_code = EXIT_CORRUPT


# ---------------------------------------------------------------- many ranks (torchrun)


class RankFailedError(TrainerError):
    """Under torchrun: another rank failed, died or timed out during a checkpoint, so
    nothing was committed (the rank that failed exits with its own code)."""

    exit_code = EXIT_RANK_FAILED


class WorldSizeError(ConfigError):
    """Resuming a checkpoint written by another number of ranks (or another --parallel
    mode): shards are not resharded (exit 2, like any option that does not fit)."""
