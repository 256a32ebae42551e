"""Where the sandbox keeps its state, and the agent config it reads.

Everything lives under ``<root>/.sandbox/`` (``root`` defaults to the repo root, the same
directory ``$SANDBOX_ROOT`` names for the storage-profile hook), so a test can point the
whole sandbox at a tmp dir.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from checkpoint_storage_bench.contract import SANDBOX_MEDIA_PROFILES_FILE, SANDBOX_PROFILES_FILE
from localcluster.emulation.sandbox_profiles import (
    ProfilesFileError,
    SandboxProfiles,
    load_sandbox_profiles,
)
from sandbox.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_OWNER = "default"  # the sandbox CE server has a single organization, "default"
DEFAULT_PROJECT = "checkpoint-storage"
DEFAULT_AGENT_FILE = REPO_ROOT / "connections" / "sandbox-agent.yaml"
DEFAULT_PROFILES_FILE = REPO_ROOT / SANDBOX_PROFILES_FILE
MEDIA_PROFILES_FILE = REPO_ROOT / SANDBOX_MEDIA_PROFILES_FILE


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only reaches this machine."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# The address of the node's bridge (localcluster/node.py, BRIDGE_IP): the one address of this
# machine that the node's pods reach. The server may listen there, and nowhere else but
# loopback, so that Polyaxon's containers in those pods (init, sidecar, tracking) reach it.
NODE_BRIDGE_ADDRESS = "10.244.0.1"


def local_addresses() -> set[str]:
    """The IP addresses configured on this machine's interfaces."""
    import psutil

    return {
        addr.address.split("%")[0]
        for addrs in psutil.net_if_addrs().values()
        for addr in addrs
        if addr.family in (socket.AF_INET, socket.AF_INET6)
    }


def is_sandbox_host(host: str) -> bool:
    """Whether the sandbox server may listen on ``host``: loopback, or the node's bridge."""
    return is_loopback(host) or host.strip("[]") == NODE_BRIDGE_ADDRESS


def check_loopback(host: str) -> str:
    """``host`` if the sandbox server may listen there, else a ConfigError.

    The sandbox server has no authentication and its agent runs whatever command a submitted
    run names, so it must never listen where another machine can reach it: loopback, or the
    node's bridge address once the node has put it on this machine (its pods reach nothing
    else of the host, and nothing off the machine reaches the bridge).
    """
    if is_loopback(host):
        return host
    if host.strip("[]") == NODE_BRIDGE_ADDRESS:
        if NODE_BRIDGE_ADDRESS not in local_addresses():
            raise ConfigError(
                f"--host {host} is the node's bridge address, but no interface of this machine "
                "has it: start the node first (python -m localcluster start --node)"
            )
        return host
    raise ConfigError(
        f"--host {host} is not a loopback address: the sandbox server is unauthenticated "
        "and its agent runs submitted commands, so it only listens on 127.0.0.1, ::1, "
        f"localhost, or the node's bridge address {NODE_BRIDGE_ADDRESS}"
    )


def is_loopback_http(url: str) -> bool:
    """Whether ``url`` is plain ``http://`` to the sandbox's own server (a loopback host or
    the node's bridge address)."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "http" and is_sandbox_host(parts.hostname or "")


def default_root() -> Path:
    """The sandbox root: ``$SANDBOX_ROOT`` or the repo root."""
    return Path(os.environ.get("SANDBOX_ROOT") or REPO_ROOT).resolve()


def _resolve(root: Path, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else root / path


@dataclass
class SandboxPaths:
    """Every file and directory of one sandbox, derived from its root."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()

    @property
    def state(self) -> Path:
        return self.root / ".sandbox"

    @property
    def server_data(self) -> Path:
        """The server's ``--path``: its SQLite DB and, as artifacts store, every run's files."""
        return self.state / "server"

    @property
    def server_home(self) -> Path:
        return self.state / "server-home"

    @property
    def cli_home(self) -> Path:
        """HOME for the ``polyaxon`` CLI calls, so the user's own ~/.polyaxon is untouched."""
        return self.state / "cli-home"

    @property
    def archives(self) -> Path:
        return self.state / "archives"

    @property
    def runs(self) -> Path:
        """Per-run HOME, context dir and captured log of the agent's processes."""
        return self.state / "runs"

    @property
    def generated(self) -> Path:
        """Generated polyaxonfiles (the hubRef twin of the pipeline)."""
        return self.state / "generated"

    @property
    def server_log(self) -> Path:
        return self.state / "server.log"

    @property
    def agent_log(self) -> Path:
        return self.state / "agent.log"

    @property
    def agent_ready(self) -> Path:
        """Written by the agent after its first successful poll of the server."""
        return self.state / "agent.ready"

    @property
    def server_pid(self) -> Path:
        return self.state / "server.pid"

    @property
    def agent_pid(self) -> Path:
        return self.state / "agent.pid"

    @property
    def info(self) -> Path:
        """JSON with the host and port of the running server."""
        return self.state / "sandbox.json"

    def read_info(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.info.read_text())
        except (OSError, ValueError):
            return None


