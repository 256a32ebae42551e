"""One verdict for every workload: the table of workloads, and the judge of the data ones.

Each row of :data:`ROWS` says what a workload is judged by: its headline figure and unit
(lower is better for each), how a run's samples are read (a scan's epochs, a workspace's
rounds, a run's one figure otherwise), the inputs that must match across runs, the budget
test and the words the reports use. The checkpoint row is the training run's (its figures
are made by :mod:`checkpoint_compare.figures`, its judge is :mod:`checkpoint_compare.verdict`);
the data rows are judged here, with the checkpoint verdict's refusals (the newest run of a
profile failed, the build, the GPU, the image, the claim, a switch of the claim inside a run,
impossible or malformed figures), its :class:`~checkpoint_compare.comparison.Difference`,
its cost model and its JSON schema.

The run is the unit of replication: a run's samples (epochs, rounds) are summarised per run
and the shift's interval reflects the variation between runs
(:func:`checkpoint_compare.intervals.run_level_shift`); with one run a side the verdict
claims nothing and says that more runs (``repeats``) are needed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from checkpoint_compare.comparability import check_comparable
from checkpoint_compare.comparison import NO_DIFFERENCE, Difference, Thresholds
from checkpoint_compare.cost import Pricing, ProfileCost, profile_cost
from checkpoint_compare.errors import BadInput, NotComparable
from checkpoint_compare.figures import _hook_figures
from checkpoint_compare.grouping import (
    around_the_others,
    block_counts,
    group_by_profile,
    pick_baseline,
    run_time,
)
from checkpoint_compare.intervals import Shift, run_level_shift
from checkpoint_compare.recommendation import Budget, ProfileFit, Recommendation, choose
from checkpoint_compare.records import SUMMARY_UUID_PREFIX, RunKind, RunRecord, parse_time
from checkpoint_compare.switches import check_switches
from checkpoint_compare.table import NONE_MEETS, ROWS, WorkloadBudget, WorkloadRow
from checkpoint_storage_bench.contract import (
    DATA_SUMMARY_EPOCHS,
    DATA_SUMMARY_ROUNDS,
    DATA_SUMMARY_SCHEMA,
    DATA_WORKLOADS,
    RUN_FINISHED_AT,
    RUN_STARTED_AT,
    SCAN_AU,
    SCAN_EPOCH_S,
    WORKLOAD_INPUT,
    WORKSPACE_SAVE_P99_MS,
    output_key,
)

SAMPLE_METRICS = tuple({r.sample_metric for r in ROWS.values() if r.sample_metric} | {SCAN_AU})
"""The metric events the verdict fetches for a data-workload run."""


@dataclass
class WorkloadProfile:
    """One profile's figures for the workload.

    Attributes:
        run_samples: Per run (oldest first), its samples after the warm-up.
        difference: The shift against the baseline (None for the baseline).
        relative: The shift as a share of the baseline's median.
    """

    profile: str
    runs: list[str]
    run_samples: list[list[float]]
    median: float
    au: float | None = None
    au_samples: list[float] = field(default_factory=list)
    run_au: list[list[float]] = field(default_factory=list)
    blocks: int | None = None
    difference: Difference | None = None
    relative: float | None = None
    noise: float | None = None
    cost: ProfileCost | None = None
    meets_budget: bool | None = None
    started: datetime | None = None
    run_labels: list[str] = field(default_factory=list)

    @property
    def samples(self) -> list[float]:
        return [v for run in self.run_samples for v in run]

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
        """``better``/``worse`` when the difference counts, else ``none``."""
        if not self.significant or self.shift is None:
            return "none"
        return "better" if self.shift.estimate < 0 else "worse"


@dataclass
class WorkloadDrift:
    """The baseline's own move between its runs before and after every other profile's."""

    first: list[str]
    last: list[str]
    shift: Shift


@dataclass
class WorkloadVerdict:
    workload: str
    baseline: str
    headline: str
    unit: str
    profiles: list[WorkloadProfile]
    budget: WorkloadBudget
    recommendation: Recommendation | None
    sentences: list[str]
    notes: list[str] = field(default_factory=list)
    drift: WorkloadDrift | None = None
    confidence: float = 0.95

    @property
    def row(self) -> WorkloadRow:
        return ROWS[self.workload]

    @property
    def recommended(self) -> str | None:
        """The recommended profile, None when none can be."""
        rec = self.recommendation
        return None if rec is None or rec.profile == NONE_MEETS else rec.profile

    @property
    def reason(self) -> str:
        return self.recommendation.reason if self.recommendation else ""

    @property
    def verdict(self) -> str:
        """The profile to keep, as the checkpoint verdict says it, whatever the budget: the
        cheapest measurably better profile, else the baseline when a profile was measurably
        worse, else ``no measurable difference``."""
        better = [p for p in self.profiles if p.direction == "better"]
        if better:
            return min(better, key=lambda p: (*_monthly(p), p.median)).profile
        if any(p.significant for p in self.profiles):
            return self.baseline
        return NO_DIFFERENCE


def is_data_run(record: RunRecord) -> bool:
    return record.kind is RunKind.DATA


def is_data_comparison(records: list[RunRecord]) -> bool:
    """Whether the runs are a data workload's.

    Raises:
        NotComparable: Data-workload runs mixed with training runs: one verdict is about
            one workload.
    """
    data = [r for r in records if is_data_run(r)]
    training = [r for r in records if r.kind is RunKind.TRAINING]
    if data and training:
        raise NotComparable(
            f"data-workload runs ({', '.join(r.label for r in data)}) mixed with training "
            f"runs ({', '.join(r.label for r in training)}): compare one workload at a time"
        )
    return bool(data)


def _details(data: dict[str, Any], path: Path) -> tuple[list[Any], list[Any]]:
    """The summary's epochs and rounds lists.

    Raises:
        BadInput: ``details`` or a list is of the wrong type, naming the field.
    """
    details = data.get("details")
    if details is None:
        return [], []
    if not isinstance(details, dict):
        raise BadInput(f"{path}: details must be a JSON object, not {type(details).__name__}")
    found = []
    for key in (DATA_SUMMARY_EPOCHS, DATA_SUMMARY_ROUNDS):
        value = details.get(key)
        if value is not None and not isinstance(value, list):
            raise BadInput(f"{path}: details.{key} must be a list, not {type(value).__name__}")
        found.append(value or [])
    return found[0], found[1]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def record_from_summary(profile: str, data: dict[str, Any], path: Path) -> RunRecord:
    """A ``data-workload/1`` summary as a record, as if it had been tracked.

    Raises:
        BadInput: Its sections, epochs or rounds are malformed (naming the field).
    """
    for key in ("outputs", "config"):
        if not isinstance(data.get(key), dict):
            raise BadInput(f"{path}: a {DATA_SUMMARY_SCHEMA} summary needs {key} (an object)")
    epochs, rounds = _details(data, path)
    metrics: dict[str, list[tuple[int, float]]] = {}
    prefix = SCAN_EPOCH_S.removesuffix("epoch_s")
    for i, e in enumerate(epochs):
        step = e.get("epoch") if isinstance(e, dict) else None
        if not isinstance(e, dict) or isinstance(step, bool) or not isinstance(step, int):
            raise BadInput(f"{path}: details.{DATA_SUMMARY_EPOCHS}[{i}] is not an epoch with an integer epoch")  # fmt: skip
        for metric in (SCAN_EPOCH_S, SCAN_AU):
            value = e.get(metric.removeprefix(prefix))
            if value is not None and not _number(value):
                raise BadInput(f"{path}: details.{DATA_SUMMARY_EPOCHS}[{i}].{metric.removeprefix(prefix)} = {value!r} is not a number")  # fmt: skip
            if value is not None:
                metrics.setdefault(metric, []).append((step, float(value)))
    for i, value in enumerate(rounds):
        if not _number(value):
            raise BadInput(f"{path}: details.{DATA_SUMMARY_ROUNDS}[{i}] = {value!r} is not a number")  # fmt: skip
        metrics.setdefault(WORKSPACE_SAVE_P99_MS, []).append((i, float(value)))
    return RunRecord(
        # The path: two summaries of one name in two directories are two runs.
        uuid=f"{SUMMARY_UUID_PREFIX}{path}",
        name=path.stem,
        inputs={
            **data["config"],
            WORKLOAD_INPUT: data.get(WORKLOAD_INPUT),
            "storage_profile": profile,
        },
        outputs=dict(data["outputs"]),
        metrics=metrics,
        started_at=parse_time(data.get(RUN_STARTED_AT)),
        finished_at=parse_time(data.get(RUN_FINISHED_AT)),
        source=str(path),
        profile_hint=profile,
        meta={k: v for k, v in (data.get("provenance") or {}).items() if isinstance(k, str)}
        if isinstance(data.get("provenance"), dict)
        else {},
    )


def _samples(run: RunRecord, row: WorkloadRow, warmup: int) -> list[float]:
    values = [v for _, v in sorted(run.metrics.get(row.sample_metric or "", []))]
    if len(values) > warmup:
        return values[warmup:]
    value = run.outputs.get(row.headline)
    return [float(value)] if _number(value) else []


def _au_samples(run: RunRecord, warmup: int) -> list[float]:
    values = [v for _, v in sorted(run.metrics.get(SCAN_AU, []))]
    if len(values) > warmup:
        return values[warmup:]
    au = run.outputs.get(SCAN_AU)
    return [float(au)] if _number(au) else []


def _drift(
    base: WorkloadProfile, base_runs: list[RunRecord], others: list[list[RunRecord]], t: Thresholds
) -> WorkloadDrift | None:
    """The baseline's runs before every other profile and after them (A…B…A): the drift's
    shift, last − first, between runs."""
    pairs = [(r, s) for r, s in zip(base_runs, base.run_samples, strict=True) if s]
    split = around_the_others(
        pairs, lambda pair: run_time(pair[0]), [run_time(r) for runs in others for r in runs]
    )
    if split is None:
        return None
    first, last = split
    # Before every other profile, and after them all: one block each.
    shift = run_level_shift([s for _, s in last], [s for _, s in first], t.confidence, (1, 1))
    return WorkloadDrift([r.label for r, _ in first], [r.label for r, _ in last], shift)


def judge_workloads(
    records: list[RunRecord],
    pricing: Pricing,
    thresholds: Thresholds,
    baseline: str | None = None,
    budget: WorkloadBudget | None = None,
    expected: tuple[str, ...] = (),
) -> WorkloadVerdict:
    """The verdict over the data-workload runs among ``records``.

    Raises:
        NotComparable: Runs of several workloads, of other datasets or loaders, builds,
            hardware, images or claims, a scan served by the page cache, a switch of the
            claim inside a run, or one profile only.
        RunsMissing: An expected profile has no successful run, or a profile's newest run
            failed.
        BadInput: A run recorded no headline figure.
    """
    budget = budget or WorkloadBudget()
    t = thresholds
    data_runs = [r for r in records if is_data_run(r)]
    workloads = {r.inputs[WORKLOAD_INPUT] for r in data_runs}
    if len(workloads) != 1:
        raise NotComparable(
            f"expected the runs of one data workload, found {sorted(workloads) or 'none'}"
        )
    (workload,) = workloads
    assert workload in DATA_WORKLOADS
    row = ROWS[workload]
    named = {r.profile_hint or r.inputs.get("storage_profile") for r in data_runs}
    if len(named) == 1 and not expected:
        raise NotComparable(f"{workload}: one profile only ({', '.join(map(str, named))})")
    groups, failed = group_by_profile(records, expected, kind=RunKind.DATA)
    notes = check_comparable(row, groups)
    notes += check_switches(groups, [r for r in records if r.kind is RunKind.HOOK])
    notes += [f"run {r.label} {r.status} and is not used: {r.message}" for r in failed]
    baseline = pick_baseline(groups, baseline, workload)
    groups.sort(key=lambda g: g.profile != baseline)
    blocks = block_counts(groups)
    profiles = []
    for g in groups:
        run_samples = [_samples(r, row, t.warmup) for r in g.trainings]
        if not any(run_samples):
            raise BadInput(f"{g.profile}: no run recorded {row.headline}")
        samples = [v for s in run_samples for v in s]
        run_au = [_au_samples(r, t.warmup) for r in g.trainings]
        au = [v for a in run_au for v in a]
        median = statistics.median(samples)
        seconds = median / 1000 if row.unit == "ms" else median
        profiles.append(
            WorkloadProfile(
                profile=g.profile,
                runs=[r.uuid for r in g.trainings],
                run_samples=run_samples,
                median=median,
                au=statistics.median(au) if au else None,
                au_samples=au,
                run_au=run_au,
                blocks=blocks[g.profile],
                noise=(max(samples) - min(samples)) / median
                if median and len(samples) > 1
                else None,
                cost=profile_cost(pricing, g.profile, seconds, _hook_figures(g.hook)),
                started=run_time(g.trainings[0]),
                run_labels=[r.label for r in g.trainings],
            )
        )
    base = profiles[0]
    drift = _drift(base, groups[0].trainings, [g.trainings for g in groups[1:]], t)
    for p in profiles[1:]:
        shift = run_level_shift(
            [s for s in p.run_samples if s], [s for s in base.run_samples if s], t.confidence,
            (p.blocks or 1, base.blocks or 1),
        )  # fmt: skip
        floor = t.runtime_floor * base.median
        p.difference = Difference.judge(shift, floor, row.label, row.unit)
        p.relative = shift.estimate / base.median if base.median else None
        if drift and abs(drift.shift.estimate) >= abs(shift.estimate):
            notes.append(
                f"{base.profile}'s own {row.label} moved by {drift.shift.estimate:+.3g} "
                f"{row.unit} between its first runs ({', '.join(drift.first)}) and its last "
                f"({', '.join(drift.last)}), at least as much as the difference to "
                f"{p.profile} ({shift.estimate:+.3g} {row.unit}): the difference may be "
                "drift, not the profile"
            )
            if p.difference.counts:
                p.difference.counts = False
                p.difference.why_not = f"{row.label}: no larger than the baseline's drift"
    for p in profiles:
        p.meets_budget = _every_run_meets(row, budget, p)
    verdict = WorkloadVerdict(
        workload, baseline, row.label, row.unit, profiles, budget, None, [],
        notes=notes, drift=drift, confidence=t.confidence,
    )  # fmt: skip
    verdict.recommendation = _recommend(verdict)
    verdict.sentences = sentences(verdict)
    return verdict


@dataclass(frozen=True)
class _RunFigure:
    """One run's figures as a budget test reads them."""

    median: float
    au: float | None


