"""The verdict as a JSON document: one schema (``checkpoint-compare/4``) for every workload.

Every document has ``schema``, ``workload``, ``headline`` (the figure judged, its label and
unit), ``verdict``, ``reason``, ``baseline``, ``recommendation``, ``confidence``,
``drift``, ``profiles`` (by name, each with its runs and headline samples, its median and
its ``difference`` from the baseline: null for the baseline), ``comparisons`` (one per
candidate: its outcome, reason, headline difference and notes), ``notes``, ``failed_runs``,
``thresholds``, ``assumptions`` and ``outputs``; a training run's profiles and comparisons
add what only it has (stages, the whole run, restore, cost deltas). docs/compare.md lists
the fields.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from checkpoint_compare.comparison import Comparison, Difference
from checkpoint_compare.figures import ProfileFigures, RunFigures
from checkpoint_compare.intervals import Shift
from checkpoint_compare.verdict import Candidate, ProfileVerdict, Verdict, op_outputs

SCHEMA = "checkpoint-compare/4"


def _shift(shift: Shift | None) -> dict[str, Any] | None:
    return None if shift is None else asdict(shift)


def _difference(diff: Difference) -> dict[str, Any]:
    return {
        **asdict(diff.shift),
        "floor": diff.floor,
        "counts": diff.counts,
        "why_not": diff.why_not,
    }


def difference(
    shift: Shift, diff: Difference, claimed: bool, direction: str, unit: str
) -> dict[str, Any]:
    """A profile's difference from the baseline, the same object for every workload:
    ``claimed`` (the report claims a measurable difference), ``direction`` (``better``,
    ``worse`` or ``none``), the estimate and its interval, the runs a side, the method."""
    return {
        "claimed": claimed,
        "direction": direction if claimed else "none",
        "estimate": shift.estimate,
        "low": shift.low,
        "high": shift.high,
        "confidence": shift.confidence,
        "asked": shift.asked,
        "unit": unit,
        "runs": {"profile": shift.n_x, "baseline": shift.n_y},
        "method": shift.method,
        "floor": diff.floor,
        "why_not": diff.why_not,
    }


def _run(r: RunFigures) -> dict[str, Any]:
    return {
        "uuid": r.run.uuid,
        "label": r.run.label,
        "interval": list(r.interval),
        "runtime_s": r.runtime_s,
        "checkpoint_count": r.checkpoint_count,
        "warmup_pauses": [[step, v] for step, v in r.warmup],
        "pauses": [[step, v] for step, v in r.measured],
        "pause_total_s": r.pause_total_s,
        "pause_share": r.pause_share,
        "final_loss": r.final_loss,
        "loss_problem": r.loss_problem,
        "node_name": r.node,
        "gpu_model": r.gpu_model,
        "image": r.image,
        "world_size": r.world_size,
        "pause_is_slowest_rank": r.slowest_rank,
        "aggregate_gbps_median": r.aggregate_gbps_median,
        "resumed_from_step": r.resumed_from_step,
        "restore_s": r.restore_s,
        "restore_gbps": r.restore_gbps,
        "restore_measured": r.restore_measured,
    }


def _training_profile(s: ProfileFigures) -> dict[str, Any]:
    """What a training row adds to a profile: its runs' figures, stages, the whole run."""
    return {
        "training_runs": [_run(r) for r in s.per_run],
        "training_run": s.runs.training.uuid,
        "hook_run": s.runs.hook.uuid if s.runs.hook else None,
        "fio_run": s.runs.fio.uuid if s.runs.fio else None,
        "interval": list(s.interval),
        "checkpoint_count": s.checkpoint_count,
        "stages": {k: asdict(v) | {"spread": v.spread} for k, v in s.stages.items()},
        "warmup_pause_s_median": s.warmup_median,
        "pause_per_checkpoint": [[step, v] for series in s.pause_series for step, v in series],
        "write_gbps_median": s.write_gbps_median,
        "upload_gbps_median": s.upload_gbps_median,
        "runtime_s": s.runtime_s,
        "runtimes_s": s.runtimes,
        "restores_s": s.restores,
        "pause_total_s": s.pause_total_s,
        "pause_share": s.pause_share,
        "final_loss": s.final_loss,
        "loss_problem": s.loss_problem,
        "fio": s.fio,
        "hook": s.hook,
    }


