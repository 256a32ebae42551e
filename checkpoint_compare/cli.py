"""``python -m checkpoint_compare``: parse the arguments into a
:class:`~checkpoint_compare.config.CompareConfig`, then :func:`checkpoint_compare.commands.run`.

Errors are :class:`~checkpoint_compare.errors.CompareError`\\ s carrying their exit code;
click prints them and exits with it.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import click

from checkpoint_compare import commands
from checkpoint_compare.comparison import Thresholds
from checkpoint_compare.config import CompareConfig, Sources
from checkpoint_compare.cost import DEFAULT_PRICING
from checkpoint_compare.errors import EXIT_CODES
from checkpoint_compare.figures import DEFAULT_WARMUP
from checkpoint_compare.recommendation import Budget
from checkpoint_compare.table import WorkloadBudget
from checkpoint_storage_bench.errors import exit_codes_help


class FiniteFloat(click.ParamType):
    """A float that is finite and within bounds: click's FloatRange lets ``nan`` through
    (every comparison with NaN is false) and ``inf`` through an open upper bound."""

    name = "float"

    def __init__(self, low: float = 0.0, high: float = math.inf, high_open: bool = False):
        self.low, self.high, self.high_open = low, high, high_open

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None):  # noqa: ANN201
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        above = number >= self.high if self.high_open else number > self.high
        if not math.isfinite(number) or number < self.low or above:
            bound = f"{self.low:g} ≤ x {'<' if self.high_open else '≤'} {self.high:g}"
            self.fail(f"{value!r} is not a finite number with {bound}", param, ctx)
        return number


def _pairs(values: tuple[str, ...], what: str, need_key: bool) -> list[tuple[str | None, str]]:
    """Parse ``KEY=VALUE`` options into (key, value) pairs in the order given; with
    ``need_key=False`` a bare VALUE has the key None. A repeated key is kept: several
    summaries of one profile are its repeats."""
    result: list[tuple[str | None, str]] = []
    for text in values:
        key, sep, value = text.partition("=")
        if not sep:
            if need_key:
                raise click.BadParameter(f"expected PROFILE=PATH, got {text!r}", param_hint=what)
            key, value = "", text
        if not value or (sep and not key):
            raise click.BadParameter(f"empty profile or value in {text!r}", param_hint=what)
        result.append((key or None, value))
    return result


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=exit_codes_help(EXIT_CODES),
)
@click.option("--offline-root", type=click.Path(path_type=Path), help="Offline Polyaxon runs.")
@click.option(
    "--summary",
    "summaries",
    multiple=True,
    metavar="PROFILE=PATH",
    help="Trainer summary JSON of a profile (repeat per profile; several of one profile "
    "are its repeats).",
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
@click.option("--gpu-hourly", type=FiniteFloat(), help="GPU USD/hour (file default).")
@click.option("--volume-gib", type=FiniteFloat(), help="Volume size (file default).")
@click.option(
    "--baseline",
    help="Baseline profile (default: the first one run; required for runs without start "
    "times, e.g. summaries).",
)
@click.option(
    "--expect",
    "expected",
    multiple=True,
    metavar="PROFILE",
    help="A profile that must be present (repeat); missing ones exit 3.",
)
@click.option(
    "--runtime-floor",
    type=FiniteFloat(0, 1, high_open=True),
    default=0.02,
    show_default=True,
    help="Relative runtime change treated as noise.",
)
@click.option(
    "--practical-floor-s",
    type=FiniteFloat(),
    default=Thresholds.practical_floor_s,
    show_default=True,
    help="A checkpoint pause difference below this many seconds never counts.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=DEFAULT_WARMUP,
    show_default=True,
    help="Checkpoints at the start of each run reported as warm-up and left out.",
)
@click.option(
    "--confidence",
    type=FiniteFloat(0.5, 1, high_open=True),
    default=Thresholds.confidence,
    show_default=True,
    help="Confidence of the intervals.",
)
@click.option(
    "--max-pause-s",
    type=FiniteFloat(),
    help="Pause budget: the longest acceptable (median) pause per checkpoint, seconds.",
)
@click.option(
    "--max-pause-share",
    type=FiniteFloat(0, 1),
    help="Pause budget: the largest acceptable share of the runtime spent paused (0-1).",
)
@click.option(
    "--checkpoints-per-month",
    type=FiniteFloat(),
    help="The team's checkpoint cadence, for the net cost (GPU time paused + storage).",
)
@click.option(
    "--min-au",
    type=FiniteFloat(0, 1),
    help="Data workload scan: the lowest acceptable accelerator utilization (0-1; MLPerf: 0.9).",
)
@click.option(
    "--max-p99-ms",
    type=FiniteFloat(),
    help="Data workload workspace: the highest acceptable p99 save latency, ms.",
)
@click.option(
    "--allow-resumed",
    is_flag=True,
    help="Rank runs resumed part-way (their timings cover only part of a run) against "
    "uninterrupted ones; refused (exit 3) without it.",
)
@click.option("--html", "html_path", type=click.Path(path_type=Path), help="Write the HTML report.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the JSON report.")
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(path_type=Path),
    help="Write the markdown report (tracked runs get it as their readme in any case).",
)
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
    practical_floor_s: float,
    warmup: int,
    confidence: float,
    max_pause_s: float | None,
    max_pause_share: float | None,
    checkpoints_per_month: float | None,
    min_au: float | None,
    max_p99_ms: float | None,
    allow_resumed: bool,
    html_path: Path | None,
    json_path: Path | None,
    markdown_path: Path | None,
    track: bool,
) -> None:
    """Compare the training (or data-workload) runs of storage profiles and say which one to
    keep."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    summary_paths = [(str(p), Path(v)) for p, v in _pairs(summaries, "--summary", True)]
    sources = Sources(
        offline_root=offline_root,
        summaries=summary_paths,
        api_host=api_host,
        project=project,
        pipeline=pipeline,
        runs={v: p for p, v in _pairs(runs, "--run", False)},
        token=token,
    )
    config = CompareConfig(
        sources=sources,
        pricing_path=pricing_path,
        gpu_hourly=gpu_hourly,
        volume_gib=volume_gib,
        thresholds=Thresholds(
            runtime_floor=runtime_floor,
            practical_floor_s=practical_floor_s,
            confidence=confidence,
            warmup=warmup,
        ),
        baseline=baseline,
        expected=expected,
        budget=Budget(max_pause_s, max_pause_share, checkpoints_per_month),
        workload_budget=WorkloadBudget(min_au, max_p99_ms),
        allow_resumed=allow_resumed,
        html_path=html_path,
        json_path=json_path,
        markdown_path=markdown_path,
        track=track,
    )
    commands.run(config)
