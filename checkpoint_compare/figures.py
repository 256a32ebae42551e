"""The figures of one profile, from its runs: checkpoint stages, runtime, loss, fio, hook.

A distributed run's checkpoint pauses training until its slowest rank is done, so where a
run recorded the slowest rank's pause (``ckpt_slowest_pause_s``) that is its pause; a
single-process run's pause is its only rank's.

A profile may have several training runs (repeats). The checkpoints of each run are split
into warm-up (the first ``--warmup`` ones: a cold buffer, the first file in a directory)
and measured ones; the measured pauses of all runs are pooled for the comparison, the
warm-up ones are reported separately. The runtimes stay one per run: the whole run is one
measurement, and repeats give its between-run spread.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from checkpoint_compare.errors import NotComparable
from checkpoint_compare.grouping import ProfileRuns
from checkpoint_compare.records import RunRecord, Series
from checkpoint_storage_bench.contract import (
    DISTRIBUTED_CHECKPOINT_METRICS,
    IMAGE_INPUT,
    LOSS_METRIC,
    RESTORE_MEASURED,
    RESTORE_OUTPUTS,
    STAGES,
    VAC_PARAMETER_PREFIX,
    VERDICT_WARMUP,
    WORLD_SIZE,
)

DEFAULT_WARMUP = VERDICT_WARMUP
"""Checkpoints at the start of each run reported as warm-up and left out of the comparison."""


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@dataclass
class StageFigures:
    """One checkpoint stage: median, min and max seconds over ``n`` checkpoints.

    ``n`` is 0 when only the runs' summary outputs were available, not every checkpoint.
    """

    median: float
    min: float
    max: float
    n: int = 0

    @property
    def spread(self) -> float:
        return self.max - self.min

    @classmethod
    def of(cls, values: list[float]) -> StageFigures:
        return cls(statistics.median(values), min(values), max(values), len(values))


@dataclass
class RunFigures:
    """The figures of one training run.

    Attributes:
        run: The run.
        runtime_s: Its total runtime.
        checkpoint_count: Checkpoints taken (warm-up included).
        warmup: Pause per checkpoint of the warm-up checkpoints (step, seconds).
        measured: Pause per checkpoint of the others: what is compared.
        stages: Stage → figures over the measured checkpoints (or the run's outputs).
        pause_total_s: Time the training loop was paused by checkpoints.
        pause_share: pause_total_s / runtime_s.
        final_loss: The training loss at the end; None when not recorded or not finite.
        loss_problem: Why there is no final loss to compare, if there is none.
        write_gbps_median: Median write bandwidth, GB/s.
        upload_gbps_median: Median upload bandwidth, GB/s.
        aggregate_gbps_median: Median aggregate write rate of all ranks (distributed runs).
        world_size: Ranks that wrote each checkpoint (None: a single process).
        slowest_rank: Whether the pauses are the slowest rank's (a distributed run).
        resumed_from_step: The step a resumed run continued from (None: uninterrupted).
        restore_s: Seconds to load and verify the newest checkpoint (None: not measured).
        restore_gbps: Its rate.
        restore_measured: ``resume`` or ``end`` (``--restore-check``).
    """

    run: RunRecord
    runtime_s: float
    checkpoint_count: int
    warmup: Series
    measured: Series
    stages: dict[str, StageFigures]
    pause_total_s: float | None
    pause_share: float | None
    final_loss: float | None
    loss_problem: str | None
    write_gbps_median: float | None
    upload_gbps_median: float | None
    aggregate_gbps_median: float | None = None
    world_size: int | None = None
    slowest_rank: bool = False
    resumed_from_step: int | None = None
    restore_s: float | None = None
    restore_gbps: float | None = None
    restore_measured: str | None = None

    @property
    def node(self) -> str | None:
        return self.run.meta.get("node_name")

    @property
    def gpu_model(self) -> str | None:
        return self.run.meta.get("gpu_model")

    @property
    def image(self) -> str | None:
        return self.run.inputs.get(IMAGE_INPUT)

    @property
    def started(self) -> datetime | None:
        return self.run.started_at or self.run.created_at

    @property
    def interval(self) -> tuple[str | None, str | None]:
        """Start and end of the run (ISO), its measured interval."""
        start, end = self.run.started_at, self.run.finished_at
        return (start.isoformat() if start else None, end.isoformat() if end else None)


@dataclass
class ProfileFigures:
    """The figures of one profile that the reports show and the verdict uses.

    Attributes:
        profile: Profile name.
        runs: The runs the figures come from.
        per_run: The figures of each training run, oldest first.
        stages: Stage name → figures over every run's measured checkpoints.
        measured_pauses: The measured pauses of all runs, pooled.
        warmup_pauses: The warm-up pauses of all runs, pooled.
        fio: fio case → headline figures.
        hook: What the hook recorded: claim identity, applied class, settle times.
        blocks: How many blocks of back-to-back runs its runs make (None: not known).
    """

    profile: str
    runs: ProfileRuns
    per_run: list[RunFigures]
    stages: dict[str, StageFigures]
    measured_pauses: list[float]
    warmup_pauses: list[float]
    fio: dict[str, dict[str, float]] = field(default_factory=dict)
    hook: dict[str, Any] = field(default_factory=dict)
    blocks: int | None = None

    @property
    def pause(self) -> StageFigures:
        return self.stages["pause"]

    @property
    def runtimes(self) -> list[float]:
        return [r.runtime_s for r in self.per_run]

    @property
    def runtime_s(self) -> float:
        """The median runtime over the runs."""
        return statistics.median(self.runtimes)

    @property
    def runtime_spread_s(self) -> float:
        """Between-run spread of the runtime (0 with one run)."""
        return max(self.runtimes) - min(self.runtimes)

    @property
    def checkpoint_count(self) -> int:
        """Checkpoints per run (the median over the runs)."""
        return int(statistics.median(r.checkpoint_count for r in self.per_run))

    @property
    def pause_total_s(self) -> float | None:
        return _median_or_none([r.pause_total_s for r in self.per_run])

    @property
    def pause_share(self) -> float | None:
        return _median_or_none([r.pause_share for r in self.per_run])

    @property
    def write_gbps_median(self) -> float | None:
        return _median_or_none([r.write_gbps_median for r in self.per_run])

    @property
    def upload_gbps_median(self) -> float | None:
        return _median_or_none([r.upload_gbps_median for r in self.per_run])

    @property
    def aggregate_gbps_median(self) -> float | None:
        return _median_or_none([r.aggregate_gbps_median for r in self.per_run])

    @property
    def final_loss(self) -> float | None:
        """The median final loss of the runs; None when any run has none to compare."""
        if self.loss_problem:
            return None
        return statistics.median(r.final_loss for r in self.per_run)  # type: ignore[type-var]

    @property
    def loss_problem(self) -> str | None:
        problems = [f"run {r.run.label} {r.loss_problem}" for r in self.per_run if r.loss_problem]
        return "; ".join(problems) or None

    @property
    def restores(self) -> list[float]:
        """One restore time per run that measured one: compared like the pauses."""
        return [r.restore_s for r in self.per_run if r.restore_s is not None]

    @property
    def restore_gbps_median(self) -> float | None:
        return _median_or_none([r.restore_gbps for r in self.per_run])

    @property
    def warmup_median(self) -> float | None:
        return statistics.median(self.warmup_pauses) if self.warmup_pauses else None

    @property
    def interval(self) -> tuple[str | None, str | None]:
        """From the start of the first run to the end of the last (ISO)."""
        return self.per_run[0].interval[0], self.per_run[-1].interval[1]

    @property
    def pause_series(self) -> list[Series]:
        """Pause per checkpoint over training steps, one series per run (warm-up included)."""
        return [sorted(r.warmup + r.measured) for r in self.per_run]


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _outputs_stage(run: RunRecord, stage: str) -> StageFigures | None:
    """A stage from the run's summary outputs (a source without per-checkpoint events)."""
    slowest = _num(run.outputs.get(f"{DISTRIBUTED_CHECKPOINT_METRICS['slowest_pause_s']}_median"))
    if stage == "pause" and slowest is not None:
        return StageFigures(slowest, slowest, slowest)
    median = _num(run.outputs.get(f"ckpt_{stage}_s_median"))
    if median is None:
        return None
    low = _num(run.outputs.get(f"ckpt_{stage}_s_min"))
    high = _num(run.outputs.get(f"ckpt_{stage}_s_max"))
    return StageFigures(median, median if low is None else low, median if high is None else high)


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


def _stage_metric(run: RunRecord, stage: str) -> str:
    """The metric that holds a stage per checkpoint: for the pause of a distributed run,
    the slowest rank's."""
    if stage == "pause" and run.metrics.get(DISTRIBUTED_CHECKPOINT_METRICS["slowest_pause_s"]):
        return DISTRIBUTED_CHECKPOINT_METRICS["slowest_pause_s"]
    return f"ckpt_{stage}_s"


def pause_series(run: RunRecord) -> Series:
    """The pause of every checkpoint of a run, by step (the slowest rank's when recorded)."""
    return sorted(run.metrics.get(_stage_metric(run, "pause"), []))


DIVERGED = "the training diverged"
"""What the reports, the notes and the recommendation say of a run whose loss went
non-finite."""


def _final_loss(run: RunRecord) -> tuple[float | None, str | None]:
    """The run's final loss, or None and why there is none to compare.

    The trainer writes a loss that is not finite as null (the summary) or leaves it out (the
    outputs and loss events take no non-finite number), and says where it went non-finite
    (``diverged_at_step``); runs of older trainers show it in their loss events or the
    summary's curve. Such a run diverged, which is more than a run that recorded no loss.
    """
    if (step := run.diverged_at_step) is not None:
        return None, f"has a non-finite loss from step {step} on ({DIVERGED})"
    curve = run.metrics.get(LOSS_METRIC, [])
    loss = _num(run.outputs.get("final_loss"))
    if loss is None and curve:
        broken = [(step, v) for step, v in curve if not math.isfinite(v)]
        loss = broken[0][1] if broken else curve[-1][1]
        if broken:
            return None, f"has a non-finite loss ({loss}) from step {broken[0][0]} on ({DIVERGED})"
    if loss is None:
        return None, "recorded no final loss"
    if not math.isfinite(loss):
        return None, f"ended with a final loss of {loss} ({DIVERGED})"
    return loss, None


def run_figures(profile: str, run: RunRecord, warmup: int) -> RunFigures:
    """The figures of one training run.

    Raises:
        NotComparable: The run has no pause figures or no runtime (e.g. it never
            checkpointed), so it cannot be compared.
    """
    runtime = _num(run.outputs.get("runtime_s"))
    pauses = pause_series(run)
    if runtime is None:
        raise NotComparable(f"profile {profile}: run {run.label} recorded no runtime_s")
    if not pauses and _outputs_stage(run, "pause") is None:
        raise NotComparable(f"profile {profile}: run {run.label} recorded no checkpoint pauses")
    warm_steps = {step for step, _ in pauses[:warmup]}
    stages: dict[str, StageFigures] = {}
    for stage in STAGES:
        series = run.metrics.get(_stage_metric(run, stage), [])
        values = [v for step, v in series if step not in warm_steps]
        if values:
            stages[stage] = StageFigures.of(values)
        elif not series and (outputs := _outputs_stage(run, stage)) is not None:
            stages[stage] = outputs
    count = _num(run.outputs.get("checkpoint_count"))
    pause_total = _num(run.outputs.get("ckpt_pause_s_total"))
    if pause_total is None and pauses:
        pause_total = sum(v for _, v in pauses)
    share = _num(run.outputs.get("ckpt_pause_share"))
    if share is None and pause_total is not None and runtime:
        share = pause_total / runtime
    loss, loss_problem = _final_loss(run)
    return RunFigures(
        run=run,
        runtime_s=runtime,
        checkpoint_count=int(count) if count is not None else len(pauses),
        warmup=pauses[:warmup],
        measured=pauses[warmup:],
        stages=stages,
        pause_total_s=pause_total,
        pause_share=share,
        final_loss=loss,
        loss_problem=loss_problem,
        write_gbps_median=_median_metric(run, "ckpt_write_gbps"),
        upload_gbps_median=_median_metric(run, "ckpt_upload_gbps"),
        aggregate_gbps_median=_median_metric(run, DISTRIBUTED_CHECKPOINT_METRICS["aggregate_gbps"]),
        world_size=int(world) if (world := _num(run.outputs.get(WORLD_SIZE))) else None,
        slowest_rank=bool(run.metrics.get(DISTRIBUTED_CHECKPOINT_METRICS["slowest_pause_s"]))
        or _num(run.outputs.get(f"{DISTRIBUTED_CHECKPOINT_METRICS['slowest_pause_s']}_median"))
        is not None,
        resumed_from_step=run.resumed_from_step,
        restore_s=_num(run.outputs.get(RESTORE_OUTPUTS[0])),
        restore_gbps=_num(run.outputs.get(RESTORE_OUTPUTS[2])),
        restore_measured=run.meta.get(RESTORE_MEASURED),
    )


def profile_figures(runs: ProfileRuns, warmup: int = DEFAULT_WARMUP) -> ProfileFigures:
    """Compute the figures of one profile from its runs.

    Raises:
        NotComparable: A training run has no pause figures or no runtime.
    """
    per_run = [run_figures(runs.profile, run, warmup) for run in runs.trainings]
    stages: dict[str, StageFigures] = {}
    for stage in STAGES:
        of_runs = [r.stages[stage] for r in per_run if stage in r.stages]
        if not of_runs:
            continue
        values = [
            v
            for r in per_run
            for step, v in r.run.metrics.get(_stage_metric(r.run, stage), [])
            if step not in {s for s, _ in r.warmup}
        ]
        if values:
            stages[stage] = StageFigures.of(values)
        else:  # only summary outputs: the median of the runs' medians, n = 0 (no events)
            stages[stage] = StageFigures(
                statistics.median(f.median for f in of_runs),
                min(f.min for f in of_runs),
                max(f.max for f in of_runs),
            )
    if "pause" not in stages:  # every checkpoint was warm-up: compare nothing, show them
        warm = [v for r in per_run for _, v in r.warmup]
        stages["pause"] = StageFigures(statistics.median(warm), min(warm), max(warm), 0)
    return ProfileFigures(
        profile=runs.profile,
        runs=runs,
        per_run=per_run,
        stages=stages,
        measured_pauses=[v for r in per_run for _, v in r.measured],
        warmup_pauses=[v for r in per_run for _, v in r.warmup],
        fio=runs.fio.fio_cases() if runs.fio else {},
        hook=_hook_figures(runs.hook),
    )
