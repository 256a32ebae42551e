"""Which profile to use, and why: one recommender for every workload.

Each profile becomes a :class:`ProfileFit` (does it meet the budget, what it costs a month,
is it measurably faster or slower than the baseline); :func:`choose` picks from the fits
with one set of rules and one set of words:

- With a budget: the cheapest profile a month that meets it; none → ``none``. The
  checkpoint budget (``--max-pause-s``, ``--max-pause-share``) is met when, in every run
  of the profile, the one-sided upper confidence bound of the run's median measured pause
  is within ``max_pause_s`` and that bound × the run's checkpoints / its runtime within
  ``max_pause_share`` (the run is the unit, not the pooled checkpoints); a data
  workload's (``--min-au``, ``--max-p99-ms``) is tested on its row's figure
  (:mod:`checkpoint_compare.table`).
- Without a budget, with ``--checkpoints-per-month`` (checkpoints): the profile with the
  lowest net cost a month, storage + the GPU time its checkpoints pause training. A
  candidate's pause counts as different from the baseline's only when its difference
  counts; otherwise it is charged the baseline's pause (no credit for what the
  measurement cannot tell apart).
- With neither: the verdict's profile when the verdict keeps one on the cost of a run;
  otherwise the cheapest of the measurably faster profiles, or, when none is, the cheapest
  profile that is not measurably slower.

Priced before unpriced, always: nothing is said of what an unpriced profile costs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from checkpoint_compare.comparison import NO_DIFFERENCE, Comparison
from checkpoint_compare.cost import Pricing, ProfileCost
from checkpoint_compare.figures import ProfileFigures
from checkpoint_compare.formatting import seconds, usd
from checkpoint_compare.intervals import median_upper_bound
from checkpoint_compare.table import NONE_MEETS, Budget, WorkloadRow

if TYPE_CHECKING:
    from checkpoint_compare.verdict import Verdict


@dataclass
class ProfileFit:
    """One profile against the budget and the cadence.

    Attributes:
        profile: The profile.
        pause_high_s: The largest of its runs' upper confidence bounds of their median
            measured pause (None: a run has too few checkpoints).
        share_high: The largest of its runs' bound × checkpoints / runtime.
        meets: Whether it meets the budget with confidence (None without a budget).
        why: In words.
        storage_month: Storage USD a month (None: not priced).
        gpu_month: GPU USD a month paused by checkpoints at the cadence (None without one).
        direction: Against the baseline: ``better``/``worse`` when the difference counts,
            else ``none``.
        eligible: False for a profile that may never be recommended (a diverged run).
    """

    profile: str
    pause_high_s: float | None
    share_high: float | None
    meets: bool | None
    why: str
    storage_month: float | None
    gpu_month: float | None
    direction: str = "none"
    eligible: bool = True

    @property
    def monthly(self) -> float | None:
        """Storage + GPU time paused a month (storage alone without a cadence)."""
        if self.storage_month is None:
            return None
        return self.storage_month + (self.gpu_month or 0.0)


@dataclass
class Recommendation:
    """The profile to use (or ``none``) and why."""

    profile: str
    reason: str
    budget: Budget
    confidence: float
    fits: list[ProfileFit] = field(default_factory=list)


def _effective_pause(figures: ProfileFigures, comparisons: dict[str, Comparison]) -> float:
    """The pause to charge a profile: its own when its difference to the baseline counts,
    the baseline's when it does not (no credit for what cannot be told apart)."""
    comp = comparisons.get(figures.profile)
    if comp is None:  # the baseline
        return figures.pause.median
    if comp.pause_measurable:
        return comp.baseline.pause.median + comp.pause_delta_s
    return comp.baseline.pause.median


def _run_bounds(
    figures: ProfileFigures, confidence: float
) -> tuple[float | None, float | None, str]:
    """The pause bound and the paused share a budget is tested on: each run's own upper
    confidence bound of its median pause, and the largest over the runs. A run is the unit
    (its checkpoints share its minutes on the machine), so pooling the checkpoints of two
    runs would let them stand in for runs: the profile meets the budget when every run
    does. None, and why, when a run has too few checkpoints for a bound."""
    highs, shares = [], []
    for run in figures.per_run:
        pauses = [v for _, v in run.measured]
        high = median_upper_bound(pauses, confidence)
        if high is None:
            return (
                None,
                None,
                (
                    f"too few checkpoints in run {run.run.label} ({len(pauses)} after "
                    f"warm-up) for a {confidence:.0%} bound on its pause"
                ),
            )
        highs.append(high)
        shares.append(high * run.checkpoint_count / run.runtime_s)
    return max(highs), max(shares), ""


