"""A candidate profile against the baseline, noise-aware and symmetric.

Noise model (documented in docs/compare.md): the checkpoints of one run are repeated
measurements of the same operation, so the spread between them (max − min of the pause)
is the noise floor. A pause difference between two profiles counts only when it exceeds
the larger of the two spreads and a practical floor. The whole run is one measurement, so
its runtime difference counts only when it exceeds what checkpoint jitter alone could add
up to (spread × number of checkpoints) and a relative floor for everything else that
varies between runs.

Every rule is symmetric: swapping baseline and candidate swaps the sign of each delta and
nothing else, and a slower profile needs the same evidence as a faster one.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from checkpoint_compare.figures import MIN_CHECKPOINTS, ProfileFigures
from checkpoint_storage_bench.contract import STAGES


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
    """Noise floors of the verdict.

    Attributes:
        runtime_floor: Relative runtime change below which whole runs count as equal,
            for the variation that checkpoints do not explain (data loading, scheduling).
        practical_floor_s: A checkpoint pause difference smaller than this never counts,
            however steady the pauses: below it a difference is clock and scheduler
            jitter on one node, and worth nothing in GPU time.
        loss_tolerance: Relative final-loss difference tolerated; beyond it the runs did
            not train the same model and no profile is declared better.
    """

    runtime_floor: float = 0.02
    practical_floor_s: float = 0.01
    loss_tolerance: float = 1e-3

    def __post_init__(self) -> None:
        if not 0 <= self.runtime_floor < 1:
            raise ValueError(f"runtime floor must be in [0, 1), got {self.runtime_floor}")
        if not (math.isfinite(self.practical_floor_s) and self.practical_floor_s >= 0):
            raise ValueError(f"practical floor must be >= 0 s, got {self.practical_floor_s}")
        if self.loss_tolerance < 0:
            raise ValueError(f"loss tolerance must be >= 0, got {self.loss_tolerance}")


@dataclass
class Comparison:
    """A candidate profile against the baseline (deltas are candidate − baseline).

    Attributes:
        baseline: Baseline figures.
        candidate: Candidate figures.
        pause_delta_s: Median pause difference.
        pause_noise_s: The pause noise floor used: the larger spread, at least the
            practical floor.
        pause_measurable: Whether |pause_delta_s| exceeds the noise.
        runtime_delta_s: Runtime difference.
        runtime_noise_s: The runtime noise floor used.
        runtime_measurable: Whether |runtime_delta_s| exceeds it.
        stage_deltas: Stage → median difference (s), for stages both runs measured.
        loss_delta: Final loss difference, when both recorded a finite one.
        loss_differs: The final losses differ beyond the tolerance.
        loss_unknown: A run has no finite final loss, so nobody can say the runs trained the
            same model.
        notes: Plain-language observations (dominating stage, loss mismatch, ...).
    """

    baseline: ProfileFigures
    candidate: ProfileFigures
    pause_delta_s: float
    pause_noise_s: float
    pause_measurable: bool
    runtime_delta_s: float
    runtime_noise_s: float
    runtime_measurable: bool
    stage_deltas: dict[str, float]
    loss_delta: float | None
    loss_differs: bool = False
    loss_unknown: bool = False
    notes: list[str] = field(default_factory=list)

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
        return same_direction and abs(self.pause_delta_s) * checkpoints > self.runtime_noise_s


def compare(
    baseline: ProfileFigures, candidate: ProfileFigures, thresholds: Thresholds
) -> Comparison:
    """Compare a candidate profile with the baseline, noise-aware and symmetric."""
    pause_delta = candidate.pause.median - baseline.pause.median
    pause_noise = max(baseline.pause.spread, candidate.pause.spread, thresholds.practical_floor_s)
    checkpoints = max(baseline.checkpoint_count, candidate.checkpoint_count, 1)
    runtime_delta = candidate.runtime_s - baseline.runtime_s
    longer_run = max(baseline.runtime_s, candidate.runtime_s)
    runtime_noise = max(pause_noise * checkpoints, thresholds.runtime_floor * longer_run)
    stage_deltas = {
        s: candidate.stages[s].median - baseline.stages[s].median
        for s in STAGES
        if s in baseline.stages and s in candidate.stages
    }
    losses = (baseline.final_loss, candidate.final_loss)
    loss_delta = losses[1] - losses[0] if None not in losses else None
    enough = min(baseline.pause.n, candidate.pause.n) >= MIN_CHECKPOINTS
    # Relative to the larger loss (symmetric); absolute when both are 0.
    loss_scale = max(abs(losses[0] or 0.0), abs(losses[1] or 0.0)) or 1.0
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
        loss_unknown=loss_delta is None,
    )
    result.notes = _notes(result)
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


def _notes(c: Comparison) -> list[str]:
    notes = []
    name, base = c.candidate.profile, c.baseline.profile
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
    for figures in (c.baseline, c.candidate):
        if figures.loss_problem:
            notes.append(
                f"{figures.profile} {figures.loss_problem}: nothing shows the runs trained the "
                "same model, so neither is declared better (final loss unknown)"
            )
    return notes
