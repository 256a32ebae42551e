"""``python -m operator_standin``: run the operator stand-in against one namespace.

The options are generated from :class:`operator_standin.config.OperatorConfig`; it runs
until SIGTERM or SIGINT, then exits 0.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import click
from kubernetes import client, config

from checkpoint_storage_bench.config_cli import config_options
from checkpoint_storage_bench.errors import EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, exit_codes_help
from operator_standin import crd
from operator_standin.config import OperatorConfig
from operator_standin.controller import ApiStatusSink, Controller, Reconciler
from operator_standin.crd import JOB_PLURAL, KFJOB_PLURAL

EXIT_CODES = {
    EXIT_OK: "stopped by SIGTERM or SIGINT",
    EXIT_UNEXPECTED: "unexpected error",
    EXIT_USAGE: "bad arguments (no namespace or kubeconfig given, nor in the environment)",
}


@click.command(
    epilog=exit_codes_help(EXIT_CODES),
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@config_options(OperatorConfig)
def main(**settings: Any) -> None:
    """Stand-in for Polyaxon's operator: runs polyaxon.com/v1 Jobs as batch Jobs and KfJobs
    as PyTorchJobs."""
    try:
        cfg = OperatorConfig(**settings)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    logging.basicConfig(
        level=logging.DEBUG if cfg.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    api = config.new_client_from_config(config_file=str(cfg.kubeconfig))
    if cfg.install_crds:
        crd.install(api)
    sink = (
        ApiStatusSink(cfg.api_host, os.environ.get("POLYAXON_AUTH_TOKEN")) if cfg.api_host else None
    )
    # One controller per kind, sharing one stop: Jobs become batch Jobs, KfJobs PyTorchJobs.
    jobs = Controller(Reconciler(api, cfg.namespace, sink, JOB_PLURAL))
    kfjobs = Controller(
        Reconciler(api, cfg.namespace, sink, KFJOB_PLURAL), stop_event=jobs.stop_event
    )
    signal.signal(signal.SIGTERM, lambda *_: jobs.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: jobs.stop_event.set())
    logging.getLogger("operator_standin").info(
        "watching polyaxon.com/v1 jobs and kfjobs in %s (statuses to %s)",
        cfg.namespace,
        cfg.api_host or "-",
    )
    kfjobs.start()
    try:
        jobs.run_forever()
    finally:
        kfjobs.stop()
    client.ApiClient.close(api)
