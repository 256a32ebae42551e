"""The hook's errors: each class carries the exit code the CLI returns for it.

They are :class:`checkpoint_storage_bench.errors.BenchError` subclasses, so click maps them
to the exit (``cli.py`` converts anything else once, in :func:`as_hook_error`). The exit
codes are listed once, in :data:`EXIT_CODES`: the ``--help`` epilog is made from it and
docs/storage-profile.md repeats it.

A temporary failure (throttling, a flaky API server) is a
:class:`checkpoint_storage_bench.retry.TemporaryError`, retried by the shared retry loop
and never shown as such; the overall ``--timeout`` is the shared
:class:`~checkpoint_storage_bench.retry.DeadlineExceeded` (exit 5).
"""

from __future__ import annotations

import json
from datetime import datetime

from kubernetes.client.rest import ApiException

from checkpoint_storage_bench.errors import EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, BenchError
from checkpoint_storage_bench.retry import EXIT_DEADLINE, DeadlineExceeded, TemporaryError

__all__ = [
    "ApiError",
    "Conflict",
    "EXIT_CODES",
    "EXIT_DEADLINE",
    "EXIT_INFEASIBLE",
    "EXIT_OK",
    "EXIT_PREFLIGHT",
    "EXIT_UNEXPECTED",
    "EXIT_USAGE",
    "Forbidden",
    "Gone",
    "Invalid",
    "NotFound",
    "OUTCOMES",
    "api_error",
    "api_message",
    "BudgetExceeded",
    "PROG",
    "DeadlineExceeded",
    "HookError",
    "Infeasible",
    "PlanRefused",
    "PreflightRefused",
    "UnexpectedState",
    "as_hook_error",
]

PROG = "storage-profile"
EXIT_PREFLIGHT = 3
EXIT_INFEASIBLE = 4

EXIT_CODES = {
    EXIT_OK: 'settled (including "already on that class" and an unbound claim created with '
    "that class), a dry run passed preflight, a lease released or renewed, or a plan fits now",
    EXIT_UNEXPECTED: "unexpected error (unknown modify status, claim deleted or changed "
    "by others, …)",
    EXIT_USAGE: "bad arguments",
    EXIT_PREFLIGHT: "preflight refused (claim or class missing, claim not bound, driver "
    "mismatch, modification budget used up, claim held by another holder's lease (renew: "
    "the lease is no longer this holder's), a run of the switch's pipeline failed "
    "(--stop-after-failure), API server refused the patch; plan: the run's modifications do not fit the provider's "
    "window now, named with when they would) — nothing was changed",
    EXIT_INFEASIBLE: "infeasible (Infeasible status, Pending beyond --pending-grace, "
    "provider failed)",
    EXIT_DEADLINE: "deadline (--timeout) passed",
}
"""The one table of the hook's exit codes (``--help`` and docs/storage-profile.md)."""

OUTCOMES = {
    EXIT_PREFLIGHT: "refused",
    EXIT_INFEASIBLE: "infeasible",
    EXIT_DEADLINE: "deadline",
    EXIT_UNEXPECTED: "error",
}
"""The report's ``outcome`` for a failed switch, by exit code."""


class HookError(BenchError):
    """Base class of every error the hook reports with a one-line message (exit 1)."""

    exit_code = EXIT_UNEXPECTED
    prog = PROG


class PreflightRefused(HookError):
    """A check before any write failed (claim or class missing, unbound, wrong driver, …)."""

    exit_code = EXIT_PREFLIGHT


class BudgetExceeded(PreflightRefused):
    """One more switch would exceed the provider's modification limit (exit 3).

    Attributes:
        next_at: When the next switch is allowed, if known (the stricter of two sources
            names the later time).
    """

    def __init__(self, message: str, next_at: datetime | None = None) -> None:
        super().__init__(message)
        self.next_at = next_at


class PlanRefused(PreflightRefused):
    """``plan``: the run's modifications do not fit the provider's window now (the message
    names when they would, or never), or the run cannot start on its first profile (exit 3).
    ``plan`` only reads, so nothing was changed."""


class Infeasible(HookError):
    """The modification cannot complete (Infeasible, Pending beyond grace, provider failed)."""

    exit_code = EXIT_INFEASIBLE


class UnexpectedState(HookError):
    """Something the hook does not know how to judge (an unknown modify status, a deleted claim)."""

    exit_code = EXIT_UNEXPECTED


class ApiError(HookError):
    """An answer of the API server that no caller judged: exit 1, one line with the
    server's message (not the client's dump with its headers).

    The subclasses name the answers the hook judges; :func:`api_error` is the one place a
    status becomes a name.

    Attributes:
        status: The HTTP status.
        server_message: The ``message`` of the Kubernetes Status body, else the HTTP
            reason (what callers quote in their own message).
        body: The raw response body.
    """

    status = 0

    def __init__(self, status: int, server_message: str, body: str | None = None) -> None:
        super().__init__(f"the API server answered {status}: {server_message}")
        self.status = status
        self.server_message = server_message
        self.body = body


class Forbidden(ApiError):
    """403: RBAC (or an admission quota) refused the request."""


class NotFound(ApiError):
    """404: the object does not exist."""


class Conflict(ApiError):
    """409: the object changed since it was read, or already exists."""


class Gone(ApiError):
    """410: a watch's resourceVersion is too old; list again."""


class Invalid(ApiError):
    """422: the API server's validation refused the object."""


API_ERRORS: dict[int, type[ApiError]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
}


def api_error(exc: ApiException) -> ApiError | TemporaryError:
    """The client's exception as what it means to the hook: throttling and server errors
    are temporary (retried, honouring ``Retry-After``); any other answer is an
    :class:`ApiError`, named by :data:`API_ERRORS` where the hook judges it."""
    if exc.status == 429 or exc.status >= 500:
        return TemporaryError(
            f"API server answered {exc.status}: {api_message(exc)}", _retry_after(exc)
        )
    error = API_ERRORS.get(exc.status, ApiError)(exc.status, api_message(exc), exc.body)
    error.__cause__ = exc
    return error


def _retry_after(exc: ApiException) -> float | None:
    """The ``Retry-After`` header of a response, in seconds, if it has a numeric one."""
    value = (exc.headers or {}).get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def api_message(exc: ApiException) -> str:
    """The ``message`` of a Kubernetes Status body, else the HTTP reason."""
    try:
        return json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{exc.status} {exc.reason}"


def as_hook_error(exc: BaseException) -> BenchError:
    """Any failure as the error the CLI exits with.

    A :class:`BenchError` keeps its exit code (a shared one, like the deadline, is shown
    under this CLI's name); retries that ran out keep their message; anything else is
    "unexpected" (exit 1).
    """
    if isinstance(exc, BenchError):
        exc.prog = PROG
        return exc
    if isinstance(exc, ApiException):
        mapped = api_error(exc)
        if isinstance(mapped, ApiError):
            mapped.prog = PROG
            return mapped
        error = HookError(f"the API server answered {exc.status}: {api_message(exc)}")
    elif isinstance(exc, TemporaryError):
        error = HookError(str(exc))
    else:
        error = HookError(f"unexpected {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