def _every_run_meets(row: WorkloadRow, budget: WorkloadBudget, p: WorkloadProfile) -> bool | None:
    """The budget is met when every run meets it, each on its own median (the run is the
    unit: the epochs of a quick run must not carry a run that starved the GPUs); None when
    no budget was asked or a run has no figure to judge."""
    tests = [
        row.budget(_RunFigure(statistics.median(s), statistics.median(a) if a else None), budget)
        for s, a in zip(p.run_samples, p.run_au or [[]] * len(p.run_samples), strict=True)
        if s
    ]
    if not tests or any(t is None for t in tests):
        return None
    return all(tests)


def _monthly(p: WorkloadProfile) -> tuple[bool, float]:
    """Priced before unpriced (nothing is said of what an unpriced profile costs)."""
    cost = p.cost
    known = cost is not None and cost.storage_month is not None
    return (not known, cost.storage_month if known else math.inf)  # type: ignore[union-attr]


def _recommend(v: WorkloadVerdict) -> Recommendation:
    """The recommender every workload shares (:func:`~checkpoint_compare.recommendation.choose`),
    given each profile's fit: the row's budget test and figure, its storage a month, its
    direction against the baseline."""
    row, budget = v.row, v.budget
    fits = [
        ProfileFit(
            profile=p.profile, pause_high_s=None, share_high=None, meets=p.meets_budget,
            why=row.budget_figure(p), gpu_month=None, direction=p.direction,
            storage_month=None if _monthly(p)[0] else p.cost.storage_month,  # type: ignore[union-attr]
        )
        for p in v.profiles
    ]  # fmt: skip
    rec = Recommendation(NONE_MEETS, "", Budget(), v.confidence, fits)
    if why := row.unjudgeable(v.profiles, budget):
        rec.reason = why
        return rec
    words = row.budget_words(budget)
    rec.profile, rec.reason = choose(fits, has_limit=words is not None)
    return rec


