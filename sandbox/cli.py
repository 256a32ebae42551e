"""``python -m sandbox``: start/stop/status of the local Polyaxon sandbox, its agent, the
component hub registration, and the one-command demo of the storage-profile pipeline.

Each command parses its options, builds the :class:`~sandbox.server.Sandbox` and calls
:mod:`sandbox.commands`; errors are :class:`~sandbox.errors.SandboxError`\\ s that click
prints as one line and turns into their exit code.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from checkpoint_storage_bench.config_cli import output_option
from checkpoint_storage_bench.contract import WORKLOADS
from checkpoint_storage_bench.errors import exit_codes_help
from sandbox import commands
from sandbox.config import (
    DEFAULT_HOST,
    DEFAULT_OWNER,
    DEFAULT_PORT,
    DEFAULT_PROJECT,
    SandboxPaths,
    default_root,
)
from sandbox.errors import EXIT_CODES, ConfigError, ServerUnavailableError
from sandbox.runtime import Runtime
from sandbox.server import Sandbox

EPILOG = exit_codes_help(EXIT_CODES)


def _sandbox(root, host, port, agent_file, profiles_file, rt: Runtime | None = None) -> Sandbox:
    """The sandbox at ``root`` as runtime ``rt`` configures its server (default: local)."""
    paths = SandboxPaths(root or default_root())
    if port is None:
        info = paths.read_info() or {}
        port = int(info.get("port", DEFAULT_PORT))
    return (rt or commands.runtime("local")).sandbox(
        paths,
        host,
        port,
        Path(agent_file) if agent_file else None,
        Path(profiles_file) if profiles_file else None,
    )


def _running_sandbox(root, host, port, agent_file, profiles_file) -> Sandbox:
    """The sandbox at ``root`` where its server last listened, unless ``--host`` names
    another: the node runtime's server listens on the node's bridge, not on loopback. Once
    the bridge is gone no server can be listening there; its pids are still this root's."""
    sb = _sandbox(root, host, port, agent_file, profiles_file)
    last = (sb.paths.read_info() or {}).get("host")
    if host == DEFAULT_HOST and last not in (None, host):
        try:
            sb = _sandbox(root, last, port, agent_file, profiles_file)
        except ConfigError:
            pass
    return sb


def _common(fn):
    for option in reversed(
        [
            click.option(
                "--root",
                type=click.Path(file_okay=False, path_type=Path),
                help="Sandbox root; state goes to ROOT/.sandbox (default $SANDBOX_ROOT or repo).",
            ),
            click.option(
                "--host",
                default=DEFAULT_HOST,
                show_default=True,
                help="The server's address: loopback (127.0.0.1, ::1, localhost), or the node's "
                "bridge address (10.244.0.1) once the node runs; nowhere else.",
            ),
            click.option(
                "--port", type=int, help=f"Server port (default: last used, else {DEFAULT_PORT})."
            ),
            click.option(
                "--agent-file",
                type=click.Path(dir_okay=False, exists=True),
                help="Agent config: connections and artifacts store, for the server and the "
                "agent (default connections/sandbox-agent.yaml).",
            ),
            click.option(
                "--profiles-file",
                type=click.Path(dir_okay=False, exists=True),
                help="Storage profiles (default connections/sandbox-profiles.yaml: the "
                "volume classes emulated by block-I/O limits, or, where the kernel cannot "
                "throttle, connections/sandbox-profiles-media.yaml, which is not an emulation).",
            ),
        ]
    ):
        fn = option(fn)
    return fn


def _parse_params(values: tuple[str, ...]) -> dict[str, str]:
    params = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint="-P")
        params[key] = value
    return params


