"""The verdict in a data workload's own terms (``python -m data_workloads``'s runs).

The runs of a comparison whose stages ran a data workload instead of the training are judged
by the figure that matters to that workload: the epoch time and the accelerator utilization
(AU) for a scan, the total time for building a cache, the p99 save latency for a notebook
workspace. The statistics are the checkpoint verdict's: the Hodges–Lehmann shift against the
baseline with its rank interval, warm-up epochs left out, the noise floor on relative
changes; the cost is the same model (the volume per month, the GPUs for the measured time);
the recommendation is the cheapest profile that meets the user's budget (``--min-au``,
``--max-p99-ms``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from checkpoint_compare.comparison import Thresholds
from checkpoint_compare.cost import Pricing, ProfileCost, profile_cost
from checkpoint_compare.errors import BadInput, NotComparable, RunsMissing
from checkpoint_compare.intervals import Shift, hodges_lehmann
from checkpoint_compare.records import RunRecord
from checkpoint_storage_bench.contract import DATA_SUMMARY_SCHEMA, DATA_WORKLOADS

HEADLINE = {
    "scan": ("scan_epoch_s", "epoch time", "s"),
    "materialize": ("materialize_total_s", "total time", "s"),
    "workspace": ("workspace_save_p99_ms", "p99 save latency", "ms"),
}
"""Workload → (output, its name for people, unit). Lower is better for each."""

PER_STEP_METRIC = {"scan": "scan_epoch_s", "workspace": "workspace_save_p99_ms"}
"""Metrics logged once per epoch (scan) or round (workspace): the samples of a run."""

SAMPLE_METRICS = ("scan_epoch_s", "scan_au", "workspace_save_p99_ms")
"""The metric events the verdict fetches for a data-workload run."""

COMPARABLE = (
    "workload",
    "dataset_format",
    "codec",
    "dataset_size",
    "record_size",
    "shard_size",
    "seed",
    "epochs",
    "num_workers",
    "batch_size",
    "compute_ms",
    "output_shard_size",
    "files",
    "file_size",
    "rounds",
)
"""Inputs that must be equal across profiles: the same dataset and the same loader."""


@dataclass(frozen=True)
class WorkloadBudget:
    """What the user needs: an AU floor for a scan, a p99 save latency for a workspace."""

    min_au: float | None = None
    max_p99_ms: float | None = None


@dataclass
class WorkloadProfile:
    """One profile's figures for the workload."""

    profile: str
    runs: list[str]
    samples: list[float]
    median: float
    au: float | None = None
    au_samples: list[float] = field(default_factory=list)
    shift: Shift | None = None
    relative: float | None = None
    floor: float | None = None
    significant: bool = False
    noise: float | None = None
    cost: ProfileCost | None = None
    meets_budget: bool | None = None


@dataclass
class WorkloadVerdict:
    workload: str
    baseline: str
    headline: str
    unit: str
    profiles: list[WorkloadProfile]
    budget: WorkloadBudget
    recommended: str | None
    sentences: list[str]


def is_data_run(record: RunRecord) -> bool:
    return record.inputs.get("workload") in DATA_WORKLOADS


def is_data_comparison(records: list[RunRecord]) -> bool:
    """Whether the runs are a data workload's (and no training run's)."""
    from checkpoint_compare.records import RunKind

    return any(is_data_run(r) for r in records) and not any(
        r.kind is RunKind.TRAINING for r in records
    )


def record_from_summary(profile: str, data: dict[str, Any], path: Path) -> RunRecord:
    """A ``data-workload/1`` summary as a record, as if it had been tracked."""
    if not isinstance(data.get("outputs"), dict) or not isinstance(data.get("config"), dict):
        raise BadInput(f"{path}: a {DATA_SUMMARY_SCHEMA} summary needs outputs and config")
    metrics: dict[str, list[tuple[int, float]]] = {}
    for e in (data.get("details") or {}).get("epochs") or []:
        for key in ("epoch_s", "au"):
            if isinstance(e.get(key), int | float):
                metrics.setdefault(f"scan_{key}", []).append((int(e["epoch"]), float(e[key])))
    rounds = (data.get("details") or {}).get("rounds") or []
    for i, value in enumerate(rounds):
        metrics.setdefault("workspace_save_p99_ms", []).append((i, float(value)))
    return RunRecord(
        uuid=str(path),
        name=f"data-{data.get('workload')}",
        inputs={**data["config"], "workload": data.get("workload")},
        outputs=dict(data["outputs"]),
        metrics=metrics,
        source=str(path),
        profile_hint=profile,
    )


