"""The verdict: one engine for every workload, driven by the workload's row of the table.

The same steps for the checkpointing training run and for the data workloads (scan,
materialize, workspace): refuse runs that do not measure the same thing, pick the baseline,
summarise each run's headline samples (a run's pauses, epochs or rounds; its one figure),
take the run-level shift of each candidate's headline against the baseline's with its
between-run interval, hold it to the baseline's drift, price each profile, decide the
outcome and recommend. What differs is the row (:mod:`checkpoint_compare.table`): the
headline and its unit, the samples, the inputs that must match, the budget, the words; a
training row also makes the run's figures (stages, runtime, loss) and lets the whole run
and the cost of a run decide, as the outcome table in docs/compare.md says.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from datetime import datetime
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
)
from checkpoint_compare.cost import (
    CostDelta,
    Pricing,
    ProfileCost,
    cost_delta,
    general_assumptions,
    profile_cost,
)
from checkpoint_compare.errors import BadInput, NotComparable
from checkpoint_compare.figures import ProfileFigures, _hook_figures, profile_figures
from checkpoint_compare.formatting import level, seconds, usd
from checkpoint_compare.grouping import (
    ProfileRuns,
    around_the_others,
    block_counts,
    group_by_profile,
    pick_baseline,
    run_time,
)
from checkpoint_compare.intervals import Shift, counted_runs, run_level_shift
from checkpoint_compare.recommendation import Recommendation, recommend
from checkpoint_compare.records import RunKind, RunRecord
from checkpoint_compare.switches import check_switches
from checkpoint_compare.table import NONE_MEETS, Budget, WorkloadRow
from checkpoint_compare.workloads import workload_row
from checkpoint_storage_bench.config_cli import flag
from checkpoint_storage_bench.contract import (
    PROFILE_FIGURES,
    RECOMMENDED_PROFILE_OUTPUT,
    VERDICT_OUTPUT,
    WORKLOAD_INPUT,
    headline_outputs,
    output_key,
    profile_headline_figures,
    profile_output,
)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class ProfileVerdict:
    """One profile's headline figure and where it stands, the same for every workload.

    Attributes:
        profile: The profile.
        runs: Its runs, oldest first.
        run_samples: Per run, its headline samples after the warm-up (empty for a run with
            none: a training run known only by its summary outputs).
        median: The headline's median over the profile's samples (a training run's pause
            from its outputs when it has no per-checkpoint events).
        cost: Its price (storage a month, over a run, the GPU time of a run).
        blocks: How many blocks of back-to-back runs its runs make.
        run_au: Per run, the accelerator utilization samples (rows with ``au_metric``).
        figures: A training row's figures of the profile (stages, runtime, loss, fio, hook).
        difference: The headline's shift against the baseline (None for the baseline).
        relative: That shift as a share of the baseline's median.
        standing: ``better``/``worse`` when the outcome declares it faster or slower
            (a training run: the whole run), else ``none``.
        meets_budget: Whether it meets the budget asked (None: none asked, or no figure).
    """

    profile: str
    runs: list[RunRecord]
    run_samples: list[list[float]]
    median: float
    cost: ProfileCost
    blocks: int | None = None
    run_au: list[list[float]] = field(default_factory=list)
    figures: ProfileFigures | None = None
    difference: Difference | None = None
    relative: float | None = None
    standing: str = "none"
    meets_budget: bool | None = None

    @property
    def samples(self) -> list[float]:
        return [v for run in self.run_samples for v in run]

    @property
    def au_samples(self) -> list[float]:
        return [v for run in self.run_au for v in run]

    @property
    def au(self) -> float | None:
        """The median accelerator utilization over every run's samples."""
        return statistics.median(self.au_samples) if self.au_samples else None

    @property
    def shift(self) -> Shift | None:
        return self.difference.shift if self.difference else None

    @property
    def significant(self) -> bool:
        return bool(self.difference and self.difference.counts)

    @property
    def floor(self) -> float | None:
        return self.difference.floor if self.difference else None

    @property
    def direction(self) -> str:
        """``better``/``worse`` when the headline's difference counts, else ``none``."""
        if not self.significant or self.shift is None:
            return "none"
        return "better" if self.shift.estimate < 0 else "worse"

    @property
    def claimed(self) -> bool:
        """Whether the report claims a measurable difference: the headline's counts, or
        the outcome declares the profile faster or slower."""
        return self.significant or self.standing != "none"

    @property
    def claim_direction(self) -> str:
        """The way the claim points: the outcome's, else the headline's."""
        if not self.claimed:
            return "none"
        if self.standing != "none":
            return self.standing
        return "better" if self.shift and self.shift.estimate < 0 else "worse"

    @property
    def noise(self) -> float | None:
        """(max − min) / median of the samples."""
        samples = self.samples
        if not self.median or len(samples) < 2:
            return None
        return (max(samples) - min(samples)) / self.median

    @property
    def run_medians(self) -> list[float]:
        return [statistics.median(s) for s in self.run_samples if s]

    @property
    def run_labels(self) -> list[str]:
        return [r.label for r in self.runs]

    @property
    def started(self) -> datetime | None:
        return run_time(self.runs[0]) if self.runs else None