def _figure(value: float, unit: str) -> str:
    return f"{value:.3g} {unit}"


def sentences(v: WorkloadVerdict) -> list[str]:
    """The verdict for people, in the workload's language."""
    base = v.profiles[0]
    out = []
    for p in v.profiles[1:]:
        change = (
            f"{v.headline} {_figure(p.median, v.unit)} vs {_figure(base.median, v.unit)} "
            f"on {base.profile}"
        )
        shift = p.shift
        if shift is not None and shift.has_interval:
            change += (
                f" (shift {shift.estimate:+.3g} {v.unit}, {shift.confidence:.0%} interval "
                f"{shift.low:+.3g} to {shift.high:+.3g}, between runs)"
            )
        elif shift is not None:
            change += f" (no interval: {shift.method}; more runs, repeats, are needed)"
        if not p.significant:
            change += ": no measurable difference"
        elif p.relative is not None:
            change += f": {abs(p.relative):.0%} {'faster' if p.relative < 0 else 'slower'}"
        if v.workload == "scan" and p.au is not None and base.au is not None:
            if p.meets_budget is None:
                change += f"; {p.profile} at {p.au:.0%} AU, baseline {base.au:.0%}"
            else:
                fed = "keeps the GPUs fed" if p.meets_budget else "does not keep the GPUs fed"
                change += f"; {p.profile} {fed} at {p.au:.0%} AU, baseline {base.au:.0%}"
        out.append(f"{p.profile}: {change}.")
    out += [f"Note: {n}." for n in v.notes]
    if words := v.row.budget_words(v.budget):
        out.append(f"Budget: {words}.")
    out.append(f"Recommendation: {v.recommended or NONE_MEETS}: {v.reason}.")
    return out