def _samples(run: RunRecord, workload: str, warmup: int) -> list[float]:
    series = run.metrics.get(PER_STEP_METRIC.get(workload, ""), [])
    values = [v for _, v in sorted(series)]
    if len(values) > warmup:
        return values[warmup:]
    value = run.outputs.get(HEADLINE[workload][0])
    return [float(value)] if isinstance(value, int | float) else []


def _au_samples(run: RunRecord, warmup: int) -> list[float]:
    values = [v for _, v in sorted(run.metrics.get("scan_au", []))]
    if len(values) > warmup:
        return values[warmup:]
    au = run.outputs.get("scan_au")
    return [float(au)] if isinstance(au, int | float) else []


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
        NotComparable: Runs of several workloads, or of other datasets or loaders, or one
            profile only.
        RunsMissing: An expected profile has no successful run.
    """
    budget = budget or WorkloadBudget()
    runs = [r for r in records if is_data_run(r) and r.succeeded]
    workloads = {r.inputs["workload"] for r in runs}
    if len(workloads) != 1:
        raise NotComparable(
            f"expected the runs of one data workload, found {sorted(workloads) or 'none'}"
        )
    (workload,) = workloads
    by_profile: dict[str, list[RunRecord]] = {}
    for r in runs:
        profile = r.profile_hint or r.inputs.get("storage_profile") or "unlabelled"
        by_profile.setdefault(str(profile), []).append(r)
    missing = [p for p in expected if p not in by_profile]
    if missing:
        raise RunsMissing(f"no successful {workload} run of profile(s) {', '.join(missing)}")
    if len(by_profile) < 2:
        raise NotComparable(f"{workload}: one profile only ({', '.join(by_profile)})")
    first = runs[0]
    for r in runs[1:]:
        differ = [k for k in COMPARABLE if r.inputs.get(k) != first.inputs.get(k)]
        if differ:
            k = differ[0]
            raise NotComparable(
                f"runs {first.label} and {r.label} differ in {k}: "
                f"{first.inputs.get(k)!r} vs {r.inputs.get(k)!r}"
            )
    baseline = baseline or next(iter(by_profile))
    if baseline not in by_profile:
        raise RunsMissing(f"baseline {baseline} has no successful {workload} run")
    output, headline, unit = HEADLINE[workload]
    profiles = []
    for name, group in by_profile.items():
        samples = [v for r in group for v in _samples(r, workload, thresholds.warmup)]
        if not samples:
            raise NotComparable(f"{name}: no run recorded {output}")
        au = [v for r in group for v in _au_samples(r, thresholds.warmup)]
        median = statistics.median(samples)
        spread = (max(samples) - min(samples)) / median if median and len(samples) > 1 else None
        seconds = median / 1000 if unit == "ms" else median
        profiles.append(
            WorkloadProfile(
                profile=name,
                runs=[r.uuid for r in group],
                samples=samples,
                median=median,
                au=statistics.median(au) if au else None,
                au_samples=au,
                noise=spread,
                cost=profile_cost(pricing, name, seconds, {}),
            )
        )
    base = next(p for p in profiles if p.profile == baseline)
    for p in profiles:
        if p is base:
            continue
        p.shift = hodges_lehmann(p.samples, base.samples, thresholds.confidence)
        p.relative = p.shift.estimate / base.median if base.median else None
        p.floor = thresholds.runtime_floor * base.median
        excludes_zero = p.shift.has_interval and (p.shift.high < 0 or p.shift.low > 0)
        p.significant = bool(
            excludes_zero and p.relative is not None and abs(p.relative) > thresholds.runtime_floor
        )
    for p in profiles:
        checks = []
        if workload == "scan" and budget.min_au is not None:
            checks.append(p.au is not None and p.au >= budget.min_au)
        if workload == "workspace" and budget.max_p99_ms is not None:
            checks.append(p.median <= budget.max_p99_ms)
        p.meets_budget = all(checks) if checks else None
    recommended = _recommend(profiles, base)
    verdict = WorkloadVerdict(workload, baseline, headline, unit, profiles, budget, recommended, [])
    verdict.sentences = sentences(verdict)
    return verdict


def _monthly(p: WorkloadProfile) -> float:
    cost = p.cost
    return cost.storage_month if cost and cost.storage_month is not None else float("inf")


def _recommend(profiles: list[WorkloadProfile], base: WorkloadProfile) -> str | None:
    """The cheapest profile that meets the budget; without one, the cheapest profile that
    is not measurably slower than a cheaper one (the baseline unless a profile is
    measurably faster)."""
    if any(p.meets_budget is not None for p in profiles):
        fits = [p for p in profiles if p.meets_budget]
        return min(fits, key=_monthly).profile if fits else None
    better = [p for p in profiles if p.significant and p.relative is not None and p.relative < 0]
    if not better:
        return base.profile
    return min(better, key=lambda p: (p.median, _monthly(p))).profile


def _figure(value: float, unit: str) -> str:
    return f"{value:.3g} {unit}"


def sentences(v: WorkloadVerdict) -> list[str]:
    """The verdict for people, in the workload's language."""
    base = next(p for p in v.profiles if p.profile == v.baseline)
    out = []
    for p in v.profiles:
        if p is base:
            continue
        change = (
            f"{v.headline} {_figure(p.median, v.unit)} vs {_figure(base.median, v.unit)} "
            f"on {base.profile}"
        )
        if p.shift and p.shift.has_interval:
            change += (
                f" (shift {p.shift.estimate:+.3g} {v.unit}, {p.shift.confidence:.0%} interval "
                f"{p.shift.low:+.3g} to {p.shift.high:+.3g})"
            )
        else:
            change += " (too few samples for an interval: add repeats or epochs)"
        if not p.significant:
            change += ": no measurable difference"
        elif p.relative is not None:
            change += f": {abs(p.relative):.0%} {'faster' if p.relative < 0 else 'slower'}"
        if v.workload == "scan" and p.au is not None and base.au is not None:
            fed = (
                "keeps the GPUs fed"
                if v.budget.min_au is None or p.au >= v.budget.min_au
                else ("does not keep the GPUs fed")
            )
            change += f"; {p.profile} {fed} at {p.au:.0%} AU, baseline {base.au:.0%}"
        out.append(f"{p.profile}: {change}.")
    if v.workload == "scan" and v.budget.min_au is not None:
        out.append(f"Budget: accelerator utilization >= {v.budget.min_au:.0%} (MLPerf: 90 %).")
    if v.workload == "workspace" and v.budget.max_p99_ms is not None:
        out.append(f"Budget: p99 save latency <= {v.budget.max_p99_ms:g} ms.")
    if v.recommended:
        cost = next(p for p in v.profiles if p.profile == v.recommended).cost
        price = (
            f" (${cost.storage_month:.2f}/month for the volume)"
            if cost and cost.storage_month is not None
            else ""
        )
        out.append(f"Recommendation: {v.recommended}{price}.")
    else:
        out.append("Recommendation: none of the profiles meets the budget.")
    return out