@dataclass
class Candidate:
    """A non-baseline profile: its outcome against the baseline and why.

    Attributes:
        profile: Its figures and headline difference.
        outcome: better, worse, ... (docs/compare.md's table).
        reason: Why, in one sentence.
        comparison: A training row's whole-run comparison (runtime, loss, stages, restore).
        cost: A training row's cost difference (per checkpoint, a month, one run).
        notes: What the report says of this pair (drift, a run the checkpoints cannot
            account for, a loss that differs).
    """

    profile: ProfileVerdict
    outcome: Outcome
    reason: str
    comparison: Comparison | None = None
    cost: CostDelta | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.profile.profile

    @property
    def delta(self) -> float:
        """What breaks ties between candidates: the whole run's difference for a training
        row, the headline's otherwise."""
        if self.comparison is not None:
            return self.comparison.runtime_delta_s
        return self.profile.shift.estimate if self.profile.shift else 0.0


@dataclass
class Verdict:
    """The answer and everything behind it that the reports show, for every workload.

    Attributes:
        row: The workload's row of the table: what is judged and how it is said.
        baseline: The profile the others are compared with.
        profiles: Per profile its headline and standing, baseline first.
        candidates: One entry per non-baseline profile.
        verdict: The profile to keep, or "no measurable difference".
        reason: Why, in one sentence.
        assumptions: Cost assumptions, general then per profile.
        failed_runs: Failed runs that were seen and not used.
        thresholds: The noise floors used.
        drift: The baseline's drift, when the pipeline returned to it at the end.
        recommendation: The profile to use given the budget and cadence, and why.
        notes: About the whole comparison (checks that could not be made, resumed runs).
        budget: The budget (and cadence) the workload's verdict tested: what was asked of
            it (``row.budget_fields``).
    """

    row: WorkloadRow
    baseline: str
    profiles: list[ProfileVerdict]
    candidates: list[Candidate]
    verdict: str
    reason: str
    assumptions: list[str]
    failed_runs: list[RunRecord] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)
    drift: Drift | None = None
    recommendation: Recommendation | None = None
    notes: list[str] = field(default_factory=list)
    budget: Budget = field(default_factory=Budget)

    @property
    def workload(self) -> str:
        return self.row.name

    @property
    def figures(self) -> list[ProfileFigures]:
        """A training row's figures per profile, baseline first (empty otherwise)."""
        return [p.figures for p in self.profiles if p.figures is not None]

    @property
    def costs(self) -> dict[str, ProfileCost]:
        return {p.profile: p.cost for p in self.profiles}

    @property
    def confidence(self) -> float:
        return self.thresholds.confidence

    @property
    def winners(self) -> list[Candidate]:
        """Candidates measurably better than the baseline on the whole: faster and not
        costlier per run, or slower but cheaper per run (the GPU time lost is worth less
        than the storage saved)."""
        return [c for c in self.candidates if c.outcome in _WINS]

    @property
    def best(self) -> Candidate | None:
        """The candidate the verdict is about: the cheapest winner, else the most
        informative one."""
        if not self.candidates:
            return None
        if self.winners:
            return min(self.winners, key=_cheapest)
        return min(self.candidates, key=lambda c: (_ORDER.index(c.outcome), c.delta))

    @property
    def recommended(self) -> str | None:
        """The recommended profile, None when none can be."""
        rec = self.recommendation
        return None if rec is None or rec.profile == NONE_MEETS else rec.profile

    @property
    def sentences(self) -> list[str]:
        """The verdict for people, in the workload's language: per candidate its headline,
        the notes, the budget, the recommendation."""
        out = [headline_sentence(self, p) for p in self.profiles[1:]]
        out += [f"Note: {n}." for n in self.notes]
        out += [f"Note: {n}." for c in self.candidates for n in c.notes]
        if words := budget_words(self):
            out.append(f"Budget: {words}.")
        rec = self.recommendation
        out.append(
            f"Recommendation: {self.recommended or NONE_MEETS}: {rec.reason if rec else ''}."
        )
        return out