@click.group(epilog=EPILOG)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """A local Polyaxon sandbox: CE server, local agent, component hub, pipeline demo."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _runtime_options(fn):
    fn = click.option(
        "--node-state",
        type=click.Path(file_okay=False, path_type=Path),
        help="The node's state dir (default: that of `python -m localcluster start --node`).",
    )(fn)
    return click.option(
        "--on-node",
        "runtime",
        flag_value="node",
        default="local",
        help="Run on the local node (docs/agent-on-node.md): the server on the node's bridge "
        "address, Polyaxon's own agent and the operator stand-in instead of the local agent; "
        "the agent config defaults to connections/node-agent.yaml.",
    )(fn)


@main.command(epilog=EPILOG)
@_common
@click.option("--project", default=DEFAULT_PROJECT, show_default=True, help="Project to create.")
@_runtime_options
def start(root, host, port, agent_file, profiles_file, project, runtime, node_state) -> None:
    """Start the server (127.0.0.1, one worker) and the agent; create the project."""
    rt = commands.runtime(runtime, profiles_file, node_state)
    sb = _sandbox(root, host, port, agent_file, profiles_file, rt)
    sb = rt.start(sb, DEFAULT_OWNER, project, echo=click.echo)
    click.echo(f"sandbox: runs table {sb.url}/ui/{DEFAULT_OWNER}/{project}/runs")
    click.echo(f"sandbox: stop with: {commands.stop_hint(sb)}")


@main.command(epilog=EPILOG)
@_common
def stop(root, host, port, agent_file, profiles_file) -> None:
    """Stop the agent (and any run it executes) and the server."""
    sb = _running_sandbox(root, host, port, agent_file, profiles_file)
    stopped = commands.stop(sb)
    click.echo("sandbox: stopped " + (", ".join(stopped) if stopped else "nothing (not running)"))


@main.command(epilog=EPILOG)
@_common
@output_option
def status(root, host, port, agent_file, profiles_file, as_json) -> None:
    """Show whether the server and agent run, and where their logs are. Exit 6 if down."""
    sb = _running_sandbox(root, host, port, agent_file, profiles_file)
    rt = commands.running_runtime(sb)
    info = rt.status(sb)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            click.echo(f"{key:>15}: {value}")
    down = ["server"] if not info["server_healthy"] else []
    down += [name for name in rt.processes if not info[f"{name}_pid"]]
    if down:
        raise ServerUnavailableError(f"the sandbox's {down[0]} is not running ({sb.url})")


@main.command(epilog=EPILOG)
@_common
@click.option("--poll", type=float, default=1.0, show_default=True, help="Seconds between polls.")
@click.option(
    "--max-parallel",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Runs at the same time (1: an op starts only after the previous process exited).",
)
def agent(root, host, port, agent_file, profiles_file, poll, max_parallel) -> None:
    """Run the local agent in the foreground (``start`` runs it in the background)."""
    from sandbox.agent import LocalAgent

    sb = _sandbox(root, host, port, agent_file, profiles_file)
    LocalAgent(
        paths=sb.paths,
        settings=sb.agent,
        host=sb.url,
        owner=DEFAULT_OWNER,
        poll=poll,
        max_parallel=max_parallel,
    ).serve()


@main.command("register-components", epilog=EPILOG)
@_common
@click.option(
    "--components-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=commands.DEFAULT_COMPONENTS,
    show_default=True,
    help="Where components/<name>/<version>.yaml live.",
)
@click.option("--owner", default=DEFAULT_OWNER, show_default=True, help="Hub owner (org).")
@click.option(
    "--api-host",
    help="Another Polyaxon server's URL (e.g. a cluster's). Default: this sandbox.",
)
@click.option(
    "--cluster",
    is_flag=True,
    help="Use the host and token of your polyaxon CLI config (polyaxon config set --host=...; "
    "polyaxon login): registers on a cluster's Polyaxon.",
)
def register_components(
    root, host, port, agent_file, profiles_file, components_dir, owner, api_host, cluster
) -> None:
    """Register every components/<name>/<version>.yaml as OWNER/<name>:<version>.

    A registered version is overwritten by the file (the file in git is its source of truth).
    """
    from sandbox.components import find_components, register

    comps = find_components(components_dir)
    if cluster:
        api_host = None
    elif not api_host:
        sb = _sandbox(root, host, port, agent_file, profiles_file)
        commands.require_server(sb)
        api_host = sb.url
    for ref in register(comps, owner, api_host):
        click.echo(f"registered {ref}")


@main.command(epilog=EPILOG)
@_common
@click.option("-f", "--file", "polyaxonfile", required=True, type=click.Path(exists=True),
              help="The polyaxonfile to run.")  # fmt: skip
@click.option("-P", "--param", "params", multiple=True, help="NAME=VALUE, repeatable.")
@click.option("--project", default=DEFAULT_PROJECT, show_default=True, help="Project to run in.")
@click.option(
    "--hub/--path-refs",
    default=False,
    help="Register the components and submit the hubRef twin (default: pathRefs).",
)
@click.option(
    "--components-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=commands.DEFAULT_COMPONENTS,
    show_default=True,
    help="Where components/<name>/<version>.yaml live (with --hub).",
)
@click.option("--timeout", type=float, default=1800, show_default=True, help="Seconds.")
def submit(
    root,
    host,
    port,
    agent_file,
    profiles_file,
    polyaxonfile,
    params,
    project,
    hub,
    components_dir,
    timeout,
) -> None:
    """Submit a polyaxonfile to a running sandbox and follow it; exit 5 if it fails."""
    from sandbox.components import ensure_project

    sb = _sandbox(root, host, port, agent_file, profiles_file)
    commands.require_server(sb)
    ensure_project(DEFAULT_OWNER, project, sb.client)
    commands.submit_and_follow(
        sb,
        Path(polyaxonfile),
        _parse_params(params),
        project,
        hub,
        timeout,
        components_dir,
        echo=click.echo,
    )


@main.command(epilog=EPILOG)
@_common
@click.option("--project", default=DEFAULT_PROJECT, show_default=True, help="Project to run in.")
@click.option(
    "-f",
    "--file",
    "polyaxonfile",
    type=click.Path(exists=True, path_type=Path),
    default=commands.DEFAULT_PIPELINE,
    show_default=True,
    help="The pipeline to run.",
)
@click.option("-P", "--param", "params", multiple=True, help="Override a pipeline input.")
@click.option("--timeout", type=float, default=1800, show_default=True, help="Seconds.")
@click.option(
    "--workload",
    type=click.Choice(WORKLOADS),
    default="checkpoint",
    show_default=True,
    help="What each stage measures: the training's checkpoints, or a data workload "
    "(docs/data-workloads.md) at small sizes.",
)
@_runtime_options
def demo(
    root,
    host,
    port,
    agent_file,
    profiles_file,
    project,
    polyaxonfile,
    params,
    timeout,
    workload,
    runtime,
    node_state,
):
    """Start everything, run the storage-profile pipeline, print the comparison.

    Re-running reuses the running server, project and hub (versions are re-registered from
    the files) and submits a fresh pipeline with caching disabled.
    """
    rt = commands.runtime(runtime, profiles_file, node_state)
    commands.run_demo(
        rt,
        _sandbox(root, host, port, agent_file, profiles_file, rt),
        project,
        polyaxonfile,
        _parse_params(params),
        timeout,
        echo=click.echo,
        workload=workload,
    )
