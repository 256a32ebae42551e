"""Errors of the sandbox, each with the exit code ``python -m sandbox`` returns for it.

Every error is a :class:`checkpoint_storage_bench.errors.BenchError`: click prints
``sandbox: error: <message>`` and exits with the error's code, in one place. The table
below is the one list of the CLI's exit codes (its ``--help`` epilog is built from it).
"""

from __future__ import annotations

from checkpoint_storage_bench.errors import EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, BenchError

EXIT_CONFIG = 3
EXIT_SERVER_START = 4
EXIT_RUN_FAILED = 5
EXIT_UNAVAILABLE = 6
EXIT_FOLLOW_TIMEOUT = 7

EXIT_CODES = {
    EXIT_OK: "ok",
    EXIT_UNEXPECTED: "unexpected error",
    EXIT_USAGE: "bad arguments",
    EXIT_CONFIG: "bad sandbox configuration (a non-loopback host, a profiles or agent file), "
    "or a profiles file you named emulates volume classes where the kernel cannot throttle",
    EXIT_SERVER_START: "port taken, or the server or agent failed to start (its log tail is printed)",
    EXIT_RUN_FAILED: "a run or the pipeline failed, or a component was refused "
    "(the failed op's status message and log tail are printed)",
    EXIT_UNAVAILABLE: "no sandbox server answers, or it or the agent is not running",
    EXIT_FOLLOW_TIMEOUT: "a followed pipeline was not done within --timeout (it is stopped)",
}


class SandboxError(BenchError):
    """Base of every sandbox error."""

    prog = "sandbox"


class ConfigError(SandboxError):
    """A sandbox config file or option is invalid."""

    exit_code = EXIT_CONFIG


class PortInUseError(SandboxError):
    """The port asked for is already taken."""

    exit_code = EXIT_SERVER_START


class ServerStartError(SandboxError):
    """The server or the agent exited or never became ready."""

    exit_code = EXIT_SERVER_START


class RunFailedError(SandboxError):
    """A run (or the pipeline) ended in failed, stopped or upstream_failed."""

    exit_code = EXIT_RUN_FAILED


class RegisterError(SandboxError):
    """The server refused a component version, a project or a run."""

    exit_code = EXIT_RUN_FAILED


class ServerUnavailableError(SandboxError):
    """The server does not answer."""

    exit_code = EXIT_UNAVAILABLE


class FollowTimeoutError(SandboxError):
    """A followed pipeline was not done within its timeout (it was stopped)."""

    exit_code = EXIT_FOLLOW_TIMEOUT