_WINS = (Outcome.BETTER, Outcome.SLOWER_CHEAPER)
_ORDER = [
    Outcome.BETTER,
    Outcome.SLOWER_CHEAPER,
    Outcome.FASTER_COSTLIER,
    Outcome.WORSE,
    Outcome.NO_DIFFERENCE,
]


def _monthly(p: ProfileVerdict) -> tuple[bool, float]:
    """Priced before unpriced (nothing is said of what an unpriced profile costs)."""
    known = p.cost.storage_month is not None and p.cost.known
    return (not known, p.cost.storage_month if known else math.inf)  # type: ignore[return-value]


def _cheapest(c: Candidate) -> tuple[bool, float, float]:
    """A training row's winners by the cost of one run, the others' by their storage a
    month; then the larger gain."""
    if c.comparison is not None:
        return (False, c.cost.run_total if c.cost else 0.0, c.delta)
    return (*_monthly(c.profile), c.profile.median)


def budget_words(v: Verdict) -> str | None:
    """The budget asked, in words; None when none was."""
    return v.row.budget_words(v.budget)


def interval(shift: Shift, digits: int = 3, say_why: bool = True, unit: str = "s") -> str:
    """``+0.123 s [+0.1, +0.15] 95 %`` (``digits`` significant), or the estimate and why
    there is no interval (``say_why=False``: where a note next to it says why)."""
    est = f"{seconds(shift.estimate, signed=True, digits=digits)} {unit}"
    if not shift.has_interval:
        return f"{est} (no interval: {shift.method})" if say_why else f"{est} (no interval)"
    low, high = (seconds(v, signed=True, digits=digits) for v in (shift.low, shift.high))
    shown = level(shift.confidence, shift.asked)
    return f"{est} [{low}, {high}]" + (f" {shown}" if shown else "")


def _figure(value: float, unit: str) -> str:
    return f"{value:.3g} {unit}"


def headline_sentence(v: Verdict, p: ProfileVerdict) -> str:
    """One candidate's headline against the baseline's, in the workload's words."""
    base, unit = v.profiles[0], v.row.unit
    change = (
        f"{v.row.label} {_figure(p.median, unit)} vs {_figure(base.median, unit)} on {base.profile}"
    )
    shift = p.shift
    if shift is not None and shift.has_interval:
        change += (
            f" (shift {shift.estimate:+.3g} {unit}, {shift.confidence:.0%} interval "
            f"{shift.low:+.3g} to {shift.high:+.3g}, between runs)"
        )
    elif shift is not None:
        change += f" (no interval: {shift.method}; more runs, repeats, are needed)"
    if not p.significant:
        change += ": no measurable difference"
    elif p.relative is not None:
        change += f": {abs(p.relative):.0%} {'faster' if p.relative < 0 else 'slower'}"
    if p.au is not None and base.au is not None:
        if p.meets_budget is None:
            change += f"; {p.profile} at {p.au:.0%} AU, baseline {base.au:.0%}"
        else:
            fed = "keeps the GPUs fed" if p.meets_budget else "does not keep the GPUs fed"
            change += f"; {p.profile} {fed} at {p.au:.0%} AU, baseline {base.au:.0%}"
    return f"{p.profile}: {change}."


