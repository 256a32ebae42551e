"""Helpers of the data-workload tests: tiny dataset options, the CLI in-process."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from data_workloads.cli import main

# A few hundred KiB: a handful of shards or files, generated in well under a second.
TINY = ["--dataset-size", "256KiB", "--record-size", "4KiB", "--shard-size", "64KiB"]


def run_cli(*args: str | Path) -> Result:
    """``python -m data_workloads ARGS`` in-process; the exit code is click's, as in a shell."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
