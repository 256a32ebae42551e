"""``python -m fio_sweep``: a fio sweep on a mounted claim, logged to Polyaxon.

Exit codes: 0 success, 1 unexpected error, 2 bad arguments or spec, 3 unsafe target or not
enough free space, 4 fio missing, 5 a fio job failed, 128+N interrupted by signal N
(files removed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from checkpoint_storage_bench.tracking import tracked_run
from fio_sweep.errors import FioSweepError
from fio_sweep.interrupts import signals_raise_interrupted
from fio_sweep.spec import shipped_specs
from fio_sweep.sweep import Config, prepare, run_sweep


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
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
    "--reference-dir",
    type=click.Path(path_type=Path),
    help="Run the spec's overhead case here too (e.g. the node's local disk) and report "
    "how much slower the mount is.",
)
@click.option("--summary-json", type=click.Path(path_type=Path), help="Write the summary here.")
@click.option(
    "--allow-raw-device", is_flag=True, help="Allow --mount to be a block device (destructive)."
)
@click.option("--no-track", is_flag=True, help="Do not log a Polyaxon run.")
def main(
    mount: Path,
    target: Path | None,
    spec: str | None,
    size_scale: float,
    runtime: int | None,
    reference_dir: Path | None,
    summary_json: Path | None,
    allow_raw_device: bool,
    no_track: bool,
) -> None:
    """Run a fio sweep on a mounted claim and log each case with Polyaxon tracking."""
    try:
        config = Config(
            mount=mount,
            target=target,
            spec=spec,
            size_scale=size_scale,
            runtime=runtime,
            reference_dir=reference_dir,
            summary_json=summary_json,
            allow_raw_device=allow_raw_device,
        )
        with signals_raise_interrupted():
            plan = prepare(config)
            tags = ["fio-sweep", f"spec:{Path(plan.spec.source).stem}"]
            with tracked_run("fio-sweep", tags=tags, enabled=not no_track) as tracker:
                summary = run_sweep(plan, config, tracker)
    except FioSweepError as exc:
        click.echo(f"fio-sweep: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    for case in summary["cases"]:
        click.echo(
            f"{case['name']}: {case['bw_mbps']:.1f} MB/s, {case['iops']:.0f} IOPS, "
            f"p99 {case['lat_p99_us'] or 0:.0f} us"
            + (f"  [{'; '.join(case['notes'])}]" if case["notes"] else "")
        )
    if summary["overhead"] and summary["overhead"]["overhead_pct"] is not None:
        o = summary["overhead"]
        flag = "  ABOVE 10%: investigate" if o["flagged"] else ""
        click.echo(f"overhead vs {o['reference_dir']}: {o['overhead_pct']:+.1f}%{flag}")
    elif summary["overhead"] and summary["overhead"].get("note"):
        click.echo(
            f"overhead vs {summary['overhead']['reference_dir']}: {summary['overhead']['note']}"
        )


if __name__ == "__main__":
    main()
