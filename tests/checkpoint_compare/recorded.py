"""Hand-made recorded runs for the verdict tests.

Written through ``checkpoint_storage_bench.tracking`` (the real Polyaxon offline format), with the inputs,
metrics and outputs the contracts give each part; :func:`run_cli` runs the verdict on them.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from checkpoint_compare.cli import main
from checkpoint_storage_bench.tracking import tracked_run

TRAINING_INPUTS = {
    "checkpoint_dir": "/checkpoints/run",
    "model_size_bytes": 16 * 2**20,
    "param_count": 4 * 2**20,
    "dataset_seed": 0,
    "checkpoint_format": "raw",
    "durability": "fsync",
    "async_checkpoint": False,
    "steps": 200,
    "checkpoint_every": 50,
    "device": "cpu",
}


def write_training_run(
    profile: str,
    pauses: list[float],
    runtime_s: float,
    *,
    write_share: float = 0.8,
    final_loss: float | None = 2.5,
    fail: str | None = None,
    meta: dict[str, Any] | None = None,
    outputs: dict[str, Any] | None = None,
    per_checkpoint: dict[str, list[float]] | None = None,
    **inputs: Any,
) -> str:
    """Record a training run as the trainer does; returns its uuid.

    ``pauses`` are the per-checkpoint pause seconds (synchronous checkpoints: pause equals
    total = serialize + write + fsync, split 10% / write_share / rest). ``outputs`` adds run
    outputs; ``per_checkpoint`` adds metric series (name → one value per checkpoint).
    """
    every = inputs.get("checkpoint_every", TRAINING_INPUTS["checkpoint_every"])
    nbytes = 16 * 2**20
    uuid = ""
    try:
        with tracked_run(f"train-{profile}", tags=["training"]) as t:
            uuid = t.run_uuid
            t.log_inputs(storage_profile=profile, **(TRAINING_INPUTS | inputs))
            if meta:
                t.log_meta(**meta)
            for i, pause in enumerate(pauses):
                write = pause * write_share
                serialize = pause * 0.1
                t.log_metrics(
                    (i + 1) * every,
                    {
                        "ckpt_serialize_s": serialize,
                        "ckpt_write_s": write,
                        "ckpt_fsync_s": pause - write - serialize,
                        "ckpt_pause_s": pause,
                        "ckpt_total_s": pause,
                        "ckpt_bytes": nbytes,
                        "ckpt_write_gbps": nbytes / write / 1e9,
                    }
                    | {name: values[i] for name, values in (per_checkpoint or {}).items()},
                )
            if final_loss is not None:
                t.log_metrics(len(pauses) * every, {"loss": final_loss})
            if fail:
                raise RuntimeError(fail)
            t.log_outputs(
                runtime_s=runtime_s,
                final_loss=final_loss,  # None is not logged
                checkpoint_count=len(pauses),
                ckpt_pause_s_total=sum(pauses),
                ckpt_pause_share=sum(pauses) / runtime_s,
                ckpt_pause_s_median=statistics.median(pauses),
                ckpt_pause_s_min=min(pauses),
                ckpt_pause_s_max=max(pauses),
                **(outputs or {}),
            )
    except RuntimeError:
        pass
    time.sleep(0.01)  # distinct created_at, so "newest" and "before" are well defined
    return uuid


def write_repeats(
    profile: str, pauses: list[float], runtime_s: float, runs: int = 2, **kwargs: Any
) -> list[str]:
    """``runs`` training runs of one profile, as a pipeline's ``repeats`` records them:
    the run is the unit the verdict compares, so a verdict needs two a side. Run i's pauses
    (and ``per_checkpoint`` figures) are 1 % × i above the first's, its runtime 0.1 % × i:
    two real runs never agree exactly."""
    per_checkpoint = kwargs.pop("per_checkpoint", None) or {}
    return [
        write_training_run(
            profile,
            [p * (1 + 0.01 * i) for p in pauses],
            runtime_s * (1 + 0.001 * i),
            per_checkpoint={
                k: [v * (1 + 0.01 * i) for v in vs] for k, vs in per_checkpoint.items()
            },
            **kwargs,
        )
        for i in range(runs)
    ]


def write_hook_run(
    target: str,
    driver: str = "ebs.csi.aws.com",
    class_parameters: dict | None = None,
    **outputs: Any,
) -> str:
    """Record a storage-profile hook run that switched the claim to ``target``."""
    with tracked_run(f"hook-{target}", tags=["hook"]) as t:
        t.log_inputs(
            claim="training-checkpoints",
            namespace="ml-team",
            previous_class="checkpoint-baseline",
            target_class=target,
            driver=driver,
            volume_handle="vol-0123456789abcdef0",
            **{f"vac_{k}": v for k, v in (class_parameters or {}).items()},
        )
        t.log_outputs(
            applied_class=target,
            k8s_settle_s=4.0,
            provider_settle_s=60.0,
            total_settle_s=64.0,
            **outputs,
        )
    time.sleep(0.01)
    return t.run_uuid


def write_fio_run(bw_mbps: float, lat_p99_us: float) -> str:
    """Record a fio sweep run (no profile input: it measures the claim as it is)."""
    with tracked_run("fio-sweep", tags=["fio"]) as t:
        t.log_inputs(mount="/checkpoints")
        for case, scale in (("seq_write_1m", 1.0), ("rand_write_4k", 0.1)):
            t.log_metrics(
                0,
                {
                    f"fio.{case}.bw_mbps": bw_mbps * scale,
                    f"fio.{case}.lat_p50_us": lat_p99_us * scale / 3,
                },
            )
            t.log_outputs(
                **{
                    f"fio_{case}_bw_mbps": bw_mbps * scale,
                    f"fio_{case}_iops": bw_mbps * scale / (1 if scale == 1 else 0.004),
                    f"fio_{case}_lat_p99_us": lat_p99_us * (2 - scale),
                }
            )
    time.sleep(0.01)
    return t.run_uuid


def summary_json(
    profile: str, pauses: list[float], runtime_s: float, final_loss: float = 2.5
) -> dict[str, Any]:
    """A trainer summary (``checkpoint-training/1``) as the trainer writes it."""
    every = TRAINING_INPUTS["checkpoint_every"]
    checkpoints = [
        {"step": (i + 1) * every, "bytes": 16 * 2**20, "serialize_s": p * 0.1,
         "write_s": p * 0.8, "fsync_s": p * 0.1, "upload_s": None, "pause_s": p, "total_s": p,
         "write_gbps": 16 * 2**20 / (p * 0.8) / 1e9, "upload_gbps": None, "io_mode": "direct"}
        for i, p in enumerate(pauses)
    ]  # fmt: skip
    return {
        "schema": "checkpoint-training/1",
        "storage_profile": profile,
        "checkpoint_dir": "/checkpoints/run",
        "inputs": {"storage_profile": profile, **TRAINING_INPUTS},
        "runtime_s": runtime_s,
        "final_loss": final_loss,
        "checkpoint_count": len(pauses),
        "ckpt_pause_s_total": sum(pauses),
        "ckpt_pause_share": sum(pauses) / runtime_s,
        "stages": {"pause_s": {"median": statistics.median(pauses), "min": min(pauses),
                               "max": max(pauses)}},
        "checkpoints": checkpoints,
    }  # fmt: skip


def run_cli(runs_root: Path, pricing: Path, *args: str) -> tuple[int, str, dict | None]:
    out = runs_root.parent / "report.json"
    out.unlink(missing_ok=True)
    result = CliRunner().invoke(
        main,
        ["--offline-root", str(runs_root), "--pricing", str(pricing), *args,
         "--json", str(out), "--no-track"],
    )  # fmt: skip
    report = json.loads(out.read_text()) if out.exists() and result.exit_code == 0 else None
    return result.exit_code, result.output, report