def _profile(v: Verdict, p: ProfileVerdict) -> dict[str, Any]:
    diff = p.difference
    out = {
        "runs": [
            {"uuid": r.uuid, "label": r.label, "samples": samples}
            for r, samples in zip(p.runs, p.run_samples, strict=True)
        ],
        "samples": p.samples,
        "median": p.median,
        "spread": p.noise,
        "relative": p.relative,
        "au": p.au,
        "au_samples": p.au_samples,
        "meets_budget": p.meets_budget,
        "started_at": p.started.isoformat() if p.started else None,
        "blocks": p.blocks,
        "cost": asdict(p.cost),
        "difference": None
        if diff is None
        else difference(diff.shift, diff, p.claimed, p.claim_direction, v.row.unit),
    }
    if p.figures is not None:
        out |= _training_profile(p.figures)
    return out


def _whole_run(c: Comparison) -> dict[str, Any]:
    """What a training row adds to a comparison: the pause and the whole run as the
    outcome table reads them, restore, stages, loss."""
    return {
        "pause": _difference(c.pause),
        "pause_delta_s": c.pause_delta_s,
        "pause_measurable": c.pause_measurable,
        "pause_speedup": c.pause_speedup,
        "runtime": _difference(c.runtime),
        "runtime_delta_s": c.runtime_delta_s,
        "runtime_measurable": c.runtime_measurable,
        "explained_by_checkpoints": c.explained_by_checkpoints,
        "restore": _difference(c.restore) if c.restore else None,
        "stage_deltas": c.stage_deltas,
        "final_loss_delta": c.loss_delta,
        "final_loss_unknown": c.loss_unknown,
    }


def _comparison(v: Verdict, cand: Candidate) -> dict[str, Any]:
    diff = cand.profile.difference
    out = {
        "baseline": v.baseline,
        "candidate": cand.name,
        "outcome": cand.outcome.value,
        "reason": cand.reason,
        "headline": None if diff is None else _difference(diff),
        "cost_delta": asdict(cand.cost) if cand.cost else None,
        "notes": cand.notes,
    }
    if cand.comparison is not None:
        out |= _whole_run(cand.comparison)
    return out


def document(verdict: Verdict) -> dict[str, Any]:
    """The JSON document of any workload's verdict."""
    drift, rec, row = verdict.drift, verdict.recommendation, verdict.row
    return {
        "schema": SCHEMA,
        "workload": row.name,
        "headline": {"figure": row.headline, "label": row.label, "unit": row.unit},
        "confidence": verdict.thresholds.confidence,
        "verdict": verdict.verdict,
        "reason": verdict.reason,
        "baseline": verdict.baseline,
        "recommendation": None
        if rec is None
        else {
            "profile": rec.profile,
            "reason": rec.reason,
            "budget": asdict(verdict.budget),
            "confidence": rec.confidence,
            "profiles": [asdict(f) | {"monthly_usd": f.monthly} for f in rec.fits],
        },
        "drift": None
        if drift is None
        else {
            "profile": drift.profile,
            "first_runs": [r.uuid for r in drift.first],
            "last_runs": [r.uuid for r in drift.last],
            "shift": _shift(drift.shift),
            "runtime_s": drift.runtime_s,
        },
        "profiles": {p.profile: _profile(verdict, p) for p in verdict.profiles},
        "comparisons": [_comparison(verdict, c) for c in verdict.candidates],
        "notes": verdict.notes,
        "failed_runs": [
            {"uuid": r.uuid, "name": r.name, "status": r.status, "message": r.message}
            for r in verdict.failed_runs
        ],
        "thresholds": asdict(verdict.thresholds),
        "assumptions": verdict.assumptions,
        "outputs": op_outputs(verdict),
    }


def dumps(verdict: Verdict) -> str:
    # allow_nan=False: NaN and Infinity are not JSON; a figure that is not finite is a bug
    # here (inputs are checked on the way in), not something to hand a reader to trip on.
    return json.dumps(document(verdict), indent=2, default=str, allow_nan=False) + "\n"
