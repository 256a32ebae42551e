"""Start, watch and stop the sandbox's two processes: the Polyaxon CE server and the agent.

Each runs in its own session (process group) with its pid in ``.sandbox/*.pid``, so ``stop``
can end the whole group, children included, and nothing is left behind.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from checkpoint_storage_bench.processes import group_members, stop_group
from sandbox import claim
from sandbox.claim import ClaimLimits
from sandbox.config import (
    DEFAULT_HOST,
    DEFAULT_OWNER,
    REPO_ROOT,
    AgentSettings,
    SandboxPaths,
    check_loopback,
)
from sandbox.errors import PortInUseError, ServerStartError, ServerUnavailableError

# Seconds, as data: how long the server may take to answer /healthz, the agent to poll it
# once, and how long a process group gets between SIGTERM and SIGKILL.
SERVER_START_TIMEOUT = 90.0
AGENT_START_TIMEOUT = 60.0
RUNS_STOP_WAIT = 20.0  # how long ``stop`` lets the agent end the runs it asked to stop
LOG_TAIL_LINES = 40


def port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port the OS considers free now (for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def healthy(url: str, timeout: float = 2.0) -> bool:
    """Whether the server at ``url`` answers ``/healthz``.

    Never the agents' state (the SDK's agent client): reading that schedules queued runs.
    """
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file ('' when it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def pid_in(path: Path) -> int | None:
    """The pid written in ``path``, alive or not."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def read_pid(path: Path) -> int | None:
    """The pid in ``path`` if that process is still alive (zombies count as dead)."""
    pid = pid_in(path)
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return pid
    except psutil.Error:
        return None


