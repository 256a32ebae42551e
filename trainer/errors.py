"""The trainer's errors: each maps to one exit code, documented in the README."""

from __future__ import annotations


class TrainerError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with; the message is one line."""

    exit_code = 1


class ConfigError(TrainerError):
    """Invalid options (non-positive steps, unknown device, bad size, …)."""

    exit_code = 2


class CheckpointDirError(TrainerError):
    """The checkpoint directory (or the mount it belongs in) is missing, or not writable."""

    exit_code = 3


class StorageFullError(TrainerError):
    """The volume ran out of space (ENOSPC/EDQUOT) while writing a checkpoint."""

    exit_code = 4


class UploadError(TrainerError):
    """Uploading to the artifact store failed after every retry; the local copy is kept."""

    exit_code = 5


class CheckpointCorruptError(TrainerError):
    """A checkpoint is incomplete or fails its checksum, or none is usable for ``--resume``."""

    exit_code = 6


# ------------------------------------------------------- many ranks (torchrun), issue 16


class RankFailedError(TrainerError):
    """Under torchrun: another rank failed, died or timed out during a checkpoint, so
    nothing was committed (the rank that failed exits with its own code)."""

    exit_code = 7


class WorldSizeError(ConfigError):
    """Resuming a checkpoint written by another number of ranks (or another --parallel
    mode): shards are not resharded (exit 2, like any option that does not fit)."""
