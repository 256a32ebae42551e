"""One training job as the component runs it: a tracked Polyaxon run around :func:`train`,
then the summary JSON and the terminal table."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import click

from checkpoint_storage_bench.contract import CHECKPOINT_METRICS
from checkpoint_storage_bench.tracking import tracked_run
from trainer.config import TrainConfig
from trainer.summary import format_timeline, write_json_atomic


def code_revision() -> str | None:
    """``CODE_REVISION`` from the image build, else the git commit of this checkout."""
    if rev := os.environ.get("CODE_REVISION"):
        return rev
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run_job(cfg: TrainConfig) -> None:
    """Train under a tracked Polyaxon run and report."""
    from trainer.train import run_inputs, train

    tags = ["checkpoint-training", cfg.storage_profile, cfg.format]
    with tracked_run(f"train-{cfg.storage_profile}", tags=tags, enabled=cfg.track) as tracker:
        tracker.log_inputs(**run_inputs(cfg))
        revision = code_revision()
        tracker.log_meta(image_digest=os.environ.get("IMAGE_DIGEST"), code_revision=revision)

        def on_checkpoint(r) -> None:
            tracker.log_metrics(
                r.step, {metric: getattr(r, field) for field, metric in CHECKPOINT_METRICS.items()}
            )
            upload = f" upload {r.upload_s:.3f}s" if r.upload_s is not None else ""
            click.echo(
                f"checkpoint step {r.step}: {r.bytes / 1e6:.1f} MB serialize {r.serialize_s:.3f}s "
                f"write {r.write_s:.3f}s ({r.write_gbps:.2f} GB/s) fsync {r.fsync_s:.3f}s{upload} "
                f"pause {r.pause_s:.3f}s total {r.total_s:.3f}s [{r.io_mode}]"
            )

        summary = train(
            cfg,
            on_checkpoint=on_checkpoint,
            on_loss=lambda step, loss: tracker.log_metrics(step, {"loss": loss}),
            say=click.echo,
        )
        # Known only once the model is built.
        tracker.log_inputs(
            param_count=summary.inputs["param_count"], device=summary.inputs["device"]
        )
        data = summary.to_json()
        data["inputs"]["image_digest"] = os.environ.get("IMAGE_DIGEST")
        data["code_revision"] = revision
        data["polyaxon_run_uuid"] = tracker.run_uuid
        tracker.log_outputs(**summary.outputs())
        if cfg.summary_json is not None:
            write_json_atomic(cfg.summary_json, data)
            tracker.log_artifact(cfg.summary_json, name="summary", kind="file")
        click.echo(format_timeline(summary))