@dataclass
class AgentSettings:
    """The sandbox agent's config (``connections/sandbox-agent.yaml``), paths resolved.

    Attributes:
        artifacts_store: The Polyaxon ``host_path`` connection of the artifacts store.
        connections: Polyaxon connections, the same names the cluster agent declares.
        local_mounts: mountPath -> local directory, for every mounted connection.
        profiles_file: The sandbox storage-profiles file (contracts.md).
        profiles: That file's content, paths resolved (None without a profiles file).
        agent_file: The agent config these settings were read from.
        claim_connections: The connections that mount the profiles' claim (an op that
            names one runs in the claim's cgroup).
    """

    artifacts_store: dict[str, Any]
    connections: list[dict[str, Any]]
    local_mounts: dict[str, Path] = field(default_factory=dict)
    profiles_file: Path | None = None
    profiles: SandboxProfiles | None = None
    agent_file: Path | None = None
    claim_connections: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        names = [c.get("name") for c in self.connections]
        if len(set(names)) != len(names) or not all(names):
            raise ConfigError(f"agent config: connection names must be unique and set: {names}")
        if self.artifacts_store.get("kind") != "host_path":
            raise ConfigError("agent config: the sandbox artifacts store must be a host_path")

    def server_env(self) -> dict[str, str]:
        """The env vars that give the server the same connections (it compiles against them)."""
        return {
            "POLYAXON_AGENT_ARTIFACTS_STORE": json.dumps(self.artifacts_store),
            "POLYAXON_AGENT_CONNECTIONS": json.dumps(self.connections),
        }


def load_profiles(path: Path, root: Path) -> SandboxProfiles:
    """Read the sandbox storage-profiles file (the contract's parser); relative paths
    resolve against ``root``.

    Raises:
        ConfigError: The file is unreadable or malformed.
    """
    try:
        return load_sandbox_profiles(path, root)
    except ProfilesFileError as exc:
        raise ConfigError(str(exc)) from exc


def load_agent_settings(
    root: Path, agent_file: Path | None = None, profiles_file: Path | None = None
) -> AgentSettings:
    """Read the agent config and resolve every local path against the sandbox root.

    A ``volume_claim`` connection mounts the profiles file's ``claimPath`` when its claim is
    the profiles file's claim, else ``.sandbox/claims/<claim>``; a ``host_path`` connection
    mounts its ``hostPath``.
    """
    agent_file = agent_file or DEFAULT_AGENT_FILE
    try:
        data = yaml.safe_load(Path(agent_file).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read agent config {agent_file}: {exc}") from exc
    paths = SandboxPaths(root)
    store = json.loads(json.dumps(data.get("artifactsStore") or {}))
    schema = store.setdefault("schema", {})
    host = str(_resolve(paths.root, schema.get("hostPath") or str(paths.server_data)))
    schema.update(hostPath=host, mountPath=host)

    if profiles_file is None and data.get("profilesFile"):
        profiles_file = _resolve(REPO_ROOT, data["profilesFile"])
    profiles = (
        load_profiles(profiles_file, paths.root)
        if profiles_file and Path(profiles_file).exists()
        else None
    )
    mounts: dict[str, Path] = {}
    claim_connections = set()
    connections = data.get("connections") or []
    for conn in connections:
        kind, schema = conn.get("kind"), conn.get("schema") or {}
        mount = schema.get("mountPath")
        if not mount:
            continue
        if kind == "volume_claim":
            claim = schema.get("volumeClaim")
            if profiles and profiles.claim == claim:
                mounts[mount] = profiles.claim_path
                claim_connections.add(str(conn.get("name")))
            else:
                mounts[mount] = paths.state / "claims" / str(claim)
        elif kind == "host_path":
            mounts[mount] = _resolve(paths.root, schema.get("hostPath", mount))
    return AgentSettings(
        artifacts_store=store,
        connections=connections,
        local_mounts=mounts,
        profiles_file=Path(profiles_file) if profiles_file else None,
        profiles=profiles,
        agent_file=Path(agent_file),
        claim_connections=frozenset(claim_connections),
    )


def prepare_media(profiles: SandboxProfiles) -> list[Path]:
    """Create every profile's media directory; point a missing claim path at the first one.

    The claim starts on the first profile (baseline), as a fresh claim starts on its
    default class; the storage-profile hook repoints it from then on.
    """
    made = []
    for profile in profiles.profiles.values():
        if profile.path not in made:
            profile.path.mkdir(parents=True, exist_ok=True)
            made.append(profile.path)
    link = profiles.claim_path
    if not link.exists() and not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        first = next(iter(profiles.profiles.values()))
        link.symlink_to(first.path, target_is_directory=True)
    return made
