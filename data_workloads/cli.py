"""``python -m data_workloads scan|materialize|workspace``: parse → config → measure.

Each subcommand's options are generated from its settings dataclass
(:mod:`data_workloads.config`). Errors are :class:`data_workloads.errors.WorkloadError`,
which click maps to their exit codes (:data:`data_workloads.errors.EXIT_CODES`, listed in
``--help``).
"""

from __future__ import annotations

import logging
from typing import Any

import click

from checkpoint_storage_bench.config_cli import config_options
from checkpoint_storage_bench.contract import (
    DATA_SUMMARY_EPOCH,
    DATA_SUMMARY_EPOCHS,
    DATA_SUMMARY_ROUNDS,
    SCAN_EPOCH_METRICS,
    WORKSPACE_SAVE_P99_MS,
)
from checkpoint_storage_bench.errors import exit_codes_help
from checkpoint_storage_bench.interrupts import signals_raise
from data_workloads.config import MaterializeConfig, ScanConfig, WorkspaceConfig
from data_workloads.errors import EXIT_CODES, Interrupted

_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=_SETTINGS, epilog=exit_codes_help(EXIT_CODES))
@click.pass_context
def main(ctx: click.Context) -> None:
    """Measure a claim with the operation that matters to a data workload."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ctx.with_resource(signals_raise(Interrupted))


@main.command(epilog=exit_codes_help(EXIT_CODES))
@config_options(ScanConfig)
def scan(**settings: Any) -> None:
    """Read the dataset as training does: DataLoader workers, shuffled epochs, decoded
    records, an emulated compute step; accelerator utilization, throughput, batch waits."""
    cfg = ScanConfig(**settings)
    cfg.check_data_dir()
    from data_workloads.commands import dataset_spec, prepare_dataset, run_workload  # torch
    from data_workloads.formats import check_libraries
    from data_workloads.scan import check_ring_memory, run_scan

    check_libraries(cfg.dataset_format, cfg.loader)
    if cfg.loader == "ours":  # the libraries' loaders have no slot ring
        check_ring_memory(dataset_spec(cfg), cfg)  # before the dataset is generated or verified
    data = prepare_dataset(cfg)

    def measure() -> dict[str, Any]:
        result = run_scan(data, cfg)
        result["metrics"] = [
            (e[DATA_SUMMARY_EPOCH], {m: e[k] for k, m in SCAN_EPOCH_METRICS.items()})
            for e in result[DATA_SUMMARY_EPOCHS]
        ]
        return result

    run_workload("scan", cfg, measure, data)


@main.command(epilog=exit_codes_help(EXIT_CODES))
@config_options(MaterializeConfig)
def materialize(**settings: Any) -> None:
    """Build a preprocessed cache: read, transform, write and fsync shards, each stage
    timed."""
    cfg = MaterializeConfig(**settings)
    cfg.check_data_dir()
    from data_workloads.commands import prepare_dataset, run_workload
    from data_workloads.formats import check_libraries
    from data_workloads.materialize import run_materialize
    from data_workloads.scratch import ScratchDir

    check_libraries(cfg.dataset_format)
    data = prepare_dataset(cfg)

    def measure() -> dict[str, Any]:
        with ScratchDir(cfg.data_dir, "materialize") as scratch:
            return run_materialize(data, cfg, scratch)

    run_workload("materialize", cfg, measure, data)


@main.command(epilog=exit_codes_help(EXIT_CODES))
@config_options(WorkspaceConfig)
def workspace(**settings: Any) -> None:
    """A notebook workspace's saves: many small files written, fsynced, renamed into place,
    listed and reopened; latency p50/p99/max per operation."""
    cfg = WorkspaceConfig(**settings)
    cfg.check_data_dir()
    from data_workloads.commands import run_workload
    from data_workloads.scratch import ScratchDir
    from data_workloads.workspace import run_workspace

    def measure() -> dict[str, Any]:
        with ScratchDir(cfg.data_dir, "workspace") as scratch:
            result = run_workspace(cfg, scratch)
        result["metrics"] = [
            (i, {WORKSPACE_SAVE_P99_MS: p99}) for i, p99 in enumerate(result[DATA_SUMMARY_ROUNDS])
        ]
        return result

    run_workload("workspace", cfg, measure)
