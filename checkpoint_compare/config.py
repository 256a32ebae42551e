"""What one verdict is asked to do, validated once: where the runs come from, the prices,
the noise floors, the baseline and the files to write. The CLI builds it; nothing after it
parses arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import click

from checkpoint_compare.comparison import Thresholds
from checkpoint_compare.cost import DEFAULT_PRICING
from checkpoint_compare.recommendation import Budget
from checkpoint_compare.table import WorkloadBudget
from checkpoint_storage_bench.tracking import in_polyaxon_run


@dataclass
class Sources:
    """Where the runs come from (exactly one of offline root, summaries, API).

    Attributes:
        offline_root: Offline Polyaxon runs.
        summaries: (profile, trainer summary JSON) pairs in the order given; several of
            one profile are its repeats.
        api_host: Polyaxon server URL (None inside a Polyaxon run).
        project: ``owner/name`` on the server.
        pipeline: Uuid of the pipeline whose runs to compare.
        runs: Run uuid → profile it stands for (None: what the run recorded).
        token: API token, if the server needs one.
    """

    offline_root: Path | None = None
    summaries: list[tuple[str, Path]] = field(default_factory=list)
    api_host: str | None = None
    project: str | None = None
    pipeline: str | None = None
    runs: dict[str, str | None] = field(default_factory=dict)
    token: str | None = None

    def __post_init__(self) -> None:
        api = self.uses_api
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

    @property
    def uses_api(self) -> bool:
        api = bool(self.api_host or self.pipeline or (self.runs and not self.offline_root))
        # Inside the pipeline's compare op, no source means: the runs of my own pipeline.
        return api or (in_polyaxon_run() and not (self.offline_root or self.summaries))


@dataclass
class CompareConfig:
    """One verdict's settings.

    Attributes:
        sources: Where the runs come from.
        pricing_path: The pricing file.
        gpu_hourly: GPU USD/hour, overriding the pricing file's.
        volume_gib: Volume size, overriding the pricing file's.
        thresholds: Noise floors.
        baseline: The baseline profile (default: the first one run).
        expected: Profiles that must be present.
        budget: Pause budget and cadence for the recommendation.
        workload_budget: A data workload's budget (AU floor, p99 save latency).
        allow_resumed: Rank runs resumed part-way against uninterrupted ones anyway.
        html_path: Where to write the HTML report.
        json_path: Where to write the JSON report.
        markdown_path: Where to write the markdown report (also the run's readme).
        track: Log the verdict to a Polyaxon run (and its readme; inside a pipeline also
            the pipeline's readme).
    """

    sources: Sources
    pricing_path: Path = DEFAULT_PRICING
    gpu_hourly: float | None = None
    volume_gib: float | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    baseline: str | None = None
    expected: tuple[str, ...] = ()
    budget: Budget = field(default_factory=Budget)
    workload_budget: WorkloadBudget = field(default_factory=WorkloadBudget)
    allow_resumed: bool = False
    html_path: Path | None = None
    json_path: Path | None = None
    markdown_path: Path | None = None
    track: bool = True
