"""Which profile to use: the cheapest one that meets a pause budget with confidence, or the
one with the best net cost at the team's checkpoint cadence, and why.

- With a budget (``--max-pause-s`` per checkpoint and/or ``--max-pause-share`` of the
  runtime): a profile meets it when the one-sided upper confidence bound of its median
  measured pause is within ``max_pause_s``, and that bound × checkpoints per run / runtime is
  within ``max_pause_share``. Of those that meet it, the cheapest per month is recommended;
  when none does, the answer is ``none``.
- Without a budget, with ``--checkpoints-per-month``: the profile with the lowest net cost a
  month, storage + the GPU time its checkpoints pause training. A candidate's pause counts
  as different from the baseline's only when its difference counts; otherwise it is charged
  the baseline's pause (no credit for what the measurement cannot tell apart).
- With neither: the verdict's profile; when no profile is measurably different, the cheapest
  to keep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from checkpoint_compare.comparison import Comparison
from checkpoint_compare.cost import Pricing, ProfileCost
from checkpoint_compare.figures import ProfileFigures
from checkpoint_compare.formatting import seconds, usd
from checkpoint_compare.intervals import median_upper_bound
from checkpoint_storage_bench.config_cli import FiniteFloat, cli

NONE_MEETS = "none"
"""``recommended_profile`` when no profile meets the budget."""


@dataclass(frozen=True)
class Budget:
    """What the team can accept and how often it checkpoints (one section of the verdict's
    settings: each field is an option of ``python -m checkpoint_compare``)."""

    max_pause_s: float | None = field(default=None, metadata=cli(click_type=FiniteFloat()))
    """Pause budget: the longest acceptable (median) pause per checkpoint, seconds."""
    max_pause_share: float | None = field(default=None, metadata=cli(click_type=FiniteFloat(0, 1)))
    """Pause budget: the largest acceptable share of the runtime spent paused (0-1)."""
    checkpoints_per_month: float | None = field(
        default=None, metadata=cli(click_type=FiniteFloat())
    )
    """The team's checkpoint cadence, for the net cost (GPU time paused + storage)."""

    def __post_init__(self) -> None:
        for name in ("max_pause_s", "max_pause_share", "checkpoints_per_month"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.max_pause_share is not None and self.max_pause_share > 1:
            raise ValueError(
                f"max_pause_share is a share of the runtime (0-1): {self.max_pause_share}"
            )

    @property
    def has_limit(self) -> bool:
        return self.max_pause_s is not None or self.max_pause_share is not None


@dataclass
class ProfileFit:
    """One profile against the budget and the cadence.

    Attributes:
        profile: The profile.
        pause_high_s: Upper confidence bound of its median measured pause (None: too few).
        share_high: That bound × checkpoints per run / runtime.
        meets: Whether it meets the budget with confidence (None without a budget).
        why: In words.
        storage_month: Storage USD a month (None: not priced).
        gpu_month: GPU USD a month paused by checkpoints at the cadence (None without one).
    """

    profile: str
    pause_high_s: float | None
    share_high: float | None
    meets: bool | None
    why: str
    storage_month: float | None
    gpu_month: float | None

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


def _fit(
    figures: ProfileFigures,
    cost: ProfileCost,
    budget: Budget,
    pricing: Pricing,
    comparisons: dict[str, Comparison],
    confidence: float,
) -> ProfileFit:
    high = median_upper_bound(figures.measured_pauses, confidence)
    share = high * figures.checkpoint_count / figures.runtime_s if high is not None else None
    gpu = None
    if budget.checkpoints_per_month is not None:
        pause = _effective_pause(figures, comparisons)
        gpu = budget.checkpoints_per_month * pause * pricing.gpu_hourly_usd / 3600
    meets, why = None, ""
    if figures.loss_problem:
        meets = False if budget.has_limit else None
        why = f"not recommended: {figures.loss_problem}"
    elif budget.has_limit:
        if high is None:
            meets = False
            why = (
                f"too few checkpoints ({len(figures.measured_pauses)} after warm-up) for a "
                f"{confidence:.0%} bound on its pause"
            )
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
                f"pause ≤ {seconds(high)} s, paused ≤ {share:.1%} of the run"  # type: ignore[str-format]
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


def _cost_words(fit: ProfileFit, budget: Budget) -> str:
    if fit.monthly is None:
        return "not priced"
    if budget.checkpoints_per_month is None:
        return f"{_usd(fit.monthly)} a month of storage"
    return (
        f"{_usd(fit.monthly)} a month (storage {_usd(fit.storage_month or 0.0)} + GPU time "
        f"paused {_usd(fit.gpu_month or 0.0)} at {budget.checkpoints_per_month:,.0f} "
        "checkpoints a month)"
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


def recommend(
    profiles: list[ProfileFigures],
    costs: dict[str, ProfileCost],
    comparisons: list[Comparison],
    verdict_profile: str | None,
    budget: Budget,
    pricing: Pricing,
    confidence: float,
) -> Recommendation:
    """Recommend a profile (``profiles`` baseline first).

    A profile with a run that has no finite final loss (it diverged, or did not say) is
    never recommended, whatever its pauses and price: nothing shows it trained the model.
    """
    by_candidate = {c.candidate.profile: c for c in comparisons}
    fits = [_fit(f, costs[f.profile], budget, pricing, by_candidate, confidence) for f in profiles]
    rec = Recommendation(NONE_MEETS, "", budget, confidence, fits)
    unusable = [f"{p.profile}: {p.loss_problem}" for p in profiles if p.loss_problem]
    left_out = f" ({'; '.join(unusable)}: not recommended)" if unusable else ""
    eligible = [fit for fit, p in zip(fits, profiles, strict=True) if not p.loss_problem]
    if not eligible:
        rec.reason = "no profile can be recommended: " + "; ".join(unusable)
        return rec
    rec.reason = _choose(rec, fits, eligible, verdict_profile, budget, confidence) + left_out
    return rec


def _choose(
    rec: Recommendation,
    fits: list[ProfileFit],
    eligible: list[ProfileFit],
    verdict_profile: str | None,
    budget: Budget,
    confidence: float,
) -> str:
    """Set ``rec.profile`` from the eligible fits (``fits`` baseline first); return why."""
    level = f"{confidence:.0%} confidence"
    if budget.has_limit:
        meeting = [f for f in eligible if f.meets]
        if not meeting:
            return f"no profile meets the budget with {level}: " + "; ".join(
                f"{f.profile}: {f.why}" for f in fits
            )
        best = _cheapest(meeting)
        rec.profile = best.profile
        unpriced = _unpriced(meeting)
        if best.monthly is None:
            return (
                f"{best.profile} meets the budget with {level} ({best.why}); not priced "
                f"({', '.join(unpriced)}): nothing is said of what it costs"
            )
        priced = [f for f in meeting if f.monthly is not None]
        of = f" (of {len(priced)} that do)" if len(priced) > 1 else ""
        which, also = "", ""
        if unpriced:
            which = " priced profile"
            also = f"; {', '.join(unpriced)} also meets it, not priced: nothing is said of its cost"
        return (
            f"{best.profile} meets the budget with {level} ({best.why}) and is the cheapest"
            f"{which} that does{of}: {_cost_words(best, budget)}{also}"
        )
    priced = [f for f in eligible if f.monthly is not None]
    if budget.checkpoints_per_month is not None and priced:
        best = _cheapest(priced)
        base = fits[0]
        rec.profile = best.profile
        if base.monthly is None:
            # No saving is claimed against a profile whose cost is unknown.
            return (
                f"{best.profile} has the best net cost of the priced profiles: "
                f"{_cost_words(best, budget)}; {', '.join(_unpriced(fits))} not priced, "
                "so no saving against it is claimed"
            )
        if best is base:
            return (
                f"{best.profile} (the baseline) has the best net cost: no other profile saves "
                f"more GPU time than its storage costs; {_cost_words(best, budget)}"
            )
        saving = (base.monthly or 0.0) - (best.monthly or 0.0)
        return (
            f"{best.profile} has the best net cost, {_usd(saving)} a month less than "
            f"{base.profile}: {_cost_words(best, budget)}"
        )
    hint = "no pause budget (--max-pause-s, --max-pause-share) or cadence (--checkpoints-per-month) given"
    if verdict_profile:
        rec.profile = verdict_profile
        return f"{hint}: the verdict's profile, on the cost of one run"
    best = _cheapest(priced) if priced else eligible[0]
    rec.profile = best.profile
    return (
        f"{hint}; no profile is measurably different, so the cheapest to keep: "
        f"{_cost_words(best, budget)}"
    )
