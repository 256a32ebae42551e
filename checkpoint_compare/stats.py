"""Per-profile figures, the comparability check and the noise-aware verdict.

Noise model (documented in docs/compare.md): the checkpoints of one run are repeated
measurements of the same operation, so the spread between them (max − min of the pause)
is the noise floor. A pause difference between two profiles counts only when it exceeds
the larger of the two spreads. The whole run is one measurement, so its runtime difference
counts only when it exceeds what checkpoint jitter alone could add up to (spread × number
of checkpoints) and a relative floor for everything else that varies between runs.
"""

from __future__ import annotations

import enum
import statistics
from dataclasses import dataclass, field
from typing import Any

from checkpoint_compare.errors import NotComparable
from checkpoint_compare.loading import ProfileRuns
from checkpoint_compare.records import RunRecord, Series
from checkpoint_storage_bench.contract import (
    COMPARABLE_INPUTS,
    COMPARABLE_META,
    REQUIRED_INPUTS,
    STAGES,
)


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
class ProfileStats:
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
        final_loss: The training loss at the end.
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
    # The class's parameters (vac_type, vac_iops, vac_throughput, ...) price the profile.
    figures |= {k: v for k, v in hook.inputs.items() if k.startswith("vac_")}
    figures["run"] = hook.label
    return figures


def profile_stats(runs: ProfileRuns) -> ProfileStats:
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
    return ProfileStats(
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
        fio=runs.fio.fio_cases() if runs.fio else {},
        hook=_hook_figures(runs.hook),
        interval=(
            run.started_at.isoformat() if run.started_at else None,
            run.finished_at.isoformat() if run.finished_at else None,
        ),
    )


def check_comparable(groups: list[ProfileRuns]) -> None:
    """Refuse runs whose fixed inputs differ.

    Raises:
        NotComparable: Naming every input that differs and its value per profile.
    """
    missing = [
        f"{g.profile} ({g.training.label}) does not record {key}"
        for g in groups
        for key in REQUIRED_INPUTS
        if g.training.inputs.get(key) is None
    ]
    if missing:
        raise NotComparable("runs are not comparable: " + "; ".join(missing))
    differences = []
    for key in COMPARABLE_META:
        values = {g.profile: g.training.meta.get(key) for g in groups}
        # Only when every run recorded it: a local run may have no image digest.
        if None not in values.values() and len(set(map(repr, values.values()))) > 1:
            shown = ", ".join(f"{p}={v!r}" for p, v in values.items())
            differences.append(f"{key} differs ({shown}): a different trainer build")
    for key in COMPARABLE_INPUTS:
        values = {g.profile: g.training.inputs.get(key) for g in groups}
        if len({repr(v) for v in values.values()}) > 1:
            shown = ", ".join(f"{p}={v!r}" for p, v in values.items())
            differences.append(f"{key} differs ({shown})")
    if differences:
        raise NotComparable("runs are not comparable: " + "; ".join(differences))


class Outcome(enum.Enum):
    """How a candidate profile compares with the baseline."""

    BETTER = "better"  # measurably faster whole run, not costlier
    FASTER_COSTLIER = "faster_costlier"  # measurably faster whole run, costs more per run
    NO_DIFFERENCE = "no_difference"  # within noise, or only a stage got faster
    WORSE = "worse"  # measurably slower


NO_DIFFERENCE = "no measurable difference"


@dataclass(frozen=True)
class Thresholds:
    """Noise floors of the verdict.

    Attributes:
        runtime_floor: Relative runtime change below which whole runs count as equal,
            for the variation that checkpoints do not explain (data loading, scheduling).
        loss_tolerance: Relative final-loss difference tolerated; beyond it the runs did
            not train the same model and no profile is declared better.
    """

    runtime_floor: float = 0.02
    loss_tolerance: float = 1e-3

    def __post_init__(self) -> None:
        if not 0 <= self.runtime_floor < 1:
            raise ValueError(f"runtime floor must be in [0, 1), got {self.runtime_floor}")
        if self.loss_tolerance < 0:
            raise ValueError(f"loss tolerance must be >= 0, got {self.loss_tolerance}")


