"""The verdict: figures, comparisons and costs put together into one answer a team can act on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from checkpoint_compare.comparability import check_comparable
from checkpoint_compare.comparison import (
    NO_DIFFERENCE,
    Comparison,
    Difference,
    Drift,
    Outcome,
    Thresholds,
    compare,
    measure_drift,
)
from checkpoint_compare.cost import (
    CostDelta,
    Pricing,
    ProfileCost,
    cost_delta,
    general_assumptions,
    profile_cost,
)
from checkpoint_compare.figures import ProfileFigures, profile_figures
from checkpoint_compare.formatting import level, seconds, usd
from checkpoint_compare.grouping import ProfileRuns, block_counts, pick_baseline
from checkpoint_compare.intervals import Shift
from checkpoint_compare.recommendation import Budget, Recommendation, recommend
from checkpoint_compare.records import RunRecord
from checkpoint_compare.switches import check_switches
from checkpoint_compare.table import CHECKPOINT
from checkpoint_storage_bench.contract import (
    RECOMMENDED_PROFILE_OUTPUT,
    VERDICT_OUTPUT,
    profile_output,
)


@dataclass
class Candidate:
    """A non-baseline profile: its timing comparison, cost difference and outcome."""

    comparison: Comparison
    cost: CostDelta | None
    outcome: Outcome
    reason: str


@dataclass
class Verdict:
    """The answer and everything behind it that the reports show.

    Attributes:
        baseline: The profile the others are compared with.
        profiles: Figures per profile, baseline first.
        costs: Cost figures per profile.
        candidates: One entry per non-baseline profile.
        verdict: The profile to keep, or "no measurable difference".
        reason: Why, in one sentence.
        assumptions: Cost assumptions, general then per profile.
        failed_runs: Failed training runs that were seen and not used.
        thresholds: The noise floors used.
        drift: The baseline's drift, when the pipeline returned to it at the end.
        recommendation: The profile to use given the budget and cadence, and why.
        notes: About the whole comparison (checks that could not be made, resumed runs).
    """

    baseline: str
    profiles: list[ProfileFigures]
    costs: dict[str, ProfileCost]
    candidates: list[Candidate]
    verdict: str
    reason: str
    assumptions: list[str]
    failed_runs: list[RunRecord] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)
    drift: Drift | None = None
    recommendation: Recommendation | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def winners(self) -> list[Candidate]:
        """Candidates measurably better than the baseline on the whole: faster and not
        costlier per run, or slower but cheaper per run (the GPU time lost is worth less
        than the storage saved)."""
        return [c for c in self.candidates if c.outcome in _WINS]

    @property
    def best(self) -> Candidate | None:
        """The candidate the verdict is about: the cheapest winner per run (the fastest
        when not priced), else the most informative one."""
        if not self.candidates:
            return None
        if self.winners:
            return min(self.winners, key=_cheapest)
        return min(
            self.candidates,
            key=lambda c: (_ORDER.index(c.outcome), c.comparison.runtime_delta_s),
        )


_WINS = (Outcome.BETTER, Outcome.SLOWER_CHEAPER)
_ORDER = [
    Outcome.BETTER,
    Outcome.SLOWER_CHEAPER,
    Outcome.FASTER_COSTLIER,
    Outcome.WORSE,
    Outcome.NO_DIFFERENCE,
]


def _cheapest(c: Candidate) -> tuple[float, float]:
    return (c.cost.run_total if c.cost else 0.0, c.comparison.runtime_delta_s)


def interval(shift: Shift, digits: int = 3, say_why: bool = True) -> str:
    """``+0.123 s [+0.1, +0.15] 95 %`` (``digits`` significant), or the estimate and why
    there is no interval (``say_why=False``: where a note next to it says why)."""
    est = f"{seconds(shift.estimate, signed=True, digits=digits)} s"
    if not shift.has_interval:
        return f"{est} (no interval: {shift.method})" if say_why else f"{est} (no interval)"
    low, high = (seconds(v, signed=True, digits=digits) for v in (shift.low, shift.high))
    shown = level(shift.confidence, shift.asked)
    return f"{est} [{low}, {high}]" + (f" {shown}" if shown else "")


def _counted(diff: Difference) -> str:
    return "counts" if diff.counts else "does not count"


def _judge(comp: Comparison, delta: CostDelta | None) -> tuple[Outcome, str]:
    """The outcome of one pair; swapping the pair gives the mirrored outcome (better ↔
    worse, faster_costlier ↔ slower_cheaper), so the profile kept does not depend on which
    one is the baseline."""
    name, base = comp.candidate.profile, comp.baseline.profile
    faster = comp.faster
    if faster is None:
        # The same reason for no interval (one run a side) is said once, at the pause.
        same_why = not comp.runtime.shift.has_interval and (
            comp.runtime.shift.method == comp.pause.shift.method
        )
        return Outcome.NO_DIFFERENCE, (
            f"{name} vs {base}: pause per checkpoint {interval(comp.pause.shift)}, "
            f"{_counted(comp.pause)}; whole run "
            f"{interval(comp.runtime.shift, say_why=not same_why)}, "
            f"{_counted(comp.runtime)}"
            + (
                "; the checkpoints cannot account for the run's difference"
                if comp.pause.counts and comp.runtime.counts and not comp.explained_by_checkpoints
                else ""
            )
            + (
                "; the final losses differ or are unknown"
                if comp.loss_differs or comp.loss_unknown
                else ""
            )
        )
    runtime = f"a {seconds(abs(comp.runtime_delta_s))} s {'shorter' if faster else 'longer'} run"
    if delta is None:
        if faster:
            return Outcome.BETTER, f"{name} is measurably faster ({runtime}); cost not priced"
        return (
            Outcome.WORSE,
            f"{name} is measurably slower than {base} ({runtime}); cost not priced",
        )
    if faster and delta.run_total > 0:
        return Outcome.FASTER_COSTLIER, (
            f"{name} is faster ({runtime}) but costs {usd(delta.run_total)} more per run: "
            "the storage change outweighs the saved GPU time"
        )
    if faster:
        saving = "costs the same" if delta.run_total == 0 else f"saves {usd(-delta.run_total)}"
        return Outcome.BETTER, f"{name} is faster ({runtime}) and {saving} per run"
    if delta.run_total < 0:
        return Outcome.SLOWER_CHEAPER, (
            f"{name} is slower ({runtime}) but costs {usd(-delta.run_total)} less per run "
            f"than {base}: the storage saved outweighs the GPU time lost"
        )
    return Outcome.WORSE, f"{name} is measurably slower than {base} ({runtime}) and no cheaper"


def build_verdict(
    groups: list[ProfileRuns],
    pricing: Pricing,
    thresholds: Thresholds,
    baseline: str | None = None,
    failed_runs: list[RunRecord] | None = None,
    budget: Budget | None = None,
    hook_runs: list[RunRecord] | None = None,
    allow_resumed: bool = False,
) -> Verdict:
    """Compare every profile with the baseline and decide.

    Args:
        groups: The runs per profile (at least two).
        pricing: Prices.
        thresholds: Noise floors.
        baseline: The baseline profile; default the first profile run.
        failed_runs: Failed training runs to mention.
        budget: Pause budget and cadence for the recommendation.
        hook_runs: Every hook run seen: their ledgers show switches of the claim.
        allow_resumed: Rank resumed runs against uninterrupted ones anyway.

    Raises:
        NotComparable: The runs' fixed inputs, build, GPU or image differ, a resumed run
            meets an uninterrupted one, the claim was switched inside a measured interval,
            or a run lacks the figures needed.
        RunsMissing: The named baseline has no runs.
    """
    notes = check_comparable(CHECKPOINT, groups, allow_resumed)
    notes += check_switches(groups, hook_runs or [])
    figures = [profile_figures(g, thresholds.warmup) for g in groups]
    blocks = block_counts(groups)
    for f in figures:
        f.blocks = blocks[f.profile]
    baseline = pick_baseline(groups, baseline, "training")
    figures.sort(key=lambda f: f.profile != baseline)
    base = figures[0]
    costs = {f.profile: profile_cost(pricing, f.profile, f.runtime_s, f.hook) for f in figures}
    drift = measure_drift(base, figures[1:], thresholds.confidence)

    candidates = []
    for cand in figures[1:]:
        comp = compare(base, cand, thresholds, drift)
        delta = cost_delta(pricing, costs[base.profile], costs[cand.profile], comp.pause_delta_s)
        outcome, reason = _judge(comp, delta)
        candidates.append(Candidate(comp, delta, outcome, reason))

    verdict = Verdict(
        baseline=baseline,
        profiles=figures,
        costs=costs,
        candidates=candidates,
        verdict=NO_DIFFERENCE,
        reason="",
        # dict.fromkeys: the same type note for several profiles is said once
        assumptions=list(
            dict.fromkeys(
                general_assumptions(pricing) + [a for c in costs.values() for a in c.assumptions]
            )
        ),
        failed_runs=failed_runs or [],
        thresholds=thresholds,
        drift=drift,
        notes=notes,
    )
    best = verdict.best
    assert best is not None  # at least two profiles
    if best.outcome in _WINS:
        verdict.verdict = best.comparison.candidate.profile
    elif best.outcome in (Outcome.FASTER_COSTLIER, Outcome.WORSE):
        verdict.verdict = baseline
    verdict.reason = best.reason
    verdict.recommendation = recommend(
        figures,
        costs,
        [c.comparison for c in candidates],
        None if verdict.verdict == NO_DIFFERENCE else verdict.verdict,
        budget or Budget(),
        pricing,
        thresholds.confidence,
    )
    return verdict


def _round(value: float | None, digits: int = 6) -> float | None:
    """Outputs are comparison-view columns: a figure to the microsecond (or micro-dollar)
    says all the measurement can, not 1.6497099000000617."""
    return None if value is None else round(value, digits)


def op_outputs(verdict: Verdict) -> dict[str, Any]:
    """The scalars logged as outputs of the compare op (columns of the comparison view)."""
    best = verdict.best
    assert best is not None
    comp, delta = best.comparison, best.cost
    rec = verdict.recommendation
    out: dict[str, Any] = {
        VERDICT_OUTPUT: verdict.verdict,
        "verdict_reason": verdict.reason,
        "verdict_outcome": best.outcome.value,
        RECOMMENDED_PROFILE_OUTPUT: rec.profile if rec else None,
        "recommendation_reason": rec.reason if rec else None,
        "baseline_profile": verdict.baseline,
        "candidate_profile": comp.candidate.profile,
        "profile_count": len(verdict.profiles),
        "confidence": verdict.thresholds.confidence,
        "pause_speedup": comp.pause_speedup,
        "pause_delta_s": comp.pause_delta_s,
        "pause_delta_ci_low_s": comp.pause.shift.low,
        "pause_delta_ci_high_s": comp.pause.shift.high,
        "runtime_delta_s": comp.runtime_delta_s,
        "runtime_delta_ci_low_s": comp.runtime.shift.low,
        "runtime_delta_ci_high_s": comp.runtime.shift.high,
        "final_loss_delta": comp.loss_delta,
        "failed_runs": len(verdict.failed_runs),
    }
    if verdict.drift is not None:
        out["baseline_drift_runtime_s"] = verdict.drift.runtime_s
        if verdict.drift.pause is not None:
            out["baseline_drift_pause_s"] = verdict.drift.pause.estimate
    if delta is not None:
        out |= {
            "cost_delta_usd_per_checkpoint": delta.gpu_per_checkpoint,
            "cost_delta_usd_per_1000_ckpt": delta.gpu_per_1000_checkpoints,
            "storage_delta_usd_per_month": delta.storage_month,
            "run_cost_delta_usd": delta.run_total,
            "breakeven_checkpoints_per_month": delta.breakeven_checkpoints_month,
        }
    for s in verdict.profiles:
        cost = verdict.costs[s.profile]
        out |= _profile_outputs(
            s.profile,
            pause_s_median=s.pause.median,
            warmup_pause_s_median=s.warmup_median,
            runtime_s=s.runtime_s,
            runs=len(s.per_run),
            run_cost_usd=cost.run_total if cost.known else None,
        )
    for cand in verdict.candidates:
        out |= _profile_outputs(
            cand.comparison.candidate.profile,
            pause_diff_ci_low_s=cand.comparison.pause.shift.low,
            pause_diff_ci_high_s=cand.comparison.pause.shift.high,
        )
    return {k: _round(v) if isinstance(v, float) else v for k, v in out.items() if v is not None}


def _profile_outputs(profile: str, **figures: Any) -> dict[str, Any]:
    """One profile's figures under their output names."""
    return {profile_output(profile, name): value for name, value in figures.items()}
