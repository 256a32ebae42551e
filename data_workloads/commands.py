"""One workload run: check the data dir, prepare and verify the dataset, measure, record.

Everything that can refuse (the options, the data dir, the dataset) is checked before a
tracked run is opened or anything is measured. The figures go to Polyaxon (inputs,
per-epoch metrics, run-level outputs named in the contract), to ``--summary-json`` and to
the terminal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from checkpoint_storage_bench.contract import (
    DATA_SUMMARY_CONFIG,
    DATA_SUMMARY_DETAILS,
    DATA_SUMMARY_OUTPUTS,
    DATA_SUMMARY_SCHEMA,
    DATASET_BYTES,
    DATASET_GENERATED,
    DATASET_RECORDS,
    IMAGE_INPUT,
    RUN_FINISHED_AT,
    RUN_STARTED_AT,
    WORKLOAD_INPUT,
)
from checkpoint_storage_bench.tracking import tracked_run
from data_workloads import dataset as ds
from data_workloads.config import CommonConfig, DatasetConfig
from data_workloads.scratch import scratch_tag


def dataset_spec(cfg: DatasetConfig) -> ds.DatasetSpec:
    return ds.DatasetSpec(
        format=cfg.dataset_format,
        seed=cfg.seed,
        dataset_size=int(cfg.dataset_size),
        record_size=int(cfg.record_size),
        shard_size=int(cfg.shard_size),
        codec=cfg.codec,
        row_group_size=int(cfg.row_group_size),
    )


def prepare_dataset(cfg: DatasetConfig) -> ds.Dataset:
    """The verified dataset of ``cfg`` (generated on first use)."""
    return ds.open_dataset(cfg.data_dir, dataset_spec(cfg), allow_generate=cfg.generate)


def dataset_outputs(data: ds.Dataset) -> dict[str, Any]:
    return {
        DATASET_RECORDS: data.records,
        DATASET_BYTES: data.bytes,
        DATASET_GENERATED: data.generated,
    }


def utc_now() -> str:
    """Now, ISO 8601 in UTC to the second (``2026-12-01T23:41:29Z``), as the trainer's
    summary records its times: the verdict orders runs by them."""
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Write the summary so that a reader never sees half of it: a temporary file beside it,
    fsynced, renamed over it, the directory fsynced. On failure the temporary file is
    removed and whatever was at ``path`` before is left as it was.

    Raises:
        StorageFullError: The volume is full (ENOSPC, EDQUOT).
        DataDirError: The directory is not writable.
    """
    data = (json.dumps(summary, indent=2) + "\n").encode()
    tmp = path.with_name(f".{path.name[:120]}.{scratch_tag()}.tmp")  # a name fits in 255
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        ds.fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ds.storage_error(exc, f"the summary {path}") from None
    except BaseException:  # stopped (SIGTERM) half-way: no temporary file left behind
        tmp.unlink(missing_ok=True)
        raise


def run_workload(
    workload: str,
    cfg: CommonConfig,
    measure: Callable[[], dict[str, Any]],
    data: ds.Dataset | None = None,
) -> dict[str, Any]:
    """Measure, then record the run (inputs, metrics, outputs), write the summary; returns
    the summary.

    The measurement runs before the tracked run is opened: an online Polyaxon run starts
    threads, and DataLoader workers forked from a process with threads can inherit a lock
    held by one of them and hang (seen under the sandbox's agent). Nothing of the tracking
    shares the process with the measurement, so it cannot perturb it either. A failed
    measurement is then no tracked run; the op fails with the exit code.

    ``measure`` returns ``figures`` (the outputs), optionally ``metrics`` (a list of
    ``(step, {name: value})``, e.g. one per epoch) and any details for the summary.
    """
    started = utc_now()
    result = measure()
    finished = utc_now()
    outputs = {**(dataset_outputs(data) if data else {}), **result.pop("figures")}
    metrics = result.pop("metrics", [])
    tags = ["data-workload", f"workload:{workload}", f"profile:{cfg.storage_profile}"]
    with tracked_run(f"data-{workload}", tags=tags, enabled=cfg.track) as tracker:
        inputs = {
            WORKLOAD_INPUT: workload,
            **cfg.record(),
            IMAGE_INPUT: os.environ.get("IMAGE_REF"),
        }
        tracker.log_inputs(**{k: v for k, v in inputs.items() if k not in ("track",)})
        tracker.log_meta(node_name=os.environ.get("NODE_NAME") or os.uname().nodename)
        for step, values in metrics:
            tracker.log_metrics(step, values)
        tracker.log_outputs(**outputs)
        summary = {
            "schema": DATA_SUMMARY_SCHEMA,
            WORKLOAD_INPUT: workload,
            "storage_profile": cfg.storage_profile,
            "run_uuid": tracker.run_uuid,
            RUN_STARTED_AT: started,
            RUN_FINISHED_AT: finished,
            DATA_SUMMARY_CONFIG: cfg.record(),
            DATA_SUMMARY_OUTPUTS: outputs,
            DATA_SUMMARY_DETAILS: result,
        }
        if cfg.summary_json is not None:
            write_summary(cfg.summary_json, summary)
            tracker.log_artifact(cfg.summary_json, name="summary", kind="file")
    print_summary(summary)
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    """The figures on stdout, one per line."""
    click.echo(f"{summary[WORKLOAD_INPUT]} on {summary['storage_profile']}:")
    for key, value in summary[DATA_SUMMARY_OUTPUTS].items():
        shown = f"{value:.4g}" if isinstance(value, float) else value
        click.echo(f"  {key}: {shown}")