def terminal(v: WorkloadVerdict) -> str:
    lines = [f"{v.workload} verdict, baseline {v.baseline}:"]
    for p in v.profiles:
        au = f", AU {p.au:.0%}" if p.au is not None else ""
        noise = f", spread {p.noise:.0%}" if p.noise is not None else ""
        lines.append(
            f"  {p.profile}: {v.headline} {_figure(p.median, v.unit)} over {len(p.samples)} "
            f"sample(s){au}{noise}"
        )
    lines += [f"  {s}" for s in v.sentences]
    return "\n".join(lines) + "\n"


def outputs(v: WorkloadVerdict) -> dict[str, Any]:
    """The compare run's outputs for a data workload (comparison-view columns)."""
    out: dict[str, Any] = {
        "workload": v.workload,
        "baseline": v.baseline,
        # The checkpoint verdict's convention: the string "none" when no profile fits.
        "recommended_profile": v.recommended or "none",
        "verdict": " ".join(v.sentences[:-1]),
        "recommendation_reason": v.sentences[-1],
    }
    for p in v.profiles:
        key = p.profile.replace("-", "_").replace(".", "_")
        out[f"{key}_{HEADLINE[v.workload][0]}"] = p.median
        if p.au is not None:
            out[f"{key}_scan_au"] = p.au
    return out


def to_json(v: WorkloadVerdict) -> str:
    return json.dumps(asdict(v), indent=2, default=str) + "\n"
