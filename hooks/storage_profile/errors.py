"""The hook's errors: each carries the exit code the CLI returns for it.

Permanent errors end the hook at once. Temporary ones (throttling, a flaky API server)
are retried with capped backoff: a single API call gives up after its attempts
(:class:`TemporaryApiError`, exit 1), the wait retries until the overall deadline
(:class:`DeadlineExceeded`, exit 5).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_PREFLIGHT = 3
EXIT_INFEASIBLE = 4
EXIT_DEADLINE = 5


class HookError(Exception):
    """Base class of every error the hook reports with a one-line message."""

    exit_code = EXIT_UNEXPECTED
    temporary = False


class PreflightRefused(HookError):
    """A check before any write failed (claim or class missing, unbound, wrong driver, …)."""

    exit_code = EXIT_PREFLIGHT


class Infeasible(HookError):
    """The modification cannot complete (Infeasible, Pending beyond grace, provider failed)."""

    exit_code = EXIT_INFEASIBLE


class DeadlineExceeded(HookError):
    """The overall ``--timeout`` passed before the claim (or the provider) settled."""

    exit_code = EXIT_DEADLINE


class UnexpectedState(HookError):
    """Something the hook does not know how to judge (an unknown modify status, a deleted claim)."""

    exit_code = EXIT_UNEXPECTED


class TemporaryApiError(HookError):
    """The API answered 429/5xx or the connection failed; worth retrying.

    Attributes:
        retry_after: Seconds the server asked us to wait (``Retry-After``), if it said.
    """

    temporary = True

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
