"""The local cluster's errors, each with the exit code ``python -m localcluster`` returns.

Every error is a :class:`checkpoint_storage_bench.errors.BenchError`: click prints
``localcluster: error: <message>`` and exits with the error's code, in one place. The table
below is the one list of the CLI's exit codes (its ``--help`` epilog is built from it).
"""

from __future__ import annotations

from checkpoint_storage_bench.errors import EXIT_OK, EXIT_USAGE, BenchError

EXIT_FAILED = 1
EXIT_SETUP = 3

EXIT_CODES = {
    EXIT_OK: "done (status: every recorded process runs)",
    EXIT_FAILED: "the cluster failed: it did not start, left something behind, or is not running",
    EXIT_USAGE: "bad usage",
    EXIT_SETUP: "what the command needs is missing here (the build script, the binary cache)",
}


class LocalClusterError(BenchError):
    """Base of the local cluster's errors; the message says what failed."""

    prog = "localcluster"


class ClusterFailed(LocalClusterError):
    """A process did not start or become ready, or a node's sweep was refused."""

    exit_code = EXIT_FAILED


class SetupMissing(LocalClusterError):
    """What the command needs is not here (the build script, the binary cache)."""

    exit_code = EXIT_SETUP


class BadUsage(LocalClusterError):
    """Settings that contradict each other (click's own usage errors exit 2 too)."""

    exit_code = EXIT_USAGE
