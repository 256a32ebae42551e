"""``python -m sandbox``: start/stop/status of the local Polyaxon sandbox, its agent, the
component hub registration, and the one-command demo of the storage-profile pipeline."""

from __future__ import annotations

import importlib.util
import json
import logging
import shlex
import subprocess
import sys
from pathlib import Path

import click

from sandbox.config import (
    DEFAULT_HOST,
    DEFAULT_OWNER,
    DEFAULT_PORT,
    DEFAULT_PROJECT,
    REPO_ROOT,
    SandboxPaths,
    default_root,
    load_agent_settings,
    prepare_media,
)
from sandbox.errors import SandboxError, ServerUnavailableError
from sandbox.server import Sandbox

DEFAULT_PIPELINE = REPO_ROOT / "polyaxonfiles" / "checkpoint-storage-pipeline.yaml"
# Small enough for a 2-core laptop to finish the whole pipeline in a few minutes. Only the
# ones the pipeline declares as inputs are passed.
DEMO_PARAMS = {
    "backend": "local",
    "size_scale": "0.02",
    "fio_runtime": "2",
    "model_size": "32MiB",
    "steps": "60",
    "checkpoint_every": "10",
    "device": "cpu",
}


def demo_params(sb: Sandbox, pipeline: Path, overrides: dict[str, str]) -> dict[str, str]:
    """The demo's pipeline inputs: small sizes, the local hook backend, this sandbox's API."""
    import yaml

    declared = {
        i.get("name") for i in (yaml.safe_load(pipeline.read_text()) or {}).get("inputs") or []
    }
    values = dict(DEMO_PARAMS, api_host=sb.url)
    if sb.agent.profiles_file:
        values["profiles_file"] = str(sb.agent.profiles_file)
    for key in ("namespace", "claim"):
        if sb.agent.profiles and sb.agent.profiles.get(key):
            values[key] = sb.agent.profiles[key]
    values = {k: v for k, v in values.items() if k in declared}
    values.update(overrides)
    return values


def _sandbox(root: Path | None, host: str, port: int | None, agent_file, profiles_file) -> Sandbox:
    paths = SandboxPaths(root or default_root())
    if port is None:
        info = paths.read_info() or {}
        port = int(info.get("port", DEFAULT_PORT))
    agent = load_agent_settings(
        paths.root,
        Path(agent_file) if agent_file else None,
        Path(profiles_file) if profiles_file else None,
    )
    return Sandbox(paths=paths, agent=agent, host=host, port=port)


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
                help="The server's address; loopback only (127.0.0.1, ::1, localhost).",
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
                help="Storage profiles (default connections/sandbox-profiles.yaml).",
            ),
        ]
    ):
        fn = option(fn)
    return fn


def _run(fn, *args, **kwargs):
    """Turn sandbox errors into one clear line and their exit code."""
    try:
        return fn(*args, **kwargs)
    except SandboxError as exc:
        click.echo(f"sandbox: error: {exc}", err=True)
        sys.exit(exc.exit_code)


def _stop_hint(sb: Sandbox) -> str:
    root = "" if sb.paths.root == REPO_ROOT else f" --root {shlex.quote(str(sb.paths.root))}"
    return f"{shlex.quote(sys.executable)} -m sandbox stop{root}"


def require_server(sb: Sandbox) -> None:
    """Raise ServerUnavailableError unless this sandbox's server answers."""
    if not sb.api.healthy():
        raise ServerUnavailableError(
            f"no sandbox server answers at {sb.url}; start it with "
            f"{shlex.quote(sys.executable)} -m sandbox start"
        )


def _ensure_project(sb: Sandbox, owner: str, project: str) -> None:
    from sandbox.components import api_client, ensure_project

    ensure_project(owner, project, api_client(sb.url))


