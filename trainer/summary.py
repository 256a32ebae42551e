"""Run-level figures from the per-checkpoint timelines: the summary JSON and Polyaxon outputs.

Keys are part of the contract (docs/contracts.md): seconds end in ``_s``, bytes are
``bytes``, GB/s are ``gbps`` with GB = 1e9 bytes.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from checkpoint_storage_bench.contract import (
    DISTRIBUTED_CHECKPOINT_METRICS,
    DIVERGED_AT_STEP,
    RESTORE_MEASURED,
    RESUMED_FROM_STEP,
    RUN_FINISHED_AT,
    RUN_OUTPUTS,
    RUN_STARTED_AT,
    STAGES,
    SUMMARY_SCHEMA,
    WORLD_SIZE,
)
from checkpoint_storage_bench.units import significant
from trainer.ckpt.checkpointer import CheckpointRecord
from trainer.restore import RestoreFigure, restore_keys


@dataclass
class RunSummary:
    """What one training run measured."""

    storage_profile: str
    checkpoint_dir: str
    inputs: dict[str, Any]
    runtime_s: float
    steps_run: int
    final_loss: float | None
    checkpoints: list[CheckpointRecord]
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    resumed_from: int | None = None
    world_size: int = 1
    provenance: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    restore: RestoreFigure | None = None

    @property
    def diverged_at(self) -> int | None:
        """The first logged step whose loss was not finite, None while it stayed finite."""
        return next((step for step, loss in self.loss_curve if not math.isfinite(loss)), None)

    def stage_stats(self) -> dict[str, dict[str, float]]:
        stats = {}
        for stage in STAGES:
            values = [v for r in self.checkpoints if (v := getattr(r, f"{stage}_s")) is not None]
            if values:
                stats[f"{stage}_s"] = {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                }
        return stats

    def to_json(self) -> dict[str, Any]:
        pause_total = sum(r.pause_s for r in self.checkpoints)
        # A figure that cannot be told (no step run, a diverged loss) is null, never a
        # negative number or NaN (which is not JSON).
        ran = self.steps_run > 0 and self.runtime_s > 0
        data = {
            "schema": SUMMARY_SCHEMA,
            "storage_profile": self.storage_profile,
            "checkpoint_dir": self.checkpoint_dir,
            "inputs": self.inputs,
            "runtime_s": self.runtime_s,
            "steps_run": self.steps_run,
            "steps_per_s": self.steps_run / self.runtime_s if ran else None,
            "final_loss": self.final_loss,
            # Set when the run continued from a checkpoint: its timings cover only the
            # steps after it, so it is no whole run to rank against an uninterrupted one.
            RESUMED_FROM_STEP: self.resumed_from,
            DIVERGED_AT_STEP: self.diverged_at,
            WORLD_SIZE: self.world_size,
            "provenance": self.provenance,
            RUN_STARTED_AT: self.started_at,
            RUN_FINISHED_AT: self.finished_at,
            **restore_keys(self.restore),
            "checkpoint_count": len(self.checkpoints),
            "checkpoint_bytes": self.checkpoints[-1].bytes if self.checkpoints else 0,
            "ckpt_time_s_total": sum(r.total_s for r in self.checkpoints),
            "ckpt_pause_s_total": pause_total,
            "ckpt_pause_share": pause_total / self.runtime_s if ran else None,
            "stages": self.stage_stats(),
            "checkpoints": [r.as_dict() for r in self.checkpoints],
            "loss_curve": [[s, v] for s, v in self.loss_curve],
        }
        return finite_or_null(data)

    def outputs(self) -> dict[str, float | int | None]:
        """The scalar outputs that become Polyaxon comparison-view columns (None: untold)."""
        data = self.to_json()
        out: dict[str, float | int | None] = {key: data[key] for key in RUN_OUTPUTS}
        for stage, stats in data["stages"].items():
            out[f"ckpt_{stage}_median"] = stats["median"]
        if "pause_s" in data["stages"]:
            out["ckpt_pause_s_min"] = data["stages"]["pause_s"]["min"]
            out["ckpt_pause_s_max"] = data["stages"]["pause_s"]["max"]
        for rate in ("write_gbps", "upload_gbps"):
            values = [v for r in self.checkpoints if (v := getattr(r, rate)) is not None]
            if values:
                out[f"ckpt_{rate}_median"] = statistics.median(values)
        # Many ranks: the whole job's write rate and its slowest rank's pause, which a
        # single process's figures do not show.
        out[WORLD_SIZE] = self.world_size
        for name in DISTRIBUTED_CHECKPOINT_METRICS:
            values = [v for r in self.checkpoints if (v := getattr(r, name, None)) is not None]
            if values:
                out[f"ckpt_{name}_median"] = statistics.median(values)
        # Outputs are numbers (comparison-view columns); when it was measured is run meta.
        out |= {
            k: v
            for k, v in restore_keys(self.restore).items()
            if v is not None and k != RESTORE_MEASURED
        }
        # A column shows what a figure can tell, not float noise (1.6497099000000617 s).
        out = {k: significant(v) if isinstance(v, float) else v for k, v in out.items()}
        out[RESUMED_FROM_STEP] = self.resumed_from or 0  # 0: started at step 0
        out[DIVERGED_AT_STEP] = self.diverged_at or 0  # 0: the loss stayed finite
        return finite_or_null(out)


def finite_or_null(value: Any) -> Any:
    """``value`` with every NaN and infinity, however deep, replaced by None.

    A diverged run (the loss went to NaN) is a result to report, not a crash: strict JSON
    has no NaN, and a figure that cannot be told is null everywhere in the contract.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value


