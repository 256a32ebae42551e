"""``python -m fio_sweep``: a fio sweep on a mounted claim, logged to Polyaxon.

The options are generated from :class:`~fio_sweep.config.Config`'s fields (type, default,
docstring), parsed into it → :func:`~fio_sweep.commands.prepare` and
:func:`~fio_sweep.commands.run_sweep`. Errors are :class:`~fio_sweep.errors.FioSweepError`
subclasses that carry their exit code; click prints them (``fio-sweep: error: ...``) and
exits with it. The exit codes are :data:`fio_sweep.errors.EXIT_CODES`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from checkpoint_storage_bench.config_cli import config_options
from checkpoint_storage_bench.errors import exit_codes_help
from checkpoint_storage_bench.interrupts import signals_raise
from checkpoint_storage_bench.tracking import tracked_run
from fio_sweep.commands import prepare, run_sweep
from fio_sweep.config import Config
from fio_sweep.errors import EXIT_CODES, Interrupted


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]}, epilog=exit_codes_help(EXIT_CODES)
)
@config_options(Config)
def main(**settings: Any) -> None:
    """Run a fio sweep on a mounted claim and log each case with Polyaxon tracking."""
    config = Config(**settings)
    with signals_raise(Interrupted):
        plan = prepare(config)
        tags = ["fio-sweep", f"spec:{Path(plan.spec.source).stem}"]
        with tracked_run("fio-sweep", tags=tags, enabled=config.track) as tracker:
            summary = run_sweep(plan, config, tracker)
    print_results(summary)


def print_results(summary: dict) -> None:
    """The result table on stdout: one line per case, then the overhead check."""
    for case in summary["cases"]:
        click.echo(
            f"{case['name']}: {case['bw_mbps']:.1f} MB/s, {case['iops']:.0f} IOPS, "
            f"p99 {case['lat_p99_us'] or 0:.0f} us"
            + (f"  [{'; '.join(case['notes'])}]" if case["notes"] else "")
        )
    overhead = summary["overhead"]
    if overhead and overhead["overhead_pct"] is not None:
        flag = "  ABOVE 10%: investigate" if overhead["flagged"] else ""
        click.echo(
            f"overhead vs {overhead['reference_dir']}: {overhead['overhead_pct']:+.1f}%{flag}"
        )
    elif overhead and overhead.get("note"):
        click.echo(f"overhead vs {overhead['reference_dir']}: {overhead['note']}")
