"""The hook's errors: each class carries the exit code the CLI returns for it.

They are :class:`checkpoint_storage_bench.errors.BenchError` subclasses, so click maps them
to the exit (``cli.py`` converts anything else once, in :func:`as_hook_error`). The exit
codes are listed once, in :data:`EXIT_CODES`: the ``--help`` epilog is made from it and
docs/storage-profile.md repeats it.

An answer of the API server is the shared object layer's error
(:class:`checkpoint_storage_bench.kube.KubeError`, here :class:`ApiError`, with
:class:`Forbidden`, :class:`NotFound`, :class:`Conflict`, :class:`Gone` and :class:`Invalid`
for the answers the hook judges): exit 1 with the server's message, where no caller judged it.

A temporary failure (throttling, a flaky API server) is a
:class:`checkpoint_storage_bench.retry.TemporaryError`, retried by the shared retry loop
and never shown as such; the overall ``--timeout`` is the shared
:class:`~checkpoint_storage_bench.retry.DeadlineExceeded` (exit 5).
"""

from __future__ import annotations

from datetime import datetime

from kubernetes.client.rest import ApiException

from checkpoint_storage_bench.errors import EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, BenchError
from checkpoint_storage_bench.kube import Conflict, Forbidden, Gone, Invalid, NotFound, api_error
from checkpoint_storage_bench.kube import KubeError as ApiError
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
        mapped = api_error(exc.status or 0, exc.body, exc.reason)
        if isinstance(mapped, ApiError):
            mapped.prog = PROG
            return mapped
        error = HookError(str(mapped))
    elif isinstance(exc, TemporaryError):
        error = HookError(str(exc))
    else:
        error = HookError(f"unexpected {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