def utc_now() -> str:
    """Now, ISO 8601 in UTC to the second (``2026-12-01T23:41:29Z``): a summary's times."""
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so a reader never sees half a file: a temporary file beside it, fsynced,
    then renamed over it; on failure the temporary file is removed and the old one kept."""
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def format_timeline(summary: RunSummary) -> str:
    """A terminal table: one row per checkpoint, then the run-level figures."""
    head = f"{'step':>7} {'MB':>9} {'serialize':>9} {'write':>8} {'fsync':>8} {'checksum':>8} {'upload':>8} {'pause':>8} {'total':>8} {'GB/s':>6}  io"
    lines = [
        f"storage profile: {summary.storage_profile}   checkpoints: {summary.checkpoint_dir}",
        head,
    ]
    if summary.resumed_from:
        lines.insert(
            1,
            f"resumed from step {summary.resumed_from}: the figures cover only the steps after it",
        )
    for r in summary.checkpoints:
        upload = f"{r.upload_s:8.3f}" if r.upload_s is not None else f"{'-':>8}"
        # The read-back a library format needs to checksum its file is part of the pause.
        check = f"{r.checksum_s:8.3f}" if r.checksum_s is not None else f"{'-':>8}"
        lines.append(
            f"{r.step:7d} {r.bytes / 1e6:9.1f} {r.serialize_s:9.3f} {r.write_s:8.3f} {r.fsync_s:8.3f} "
            f"{check} {upload} {r.pause_s:8.3f} {r.total_s:8.3f} {r.write_gbps:6.2f}  {r.io_mode}"
        )
    data = summary.to_json()
    if not data["steps_run"]:
        lines.remove(head)
        lines.append("no training step run (the checkpoint was already at --steps)")
        return "\n".join(lines)
    lines.append(
        f"runtime {data['runtime_s']:.2f}s, {data['steps_per_s']:.1f} steps/s, "
        f"paused {data['ckpt_pause_s_total']:.2f}s ({100 * data['ckpt_pause_share']:.1f}% of runtime), "
        f"final loss {_or_dash(data['final_loss'], '.4f')}"
    )
    if summary.restore is not None:
        lines.append(summary.restore.line())
    return "\n".join(lines)


def _or_dash(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