def _counted(diff: Difference) -> str:
    return "counts" if diff.counts else "does not count"


def _judge_run(comp: Comparison, delta: CostDelta | None) -> tuple[Outcome, str]:
    """A training row's outcome of one pair, on the whole run and the cost of one run;
    swapping the pair gives the mirrored outcome (better ↔ worse, faster_costlier ↔
    slower_cheaper), so the profile kept does not depend on which one is the baseline."""
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


def _samples(run: RunRecord, metric: str | None, output: str, warmup: int) -> list[float]:
    """A run's samples of ``metric`` after the warm-up; with too few (or no per-epoch
    metric), its ``output`` as its one sample."""
    values = [v for _, v in sorted(run.metrics.get(metric or "", []))]
    if len(values) > warmup:
        return values[warmup:]
    value = run.outputs.get(output)
    return [float(value)] if _number(value) else []


def _profile(
    row: WorkloadRow, g: ProfileRuns, figures: ProfileFigures | None, pricing: Pricing, warmup: int
) -> ProfileVerdict:
    """One profile's headline samples and price.

    Raises:
        BadInput: No run of the profile recorded the headline.
    """
    if figures is not None:
        run_samples = [[v for _, v in r.measured] for r in figures.per_run]
        median, duration = figures.pause.median, figures.runtime_s
    else:
        run_samples = [_samples(r, row.sample_metric, row.headline, warmup) for r in g.trainings]
        if not any(run_samples):
            raise BadInput(f"{g.profile}: no run recorded {row.headline}")
        median = statistics.median(v for s in run_samples for v in s)
        duration = median / 1000 if row.unit == "ms" else median
    hook = figures.hook if figures is not None else _hook_figures(g.hook)
    return ProfileVerdict(
        profile=g.profile,
        runs=list(g.trainings),
        run_samples=run_samples,
        median=median,
        cost=profile_cost(pricing, g.profile, duration, hook),
        run_au=[_samples(r, row.au_metric, row.au_metric, warmup) for r in g.trainings]
        if row.au_metric
        else [],
        figures=figures,
    )


def _headline_shift(
    row: WorkloadRow, base: ProfileVerdict, cand: ProfileVerdict, t: Thresholds
) -> Shift:
    """The runs' headline medians against each other: the run, not the checkpoint or the
    epoch, is what was assigned to a profile."""
    x = [s for s in cand.run_samples if s]
    y = [s for s in base.run_samples if s]
    if x and y:
        blocks = (cand.blocks or 1, base.blocks or 1)
        return run_level_shift(x, y, t.confidence, blocks, row.runs_per_block)
    return Shift(
        cand.median - base.median, None, None, None, len(x), len(y),
        "no per-checkpoint pauses after warm-up (only the runs' summary outputs, or every "
        "checkpoint was warm-up): no interval",
    )  # fmt: skip


def _drift(
    row: WorkloadRow, base: ProfileVerdict, others: list[ProfileVerdict], t: Thresholds
) -> Drift | None:
    """The baseline's runs before every other profile and after them (A…B…A): the drift of
    its headline (last − first, between runs) and, for a training run, of its runtime."""
    pairs = list(zip(base.runs, base.run_samples, strict=True))
    split = around_the_others(
        pairs, lambda pair: run_time(pair[0]), [run_time(r) for p in others for r in p.runs]
    )
    if split is None:
        return None
    first, last = split
    before, after = [s for _, s in first if s], [s for _, s in last if s]
    # Before every other profile, and after them all: one block each.
    shift = None
    if before and after:
        shift = run_level_shift(after, before, t.confidence, (1, 1), row.runs_per_block)
    runtime = None
    if base.figures is not None:
        by_run = {r.run.uuid: r.runtime_s for r in base.figures.per_run}
        runtime = statistics.median(by_run[r.uuid] for r, _ in last) - statistics.median(
            by_run[r.uuid] for r, _ in first
        )
    return Drift(base.profile, [r for r, _ in first], [r for r, _ in last], shift, runtime)