def terminal(v: WorkloadVerdict) -> str:
    lines = [f"{v.workload} verdict, baseline {v.baseline}:"]
    for p in v.profiles:
        au = f", AU {p.au:.0%}" if p.au is not None else ""
        noise = f", spread {p.noise:.0%}" if p.noise is not None else ""
        lines.append(
            f"  {p.profile}: {v.headline} {_figure(p.median, v.unit)} over {len(p.samples)} "
            f"sample(s) from {len(p.runs)} run(s){au}{noise}"
        )
    lines += [f"  {s}" for s in v.sentences]
    # The checkpoint report's last lines, so a log reads the same for every workload.
    lines += [
        "",
        f"VERDICT: {v.verdict}",
        f"RECOMMENDED: {v.recommended or NONE_MEETS} — {v.reason}",
    ]
    return "\n".join(lines) + "\n"


def outputs(v: WorkloadVerdict) -> dict[str, Any]:
    """The compare run's outputs for a data workload (comparison-view columns)."""
    out: dict[str, Any] = {
        WORKLOAD_INPUT: v.workload,
        "baseline": v.baseline,
        "recommended_profile": v.recommended or NONE_MEETS,
        "verdict": " ".join(v.sentences[:-1]),
        "recommendation_reason": v.sentences[-1],
    }
    for p in v.profiles:
        out[f"{output_key(p.profile)}_{v.row.headline}"] = p.median
        if p.au is not None:
            out[f"{output_key(p.profile)}_{SCAN_AU}"] = p.au
    return out
