"""The sandbox's Polyaxon CE server: start it, watch it, stop its unfinished runs, stop it.

What executes the runs is a runtime's (:mod:`sandbox.runtime`): the local process agent or
Polyaxon's own agent on the local node; both talk to this one server.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoint_storage_bench.ports import port_free
from checkpoint_storage_bench.processes import stop_group
from sandbox.config import (
    DEFAULT_HOST,
    DEFAULT_OWNER,
    AgentSettings,
    SandboxPaths,
    check_loopback,
)
from sandbox.errors import PortInUseError, ServerStartError, ServerUnavailableError
from sandbox.processes import read_pid, spawn, stop_recorded, tail

# Seconds, as data: how long the server may take to answer /healthz, and how long ``stop``
# lets a runtime's agent end the runs it asked to stop.
SERVER_START_TIMEOUT = 90.0
RUNS_STOP_WAIT = 20.0


def healthy(url: str, timeout: float = 2.0) -> bool:
    """Whether the server at ``url`` answers ``/healthz``.

    Never the agents' state (the SDK's agent client): reading that schedules queued runs.
    """
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def server_env(paths: SandboxPaths, agent: AgentSettings) -> dict[str, str]:
    """The server's environment (see docs/sandbox.md for why each variable is needed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYAXON_")}
    env.update(
        HOME=str(paths.server_home),  # haupt writes ~/.polyaxon/.home
        POLYAXON_UI_IN_SANDBOX="true",  # else /static/* is a 404 with one worker
        POLYAXON_UI_OFFLINE="true",  # else the UI loads React/Plotly from public CDNs
        POLYAXON_DB_OPTIONS=json.dumps({"timeout": 30, "transaction_mode": "IMMEDIATE"}),
        POLYAXON_ARCHIVES_ROOT=str(paths.archives),
        **agent.server_env(),
    )
    return env


@dataclass
class Sandbox:
    """One sandbox: its paths, agent settings, and where its server listens."""

    paths: SandboxPaths
    agent: AgentSettings
    host: str = DEFAULT_HOST
    port: int = 8000

    def __post_init__(self) -> None:
        check_loopback(self.host)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def client(self) -> Any:
        """Polyaxon's SDK client for this sandbox's server (no token is ever sent to it)."""
        from sandbox.components import api_client

        return api_client(self.url)

    def healthy(self) -> bool:
        return healthy(self.url)

    def server_pid(self) -> int | None:
        return read_pid(self.paths.server_pid)

    def start_server(self, timeout: float = SERVER_START_TIMEOUT) -> None:
        """Start the server unless this sandbox's server is already up; wait until healthy.

        Raises:
            PortInUseError: Something else listens on the port.
            ServerStartError: The server exited or did not become healthy (log tail inside).
        """
        if self.server_pid():
            running = (self.paths.read_info() or {}).get("port")
            if running not in (None, self.port):
                raise PortInUseError(
                    f"this sandbox's server already runs on port {running}; use --port "
                    f"{running}, or stop it first"
                )
            if self.healthy():
                return
        if not port_free(self.host, self.port):
            raise PortInUseError(
                f"port {self.port} on {self.host} is already in use; "
                f"pick another with --port (or stop what listens there)"
            )
        for d in (self.paths.server_data, self.paths.server_home, self.paths.archives):
            d.mkdir(parents=True, exist_ok=True)
        self.paths.server_log.write_text("")
        haupt = Path(sys.executable).with_name("haupt")
        cmd = [str(haupt)] if haupt.exists() else [sys.executable, "-m", "haupt"]
        cmd += ["sandbox", "start", "--host", self.host, "--port", str(self.port)]
        cmd += ["--workers", "1", "--path", str(self.paths.server_data)]
        pid = spawn(
            cmd, server_env(self.paths, self.agent), self.paths.server_log, self.paths.state
        )
        self.paths.server_pid.write_text(str(pid))
        self.paths.info.write_text(json.dumps({"host": self.host, "port": self.port}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not read_pid(self.paths.server_pid):
                stop_group(pid)  # what the server had started before it died
                raise ServerStartError(
                    f"the server exited while starting; last lines of "
                    f"{self.paths.server_log}:\n{tail(self.paths.server_log)}"
                )
            if self.healthy():
                return
            time.sleep(0.5)
        stop_group(pid)
        raise ServerStartError(
            f"the server did not answer {self.url}/healthz within {timeout:.0f}s; last lines "
            f"of {self.paths.server_log}:\n{tail(self.paths.server_log)}"
        )

    def stop_unfinished_runs(
        self, owner: str = DEFAULT_OWNER, wait: float = RUNS_STOP_WAIT
    ) -> list[str]:
        """Ask the server to stop every run that has not finished, so that none resumes at
        the next ``start``; give the agent up to ``wait`` seconds to end them (the caller
        passes 0 when no agent runs: nothing would end them).

        Returns:
            The uuids of the runs it asked to stop ([] when no server answers).
        """
        from polyaxon.client import ProjectClient

        from sandbox.components import sdk_call
        from sandbox.pipeline import DONE_STATUSES, get_run, list_runs, stop_run

        if not self.server_pid() or not self.healthy():
            return []
        client = self.client
        try:
            projects = sdk_call(
                "list projects", ProjectClient(owner=owner, client=client).list, limit=1000
            )
            unfinished = [
                (project.name, run.uuid, run.status)
                for project in projects.results or []
                for run in list_runs(client, owner, project.name)
                if run.status not in DONE_STATUSES
            ]
            for project, uuid, status in unfinished:
                if status != "stopping":
                    stop_run(client, owner, project, uuid)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(
                get_run(client, owner, project, uuid).status not in DONE_STATUSES
                for project, uuid, _ in unfinished
            ):
                time.sleep(0.5)
        except ServerUnavailableError:
            return []  # the processes are stopped all the same
        return [uuid for _, uuid, _ in unfinished]

    def stop_server(self) -> list[str]:
        """Stop the server (the runtimes' processes first: see :func:`sandbox.commands.stop`)."""
        stopped = stop_recorded(self.paths.root, "server", self.paths.server_pid)
        return [stopped] if stopped else []

    def status(self) -> dict[str, object]:
        """The server's pid, health and URL, and where its log is."""
        return {
            "url": self.url,
            "server_pid": self.server_pid(),
            "server_healthy": self.healthy(),
            "root": str(self.paths.root),
            "server_log": str(self.paths.server_log),
        }
