"""The figures of one profile, from its runs: checkpoint stages, runtime, loss, fio, hook."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from checkpoint_compare.errors import NotComparable
from checkpoint_compare.grouping import ProfileRuns
from checkpoint_compare.records import RunRecord, Series
from checkpoint_storage_bench.contract import STAGES, VAC_PARAMETER_PREFIX


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# Fewer checkpoints than this in a run and its spread says nothing about the noise.
MIN_CHECKPOINTS = 3


@dataclass
class StageFigures:
    """One checkpoint stage over a run: median, min and max seconds over ``n`` checkpoints.

    ``n`` is 0 when only the run's summary outputs were available, not every checkpoint.
    """

    median: float
    min: float
    max: float
    n: int = 0

    @property
    def spread(self) -> float:
        return self.max - self.min


@dataclass
class ProfileFigures:
    """The figures of one profile that the report shows and the verdict uses.

    Attributes:
        profile: Profile name.
        runs: The runs the figures come from.
        stages: Stage name (serialize, write, ...) → figures; only stages that were measured.
        pause_series: Pause per checkpoint over training steps.
        write_gbps_median: Median write bandwidth, GB/s.
        upload_gbps_median: Median upload bandwidth, GB/s.
        runtime_s: Total runtime of the training run.
        checkpoint_count: Checkpoints taken.
        pause_total_s: Time the training loop was paused by checkpoints.
        pause_share: pause_total_s / runtime_s.
        final_loss: The training loss at the end; None when not recorded or not finite.
        loss_problem: Why there is no final loss to compare, if there is none.
        fio: fio case → headline figures.
        hook: What the hook recorded: claim identity, applied class, settle times.
        interval: Start and end of the training run (ISO), the measured interval.
    """

    profile: str
    runs: ProfileRuns
    stages: dict[str, StageFigures]
    pause_series: Series
    write_gbps_median: float | None
    upload_gbps_median: float | None
    runtime_s: float
    checkpoint_count: int
    pause_total_s: float | None
    pause_share: float | None
    final_loss: float | None
    loss_problem: str | None = None
    fio: dict[str, dict[str, float]] = field(default_factory=dict)
    hook: dict[str, Any] = field(default_factory=dict)
    interval: tuple[str | None, str | None] = (None, None)

    @property
    def pause(self) -> StageFigures:
        return self.stages["pause"]


def _stage_figures(run: RunRecord, stage: str) -> StageFigures | None:
    """From the per-checkpoint events if we have them, else from the run's outputs."""
    values = [v for _, v in run.metrics.get(f"ckpt_{stage}_s", [])]
    if values:
        return StageFigures(statistics.median(values), min(values), max(values), len(values))
    median = _num(run.outputs.get(f"ckpt_{stage}_s_median"))
    if median is None:
        return None
    low = _num(run.outputs.get(f"ckpt_{stage}_s_min"))
    high = _num(run.outputs.get(f"ckpt_{stage}_s_max"))
    if low is None or high is None:
        return StageFigures(median, median, median, 0)  # no spread known: see MIN_CHECKPOINTS
    count = _num(run.outputs.get("checkpoint_count"))
    return StageFigures(median, low, high, int(count) if count else 0)


def _median_metric(run: RunRecord, metric: str) -> float | None:
    values = [v for _, v in run.metrics.get(metric, [])]
    return statistics.median(values) if values else _num(run.outputs.get(f"{metric}_median"))


def _hook_figures(hook: RunRecord | None) -> dict[str, Any]:
    if hook is None:
        return {}
    keys_in = ("claim", "namespace", "driver", "volume_handle", "previous_class", "target_class")
    keys_out = ("applied_class", "k8s_settle_s", "provider_settle_s", "total_settle_s")
    figures = {k: hook.inputs.get(k) for k in keys_in}
    figures |= {k: hook.outputs.get(k) for k in keys_out}
    # The class's parameters (vac_type, vac_iops, vac_throughput, ...) price the profile;
    # the hook may record them as inputs or outputs (outputs win: they are what it applied).
    for values in (hook.inputs, hook.outputs):
        figures |= {k: v for k, v in values.items() if k.startswith(VAC_PARAMETER_PREFIX)}
    figures["run"] = hook.label
    return figures


def profile_figures(runs: ProfileRuns) -> ProfileFigures:
    """Compute the figures of one profile from its runs.

    Raises:
        NotComparable: The training run has no pause figures or no runtime, so it cannot
            be compared (e.g. a run that never checkpointed).
    """
    run = runs.training
    stages = {s: f for s in STAGES if (f := _stage_figures(run, s)) is not None}
    runtime = _num(run.outputs.get("runtime_s"))
    if "pause" not in stages or runtime is None:
        missing = "checkpoint pause figures" if "pause" not in stages else "runtime_s"
        raise NotComparable(f"profile {runs.profile}: run {run.label} recorded no {missing}")
    pause_series = run.metrics.get("ckpt_pause_s", [])
    count = _num(run.outputs.get("checkpoint_count"))
    pause_total = _num(run.outputs.get("ckpt_pause_s_total"))
    if pause_total is None and pause_series:
        pause_total = sum(v for _, v in pause_series)
    share = _num(run.outputs.get("ckpt_pause_share"))
    if share is None and pause_total is not None and runtime:
        share = pause_total / runtime
    loss = _num(run.outputs.get("final_loss"))
    if loss is None and run.metrics.get("loss"):
        loss = run.metrics["loss"][-1][1]
    loss_problem = None
    if loss is None:
        loss_problem = "recorded no final loss"
    elif not math.isfinite(loss):
        loss_problem, loss = f"ended with a final loss of {loss} (the training diverged)", None
    return ProfileFigures(
        profile=runs.profile,
        runs=runs,
        stages=stages,
        pause_series=pause_series,
        write_gbps_median=_median_metric(run, "ckpt_write_gbps"),
        upload_gbps_median=_median_metric(run, "ckpt_upload_gbps"),
        runtime_s=runtime,
        checkpoint_count=int(count) if count is not None else len(pause_series),
        pause_total_s=pause_total,
        pause_share=share,
        final_loss=loss,
        loss_problem=loss_problem,
        fio=runs.fio.fio_cases() if runs.fio else {},
        hook=_hook_figures(runs.hook),
        interval=(
            run.started_at.isoformat() if run.started_at else None,
            run.finished_at.isoformat() if run.finished_at else None,
        ),
    )