def _difference(
    row: WorkloadRow, base: ProfileVerdict, cand: ProfileVerdict, t: Thresholds, drift: Drift | None
) -> tuple[Difference, list[str]]:
    """The candidate's headline difference, held to the baseline's drift: a difference no
    larger than the drift does not count, and the note says so."""
    shift = _headline_shift(row, base, cand, t)
    diff = Difference.judge(shift, row.floor(t, base.median), row.words, row.unit)
    notes = []
    if drift is not None and drift.shift is not None:
        if abs(drift.shift.estimate) >= abs(shift.estimate):
            if diff.counts:
                diff.counts = False
                diff.why_not = f"{row.words}: no larger than the baseline's drift"
            notes.append(
                f"{base.profile}'s own {row.label} moved by "
                f"{seconds(drift.shift.estimate, signed=True)} {row.unit} between its first "
                f"and its last runs (drift), at least as much as the difference to "
                f"{cand.profile} ({seconds(shift.estimate, signed=True)} {row.unit}): the "
                "difference may be drift, not the profile"
            )
    return diff, notes + _calibration_notes(row, base, cand, shift)


def _calibration_notes(
    row: WorkloadRow, base: ProfileVerdict, cand: ProfileVerdict, shift: Shift
) -> list[str]:
    """Whether the calibration (docs/compare.md) showed this comparison's design to mean its
    95 %: with fewer runs counted a side than showed both goals, the report says it is not a
    calibrated answer, and with no more than missed a factor of two, that a difference may
    go unseen. Without an interval the shift itself says why (one run counted a side)."""
    if shift.low is None:
        return []

    def counted(p: ProfileVerdict) -> int:
        return counted_runs(sum(1 for s in p.run_samples if s), p.blocks, row.runs_per_block)

    side, calibrated = min(counted(base), counted(cand)), row.calibrated
    if calibrated.met is not None and side >= calibrated.met:
        return []
    if side <= calibrated.missed:
        said = (
            "the calibration detected a factor of two between classes in fewer than 95 % of "
            f"comparisons with {calibrated.missed} counted a side: a difference may go unseen"
        )
    else:
        shown = "none of the designs measured" if calibrated.met is None else (
            f"{calibrated.met} counted a side (profiles that alternate count more)"
        )  # fmt: skip
        said = (
            "the calibration showed both goals (a factor of two between classes detected in "
            "at least 95 % of comparisons, one class under two names told apart in at most "
            f"5 %) only with {shown}"
        )
    return [
        f"{cand.profile} and the baseline {base.profile} count {side} runs a side (at most "
        f"{row.runs_per_block} a block of back-to-back runs): {said} (docs/compare.md): not a "
        "calibrated answer"
    ]


