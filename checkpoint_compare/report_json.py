"""The verdict as a JSON document (schema ``checkpoint-compare/1``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from checkpoint_compare.verdict import Verdict, op_outputs


def to_json(verdict: Verdict) -> dict[str, Any]:
    """The report as a JSON document (schema ``checkpoint-compare/1``)."""
    profiles = {}
    for s in verdict.profiles:
        profiles[s.profile] = {
            "training_run": s.runs.training.uuid,
            "hook_run": s.runs.hook.uuid if s.runs.hook else None,
            "fio_run": s.runs.fio.uuid if s.runs.fio else None,
            "interval": list(s.interval),
            "checkpoint_count": s.checkpoint_count,
            "stages": {k: asdict(v) | {"spread": v.spread} for k, v in s.stages.items()},
            "pause_per_checkpoint": [[step, v] for step, v in s.pause_series],
            "write_gbps_median": s.write_gbps_median,
            "upload_gbps_median": s.upload_gbps_median,
            "runtime_s": s.runtime_s,
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
                "pause_delta_s": c.pause_delta_s,
                "pause_noise_s": c.pause_noise_s,
                "pause_measurable": c.pause_measurable,
                "pause_speedup": c.pause_speedup,
                "runtime_delta_s": c.runtime_delta_s,
                "runtime_noise_s": c.runtime_noise_s,
                "runtime_measurable": c.runtime_measurable,
                "stage_deltas": c.stage_deltas,
                "final_loss_delta": c.loss_delta,
                "final_loss_unknown": c.loss_unknown,
                "cost_delta": asdict(cand.cost) if cand.cost else None,
                "notes": c.notes,
            }
        )
    return {
        "schema": "checkpoint-compare/1",
        "verdict": verdict.verdict,
        "reason": verdict.reason,
        "baseline": verdict.baseline,
        "profiles": profiles,
        "comparisons": comparisons,
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