def _spawn(args: Sequence[str], env: dict[str, str], log: Path, cwd: Path) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(args),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends it and its children
        )
    return proc.pid


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

    def agent_pid(self) -> int | None:
        return read_pid(self.paths.agent_pid)

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
        pid = _spawn(
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

    def agent_command(self, poll: float = 1.0) -> list[str]:
        """``python -m sandbox agent`` with this sandbox's root, server and config files."""
        cmd = [sys.executable, "-m", "sandbox", "agent", "--root", str(self.paths.root)]
        cmd += ["--host", self.host, "--port", str(self.port), "--poll", str(poll)]
        if self.agent.agent_file:
            cmd += ["--agent-file", str(self.agent.agent_file)]
        if self.agent.profiles_file:
            cmd += ["--profiles-file", str(self.agent.profiles_file)]
        return cmd

    def start_agent(
        self, poll: float = 1.0, timeout: float = AGENT_START_TIMEOUT
    ) -> tuple[ClaimLimits | None, list[int]]:
        """Start the local agent (``python -m sandbox agent``) unless it already runs; wait
        until it has polled the server once (it then writes ``.sandbox/agent.ready``).

        Before it starts, the claim's cgroup is reset: what an earlier agent left in it
        (runs that outlived a crash) is killed, and it is made afresh with the claim's
        current profile's limits.

        Returns:
            The claim's limits (None without an emulated profile) and the pids killed; (None,
            []) when the agent already ran.

        Raises:
            ServerUnavailableError: No server answers.
            ServerStartError: The agent exited or did not poll in time (log tail inside).
            ConfigError: The profiles emulate classes and the kernel cannot throttle.
        """
        if self.agent_pid():
            return None, []
        if not self.healthy():
            raise ServerUnavailableError(f"no server answers at {self.url}; start it first")
        limits = claim.reset(self.agent.profiles)
        self.paths.agent_ready.unlink(missing_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        self.paths.agent_log.parent.mkdir(parents=True, exist_ok=True)
        pid = _spawn(self.agent_command(poll), env, self.paths.agent_log, REPO_ROOT)
        self.paths.agent_pid.write_text(str(pid))
        deadline = time.monotonic() + timeout
        while not self.paths.agent_ready.exists():
            alive = read_pid(self.paths.agent_pid) is not None
            if not alive or time.monotonic() > deadline:
                what = f"did not poll the server within {timeout:.0f}s" if alive else "exited"
                stop_group(pid)
                self.paths.agent_pid.unlink(missing_ok=True)
                # No agent, no runs: the claim's cgroup would only be left behind.
                cgroup = claim.existing_cgroup(self.agent.profiles)
                if cgroup is not None:
                    cgroup.remove()
                raise ServerStartError(
                    f"the agent {what}; last lines of {self.paths.agent_log}:\n"
                    f"{tail(self.paths.agent_log)}"
                )
            time.sleep(0.2)
        return limits

    def stop_unfinished_runs(
        self, owner: str = DEFAULT_OWNER, wait: float = RUNS_STOP_WAIT
    ) -> list[str]:
        """Ask the server to stop every run that has not finished, so that none resumes at
        the next ``start``; give the agent up to ``wait`` seconds to end them.

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
            agent_runs = self.agent_pid() or read_pid(self.paths.state / "plx-agent.pid")
            deadline = time.monotonic() + (wait if agent_runs else 0)
            while time.monotonic() < deadline and any(
                get_run(client, owner, project, uuid).status not in DONE_STATUSES
                for project, uuid, _ in unfinished
            ):
                time.sleep(0.5)
        except ServerUnavailableError:
            return []  # the processes are stopped all the same
        return [uuid for _, uuid, _ in unfinished]

    def stop(self) -> list[str]:
        """Stop the unfinished runs, the agent, then the server. Returns what was stopped."""
        runs = self.stop_unfinished_runs()
        stopped = [f"{len(runs)} unfinished run(s)"] if runs else []
        # On the node (sandbox.on_node): Polyaxon's agent and the operator stand-in, once
        # the runs they were stopping are done.
        from sandbox.on_node import stop_node_processes

        stopped += stop_node_processes(self.paths)
        for name, pid_file in (("agent", self.paths.agent_pid), ("server", self.paths.server_pid)):
            pid = pid_in(pid_file)
            if pid and read_pid(pid_file):
                stop_group(pid)
                stopped.append(f"{name} (pid {pid})")
            elif pid and self._owns_group(pid):
                # The leader died but its children live on in its group.
                stop_group(pid)
                stopped.append(f"{name}'s leftover processes (group {pid})")
            pid_file.unlink(missing_ok=True)
        self.paths.agent_ready.unlink(missing_ok=True)
        # The claim's cgroup goes too (and whatever still ran in it): nothing of the
        # emulation outlives the sandbox; the next start makes it afresh.
        cgroup = claim.existing_cgroup(self.agent.profiles)
        if cgroup is not None:
            killed = cgroup.remove()
            left = f" and {len(killed)} process(es) left in it" if killed else ""
            stopped.append(f"claim cgroup {cgroup.path}{left}")
        # Its volume goes last, once nothing runs on it: the RAM it holds is freed.
        stopped += claim.remove_volumes(self.agent.profiles)
        return stopped

    def _owns_group(self, pgid: int) -> bool:
        """Whether group ``pgid`` still has members that belong to this sandbox (a stale pid
        file must never end someone else's processes)."""
        root = str(self.paths.root)
        for proc in group_members(pgid):
            try:
                if root in " ".join(proc.cmdline()) or root in proc.cwd():
                    return True
            except psutil.Error:
                continue
        return False

    def status(self) -> dict[str, object]:
        """Pids, health and URL of this sandbox; the claim's profile and the block-I/O
        limits in force, read back from the kernel."""
        return {
            "url": self.url,
            "server_pid": self.server_pid(),
            "server_healthy": self.healthy(),
            "agent_pid": self.agent_pid(),
            "root": str(self.paths.root),
            "server_log": str(self.paths.server_log),
            "agent_log": str(self.paths.agent_log),
            **claim.describe(self.agent.profiles),
        }