def _fit(
    figures: ProfileFigures,
    cost: ProfileCost,
    budget: Budget,
    has_limit: bool,
    pricing: Pricing,
    comparisons: dict[str, Comparison],
    confidence: float,
) -> ProfileFit:
    high, share, too_few = _run_bounds(figures, confidence)
    runs = f" in each of its {len(figures.per_run)} runs" if len(figures.per_run) > 1 else ""
    gpu = None
    if budget.checkpoints_per_month is not None:
        pause = _effective_pause(figures, comparisons)
        gpu = budget.checkpoints_per_month * pause * pricing.gpu_hourly_usd / 3600
    meets, why = None, ""
    if figures.loss_problem:
        meets = False if has_limit else None
        why = f"not recommended: {figures.loss_problem}"
    elif has_limit:
        if high is None:
            meets, why = False, too_few
        else:
            problems = []
            if budget.max_pause_s is not None and high > budget.max_pause_s:
                problems.append(f"pause up to {seconds(high)} s > {budget.max_pause_s:g} s")
            if budget.max_pause_share is not None and share > budget.max_pause_share:  # type: ignore[operator]
                problems.append(
                    f"paused up to {share:.1%} of the run > {budget.max_pause_share:.1%}"
                )
            meets = not problems
            why = "; ".join(problems) or (
                f"pause ≤ {seconds(high)} s, paused ≤ {share:.1%} of the run{runs}"  # type: ignore[str-format]
            )
    return ProfileFit(
        profile=figures.profile,
        pause_high_s=high,
        share_high=share,
        meets=meets,
        why=why,
        storage_month=cost.storage_month if cost.known else None,
        gpu_month=gpu,
    )


_usd = usd


def _cost_words(fit: ProfileFit, cadence: float | None) -> str:
    if fit.monthly is None:
        return "not priced"
    if cadence is None:
        return f"{_usd(fit.monthly)} a month of storage"
    return (
        f"{_usd(fit.monthly)} a month (storage {_usd(fit.storage_month or 0.0)} + GPU time "
        f"paused {_usd(fit.gpu_month or 0.0)} at {cadence:,.0f} checkpoints a month)"
    )


def _unpriced(fits: list[ProfileFit]) -> list[str]:
    return [f.profile for f in fits if f.monthly is None]


def _cheapest(fits: list[ProfileFit]) -> ProfileFit:
    """Priced before unpriced, then the lowest monthly cost, then the lowest pause bound;
    ties keep the given order (baseline first)."""
    return min(
        fits,
        key=lambda f: (
            f.monthly is None,
            f.monthly or 0.0,
            math.inf if f.pause_high_s is None else f.pause_high_s,
        ),
    )


@dataclass(frozen=True)
class _RunFigure:
    """One run's figures as a data workload's budget test reads them."""

    median: float
    au: float | None


def every_run_meets(row: WorkloadRow, budget: Budget, p: Any) -> bool | None:
    """A data workload's budget is met when every run meets it, each on its own median (the
    run is the unit: the epochs of a quick run must not carry a run that starved the GPUs);
    None when no budget was asked or a run has no figure to judge. ``p``: a profile's
    verdict (its ``run_samples``, ``run_au``)."""
    tests = [
        row.budget(_RunFigure(statistics.median(s), statistics.median(a) if a else None), budget)
        for s, a in zip(p.run_samples, p.run_au or [[]] * len(p.run_samples), strict=True)
        if s
    ]
    if not tests or any(t is None for t in tests):
        return None
    return all(tests)


def recommend(verdict: Verdict, pricing: Pricing) -> Recommendation:
    """Recommend a profile for any workload, given its verdict (profiles baseline first):
    each profile's fit (a training row: the pause bound of every run, the net cost at the
    cadence; a data row: its row's budget test on every run), then :func:`choose`.

    A profile with a run that has no finite final loss (it diverged, or did not say) is
    never recommended, whatever its pauses and price: nothing shows it trained the model.
    """
    row, budget, confidence = verdict.row, verdict.budget, verdict.thresholds.confidence
    has_limit = row.budget_words(budget) is not None
    comparisons = {c.name: c.comparison for c in verdict.candidates if c.comparison}
    fits = []
    for p in verdict.profiles:
        if p.figures is not None:
            fit = _fit(p.figures, p.cost, budget, has_limit, pricing, comparisons, confidence)
            fit.eligible = not p.figures.loss_problem
        else:
            fit = ProfileFit(
                profile=p.profile, pause_high_s=None, share_high=None,
                meets=every_run_meets(row, budget, p),
                why=row.budget_figure(p), gpu_month=None,
                storage_month=p.cost.storage_month if p.cost.known else None,
            )  # fmt: skip
        fit.direction = p.standing
        fits.append(fit)
    rec = Recommendation(NONE_MEETS, "", budget, confidence, fits)
    unusable = [f"{p.profile}: {p.figures.loss_problem}" for p in verdict.profiles
                if p.figures is not None and p.figures.loss_problem]  # fmt: skip
    if not any(f.eligible for f in fits):
        rec.reason = "no profile can be recommended: " + "; ".join(unusable)
        return rec
    if why := row.unjudgeable(verdict.profiles, budget):
        rec.reason = why
        return rec
    # A training row's verdict weighs the whole run's cost; a data row's says only which
    # profile is faster, so the cheapest that is rules.
    kept = verdict.verdict if row.training and verdict.verdict != NO_DIFFERENCE else None
    rec.profile, rec.reason = choose(
        fits, has_limit=has_limit,
        level=f" with {confidence:.0%} confidence" if row.budget_confidence else "",
        cadence=budget.checkpoints_per_month, verdict_profile=kept,
    )  # fmt: skip
    if unusable:
        rec.reason += f" ({'; '.join(unusable)}: not recommended)"
    return rec


