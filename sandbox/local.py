"""The local runtime: the sandbox's own process agent (``python -m sandbox agent``,
:mod:`sandbox.agent`), each op a process on this machine, the claim's profiles emulated by
block-I/O limits on the claim's own loop-device volume (``localcluster.emulation``;
docs/sandbox.md), or two plain media where the kernel cannot throttle.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import ClassVar

from checkpoint_storage_bench.processes import stop_group
from localcluster.emulation.io_limits import BlockDevice, ThrottleUnavailable, probe
from localcluster.emulation.sandbox_profiles import SandboxProfiles
from sandbox import claim
from sandbox.claim import ClaimLimits
from sandbox.components import ensure_project
from sandbox.config import (
    MEDIA_PROFILES_FILE,
    REPO_ROOT,
    SandboxPaths,
    load_agent_settings,
    prepare_media,
)
from sandbox.errors import ConfigError, ServerStartError, ServerUnavailableError
from sandbox.processes import read_pid, spawn, tail
from sandbox.runtime import Echo, Runtime
from sandbox.server import Sandbox

AGENT_START_TIMEOUT = 60.0  # seconds the agent may take to poll the server once


def emulation_or_media(
    sb: Sandbox, echo: Echo = print, made: list[claim.ClaimVolume] | None = None
) -> Sandbox:
    """The sandbox as it is when the kernel can emulate its profiles' classes (or none
    needs emulating); else the same sandbox on the plain media profiles, said in one line.

    For the default profiles file only: a profiles file the user named is used as it is
    (and refused, exit 3, where its emulation is impossible). The claim's volumes are made
    on the way (appended to ``made``); a fallback removes them again.
    """
    profiles = sb.agent.profiles
    if profiles is None or not profiles.emulated:
        return sb
    volumes: list[claim.ClaimVolume] = []
    try:
        devices = emulation_devices(profiles, echo, volumes)
    except ThrottleUnavailable as exc:
        claim.remove_created(profiles, volumes)
        echo(f"sandbox: cannot emulate the volume classes on this machine: {exc}")
        echo(
            f"sandbox: NOT AN EMULATION: falling back to {MEDIA_PROFILES_FILE.name}, two "
            "plain media (the local disk and memory); the comparison shows the machinery, "
            "not what the classes would do"
        )
        media = load_agent_settings(sb.paths.root, sb.agent.agent_file, MEDIA_PROFILES_FILE)
        return dataclasses.replace(sb, agent=media)
    if made is not None:
        made.extend(volumes)
    for profile in profiles.profiles.values():
        what = (
            f"emulates {profile.volume_attributes_class} ({profile.limits.describe()}) "
            f"on {devices[profile.path].name} ({devices[profile.path].id})"
            if profile.limits
            else f"{profile.path} as it is (no emulation)"
        )
        echo(f"sandbox: profile {profile.name} {what}")
    return sb


def emulation_devices(
    profiles: SandboxProfiles, echo: Echo = print, made: list[claim.ClaimVolume] | None = None
) -> dict[Path, BlockDevice]:
    """Make the claim's volumes (saying which device backs the claim and how fast it writes
    unthrottled; appended to ``made``) and check the kernel can throttle them: each emulated
    profile's directory → its device.

    Raises:
        ThrottleUnavailable: No volume, a volume too slow, or no throttle here.
    """
    for volume in claim.prepare_volumes(profiles):
        echo(f"sandbox: {volume.describe()}")
        if made is not None:
            made.append(volume)
    return {
        p.path: probe(p.path, profiles.cgroup_name)[1]
        for p in profiles.profiles.values()
        if p.limits is not None
    }


@dataclasses.dataclass
class LocalRuntime(Runtime):
    """The process agent on this machine.

    Attributes:
        fallback: Whether profiles that emulate volume classes fall back to plain media where
            the kernel cannot throttle (the default profiles file; a file the user named is
            refused there instead, see :func:`emulation_or_media`).
    """

    fallback: bool = False

    name: ClassVar[str] = "local"
    processes: ClassVar[tuple[str, ...]] = ("agent",)
    hub: ClassVar[bool] = True

    def sandbox(
        self,
        paths: SandboxPaths,
        host: str,
        port: int,
        agent_file: Path | None,
        profiles_file: Path | None,
    ) -> Sandbox:
        agent = load_agent_settings(paths.root, agent_file, profiles_file)
        return Sandbox(paths=paths, agent=agent, host=host, port=port)

    def start(self, sb: Sandbox, owner: str, project: str, echo: Echo = print) -> Sandbox:
        """Media, server, project and agent; each step is skipped when already done.

        Raises:
            ConfigError: The profiles emulate classes the kernel cannot throttle here (before
                anything is started).
        """
        created: list[claim.ClaimVolume] = []
        if self.fallback:
            sb = emulation_or_media(sb, echo, created)
        elif sb.agent.profiles is not None and sb.agent.profiles.emulated:
            try:
                emulation_devices(sb.agent.profiles, echo, created)
            except ThrottleUnavailable as exc:
                claim.remove_created(sb.agent.profiles, created)
                raise ConfigError(claim.cannot_emulate(sb.agent.profiles, str(exc))) from exc
        try:
            return self._start(sb, owner, project, echo)
        except BaseException:
            if sb.agent.profiles is not None:
                claim.remove_created(sb.agent.profiles, created)
            raise

    def _start(self, sb: Sandbox, owner: str, project: str, echo: Echo) -> Sandbox:
        claim.claim_cgroup(sb.agent.profiles)  # refuse an impossible emulation before starting
        if sb.agent.profiles:
            prepare_media(sb.agent.profiles)
        sb.paths.state.mkdir(parents=True, exist_ok=True)
        echo(f"sandbox: server on {sb.url} (log {sb.paths.server_log})")
        sb.start_server()
        ensure_project(owner, project, sb.client)
        limits, killed = self.start_agent(sb)
        if killed:
            echo(
                f"sandbox: ended {len(killed)} process(es) an earlier agent left in the "
                "claim's cgroup"
            )
        if limits:
            echo(f"sandbox: {claim.summary(limits)}")
        echo(f"sandbox: agent running (log {sb.paths.agent_log})")
        return sb

    def agent_pid(self, sb: Sandbox) -> int | None:
        return read_pid(sb.paths.agent_pid)

    def agent_command(self, sb: Sandbox, poll: float = 1.0) -> list[str]:
        """``python -m sandbox agent`` with this sandbox's root, server and config files."""
        cmd = [sys.executable, "-m", "sandbox", "agent", "--root", str(sb.paths.root)]
        cmd += ["--host", sb.host, "--port", str(sb.port), "--poll", str(poll)]
        if sb.agent.agent_file:
            cmd += ["--agent-file", str(sb.agent.agent_file)]
        if sb.agent.profiles_file:
            cmd += ["--profiles-file", str(sb.agent.profiles_file)]
        return cmd

    def start_agent(
        self, sb: Sandbox, poll: float = 1.0, timeout: float = AGENT_START_TIMEOUT
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
        if self.agent_pid(sb):
            return None, []
        if not sb.healthy():
            raise ServerUnavailableError(f"no server answers at {sb.url}; start it first")
        limits = claim.reset(sb.agent.profiles)
        sb.paths.agent_ready.unlink(missing_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        pid = spawn(self.agent_command(sb, poll), env, sb.paths.agent_log, REPO_ROOT)
        sb.paths.agent_pid.write_text(str(pid))
        deadline = time.monotonic() + timeout
        while not sb.paths.agent_ready.exists():
            alive = read_pid(sb.paths.agent_pid) is not None
            if not alive or time.monotonic() > deadline:
                what = f"did not poll the server within {timeout:.0f}s" if alive else "exited"
                stop_group(pid)
                sb.paths.agent_pid.unlink(missing_ok=True)
                # No agent, no runs: the claim's cgroup would only be left behind.
                cgroup = claim.existing_cgroup(sb.agent.profiles)
                if cgroup is not None:
                    cgroup.remove()
                raise ServerStartError(
                    f"the agent {what}; last lines of {sb.paths.agent_log}:\n"
                    f"{tail(sb.paths.agent_log)}"
                )
            time.sleep(0.2)
        return limits

    def place(self, sb: Sandbox, echo: Echo = print) -> dict[str, str]:
        return {}  # the profiles file names the claim and its profiles (demo_params)

    def status(self, sb: Sandbox) -> dict[str, object]:
        """The server's and the agent's status; the claim's profile and the block-I/O limits
        in force, read back from the kernel."""
        return {**super().status(sb), **claim.describe(sb.agent.profiles)}

    def stop(self, sb: Sandbox) -> list[str]:
        """The agent (and any run it executes), then the claim's cgroup and volumes."""
        stopped = super().stop(sb)
        sb.paths.agent_ready.unlink(missing_ok=True)
        # The claim's cgroup goes too (and whatever still ran in it): nothing of the
        # emulation outlives the sandbox; the next start makes it afresh.
        cgroup = claim.existing_cgroup(sb.agent.profiles)
        if cgroup is not None:
            killed = cgroup.remove()
            left = f" and {len(killed)} process(es) left in it" if killed else ""
            stopped.append(f"claim cgroup {cgroup.path}{left}")
        # Its volume goes last, once nothing runs on it: the RAM it holds is freed.
        stopped += claim.remove_volumes(sb.agent.profiles)
        return stopped
