"""``python -m localcluster build | start | stop | status``: the one command line.

Without ``--node`` each command acts on the control plane alone (what
``scripts/controlplane.sh start|stop`` runs); with it, on the control plane and a node
(root; docs/node.md). Each command's options are generated from its settings dataclass
(:mod:`localcluster.config`); failures leave as :mod:`localcluster.errors`, which click maps
to their exit codes (:data:`localcluster.errors.EXIT_CODES`, also the ``--help`` epilog).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click

from checkpoint_storage_bench.config_cli import config_options
from checkpoint_storage_bench.errors import exit_codes_help
from localcluster import state
from localcluster.config import BuildConfig, ClusterConfig, StatusConfig
from localcluster.controlplane import PIDS_FILE, ControlPlane, ControlPlaneError, stop_recorded
from localcluster.errors import EXIT_CODES, EXIT_FAILED, EXIT_SETUP, ClusterFailed, SetupMissing
from localcluster.node import Node, sweep

__all__ = ["EXIT_FAILED", "EXIT_SETUP", "main"]

EPILOG = exit_codes_help(EXIT_CODES)


class LocalClusterGroup(click.Group):
    """Maps the failures of the modules a command drives to their exit, in one place: a
    missing build script or binary cache exits 3, a process that did not start (or a sweep
    refused while another node runs) exits 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except state.SetupError as exc:
            raise SetupMissing(str(exc)) from exc
        except ControlPlaneError as exc:
            raise ClusterFailed(str(exc)) from exc


@click.group(
    cls=LocalClusterGroup,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
def main() -> None:
    """A real Kubernetes control plane on loopback, and optionally one node."""


@main.command(epilog=EPILOG)
@config_options(BuildConfig)
def build(**settings: Any) -> None:
    """Build the missing or stale binaries. All of them, or only the NAMEs given
    (scripts/controlplane.sh build)."""
    cfg = BuildConfig(**settings)
    if not state.BUILD_SCRIPT.is_file():
        raise state.SetupError(f"no {state.BUILD_SCRIPT} (a source checkout has it)")
    env = dict(os.environ)
    if cfg.bin_dir is not None:
        env["CONTROLPLANE_BIN_DIR"] = str(cfg.bin_dir)
    names = ["--node"] if cfg.node else list(cfg.names)
    argv = ["bash", str(state.BUILD_SCRIPT), "build", *names]
    click.get_current_context().exit(subprocess.run(argv, env=env, check=False).returncode)


@main.command(epilog=EPILOG)
@config_options(ClusterConfig)
def start(**settings: Any) -> None:
    """Start and leave running."""
    cfg = ClusterConfig(**settings)
    bin_dir = cfg.bin_dir or state.default_bin_dir()
    if cfg.node:
        _start_node(bin_dir, cfg.state)
    else:
        _start_plane(bin_dir, cfg.state)


def _start_plane(bin_dir: Path, state_dir: Path) -> None:
    if (state_dir / PIDS_FILE).exists():
        left = stop_recorded(state_dir)
        if left:
            click.echo(f"stopped a previous start's processes: {', '.join(left)}", err=True)
    shutil.rmtree(state_dir, ignore_errors=True)
    plane = ControlPlane(bin_dir, state_dir)
    plane.start()
    for proc in plane.procs:
        proc.popen = None  # detach: `stop` finds them through the pid file
    click.echo(f"started in {plane.timings['total']} s: {plane.timings}")
    click.echo(f"server: {plane.server}")
    click.echo(f"export KUBECONFIG={plane.admin_kubeconfig}")
    click.echo(f"logs: {plane.logs}; stop with scripts/controlplane.sh stop")


def _start_node(bin_dir: Path, state_dir: Path) -> None:
    node = Node(bin_dir, state_dir)
    node.start()
    for proc in [*node.procs, *(node.plane.procs if node.plane else [])]:
        proc.popen = None  # detach: `stop` finds them through the pid files
    click.echo(f"started in {node.timings['total']} s: {node.timings}")
    click.echo(f"export KUBECONFIG={node.plane.admin_kubeconfig if node.plane else ''}")


@main.command(epilog=EPILOG)
@config_options(ClusterConfig)
def stop(**settings: Any) -> None:
    """Stop what `start` started. With --node, also sweep what a node left (after a crash
    too)."""
    cfg = ClusterConfig(**settings)
    if not cfg.node:
        stopped = stop_recorded(cfg.state)
        click.echo(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return
    report = sweep(cfg.state, cfg.bin_dir)
    report["plane"] = stop_recorded(cfg.state)
    click.echo(json.dumps(report))
    if any(report["left"].values()):
        click.get_current_context().exit(EXIT_FAILED)


@main.command(epilog=EPILOG)
@config_options(StatusConfig)
def status(**settings: Any) -> None:
    """Show the recorded processes and the server. Exit 1 unless every recorded process
    runs."""
    state_dir = StatusConfig(**settings).state
    procs = state.recorded(state_dir)
    if not procs:
        click.echo(f"not started (no pid file in {state_dir})")
        click.get_current_context().exit(EXIT_FAILED)
    for proc in procs:
        running = "running" if proc.running else "gone"
        click.echo(f"{proc.part:<12} {proc.name:<24} {proc.pid:>8} {running}")
    server = state.server(state_dir)
    if server:
        click.echo(f"server: {server}")
    kubeconfig = state.admin_kubeconfig(state_dir)
    if kubeconfig.exists():
        click.echo(f"export KUBECONFIG={kubeconfig}")
    if not all(p.running for p in procs):
        click.get_current_context().exit(EXIT_FAILED)