@dataclass
class Comparison:
    """A candidate profile against the baseline (deltas are candidate − baseline).

    Attributes:
        baseline: Baseline figures.
        candidate: Candidate figures.
        pause_delta_s: Median pause difference.
        pause_noise_s: The larger pause spread of the two runs.
        pause_measurable: Whether |pause_delta_s| exceeds the noise.
        runtime_delta_s: Runtime difference.
        runtime_noise_s: The runtime noise floor used.
        runtime_measurable: Whether |runtime_delta_s| exceeds it.
        stage_deltas: Stage → median difference (s), for stages both runs measured.
        loss_delta: Final loss difference, when both recorded it.
        notes: Plain-language observations (dominating stage, loss mismatch, ...).
    """

    baseline: ProfileStats
    candidate: ProfileStats
    pause_delta_s: float
    pause_noise_s: float
    pause_measurable: bool
    runtime_delta_s: float
    runtime_noise_s: float
    runtime_measurable: bool
    stage_deltas: dict[str, float]
    loss_delta: float | None
    loss_differs: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def pause_speedup(self) -> float | None:
        """Baseline pause ÷ candidate pause (medians); > 1 means the candidate is faster."""
        if self.candidate.pause.median <= 0:
            return None
        return self.baseline.pause.median / self.candidate.pause.median

    @property
    def timing_outcome(self) -> Outcome:
        """The outcome on time alone; cost is weighed in by the verdict."""
        if (self.pause_measurable and self.pause_delta_s > 0) or (
            self.runtime_measurable and self.runtime_delta_s > 0 and self.explained_by_checkpoints
        ):
            return Outcome.WORSE
        if (
            self.pause_measurable
            and self.pause_delta_s < 0
            and self.runtime_measurable
            and self.runtime_delta_s < 0
            and self.explained_by_checkpoints
            and not self.loss_differs
        ):
            return Outcome.BETTER
        return Outcome.NO_DIFFERENCE

    @property
    def explained_by_checkpoints(self) -> bool:
        """Whether the checkpoints' time difference can account for the run's: a 10 ms
        faster checkpoint cannot explain a run 3 s shorter (nor slower ones a longer run
        when they are not slower)."""
        checkpoints = max(self.baseline.checkpoint_count, self.candidate.checkpoint_count, 1)
        same_direction = (self.pause_delta_s > 0) == (self.runtime_delta_s > 0)
        return same_direction and abs(self.pause_delta_s) * checkpoints > self.runtime_noise_s


def compare(baseline: ProfileStats, candidate: ProfileStats, thresholds: Thresholds) -> Comparison:
    """Compare a candidate profile with the baseline, noise-aware."""
    pause_delta = candidate.pause.median - baseline.pause.median
    pause_noise = max(baseline.pause.spread, candidate.pause.spread)
    checkpoints = max(baseline.checkpoint_count, candidate.checkpoint_count, 1)
    runtime_delta = candidate.runtime_s - baseline.runtime_s
    runtime_noise = max(pause_noise * checkpoints, thresholds.runtime_floor * baseline.runtime_s)
    stage_deltas = {
        s: candidate.stages[s].median - baseline.stages[s].median
        for s in STAGES
        if s in baseline.stages and s in candidate.stages
    }
    loss_delta = (
        candidate.final_loss - baseline.final_loss
        if candidate.final_loss is not None and baseline.final_loss is not None
        else None
    )
    enough = min(baseline.pause.n, candidate.pause.n) >= MIN_CHECKPOINTS
    # Relative to the baseline's loss; absolute when that is 0.
    loss_scale = abs(baseline.final_loss) if baseline.final_loss else 1.0
    loss_differs = (
        loss_delta is not None and abs(loss_delta) > thresholds.loss_tolerance * loss_scale
    )
    result = Comparison(
        baseline=baseline,
        candidate=candidate,
        pause_delta_s=pause_delta,
        pause_noise_s=pause_noise,
        # Too few checkpoints and the spread says nothing about the noise.
        pause_measurable=enough and abs(pause_delta) > pause_noise,
        runtime_delta_s=runtime_delta,
        runtime_noise_s=runtime_noise,
        runtime_measurable=abs(runtime_delta) > runtime_noise,
        stage_deltas=stage_deltas,
        loss_delta=loss_delta,
        loss_differs=loss_differs,
    )
    result.notes = _notes(result, thresholds)
    if not enough:
        result.notes.insert(
            0,
            f"too few checkpoints to judge the noise (fewer than {MIN_CHECKPOINTS} in a run): "
            "no checkpoint difference counts as measurable",
        )
    if result.runtime_measurable and not result.explained_by_checkpoints:
        longer = "longer" if runtime_delta > 0 else "shorter"
        result.notes.append(
            f"the run is {abs(runtime_delta):.2f} s {longer}, but {checkpoints} checkpoints "
            f"differing by {pause_delta:+.3f} s each cannot explain it: not put down to storage"
        )
    return result


def _notes(c: Comparison, thresholds: Thresholds) -> list[str]:
    notes = []
    name, base = c.candidate.profile, c.baseline.profile
    if c.pause_measurable and c.pause_delta_s < 0 and not c.runtime_measurable:
        share = c.baseline.pause_share
        shown = (
            f" (checkpoints paused {share:.1%} of the baseline run)" if share is not None else ""
        )
        notes.append(
            f"{name} checkpoints are measurably faster, but the whole run is not: another "
            f"stage of the run dominates{shown}"
        )
    # The stage that dominates the baseline pause, so a team knows what storage can fix.
    inner = {s: f.median for s, f in c.baseline.stages.items() if s not in ("pause", "total")}
    if inner:
        top = max(inner, key=inner.get)
        why = {
            "serialize": ": a CPU stage, a faster volume does not shorten it",
            "upload": ": it goes to the artifact store, not to this volume",
        }.get(top, "")
        notes.append(f"{base}: the {top} stage is the largest part of a checkpoint{why}")
    if c.loss_differs:
        notes.append(
            f"final loss differs by {c.loss_delta:+.4g} between {base} and {name}: the runs "
            "did not train the same model, so neither is declared better"
        )
    return notes
