"""What ``python -m checkpoint_compare`` does once its arguments are parsed: load the runs,
group them by profile, build the verdict, print it, write the reports and log it."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from checkpoint_compare.config import CompareConfig
from checkpoint_compare.cost import load_pricing
from checkpoint_compare.grouping import group_by_profile
from checkpoint_compare.sources import load_runs
from checkpoint_compare.verdict import Verdict, build_verdict, op_outputs
from checkpoint_storage_bench.tracking import tracked_run

log = logging.getLogger("checkpoint_compare")


def judge(config: CompareConfig) -> Verdict:
    """Load, group, compare and price.

    Raises:
        CompareError: A subclass carrying the exit code (bad input, runs missing, ...).
    """
    pricing = load_pricing(config.pricing_path, config.gpu_hourly, config.volume_gib)
    records = load_runs(config.sources)
    groups, failed = group_by_profile(records, expected=config.expected)
    for run in failed:
        log.warning("run %s %s and is not used: %s", run.label, run.status, run.message)
    return build_verdict(
        groups, pricing, config.thresholds, baseline=config.baseline, failed_runs=failed
    )


def run(config: CompareConfig) -> Verdict:
    """Judge, then print the verdict, write the reports and log it as a Polyaxon run."""
    verdict = judge(config)
    from checkpoint_compare.report_json import dumps
    from checkpoint_compare.report_text import terminal

    click.echo(terminal(verdict), nl=False)
    written: list[Path] = []
    if config.json_path:
        config.json_path.parent.mkdir(parents=True, exist_ok=True)
        config.json_path.write_text(dumps(verdict))
        written.append(config.json_path)
    if config.html_path:
        from checkpoint_compare.report_html import NO_PLOTS, plots_available, to_html

        if not plots_available():
            click.echo(f"warning: {config.html_path}: {NO_PLOTS}", err=True)
        config.html_path.parent.mkdir(parents=True, exist_ok=True)
        config.html_path.write_text(to_html(verdict))
        written.append(config.html_path)
    with tracked_run("compare", tags=["compare"], enabled=config.track) as tracker:
        tracker.log_inputs(
            baseline=verdict.baseline,
            profiles=",".join(f.profile for f in verdict.profiles),
            compared_runs=",".join(f.runs.training.uuid for f in verdict.profiles),
        )
        tracker.log_outputs(**op_outputs(verdict))
        for path in written:
            tracker.log_artifact(path, name=f"compare_{path.suffix.lstrip('.')}")
    for path in written:
        click.echo(f"wrote {path}")
    return verdict
