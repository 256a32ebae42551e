"""Errors of the sandbox, each with the exit code its CLI returns.

Permanent errors need the user to change something (a port, a file); temporary ones may pass
on a retry. Exit codes: 0 ok, 1 unexpected, 2 bad arguments, 3 bad sandbox configuration,
4 port taken or the server failed to start, 5 a run or the pipeline failed,
6 the server is unreachable / not running, 7 a pipeline did not finish in time (it is stopped).
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base of every sandbox error."""

    exit_code = 1


class PermanentError(SandboxError):
    """Retrying will not help."""


class TemporaryError(SandboxError):
    """May pass on a retry."""


class ConfigError(PermanentError):
    """A sandbox config file or option is invalid."""

    exit_code = 3


class PortInUseError(PermanentError):
    """The port asked for is already taken."""

    exit_code = 4


class ServerStartError(PermanentError):
    """The server process exited or never became healthy."""

    exit_code = 4


class RunFailedError(PermanentError):
    """A run (or the pipeline) ended in failed, stopped or upstream_failed."""

    exit_code = 5


class ServerUnavailableError(TemporaryError):
    """The server does not answer."""

    exit_code = 6


class FollowTimeoutError(TemporaryError):
    """A followed pipeline was not done within its timeout (it was stopped)."""

    exit_code = 7
