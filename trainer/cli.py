"""``python -m trainer``: train, checkpoint to the mounted claim, record every stage.

Exit codes: 0 success; 1 unexpected error; 2 bad arguments; 3 checkpoint dir missing or
unwritable; 4 no space left on the volume; 5 upload failed after retries; 6 no usable
checkpoint / corrupt data; 7 under torchrun: another rank failed or timed out during a
checkpoint, nothing was committed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import click

from checkpoint_storage_bench.contract import CHECKPOINT_METRICS, DISTRIBUTED_CHECKPOINT_METRICS
from checkpoint_storage_bench.tracking import tracked_run
from trainer.config import DEVICES, DURABILITY, FORMATS, PARALLEL, TrainConfig
from trainer.errors import TrainerError
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


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--checkpoint-dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Directory on the mounted claim for this run's checkpoints (must exist).",
)
@click.option("--steps", type=int, default=200, show_default=True, help="Total training steps.")
@click.option(
    "--checkpoint-every",
    type=int,
    default=50,
    show_default=True,
    help="Save a checkpoint every N steps.",
)
@click.option(
    "--keep",
    type=int,
    default=2,
    show_default=True,
    help="Complete checkpoints to keep; older ones are deleted once a newer one is durable.",
)
@click.option(
    "--resume", is_flag=True, help="Continue from the newest complete, verified checkpoint."
)
@click.option(
    "--upload-to",
    default=None,
    metavar="URL",
    help="fsspec URL of the artifact store (file://, s3://, gs://, memory://).",
)
@click.option(
    "--storage-profile",
    envvar="STORAGE_PROFILE",
    default="unlabelled",
    show_default=True,
    help="Record label of the volume profile [env STORAGE_PROFILE]; does not change the volume.",
)
@click.option(
    "--summary-json",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the run's figures and per-checkpoint timeline here.",
)
@click.option(
    "--model-size",
    default="16MiB",
    show_default=True,
    help="fp32 parameter bytes (e.g. 2MiB, 1GiB); a checkpoint is about 3x this.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Dataset and init seed.")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="raw",
    show_default=True,
    help="raw: direct, checksummed writer; torch: torch.save (the reference).",
)
@click.option(
    "--async/--sync",
    "asynchronous",
    default=False,
    show_default=True,
    help="Write checkpoints in the background; block only while staging.",
)
@click.option(
    "--durability",
    type=click.Choice(DURABILITY),
    default="fsync",
    show_default=True,
    help="fsync files and directories, or not.",
)
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--seq-len", type=int, default=64, show_default=True)
@click.option("--lr", type=float, default=3e-4, show_default=True)
@click.option(
    "--log-every", type=int, default=10, show_default=True, help="Record the loss every N steps."
)
# -- many ranks (issue 16)
@click.option(
    "--parallel",
    type=click.Choice(PARALLEL),
    default="none",
    show_default=True,
    help="Under torchrun with several processes: ddp (replicated model, the checkpoint split "
    "across ranks) or fsdp (FSDP2, each rank writes its local shards).",
)
@click.option(
    "--checkpoint-timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Under torchrun: seconds to wait for every rank's shard before nothing is committed "
    "(exit 7).",
)
@click.option(
    "--track/--no-track",
    default=True,
    show_default=True,
    help="Record with Polyaxon tracking (the current run, or an offline run).",
)
def main(
    checkpoint_dir: Path,
    steps: int,
    checkpoint_every: int,
    keep: int,
    resume: bool,
    upload_to: str | None,
    storage_profile: str,
    summary_json: Path | None,
    model_size: str,
    seed: int,
    device: str,
    fmt: str,
    asynchronous: bool,
    durability: str,
    batch_size: int,
    seq_len: int,
    lr: float,
    log_every: int,
    parallel: str,
    checkpoint_timeout: float,
    track: bool,
) -> None:
    """Train a small transformer and time every checkpoint stage on the mounted volume."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = TrainConfig(
            checkpoint_dir=checkpoint_dir,
            steps=steps,
            checkpoint_every=checkpoint_every,
            keep=keep,
            resume=resume,
            upload_to=upload_to,
            storage_profile=storage_profile,
            model_size=model_size,
            seed=seed,
            device=device,
            format=fmt,
            async_checkpoint=asynchronous,
            durability=durability,
            batch_size=batch_size,
            seq_len=seq_len,
            lr=lr,
            log_every=log_every,
            parallel=parallel,
            checkpoint_timeout=checkpoint_timeout,
        )
        cfg.check_checkpoint_dir()  # before a tracked run is opened for nothing
        run(cfg, summary_json, track)
    except TrainerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)


def run(cfg: TrainConfig, summary_json: Path | None, track: bool) -> None:
    """Train under a tracked Polyaxon run and report."""
    from trainer.distributed import is_main_process
    from trainer.train import run_inputs, train

    # Under torchrun every rank trains; only rank 0 tracks, prints and writes the summary.
    main = is_main_process()
    echo = click.echo if main else lambda *args, **kwargs: None
    metrics = CHECKPOINT_METRICS | DISTRIBUTED_CHECKPOINT_METRICS
    tags = ["checkpoint-training", cfg.storage_profile, cfg.format]
    with tracked_run(f"train-{cfg.storage_profile}", tags=tags, enabled=track and main) as tracker:
        tracker.log_inputs(**run_inputs(cfg))
        revision = code_revision()
        tracker.log_meta(image_digest=os.environ.get("IMAGE_DIGEST"), code_revision=revision)

        def on_checkpoint(r) -> None:
            # A single process's record has no aggregate: None is not logged.
            tracker.log_metrics(
                r.step, {metric: getattr(r, field, None) for field, metric in metrics.items()}
            )
            upload = f" upload {r.upload_s:.3f}s" if r.upload_s is not None else ""
            echo(
                f"checkpoint step {r.step}: {r.bytes / 1e6:.1f} MB serialize {r.serialize_s:.3f}s "
                f"write {r.write_s:.3f}s ({r.write_gbps:.2f} GB/s) fsync {r.fsync_s:.3f}s{upload} "
                f"pause {r.pause_s:.3f}s total {r.total_s:.3f}s [{r.io_mode}]"
            )
            if hasattr(r, "aggregate_gbps"):
                echo(
                    f"  {r.world_size} ranks: aggregate {r.aggregate_gbps:.2f} GB/s, slowest "
                    f"pause {r.slowest_pause_s:.3f}s, commit {r.commit_s:.3f}s"
                )

        summary = train(
            cfg,
            on_checkpoint=on_checkpoint,
            on_loss=lambda step, loss: tracker.log_metrics(step, {"loss": loss}),
            say=echo,
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
        if summary_json is not None and main:
            write_json_atomic(summary_json, data)
            tracker.log_artifact(summary_json, name="summary", kind="file")
        echo(format_timeline(summary))