def build_verdict(
    row: WorkloadRow,
    groups: list[ProfileRuns],
    pricing: Pricing,
    thresholds: Thresholds,
    baseline: str | None = None,
    failed_runs: list[RunRecord] | None = None,
    budget: Budget | None = None,
    hook_runs: list[RunRecord] | None = None,
    allow_resumed: bool = False,
) -> Verdict:
    """Compare every profile with the baseline and decide, for the workload of ``row``.

    Args:
        row: What the runs measured (``table.ROWS``).
        groups: The runs per profile (at least two).
        pricing: Prices.
        thresholds: Noise floors.
        baseline: The baseline profile; default the first profile run.
        failed_runs: Failed runs to mention.
        budget: The budget and cadence for the recommendation; the fields this workload
            does not test are left out, and a note names them.
        hook_runs: Every hook run seen: their ledgers show switches of the claim.
        allow_resumed: Rank resumed runs against uninterrupted ones anyway.

    Raises:
        NotComparable: The runs' fixed inputs, build, GPU, image or claim differ, a resumed
            run meets an uninterrupted one, the claim was switched inside a measured
            interval, a run lacks the figures needed, or the row refuses the runs.
        RunsMissing: The named baseline has no runs.
        BadInput: No run of a profile recorded the headline, or no baseline can be picked.
    """
    t = thresholds
    budget = budget or Budget()
    notes = check_comparable(row, groups, allow_resumed)
    if untested := row.untested(budget):
        flags = ", ".join(flag(name) for name in untested)
        notes.append(f"{flags}: not a budget of the {row.name} workload, not tested")
        budget = replace(budget, **dict.fromkeys(untested))
    notes += check_switches(groups, hook_runs or [])
    figures = {g.profile: profile_figures(g, t.warmup) for g in groups} if row.training else {}
    baseline = pick_baseline(groups, baseline, "training" if row.training else row.name)
    groups = sorted(groups, key=lambda g: g.profile != baseline)
    blocks = block_counts(groups)
    profiles = [_profile(row, g, figures.get(g.profile), pricing, t.warmup) for g in groups]
    for p in profiles:
        p.blocks = blocks[p.profile]
        if p.figures is not None:
            p.figures.blocks = p.blocks
    base = profiles[0]
    drift = _drift(row, base, profiles[1:], t)

    candidates = []
    for cand in profiles[1:]:
        cand.difference, drift_notes = _difference(row, base, cand, t, drift)
        cand.relative = cand.difference.estimate / base.median if base.median else None
        if cand.figures is not None and base.figures is not None:
            comp = compare(base.figures, cand.figures, t, cand.difference, drift)
            delta = cost_delta(pricing, base.cost, cand.cost, comp.pause_delta_s)
            outcome, reason = _judge_run(comp, delta)
            candidates.append(
                Candidate(cand, outcome, reason, comp, delta, drift_notes + comp.notes)
            )
        else:
            outcome = {"better": Outcome.BETTER, "worse": Outcome.WORSE}.get(
                cand.direction, Outcome.NO_DIFFERENCE
            )
            candidates.append(Candidate(cand, outcome, "", notes=drift_notes))
        cand.standing = {
            Outcome.BETTER: "better",
            Outcome.FASTER_COSTLIER: "better",
            Outcome.WORSE: "worse",
            Outcome.SLOWER_CHEAPER: "worse",
        }.get(outcome, "none")

    verdict = Verdict(
        row=row,
        baseline=baseline,
        profiles=profiles,
        candidates=candidates,
        verdict=NO_DIFFERENCE,
        reason="",
        # dict.fromkeys: the same type note for several profiles is said once
        assumptions=list(
            dict.fromkeys(
                general_assumptions(pricing) + [a for p in profiles for a in p.cost.assumptions]
            )
        ),
        failed_runs=failed_runs or [],
        thresholds=t,
        drift=drift,
        notes=notes,
        budget=budget,
    )
    best = verdict.best
    assert best is not None  # at least two profiles
    if best.outcome in _WINS:
        verdict.verdict = best.name
    elif best.outcome in (Outcome.FASTER_COSTLIER, Outcome.WORSE):
        verdict.verdict = baseline
    verdict.recommendation = recommend(verdict, pricing)
    for p, fit in zip(profiles, verdict.recommendation.fits, strict=True):
        p.meets_budget = fit.meets
    # A data workload's candidate is said in its headline's words, its budget known.
    for c in candidates:
        c.reason = c.reason or headline_sentence(verdict, c.profile).removesuffix(".")
    verdict.reason = best.reason
    return verdict


def judge_runs(
    records: list[RunRecord],
    pricing: Pricing,
    thresholds: Thresholds,
    baseline: str | None = None,
    budget: Budget | None = None,
    expected: tuple[str, ...] = (),
    allow_resumed: bool = False,
) -> tuple[Verdict, list[RunRecord]]:
    """The verdict over loaded runs: the workload they measured (its row), the runs per
    profile, then :func:`build_verdict`. Returns the verdict and the failed runs not used.

    Raises:
        NotComparable: Runs of several workloads, or of one profile only.
        RunsMissing: An expected profile has no successful run, or a profile's newest run
            failed.
    """
    row = workload_row(records)
    kind = RunKind.TRAINING if row.training else RunKind.DATA
    if not row.training:
        named = {
            r.profile_hint or r.inputs.get("storage_profile") for r in records if r.kind is kind
        }
        if len(named) == 1 and not expected:
            raise NotComparable(f"{row.name}: one profile only ({', '.join(map(str, named))})")
    groups, failed = group_by_profile(records, expected, kind=kind)
    verdict = build_verdict(
        row,
        groups,
        pricing,
        thresholds,
        baseline=baseline,
        failed_runs=failed,
        budget=budget,
        hook_runs=[r for r in records if r.kind is RunKind.HOOK],
        allow_resumed=allow_resumed,
    )
    return verdict, failed