def start_all(sb: Sandbox, owner: str, project: str, echo=click.echo) -> None:
    """Media, server, project and agent; each step is skipped when already done."""
    if sb.agent.profiles:
        prepare_media(sb.agent.profiles)
    sb.paths.state.mkdir(parents=True, exist_ok=True)
    echo(f"sandbox: server on {sb.url} (log {sb.paths.server_log})")
    sb.start_server()
    _ensure_project(sb, owner, project)
    sb.start_agent()
    echo(f"sandbox: agent running (log {sb.paths.agent_log})")


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """A local Polyaxon sandbox: CE server, local agent, component hub, pipeline demo."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@main.command()
@_common
@click.option("--project", default=DEFAULT_PROJECT, show_default=True)
def start(root, host, port, agent_file, profiles_file, project) -> None:
    """Start the server (127.0.0.1, one worker) and the local agent; create the project."""
    sb = _run(_sandbox, root, host, port, agent_file, profiles_file)
    _run(start_all, sb, DEFAULT_OWNER, project)
    click.echo(f"sandbox: runs table {sb.url}/ui/{DEFAULT_OWNER}/{project}/runs")
    click.echo(f"sandbox: stop with: {_stop_hint(sb)}")


@main.command()
@_common
def stop(root, host, port, agent_file, profiles_file) -> None:
    """Stop the agent (and any run it executes) and the server."""
    sb = _run(_sandbox, root, host, port, agent_file, profiles_file)
    stopped = sb.stop()
    click.echo("sandbox: stopped " + (", ".join(stopped) if stopped else "nothing (not running)"))


@main.command()
@_common
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(root, host, port, agent_file, profiles_file, as_json) -> None:
    """Show whether the server and agent run, and where their logs are. Exit 6 if down."""
    sb = _run(_sandbox, root, host, port, agent_file, profiles_file)
    info = sb.status()
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            click.echo(f"{key:>15}: {value}")
    if not (info["server_healthy"] and info["agent_pid"]):
        sys.exit(6)


@main.command()
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

    sb = _run(_sandbox, root, host, port, agent_file, profiles_file)
    LocalAgent(
        paths=sb.paths,
        settings=sb.agent,
        host=sb.url,
        owner=DEFAULT_OWNER,
        poll=poll,
        max_parallel=max_parallel,
    ).serve()


@main.command("register-components")
@_common
@click.option(
    "--components-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=REPO_ROOT / "components",
    show_default=True,
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

    comps = _run(find_components, components_dir)
    if cluster:
        api_host = None
    elif not api_host:
        sb = _run(_sandbox, root, host, port, agent_file, profiles_file)
        _run(require_server, sb)
        api_host = sb.url
    for ref in _run(register, comps, owner, api_host):
        click.echo(f"registered {ref}")


def _parse_params(values: tuple[str, ...]) -> dict[str, str]:
    params = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint="-P")
        params[key] = value
    return params


def submit_pipeline(
    sb: Sandbox,
    polyaxonfile: Path,
    params: dict[str, str],
    project: str,
    hub: bool,
    components_dir: Path = REPO_ROOT / "components",
    echo=click.echo,
) -> str:
    """Register the components and submit the hubRef twin (with ``hub``, else the pathRef
    twin); returns the run's uuid."""
    from sandbox.components import find_components, pipeline_twin, register
    from sandbox.pipeline import submit

    if hub:
        comps = find_components(components_dir)
        for ref in register(comps, DEFAULT_OWNER, sb.url):
            echo(f"sandbox: registered {ref}")
    twin = pipeline_twin(
        polyaxonfile, sb.paths.generated / polyaxonfile.name, DEFAULT_OWNER if hub else None
    )
    echo(f"sandbox: submitting {twin} (generated from {polyaxonfile})")
    uuid = submit(twin, DEFAULT_OWNER, project, sb.url, params, sb.paths.cli_home)
    echo(f"sandbox: pipeline {uuid} submitted; {sb.url}/ui/{DEFAULT_OWNER}/{project}/runs/{uuid}")
    return uuid