def choose(
    fits: list[ProfileFit],
    *,
    has_limit: bool,
    level: str = "",
    cadence: float | None = None,
    verdict_profile: str | None = None,
) -> tuple[str, str]:
    """The profile to use of ``fits`` (baseline first), and why; ``NONE_MEETS`` when none
    meets the budget. ``level``: how the budget was tested (e.g. `` with 95% confidence``);
    ``cadence``: checkpoints a month, for the net cost; ``verdict_profile``: the profile
    the verdict keeps on the cost of a run, if it keeps one."""
    eligible = [f for f in fits if f.eligible]
    if has_limit:
        meeting = [f for f in eligible if f.meets]
        if not meeting:
            return NONE_MEETS, f"no profile meets the budget{level}: " + "; ".join(
                f"{f.profile}: {f.why}" for f in fits
            )
        best = _cheapest(meeting)
        unpriced = _unpriced(meeting)
        if best.monthly is None:
            return best.profile, (
                f"{best.profile} meets the budget{level} ({best.why}); not priced "
                f"({', '.join(unpriced)}): nothing is said of what it costs"
            )
        priced = [f for f in meeting if f.monthly is not None]
        of = f" (of {len(priced)} that do)" if len(priced) > 1 else ""
        which, also = "", ""
        if unpriced:
            which = " priced profile"
            also = f"; {', '.join(unpriced)} also meets it, not priced: nothing is said of its cost"
        return best.profile, (
            f"{best.profile} meets the budget{level} ({best.why}) and is the cheapest"
            f"{which} that does{of}: {_cost_words(best, cadence)}{also}"
        )
    priced = [f for f in eligible if f.monthly is not None]
    if cadence is not None and priced:
        return _net_cost(fits, priced, cadence)
    if verdict_profile:
        hint = (
            "no pause budget (--max-pause-s, --max-pause-share) or cadence "
            "(--checkpoints-per-month) given"
        )
        return verdict_profile, f"{hint}: the verdict's profile, on the cost of one run"
    better = [f for f in eligible if f.direction == "better"]
    pool = better or [f for f in eligible if f.direction != "worse"] or eligible
    what = "is measurably faster" if better else "is not measurably slower"
    best = _cheapest(pool)
    if best.monthly is None:
        return best.profile, (
            f"{best.profile} is the first profile that {what}, in the pipeline's order; not "
            "priced: nothing is said of what it costs"
        )
    others = [f.profile for f in pool if f.monthly is None]
    also = f"; {', '.join(others)} not priced: nothing is said of its cost" if others else ""
    return best.profile, (
        f"{best.profile} is the cheapest profile that {what}: {_cost_words(best, cadence)}{also}"
    )


def _net_cost(fits: list[ProfileFit], priced: list[ProfileFit], cadence: float) -> tuple[str, str]:
    """The priced profile with the lowest storage + GPU time paused a month."""
    best = _cheapest(priced)
    base = fits[0]
    if base.monthly is None:
        # No saving is claimed against a profile whose cost is unknown.
        return best.profile, (
            f"{best.profile} has the best net cost of the priced profiles: "
            f"{_cost_words(best, cadence)}; {', '.join(_unpriced(fits))} not priced, "
            "so no saving against it is claimed"
        )
    if best is base:
        return best.profile, (
            f"{best.profile} (the baseline) has the best net cost: no other profile saves "
            f"more GPU time than its storage costs; {_cost_words(best, cadence)}"
        )
    saving = (base.monthly or 0.0) - (best.monthly or 0.0)
    return best.profile, (
        f"{best.profile} has the best net cost, {_usd(saving)} a month less than "
        f"{base.profile}: {_cost_words(best, cadence)}"
    )