def _round(value: float | None, digits: int = 6) -> float | None:
    """Outputs are comparison-view columns: a figure to the microsecond (or micro-dollar)
    says all the measurement can, not 1.6497099000000617."""
    return None if value is None else round(value, digits)


def _profile_key(profile: str, figure: str) -> str:
    """A profile's output name: the contract's per-profile figures by
    :func:`~checkpoint_storage_bench.contract.profile_output`, a data workload's own
    figures (its headline, its AU) under their contract names."""
    if figure in PROFILE_FIGURES:
        return profile_output(profile, figure)
    return f"{output_key(profile)}_{figure}"


def op_outputs(verdict: Verdict) -> dict[str, Any]:
    """The scalars logged as outputs of the compare op (columns of the comparison view),
    named from the row's headline for every workload; a training row adds its whole run and
    costs."""
    best = verdict.best
    assert best is not None
    row, rec = verdict.row, verdict.recommendation
    stem, unit = row.stem, row.unit
    named = headline_outputs(stem, unit)
    figure = profile_headline_figures(stem, unit)
    shift = best.profile.shift
    out: dict[str, Any] = {
        WORKLOAD_INPUT: row.name,
        VERDICT_OUTPUT: verdict.verdict,
        "verdict_reason": verdict.reason,
        "verdict_outcome": best.outcome.value,
        RECOMMENDED_PROFILE_OUTPUT: rec.profile if rec else None,
        "recommendation_reason": rec.reason if rec else None,
        "baseline_profile": verdict.baseline,
        "candidate_profile": best.name,
        "profile_count": len(verdict.profiles),
        "confidence": verdict.thresholds.confidence,
        named["speedup"]: verdict.profiles[0].median / best.profile.median
        if best.profile.median > 0
        else None,
        named["delta"]: shift.estimate if shift else None,
        named["delta_low"]: shift.low if shift else None,
        named["delta_high"]: shift.high if shift else None,
        "failed_runs": len(verdict.failed_runs),
    }
    if (drift := verdict.drift) is not None:
        if drift.runtime_s is not None:
            out["baseline_drift_runtime_s"] = drift.runtime_s
        if drift.shift is not None:
            out[named["drift"]] = drift.shift.estimate
    if (comp := best.comparison) is not None:
        out |= {
            "runtime_delta_s": comp.runtime_delta_s,
            "runtime_delta_ci_low_s": comp.runtime.shift.low,
            "runtime_delta_ci_high_s": comp.runtime.shift.high,
            "final_loss_delta": comp.loss_delta,
        }
    if (delta := best.cost) is not None:
        out |= {
            "cost_delta_usd_per_checkpoint": delta.gpu_per_checkpoint,
            "cost_delta_usd_per_1000_ckpt": delta.gpu_per_1000_checkpoints,
            "storage_delta_usd_per_month": delta.storage_month,
            "run_cost_delta_usd": delta.run_total,
            "breakeven_checkpoints_per_month": delta.breakeven_checkpoints_month,
        }
    for p in verdict.profiles:
        f = p.figures
        out[_profile_key(p.profile, figure["median"])] = p.median
        out[_profile_key(p.profile, "runs")] = len(p.runs)
        out[_profile_key(p.profile, "run_cost_usd")] = p.cost.run_total if p.cost.known else None
        if row.au_metric is not None:
            out[_profile_key(p.profile, row.au_metric)] = p.au
        if f is not None:
            out[_profile_key(p.profile, "warmup_pause_s_median")] = f.warmup_median
            out[_profile_key(p.profile, "runtime_s")] = f.runtime_s
    for c in verdict.candidates:
        if (s := c.profile.shift) is not None:
            out[_profile_key(c.name, figure["diff_low"])] = s.low
            out[_profile_key(c.name, figure["diff_high"])] = s.high
    return {k: _round(v) if isinstance(v, float) else v for k, v in out.items() if v is not None}
