"""Errors of the fio sweep, each carrying the exit code the contract gives it.

:data:`EXIT_CODES` is the one table of the CLI's exit codes: ``--help`` prints it, and
docs/fio-sweep.md and docs/contracts.md list exactly it (tests/fio_sweep/test_exit_codes.py).
"""

from __future__ import annotations

import signal

from checkpoint_storage_bench.errors import EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, BenchError

EXIT_UNSAFE_TARGET = 3
EXIT_FIO_MISSING = 4
EXIT_FIO_FAILED = 5

EXIT_CODES: dict[int | str, str] = {
    EXIT_OK: "success",
    EXIT_UNEXPECTED: "unexpected error",
    EXIT_USAGE: "bad arguments or an invalid spec",
    EXIT_UNSAFE_TARGET: "unsafe target (outside the mount, on another filesystem, a raw "
    "device without the flag) or not enough free space",
    EXIT_FIO_MISSING: "fio missing or not runnable",
    EXIT_FIO_FAILED: "a fio job failed (the summary is still written)",
    "128+N": "stopped by signal N, fio's files removed (143: SIGTERM, as Polyaxon stops "
    "a run; 130: Ctrl-C)",
}


class FioSweepError(BenchError):
    """Base of the sweep's errors: one line on stderr, ``fio-sweep: error: ...``."""

    prog = "fio-sweep"


class SpecError(FioSweepError):
    """The sweep spec or an option is invalid (bad arguments)."""

    exit_code = EXIT_USAGE


class UnsafeTargetError(FioSweepError):
    """The target is outside the mount, a raw device, or otherwise unsafe to write to."""

    exit_code = EXIT_UNSAFE_TARGET


class NoSpaceError(FioSweepError):
    """The target has less free space than the sweep needs."""

    exit_code = EXIT_UNSAFE_TARGET


class FioMissingError(FioSweepError):
    """No usable fio binary."""

    exit_code = EXIT_FIO_MISSING


class FioJobError(FioSweepError):
    """At least one fio job failed."""

    exit_code = EXIT_FIO_FAILED


class Interrupted(FioSweepError):
    """SIGTERM/SIGINT arrived; exits with the shell convention 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum
