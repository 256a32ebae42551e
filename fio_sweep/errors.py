"""Errors of the fio sweep, each with the exit code the contract gives it."""

from __future__ import annotations

import signal


class FioSweepError(Exception):
    """Base class; ``exit_code`` is what the CLI exits with, ``temporary`` whether a retry
    later could succeed without changing anything."""

    exit_code = 1
    temporary = False


class SpecError(FioSweepError):
    """The sweep spec or an option is invalid (bad arguments)."""

    exit_code = 2


class UnsafeTargetError(FioSweepError):
    """The target is outside the mount, a raw device, or otherwise unsafe to write to."""

    exit_code = 3


class NoSpaceError(FioSweepError):
    """The target has less free space than the sweep needs."""

    exit_code = 3
    temporary = True


class FioMissingError(FioSweepError):
    """No usable fio binary."""

    exit_code = 4


class FioJobError(FioSweepError):
    """At least one fio job failed."""

    exit_code = 5


class Interrupted(FioSweepError):
    """SIGTERM/SIGINT arrived; exits with the shell convention 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum
