"""``python -m fio_sweep``: a fio sweep on a mounted claim, logged to Polyaxon.

Parse the options → :class:`~fio_sweep.commands.Config` → :func:`~fio_sweep.commands.prepare`
and :func:`~fio_sweep.commands.run_sweep`. Errors are :class:`~fio_sweep.errors.FioSweepError`
subclasses that carry their exit code; click prints them (``fio-sweep: error: ...``) and
exits with it. The exit codes are :data:`fio_sweep.errors.EXIT_CODES`.
"""

from __future__ import annotations

from pathlib import Path

import click

from checkpoint_storage_bench.errors import exit_codes_help
from checkpoint_storage_bench.interrupts import signals_raise
from checkpoint_storage_bench.tracking import tracked_run
from fio_sweep.commands import Config, prepare, run_sweep
from fio_sweep.errors import EXIT_CODES, Interrupted
from fio_sweep.spec import MAX_WRITERS, WRITERS_CASE, shipped_specs


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]}, epilog=exit_codes_help(EXIT_CODES)
)
@click.option(
    "--mount",
    required=True,
    type=click.Path(path_type=Path),
    help="Where the claim is mounted; fio writes only strictly inside it.",
)
@click.option(
    "--target",
    type=click.Path(path_type=Path),
    help="Directory inside the mount for fio's files [default: MOUNT/fio-sweep].",
)
@click.option(
    "--spec",
    help=f"Sweep spec: a YAML path or a shipped name ({', '.join(sorted(shipped_specs()))}) "
    "[default: default].",
)
@click.option(
    "--size-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Multiply every case's size (whole blocks, at least one).",
)
@click.option("--runtime", type=int, help="Cap every case at this many seconds.")
@click.option(
    "--writers",
    type=click.IntRange(1, MAX_WRITERS),
    help=f"Add the case {WRITERS_CASE!r}: N parallel checkpoint writers (numjobs=N, one file "
    "each, O_DIRECT, fsync at the end, 2 GiB in all before --size-scale), to match a "
    "job whose N ranks write their shards at once.",
)
@click.option(
    "--reference-dir",
    type=click.Path(path_type=Path),
    help="Run the spec's overhead case here too (e.g. the node's local disk) and report "
    "how much slower the mount is.",
)
@click.option("--summary-json", type=click.Path(path_type=Path), help="Write the summary here.")
@click.option(
    "--allow-raw-device", is_flag=True, help="Allow --mount to be a block device (destructive)."
)
@click.option(
    "--track/--no-track",
    default=True,
    show_default=True,
    help="Log each case with Polyaxon tracking (offline outside a run).",
)
def main(
    mount: Path,
    target: Path | None,
    spec: str | None,
    size_scale: float,
    runtime: int | None,
    writers: int | None,
    reference_dir: Path | None,
    summary_json: Path | None,
    allow_raw_device: bool,
    track: bool,
) -> None:
    """Run a fio sweep on a mounted claim and log each case with Polyaxon tracking."""
    config = Config(
        mount=mount,
        target=target,
        spec=spec,
        size_scale=size_scale,
        runtime=runtime,
        reference_dir=reference_dir,
        summary_json=summary_json,
        allow_raw_device=allow_raw_device,
        writers=writers,
    )
    with signals_raise(Interrupted):
        plan = prepare(config)
        tags = ["fio-sweep", f"spec:{Path(plan.spec.source).stem}"]
        with tracked_run("fio-sweep", tags=tags, enabled=track) as tracker:
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
