"""What ``python -m checkpoint_compare`` does once its arguments are parsed: load the runs,
group them by profile, build the verdict, print it, write the reports and log it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from checkpoint_compare.config import CompareConfig
from checkpoint_compare.cost import load_pricing
from checkpoint_compare.errors import CompareError
from checkpoint_compare.sources import ApiSource, Loaded, load_runs
from checkpoint_compare.verdict import Verdict, judge_runs, op_outputs
from checkpoint_storage_bench.contract import WORKLOAD_INPUT
from checkpoint_storage_bench.tracking import in_polyaxon_run, tracked_run

log = logging.getLogger("checkpoint_compare")


def judge(config: CompareConfig, loaded: Loaded | None = None) -> tuple[Verdict, Loaded]:
    """Load (unless given), group, compare, price and recommend: the one verdict, with the
    row of the workload the runs measured.

    Raises:
        CompareError: A subclass carrying the exit code (bad input, runs missing, ...).
    """
    pricing = load_pricing(
        config.prices.pricing_path, config.prices.gpu_hourly, config.prices.volume_gib
    )
    loaded = loaded or load_runs(config.sources)
    verdict, failed = judge_runs(
        loaded.records,
        pricing,
        config.thresholds,
        baseline=config.selection.baseline,
        budget=config.budget,
        expected=config.selection.expected,
        allow_resumed=config.selection.allow_resumed,
    )
    for run in failed:
        log.warning("run %s %s and is not used: %s", run.label, run.status, run.message)
    return verdict, loaded


def _write(path: Path, text: str) -> Path:
    """Write-then-rename: a reader never sees half a report, an old one is never lost to a
    failed write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    part.replace(path)
    return path


def _record_inputs(verdict: Verdict) -> tuple[list[str], dict[str, Any]]:
    """The compare run's tags and inputs. The workload is ``compared_workload``: an input
    named ``workload`` would make the compare run a data workload's run to the next
    verdict that loads the pipeline's runs."""
    return ["compare", f"{WORKLOAD_INPUT}:{verdict.workload}"], {
        "baseline": verdict.baseline,
        "profiles": ",".join(p.profile for p in verdict.profiles),
        "compared_runs": ",".join(r.uuid for p in verdict.profiles for r in p.runs),
        f"compared_{WORKLOAD_INPUT}": verdict.workload,
    }


def run(config: CompareConfig) -> Verdict:
    """Judge, then print the verdict, write the reports and log it as a Polyaxon run (its
    outputs, the reports as artifacts, the markdown as the run's readme and as the readme
    of the outermost pipeline the user started)."""
    from checkpoint_compare.report_html import NO_PLOTS, plots_available, render_html
    from checkpoint_compare.report_json import dumps
    from checkpoint_compare.report_markdown import render_markdown
    from checkpoint_compare.report_text import render_text

    verdict, loaded = judge(config)
    click.echo(render_text(verdict), nl=False)
    markdown = render_markdown(verdict)
    written: list[Path] = []
    if config.reports.json_path:
        written.append(_write(config.reports.json_path, dumps(verdict)))
    if config.reports.markdown_path:
        written.append(_write(config.reports.markdown_path, markdown))
    if config.reports.html_path:
        if not plots_available():
            click.echo(f"warning: {config.reports.html_path}: {NO_PLOTS}", err=True)
        written.append(_write(config.reports.html_path, render_html(verdict)))
    tags, inputs = _record_inputs(verdict)
    _record(config, loaded, tags, inputs, op_outputs(verdict), written, markdown)
    return verdict


def _record(
    config: CompareConfig,
    loaded: Loaded,
    tags: list[str],
    inputs: dict[str, Any],
    results: dict[str, Any],
    written: list[Path],
    markdown: str,
) -> None:
    """Log the verdict as a Polyaxon run (inputs, outputs, the reports as artifacts, the
    markdown as its readme and, for the runs of a pipeline on a server, the pipeline's),
    then say which files were written."""
    with tracked_run("compare", tags=tags, enabled=config.reports.track) as tracker:
        tracker.log_inputs(**inputs)
        tracker.log_outputs(**results)
        for path in written:
            tracker.log_artifact(path, name=f"compare_{path.suffix.lstrip('.')}")
        tracker.set_readme(markdown)
    if config.reports.track:
        _set_pipeline_readme(loaded, markdown)
    for path in written:
        click.echo(f"wrote {path}")


def readme_pipeline(loaded: Loaded) -> str | None:
    """The pipeline whose page shows the verdict: the outermost pipeline the user started.
    Inside the compare op it is found from the op's own run on the server (the op may get
    its runs by uuid, as the profiles pipeline's joins give them, so no pipeline was
    loaded); outside, the outermost ancestor of ``--pipeline``.

    Raises:
        CompareError: The server refused or did not answer.
    """
    if in_polyaxon_run():
        return (loaded.api or ApiSource()).outermost_pipeline()
    if loaded.pipeline and loaded.api:
        return loaded.api.topmost(loaded.pipeline)
    return None


def _set_pipeline_readme(loaded: Loaded, markdown: str) -> None:
    """Set the readme of the outermost pipeline; a failure is a warning (the verdict
    stands; only the pipeline's page lacks it), and so is a compare op of no pipeline."""
    try:
        pipeline = readme_pipeline(loaded)
        if pipeline is None:
            if in_polyaxon_run():
                click.echo(
                    "note: this compare run is no pipeline's operation: no pipeline readme set",
                    err=True,
                )
            return
        (loaded.api or ApiSource()).set_readme(pipeline, markdown)
        click.echo(f"the verdict is the readme of pipeline {pipeline}")
    except CompareError as exc:
        click.echo(f"warning: the pipeline's readme was not set: {exc}", err=True)
