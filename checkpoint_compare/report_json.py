"""The verdict as a JSON document (schema ``checkpoint-compare/2``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from checkpoint_compare.comparison import Difference
from checkpoint_compare.figures import RunFigures
from checkpoint_compare.intervals import Shift
from checkpoint_compare.verdict import Verdict, op_outputs

SCHEMA = "checkpoint-compare/2"


def _shift(shift: Shift | None) -> dict[str, Any] | None:
    return None if shift is None else asdict(shift)


def _difference(diff: Difference) -> dict[str, Any]:
    return {
        **asdict(diff.shift),
        "floor": diff.floor,
        "counts": diff.counts,
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


def to_json(verdict: Verdict) -> dict[str, Any]:
    """The verdict as a JSON document."""
    profiles = {}
    for s in verdict.profiles:
        profiles[s.profile] = {
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
            "cost": asdict(verdict.costs[s.profile]),
        }
    comparisons = []
    for cand in verdict.candidates:
        c = cand.comparison
        comparisons.append(
            {
                "baseline": c.baseline.profile,
                "candidate": c.candidate.profile,
                "outcome": cand.outcome.value,
                "reason": cand.reason,
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
                "cost_delta": asdict(cand.cost) if cand.cost else None,
                "notes": c.notes,
            }
        )
    drift = verdict.drift
    rec = verdict.recommendation
    return {
        "schema": SCHEMA,
        "verdict": verdict.verdict,
        "reason": verdict.reason,
        "baseline": verdict.baseline,
        "recommendation": None
        if rec is None
        else {
            "profile": rec.profile,
            "reason": rec.reason,
            "budget": asdict(rec.budget),
            "confidence": rec.confidence,
            "profiles": [asdict(f) | {"monthly_usd": f.monthly} for f in rec.fits],
        },
        "drift": None
        if drift is None
        else {
            "profile": drift.profile,
            "first_runs": [r.run.uuid for r in drift.first],
            "last_runs": [r.run.uuid for r in drift.last],
            "pause": _shift(drift.pause),
            "runtime_s": drift.runtime_s,
        },
        "profiles": profiles,
        "comparisons": comparisons,
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
    return json.dumps(to_json(verdict), indent=2, default=str, allow_nan=False) + "\n"
