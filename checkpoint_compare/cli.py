"""``python -m checkpoint_compare``: the verdict step of the pipeline, and a local tool."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click

from checkpoint_compare.cost import DEFAULT_PRICING, load_pricing
from checkpoint_compare.errors import CompareError, RunsMissing
from checkpoint_compare.loading import ApiSource, group_by_profile, load_offline, load_summary
from checkpoint_compare.records import RunRecord
from checkpoint_compare.stats import Thresholds
from checkpoint_compare.verdict import Report, build_report, op_outputs
from checkpoint_storage_bench.tracking import in_polyaxon_run, tracked_run

log = logging.getLogger("checkpoint_compare")


def _pairs(values: tuple[str, ...], what: str, need_key: bool) -> dict[str, str | None]:
    """Parse ``KEY=VALUE`` options; with ``need_key=False`` a bare VALUE maps to None."""
    result: dict[str, str | None] = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep:
            if need_key:
                raise click.BadParameter(f"expected PROFILE=PATH, got {text!r}", param_hint=what)
            key, value = "", text
        if not value or (sep and not key):
            raise click.BadParameter(f"empty profile or value in {text!r}", param_hint=what)
        result[value] = key or None
    return result


@dataclass
class Sources:
    """Where the runs come from (exactly one of offline root, summaries, API)."""

    offline_root: Path | None = None
    summaries: dict[str, Path] = field(default_factory=dict)
    api_host: str | None = None
    project: str | None = None
    pipeline: str | None = None
    runs: dict[str, str | None] = field(default_factory=dict)
    token: str | None = None

    def __post_init__(self) -> None:
        api = bool(self.api_host or self.pipeline or (self.runs and not self.offline_root))
        # Inside the pipeline's compare op, no source means: the runs of my own pipeline.
        api = api or (in_polyaxon_run() and not (self.offline_root or self.summaries))
        chosen = [bool(self.offline_root), bool(self.summaries), api]
        if sum(chosen) != 1:
            raise click.UsageError(
                "give exactly one source: --offline-root DIR, --summary PROFILE=PATH ..., or "
                "the Polyaxon API (--pipeline UUID and/or --run [PROFILE=]UUID, with "
                "--api-host URL --project OWNER/NAME outside a Polyaxon run)"
            )
        if api and not in_polyaxon_run() and not (self.api_host and self.project):
            raise click.UsageError("outside a Polyaxon run the API needs --api-host and --project")
        if api and not (self.pipeline or self.runs or in_polyaxon_run()):
            raise click.UsageError("the API source needs --pipeline UUID or --run [PROFILE=]UUID")

    def load(self) -> list[RunRecord]:
        """Load the runs.

        Raises:
            RunsMissing: A run given with ``--run`` does not exist.
        """
        if self.summaries:
            return [load_summary(p, path) for p, path in self.summaries.items()]
        if self.offline_root:
            records = load_offline(self.offline_root)
            return _select(records, self.runs, str(self.offline_root)) if self.runs else records
        api = ApiSource(host=self.api_host, project=self.project, token=self.token)
        pipeline = self.pipeline or (None if self.runs else api.own_pipeline())
        records = api.pipeline_runs(pipeline) if pipeline else []
        if self.runs:
            known = {r.uuid for r in records}
            records += api.runs({u: p for u, p in self.runs.items() if u not in known})
            records = _select(records, self.runs, "the pipeline")
        return records


def _select(records: list[RunRecord], runs: dict[str, str | None], where: str) -> list[RunRecord]:
    by_uuid = {r.uuid: r for r in records}
    missing = [u for u in runs if u not in by_uuid]
    if missing:
        raise RunsMissing(f"run(s) not found in {where}: {', '.join(missing)}")
    for run_uuid, hint in runs.items():
        by_uuid[run_uuid].profile_hint = hint
    return [by_uuid[u] for u in runs]


def run_compare(
    sources: Sources,
    pricing_path: Path,
    gpu_hourly: float | None,
    volume_gib: float | None,
    thresholds: Thresholds,
    baseline: str | None,
    expected: tuple[str, ...],
) -> Report:
    """Load, group, compare and price; raises CompareError subclasses."""
    pricing = load_pricing(pricing_path, gpu_hourly=gpu_hourly, volume_gib=volume_gib)
    records = sources.load()
    groups, failed = group_by_profile(records, expected=expected)
    for run in failed:
        log.warning("run %s %s and is not used: %s", run.label, run.status, run.message)
    return build_report(groups, pricing, thresholds, baseline=baseline, failed_runs=failed)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--offline-root", type=click.Path(path_type=Path), help="Offline Polyaxon runs.")
@click.option(
    "--summary",
    "summaries",
    multiple=True,
    metavar="PROFILE=PATH",
    help="Trainer summary JSON of a profile (repeat per profile).",
)
@click.option("--api-host", help="Polyaxon server URL (not needed inside a Polyaxon run).")
@click.option("--project", help="OWNER/NAME on the server.")
@click.option("--pipeline", help="Uuid of the pipeline (DAG) run whose runs to compare.")
@click.option(
    "--run",
    "runs",
    multiple=True,
    metavar="[PROFILE=]UUID",
    help="A run to compare; PROFILE overrides what the run recorded (repeat).",
)
@click.option("--token", envvar="POLYAXON_AUTH_TOKEN", help="API token, if the server needs one.")
@click.option(
    "--pricing",
    "pricing_path",
    type=click.Path(path_type=Path),
    default=DEFAULT_PRICING,
    show_default=True,
    help="Pricing file.",
)
@click.option("--gpu-hourly", type=click.FloatRange(min=0), help="GPU USD/hour (file default).")
@click.option("--volume-gib", type=click.FloatRange(min=0), help="Volume size (file default).")
@click.option("--baseline", help="Baseline profile (default: the first one run).")
@click.option(
    "--expect",
    "expected",
    multiple=True,
    metavar="PROFILE",
    help="A profile that must be present (repeat); missing ones exit 3.",
)
@click.option(
    "--runtime-floor",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.02,
    show_default=True,
    help="Relative runtime change treated as noise.",
)
@click.option("--html", "html_path", type=click.Path(path_type=Path), help="Write the HTML report.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the JSON report.")
@click.option(
    "--track/--no-track",
    default=True,
    show_default=True,
    help="Log the verdict as outputs of a Polyaxon run (offline outside one).",
)
def main(
    offline_root: Path | None,
    summaries: tuple[str, ...],
    api_host: str | None,
    project: str | None,
    pipeline: str | None,
    runs: tuple[str, ...],
    token: str | None,
    pricing_path: Path,
    gpu_hourly: float | None,
    volume_gib: float | None,
    baseline: str | None,
    expected: tuple[str, ...],
    runtime_floor: float,
    html_path: Path | None,
    json_path: Path | None,
    track: bool,
) -> None:
    """Compare the training runs of storage profiles and say which one to keep.

    Exit codes: 0 verdict given, 1 unexpected error or API unavailable, 2 bad arguments
    or input files, 3 runs missing, failed or not comparable.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    summary_paths = {p: Path(v) for v, p in _pairs(summaries, "--summary", True).items()}
    sources = Sources(
        offline_root=offline_root,
        summaries=summary_paths,
        api_host=api_host,
        project=project,
        pipeline=pipeline,
        runs=_pairs(runs, "--run", False),
        token=token,
    )
    thresholds = Thresholds(runtime_floor=runtime_floor)
    try:
        report = run_compare(
            sources, pricing_path, gpu_hourly, volume_gib, thresholds, baseline, expected
        )
    except CompareError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    _write(report, html_path, json_path, track)


def _write(report: Report, html_path: Path | None, json_path: Path | None, track: bool) -> None:
    from checkpoint_compare.render import dumps, terminal

    click.echo(terminal(report), nl=False)
    written = []
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(dumps(report))
        written.append(json_path)
    if html_path:
        from checkpoint_compare.report_html import to_html

        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(to_html(report))
        written.append(html_path)
    with tracked_run("compare", tags=["compare"], enabled=track) as tracker:
        tracker.log_inputs(
            baseline=report.baseline,
            profiles=",".join(s.profile for s in report.stats),
            compared_runs=",".join(s.runs.training.uuid for s in report.stats),
        )
        tracker.log_outputs(**op_outputs(report))
        for path in written:
            tracker.log_artifact(path, name=f"compare_{path.suffix.lstrip('.')}")
    for path in written:
        click.echo(f"wrote {path}")


if __name__ == "__main__":  # pragma: no cover
    main(prog_name=os.path.basename(sys.argv[0]))
