"""Errors of the verdict step, each with the exit code the contract gives it."""

from __future__ import annotations


class CompareError(Exception):
    """Base class; ``exit_code`` is what the CLI exits with."""

    exit_code = 1
    temporary = False


class BadInput(CompareError):
    """A file or argument we were given cannot be used (unreadable JSON, bad pricing file)."""

    exit_code = 2


class RunsMissing(CompareError):
    """A profile has no usable run: never recorded, unknown uuid, or its run failed."""

    exit_code = 3


class NotComparable(CompareError):
    """The runs differ in an input that must be held fixed (model, seed, format, ...)."""

    exit_code = 3


class SourceUnavailable(CompareError):
    """The Polyaxon API did not answer; retrying later may work."""

    exit_code = 1
    temporary = True
