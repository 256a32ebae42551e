"""The data workloads' errors: each carries its exit code; click maps them to the exit.

:data:`EXIT_CODES` is the one table of the part's exit codes: ``--help`` prints it, and
docs/data-workloads.md and docs/contracts.md list the same.
"""

from __future__ import annotations

import signal

from checkpoint_storage_bench.errors import EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, BenchError

EXIT_DATA_DIR = 3
EXIT_DATASET_MISSING = 4
EXIT_DATASET_MISMATCH = 5
EXIT_DATASET_CORRUPT = 6
EXIT_STORAGE_FULL = 7

EXIT_CODES: dict[int | str, str] = {
    EXIT_OK: "success",
    EXIT_UNEXPECTED: "unexpected error",
    EXIT_USAGE: "bad arguments",
    EXIT_DATA_DIR: "data dir missing (is the claim mounted?), not writable, or holding "
    "files that are not a generated dataset",
    EXIT_DATASET_MISSING: "no dataset in the data dir and --no-generate",
    EXIT_DATASET_MISMATCH: "the dataset there was generated with another format, seed or size",
    EXIT_DATASET_CORRUPT: "the dataset is truncated or fails its checksums",
    EXIT_STORAGE_FULL: "no space left on the volume (ENOSPC/EDQUOT)",
    "128+N": "stopped by signal N, the scratch on the claim removed (143: SIGTERM, as "
    "Polyaxon stops a run; 130: Ctrl-C)",
}


class WorkloadError(BenchError):
    """Base of the part's errors: one line on stderr, ``data-workloads: error: ...``."""

    prog = "data-workloads"


class ConfigError(WorkloadError):
    """An option is invalid."""

    exit_code = EXIT_USAGE


class DataDirError(WorkloadError):
    """The data directory (or the mount it belongs in) is missing or unusable."""

    exit_code = EXIT_DATA_DIR


class DatasetMissingError(WorkloadError):
    """No dataset where one was expected, and generating one was not allowed."""

    exit_code = EXIT_DATASET_MISSING


class DatasetMismatchError(WorkloadError):
    """The dataset on the claim is another one (format, seed, size, record size)."""

    exit_code = EXIT_DATASET_MISMATCH


class DatasetCorruptError(WorkloadError):
    """Files of the dataset are missing, truncated, or fail their checksums."""

    exit_code = EXIT_DATASET_CORRUPT


class StorageFullError(WorkloadError):
    """The volume ran out of space while writing."""

    exit_code = EXIT_STORAGE_FULL


class Interrupted(WorkloadError):
    """SIGTERM/SIGINT arrived; exits with the shell convention 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum
