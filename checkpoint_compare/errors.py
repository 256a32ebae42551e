"""Errors of the verdict, each carrying the exit code it ends ``python -m checkpoint_compare``
with; :data:`EXIT_CODES` is the one table of them (``--help`` epilog, docs/compare.md and
docs/contracts.md list the same)."""

from __future__ import annotations

from checkpoint_storage_bench.errors import EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, BenchError

EXIT_NOT_COMPARABLE = 3

EXIT_CODES = {
    EXIT_OK: "verdict given (including 'no measurable difference')",
    EXIT_UNEXPECTED: "unexpected error, or the Polyaxon API unavailable after retries",
    EXIT_USAGE: "bad arguments or unusable input (pricing file, summary JSON, offline run)",
    EXIT_NOT_COMPARABLE: "runs missing, failed or not comparable",
}


class CompareError(BenchError):
    """Base of the verdict's errors."""

    prog = "checkpoint-compare"


class BadInput(CompareError):
    """A file or argument we were given cannot be used (unreadable JSON, bad pricing file)."""

    exit_code = EXIT_USAGE


class RunsMissing(CompareError):
    """A profile has no usable run: never recorded, unknown uuid, or its run failed."""

    exit_code = EXIT_NOT_COMPARABLE


class NotComparable(CompareError):
    """The runs differ in an input that must be held fixed (model, seed, format, ...)."""

    exit_code = EXIT_NOT_COMPARABLE


class SourceUnavailable(CompareError):
    """The Polyaxon API did not answer, even after the retries."""

    exit_code = EXIT_UNEXPECTED
