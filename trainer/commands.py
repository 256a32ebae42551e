"""One training job as the component runs it: a tracked Polyaxon run around :func:`train`,
then the summary JSON and the terminal table."""

from __future__ import annotations

import click

from checkpoint_storage_bench.contract import (
    CHECKPOINT_METRICS,
    DISTRIBUTED_CHECKPOINT_METRICS,
    IMAGE_INPUT,
    RESTORE_MEASURED,
)
from checkpoint_storage_bench.tracking import Tracker, tracked_run
from checkpoint_storage_bench.units import significant
from trainer import provenance
from trainer.config import RUN_ARTIFACTS_TARGETS, TrainConfig
from trainer.errors import ConfigError
from trainer.summary import finite_or_null, format_timeline, utc_now, write_json_atomic

UPLOAD_SUBDIR = "checkpoints"
"""Where ``--upload-to run-artifacts`` puts the checkpoints, under the run's outputs."""


def upload_url(cfg: TrainConfig, tracker: Tracker) -> str | None:
    """``--upload-to`` as a URL: the run's outputs for ``run-artifacts``, else as given.

    ``run-artifacts`` is the run's local outputs directory, which Polyaxon's sidecar syncs
    to the artifacts store (the upload stage then times the copy into it);
    ``run-artifacts-store`` is the same place in the store, written directly. Side by side
    they measure a direct upload against the sidecar's sync.

    Raises:
        ConfigError: The run has no such place (tracking off, or no artifacts store).
    """
    if cfg.upload_to not in RUN_ARTIFACTS_TARGETS:
        return cfg.upload_to
    if not tracker.enabled:
        raise ConfigError(f"--upload-to {cfg.upload_to} needs Polyaxon tracking (not --no-track)")
    url = tracker.outputs_path(UPLOAD_SUBDIR, store=RUN_ARTIFACTS_TARGETS[cfg.upload_to])
    if not url:
        raise ConfigError(
            f"--upload-to {cfg.upload_to}: this run has no artifacts store connection "
            "(only a run started by a Polyaxon agent has one)"
        )
    return url


def run_job(cfg: TrainConfig) -> None:
    """Train under a tracked Polyaxon run and report.

    Under torchrun every rank trains; only rank 0 (the main process) tracks, prints and
    writes the summary, and resolves ``--upload-to run-artifacts`` (train() hands its URL
    to the other ranks).
    """
    from trainer.distributed import is_main_process, resolve_device
    from trainer.train import run_inputs, train  # torch: not for --help

    started = utc_now()
    main = is_main_process()
    echo = click.echo if main else lambda *args, **kwargs: None
    # A single process's record has no aggregate: None, which is not logged.
    metrics = CHECKPOINT_METRICS | DISTRIBUTED_CHECKPOINT_METRICS
    tags = ["checkpoint-training", cfg.storage_profile, cfg.format]
    enabled = cfg.track and main
    with tracked_run(f"train-{cfg.storage_profile}", tags=tags, enabled=enabled) as tracker:
        tracker.log_inputs(**run_inputs(cfg))
        prov = provenance.collect(resolve_device(cfg.device)) if main else {}
        tracker.log_meta(**{k: v for k, v in prov.items() if k != IMAGE_INPUT})
        url = upload_url(cfg, tracker) if main else None
        if url != cfg.upload_to and main:
            echo(f"upload: --upload-to {cfg.upload_to} is {url}")

        def on_checkpoint(r) -> None:
            # Rounded like the outputs: Polyaxon copies each metric's last value into the
            # run's outputs (the runs table). The summary JSON keeps full precision.
            tracker.log_metrics(
                r.step,
                {
                    metric: significant(v) if isinstance(v := getattr(r, field, None), float) else v
                    for field, metric in metrics.items()
                },
            )
            upload = f" upload {r.upload_s:.3f}s" if r.upload_s is not None else ""
            echo(
                f"checkpoint step {r.step}: {r.bytes / 1e6:.1f} MB serialize {r.serialize_s:.3f}s "
                f"write {r.write_s:.3f}s ({r.write_gbps:.2f} GB/s) fsync {r.fsync_s:.3f}s{upload} "
                f"pause {r.pause_s:.3f}s total {r.total_s:.3f}s [{r.io_mode}]"
            )
            if r.world_size > 1:
                echo(
                    f"  {r.world_size} ranks: aggregate {r.aggregate_gbps:.2f} GB/s, slowest "
                    f"pause {r.slowest_pause_s:.3f}s, commit {r.commit_s:.3f}s"
                )

        summary = train(
            cfg,
            on_checkpoint=on_checkpoint,
            # A diverged loss (NaN) is left out of the metric, as it is null in the summary.
            on_loss=lambda step, loss: tracker.log_metrics(
                step, {"loss": finite_or_null(significant(loss, 6))}
            ),
            say=echo,
            on_progress=tracker.log_progress,
            upload_url=url,
        )
        if not main:
            return  # rank 0 reports for the job
        summary.provenance = prov
        summary.started_at, summary.finished_at = started, utc_now()
        # Known only once the model is built.
        tracker.log_inputs(
            param_count=summary.inputs["param_count"], device=summary.inputs["device"]
        )
        data = summary.to_json()
        data["polyaxon_run_uuid"] = tracker.run_uuid
        tracker.log_outputs(**summary.outputs())
        if summary.restore is not None:
            tracker.log_meta(**{RESTORE_MEASURED: summary.restore.measured})
        tracker.log_progress(1.0)
        if cfg.summary_json is not None:
            write_json_atomic(cfg.summary_json, data)
            tracker.log_artifact(cfg.summary_json, name="summary", kind="file")
        click.echo(format_timeline(summary))
