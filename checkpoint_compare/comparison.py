"""The pieces every comparison is made of, and a training run's whole run against the
baseline's: robust, symmetric, with intervals.

Noise model (docs/compare.md): the run is the unit of replication. Whatever differs
between two runs (the machine's load, a neighbour on the disk) moves all checkpoints (or
epochs) of a run together, so they are not independent draws for a comparison between
profiles: the headline's difference (the pause per checkpoint for a training run) is the
shift between the runs' medians with its between-run interval, made by the verdict's engine
for every workload (:mod:`checkpoint_compare.verdict`), and judged here
(:class:`Difference`): it counts when the interval excludes zero and the shift is larger
than a practical floor; with one run a side there is no interval and nothing counts. A
training run's whole run is one measurement: its runtimes are compared the same way, each
run one value (Student's t between runs). It counts when its interval excludes zero, it is
larger than the runtime floor, and the checkpoints can account for it.

Every rule is symmetric: swapping baseline and candidate swaps the sign of each difference
and nothing else, and a slower profile needs the same evidence as a faster one. When the
pipeline returned to the baseline at the end (A…B…A), the baseline's own drift between its
first and its last runs is measured (:class:`Drift`); a difference no larger than that drift
does not count.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import click

from checkpoint_compare.figures import DEFAULT_WARMUP, ProfileFigures
from checkpoint_compare.formatting import seconds
from checkpoint_compare.intervals import Shift, run_level_shift
from checkpoint_compare.records import RunRecord
from checkpoint_compare.table import CHECKPOINT
from checkpoint_storage_bench.config_cli import FiniteFloat, cli
from checkpoint_storage_bench.contract import STAGES, VERDICT_CONFIDENCE


class Outcome(enum.Enum):
    """How a candidate profile compares with the baseline."""

    BETTER = "better"  # measurably faster whole run, not costlier per run
    FASTER_COSTLIER = "faster_costlier"  # measurably faster whole run, costs more per run
    NO_DIFFERENCE = "no_difference"  # within noise, or only a stage got faster
    SLOWER_CHEAPER = "slower_cheaper"  # measurably slower whole run, costs less per run
    WORSE = "worse"  # measurably slower whole run, not cheaper per run


NO_DIFFERENCE = "no measurable difference"


@dataclass(frozen=True)
class Thresholds:
    """What makes a difference count (one section of the verdict's settings: each field is
    an option of ``python -m checkpoint_compare``)."""

    runtime_floor: float = field(
        default=0.02, metadata=cli(click_type=FiniteFloat(0, 1, high_open=True))
    )
    """Relative runtime change treated as noise: below it whole runs count as equal (the
    variation checkpoints do not explain: data loading, scheduling)."""
    practical_floor_s: float = field(default=0.01, metadata=cli(click_type=FiniteFloat()))
    """A checkpoint pause difference below this many seconds never counts (clock and
    scheduler jitter on one node, worth nothing in GPU time)."""
    loss_tolerance: float = field(default=1e-3, metadata=cli(click_type=FiniteFloat()))
    """Relative final-loss difference tolerated; beyond it the runs did not train the same
    model and no profile is declared better."""
    confidence: float = field(
        default=VERDICT_CONFIDENCE, metadata=cli(click_type=FiniteFloat(0.5, 1, high_open=True))
    )
    """Confidence of the intervals."""
    warmup: int = field(default=DEFAULT_WARMUP, metadata=cli(click_type=click.IntRange(min=0)))
    """Checkpoints (or epochs, rounds) at the start of each run reported as warm-up and left
    out."""

    def __post_init__(self) -> None:
        if not 0 <= self.runtime_floor < 1:
            raise ValueError(f"runtime floor must be in [0, 1), got {self.runtime_floor}")
        if not (math.isfinite(self.practical_floor_s) and self.practical_floor_s >= 0):
            raise ValueError(f"practical floor must be >= 0 s, got {self.practical_floor_s}")
        if self.loss_tolerance < 0:
            raise ValueError(f"loss tolerance must be >= 0, got {self.loss_tolerance}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.warmup < 0:
            raise ValueError(f"warm-up must be >= 0 checkpoints, got {self.warmup}")


@dataclass
class Difference:
    """Candidate − baseline of one measure, with its interval and whether it counts.

    Attributes:
        shift: The estimate and its interval.
        floor: The practical threshold the estimate must exceed.
        counts: The interval excludes zero and the estimate exceeds the floor (and no drift
            of the baseline as large as it).
        why_not: Why it does not count, when the interval or the floor says so.
    """

    shift: Shift
    floor: float
    counts: bool = False
    why_not: str | None = None

    @property
    def estimate(self) -> float:
        return self.shift.estimate

    @classmethod
    def judge(cls, shift: Shift, floor: float, what: str, unit: str = "s") -> Difference:
        if not shift.has_interval:
            return cls(shift, floor, False, f"{what}: {shift.method}")
        if not shift.excludes_zero:
            return cls(shift, floor, False, f"{what}: its interval includes zero")
        if abs(shift.estimate) <= floor:
            return cls(
                shift, floor, False, f"{what}: below the practical floor of {floor:.3g} {unit}"
            )
        return cls(shift, floor, True)


@dataclass
class Drift:
    """How much the baseline moved between its first runs and the ones after the other
    profiles (a pipeline that returned to the first profile: A…B…A), for every workload.

    Attributes:
        profile: The baseline profile.
        first: Runs before any other profile ran.
        last: Runs after the other profiles.
        shift: Shift of the headline figure (the pause, an epoch, ...), last − first,
            between runs; None when a side has no samples.
        runtime_s: A training run's median runtime of the last runs − of the first runs;
            None for a workload whose headline is its whole run.
    """

    profile: str
    first: list[RunRecord]
    last: list[RunRecord]
    shift: Shift | None
    runtime_s: float | None = None


@dataclass
class Comparison:
    """A candidate profile against the baseline (differences are candidate − baseline).

    Attributes:
        baseline: Baseline figures.
        candidate: Candidate figures.
        pause: The pause difference per checkpoint (measured checkpoints, all runs).
        runtime: The whole-run difference.
        stage_deltas: Stage → median difference (s), for stages both profiles measured.
        loss_delta: Final loss difference, when both recorded a finite one.
        loss_differs: The final losses differ beyond the tolerance.
        loss_unknown: A run has no finite final loss, so nobody can say the runs trained the
            same model.
        drift: The baseline's drift, when the pipeline returned to it.
        notes: Plain-language observations (dominating stage, loss mismatch, ...).
        restore: The difference in the time to load and verify the newest checkpoint, one
            figure per run, judged like the pause; None unless both profiles measured it.
            It informs; the verdict stays on the whole run.
    """

    baseline: ProfileFigures
    candidate: ProfileFigures
    pause: Difference
    runtime: Difference
    stage_deltas: dict[str, float]
    loss_delta: float | None
    loss_differs: bool = False
    loss_unknown: bool = False
    drift: Drift | None = None
    notes: list[str] = field(default_factory=list)
    restore: Difference | None = None

    @property
    def pause_delta_s(self) -> float:
        return self.pause.estimate

    @property
    def runtime_delta_s(self) -> float:
        return self.runtime.estimate

    @property
    def pause_measurable(self) -> bool:
        return self.pause.counts

    @property
    def runtime_measurable(self) -> bool:
        return self.runtime.counts

    @property
    def pause_speedup(self) -> float | None:
        """Baseline pause ÷ candidate pause (medians); > 1 means the candidate is faster."""
        if self.candidate.pause.median <= 0:
            return None
        return self.baseline.pause.median / self.candidate.pause.median

    @property
    def faster(self) -> bool | None:
        """True when the candidate's whole run is measurably faster because of its
        checkpoints, False when measurably slower on the same evidence, None otherwise
        (including when the runs may not have trained the same model)."""
        evidence = (
            self.pause_measurable and self.runtime_measurable and self.explained_by_checkpoints
        )
        if not evidence or self.loss_differs or self.loss_unknown:
            return None
        return self.runtime_delta_s < 0

    @property
    def explained_by_checkpoints(self) -> bool:
        """Whether the checkpoints' time difference can account for the run's: a 10 ms
        faster checkpoint cannot explain a run 3 s shorter (nor slower ones a longer run
        when they are not slower)."""
        checkpoints = max(self.baseline.checkpoint_count, self.candidate.checkpoint_count, 1)
        same_direction = (self.pause_delta_s > 0) == (self.runtime_delta_s > 0)
        return same_direction and abs(self.pause_delta_s) * checkpoints > self.runtime.floor


def _blocks(base: ProfileFigures, cand: ProfileFigures) -> tuple[int, int] | None:
    """The candidate's and the baseline's blocks of back-to-back runs, when known."""
    if cand.blocks is None or base.blocks is None:
        return None
    return cand.blocks, base.blocks


def _runtime_shift(base: ProfileFigures, cand: ProfileFigures, t: Thresholds) -> Shift:
    """The runs' runtimes against each other, each run one value: Student's t between runs
    as for the pause (a range of the differences between 2 and 2 runs is a 67 % interval,
    which calls run-to-run noise a difference about every other time); one run a side has
    no interval."""
    return run_level_shift(
        [[r] for r in cand.runtimes], [[r] for r in base.runtimes], t.confidence,
        _blocks(base, cand), CHECKPOINT.runs_per_block,
    )  # fmt: skip


def _restore_difference(
    base: ProfileFigures, cand: ProfileFigures, t: Thresholds
) -> Difference | None:
    x, y = cand.restores, base.restores
    if not x or not y:
        return None
    blocks, per_block = _blocks(base, cand), CHECKPOINT.runs_per_block
    shift = run_level_shift([[v] for v in x], [[v] for v in y], t.confidence, blocks, per_block)
    return Difference.judge(shift, t.practical_floor_s, "restore")


def compare(
    baseline: ProfileFigures,
    candidate: ProfileFigures,
    thresholds: Thresholds,
    pause: Difference,
    drift: Drift | None = None,
) -> Comparison:
    """Compare a candidate's whole training run with the baseline's, robust and symmetric,
    given the headline's difference (the pause per checkpoint, judged by the verdict's
    engine as every workload's headline is, the baseline's drift already applied)."""
    t = thresholds
    runtime_floor = t.runtime_floor * max(baseline.runtime_s, candidate.runtime_s)
    runtime = Difference.judge(_runtime_shift(baseline, candidate, t), runtime_floor, "runtime")
    stage_deltas = {
        s: candidate.stages[s].median - baseline.stages[s].median
        for s in STAGES
        if s in baseline.stages and s in candidate.stages
    }
    losses = (baseline.final_loss, candidate.final_loss)
    loss_delta = losses[1] - losses[0] if None not in losses else None  # type: ignore[operator]
    # Relative to the larger loss (symmetric); absolute when both are 0.
    loss_scale = max(abs(losses[0] or 0.0), abs(losses[1] or 0.0)) or 1.0
    loss_differs = loss_delta is not None and abs(loss_delta) > t.loss_tolerance * loss_scale
    result = Comparison(
        baseline=baseline,
        candidate=candidate,
        pause=pause,
        runtime=runtime,
        stage_deltas=stage_deltas,
        loss_delta=loss_delta,
        loss_differs=loss_differs,
        loss_unknown=loss_delta is None,
        drift=drift,
        restore=_restore_difference(baseline, candidate, t),
    )
    result.notes = _drift_notes(result) + _notes(result)
    return result


def _drift_notes(c: Comparison) -> list[str]:
    """Say when the baseline's runtime drifted as much as the whole run's difference, and
    then do not count it (the headline's drift is the engine's, for every workload)."""
    notes: list[str] = []
    drift, name = c.drift, c.candidate.profile
    if drift is None or drift.runtime_s is None:
        return notes
    if abs(drift.runtime_s) >= abs(c.runtime.estimate):
        if c.runtime.counts:
            c.runtime.counts = False
            c.runtime.why_not = "runtime: no larger than the baseline's drift"
        notes.append(
            f"{drift.profile}'s own runtime moved by {seconds(drift.runtime_s, signed=True)} s between its first "
            f"and its last runs (drift), at least as much as the difference to {name} "
            f"({seconds(c.runtime.estimate, signed=True)} s): the difference may be drift, not the profile"
        )
    return notes


def _notes(c: Comparison) -> list[str]:
    notes = []
    name, base = c.candidate.profile, c.baseline.profile
    if not c.pause.shift.has_interval:
        notes.append(
            f"{name} vs {base}: {c.pause.shift.method}; no pause difference counts"
            + (": more runs (repeats) are needed" if c.pause.shift.n_x or c.pause.shift.n_y else "")
        )
    if c.pause_measurable and not c.runtime_measurable:
        share = c.baseline.pause_share
        shown = (
            f" (checkpoints paused {share:.1%} of the baseline run)" if share is not None else ""
        )
        faster = "faster" if c.pause_delta_s < 0 else "slower"
        notes.append(
            f"{name} checkpoints are measurably {faster}, but the whole run is not: another "
            f"stage of the run dominates{shown}"
        )
    if c.runtime_measurable and not c.explained_by_checkpoints:
        longer = "longer" if c.runtime_delta_s > 0 else "shorter"
        checkpoints = max(c.baseline.checkpoint_count, c.candidate.checkpoint_count, 1)
        notes.append(
            f"the run is {seconds(abs(c.runtime_delta_s))} s {longer}, but {checkpoints} checkpoints "
            f"differing by {seconds(c.pause_delta_s, signed=True)} s each cannot explain it: not put down to "
            "storage"
        )
    # The stage that dominates the baseline pause, so a team knows what storage can fix.
    inner = {s: f.median for s, f in c.baseline.stages.items() if s not in ("pause", "total")}
    if inner:
        top = max(inner, key=inner.get)  # type: ignore[arg-type]
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
    for figures in (c.baseline, c.candidate):
        if figures.loss_problem:
            notes.append(
                f"{figures.profile}: {figures.loss_problem}: nothing shows the runs trained "
                "the same model, so neither is declared better (final loss unknown)"
            )
    return notes