def submit_and_follow(
    sb: Sandbox,
    polyaxonfile: Path,
    params: dict[str, str],
    project: str,
    hub: bool,
    timeout: float,
    components_dir: Path = REPO_ROOT / "components",
    echo=click.echo,
) -> tuple[str, list[dict]]:
    """:func:`submit_pipeline`, then follow it to its end (RunFailedError if it fails)."""
    from sandbox.pipeline import follow

    uuid = submit_pipeline(sb, polyaxonfile, params, project, hub, components_dir, echo)
    return uuid, follow(sb.api, DEFAULT_OWNER, project, uuid, timeout, echo=echo)


@main.command()
@_common
@click.option("-f", "--file", "polyaxonfile", required=True, type=click.Path(exists=True))
@click.option("-P", "--param", "params", multiple=True, help="NAME=VALUE, repeatable.")
@click.option("--project", default=DEFAULT_PROJECT, show_default=True)
@click.option(
    "--hub/--path-refs",
    default=False,
    help="Register the components and submit the hubRef twin (default: pathRefs).",
)
@click.option(
    "--components-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=REPO_ROOT / "components",
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
    sb = _run(_sandbox, root, host, port, agent_file, profiles_file)
    _run(require_server, sb)
    _run(_ensure_project, sb, DEFAULT_OWNER, project)
    _run(
        submit_and_follow,
        sb,
        Path(polyaxonfile),
        _parse_params(params),
        project,
        hub,
        timeout,
        components_dir,
    )


def print_comparison(sb: Sandbox, project: str, pipeline: str, ops: list[dict]) -> None:
    """The verdict module's report when it exists, else our own profile-by-profile table."""
    from sandbox.pipeline import comparison

    if importlib.util.find_spec("checkpoint_compare") is not None:
        # --no-track: the pipeline's own compare op already logged the verdict to its run.
        done = subprocess.run(
            [sys.executable, "-m", "checkpoint_compare", "--api-host", sb.url, "--no-track"]
            + ["--project", f"{DEFAULT_OWNER}/{project}", "--pipeline", pipeline],
            cwd=REPO_ROOT,
            check=False,
        )
        if done.returncode == 0:
            return
        click.echo("sandbox: checkpoint_compare failed; the raw outputs instead:", err=True)
    ops = [sb.api.run(DEFAULT_OWNER, project, op["uuid"]) for op in ops]
    click.echo(comparison(ops))


@main.command()
@_common
@click.option("--project", default=DEFAULT_PROJECT, show_default=True)
@click.option(
    "-f",
    "--file",
    "polyaxonfile",
    type=click.Path(exists=True, path_type=Path),
    default=DEFAULT_PIPELINE,
    show_default=True,
)
@click.option("-P", "--param", "params", multiple=True, help="Override a pipeline input.")
@click.option("--timeout", type=float, default=1800, show_default=True, help="Seconds.")
def demo(root, host, port, agent_file, profiles_file, project, polyaxonfile, params, timeout):
    """Start everything, run the storage-profile pipeline, print the comparison.

    Re-running reuses the running server, project and hub (versions are re-registered from
    the files) and submits a fresh pipeline with caching disabled.
    """
    from sandbox.pipeline import follow, runs_table_url

    sb = _run(_sandbox, root, host, port, agent_file, profiles_file)
    _run(start_all, sb, DEFAULT_OWNER, project)
    values = _run(demo_params, sb, polyaxonfile, _parse_params(params))
    uuid = _run(submit_pipeline, sb, polyaxonfile, values, project, True)
    try:
        ops = follow(sb.api, DEFAULT_OWNER, project, uuid, timeout)
        click.echo("")
        print_comparison(sb, project, uuid, ops)
        failed = None
    except SandboxError as exc:
        failed = exc
        click.echo(f"sandbox: error: {exc}", err=True)
    click.echo("")
    click.echo(f"runs table: {runs_table_url(sb.url, DEFAULT_OWNER, project, uuid)}")
    click.echo(f"the server keeps running; stop it with: {_stop_hint(sb)}")
    if failed:
        sys.exit(failed.exit_code)
