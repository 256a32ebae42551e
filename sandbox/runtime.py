"""What executes the sandbox's runs: one interface, two runtimes.

- :class:`sandbox.local.LocalRuntime`: the sandbox's own process agent (``python -m sandbox
  agent``), each op a process on this machine, the claim's profiles emulated by block-I/O
  limits (``localcluster.emulation``);
- :class:`sandbox.on_node.NodeRuntime`: Polyaxon's own Kubernetes agent and the operator
  stand-in against the local node, each op a pod, the claim on the node's CSI driver
  (docs/agent-on-node.md).

Both share the one server (:class:`sandbox.server.Sandbox`); a runtime configures it
(:meth:`Runtime.sandbox`), starts its own processes after it (:meth:`Runtime.start`), reports
and stops them, and says what a pipeline submitted to it needs to know of where its pods run
(:meth:`Runtime.place`). The commands (:mod:`sandbox.commands`) only ever call this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from sandbox.config import SandboxPaths
from sandbox.processes import read_pid, stop_recorded
from sandbox.server import Sandbox

Echo = Callable[[str], None]


class Runtime(ABC):
    """One way of executing the runs the sandbox's server schedules.

    Attributes:
        name: How ``--on-node`` (or not) names it.
        processes: The processes it starts, each with ``.sandbox/<name>.pid`` and ``.log``.
        hub: Whether a demo submits the pipeline's hubRef twin (the components registered
            in the server's hub) rather than its pathRef twin.
    """

    name: ClassVar[str]
    processes: ClassVar[tuple[str, ...]]
    hub: ClassVar[bool]

    @abstractmethod
    def sandbox(
        self,
        paths: SandboxPaths,
        host: str,
        port: int,
        agent_file: Path | None,
        profiles_file: Path | None,
    ) -> Sandbox:
        """The server as this runtime needs it: its settings, and where it listens."""

    @abstractmethod
    def start(self, sb: Sandbox, owner: str, project: str, echo: Echo = print) -> Sandbox:
        """The server, the project and this runtime's processes, each step skipped when
        already done; returns the sandbox as started."""

    @abstractmethod
    def place(self, sb: Sandbox, echo: Echo = print) -> dict[str, str]:
        """The pipeline inputs that say where this runtime's pods run (prepared on the way:
        the node's objects and image); {} where the sandbox's own settings say it all."""

    def pid_file(self, paths: SandboxPaths, name: str) -> Path:
        return paths.state / f"{name}.pid"

    def log_file(self, paths: SandboxPaths, name: str) -> Path:
        return paths.state / f"{name}.log"

    def running(self, sb: Sandbox) -> bool:
        """Whether any of this runtime's processes runs."""
        return any(read_pid(self.pid_file(sb.paths, name)) for name in self.processes)

    def status(self, sb: Sandbox) -> dict[str, object]:
        """The server's status with each of this runtime's processes' pid and log."""
        info = sb.status()
        for name in self.processes:
            info[f"{name}_pid"] = read_pid(self.pid_file(sb.paths, name))
        for name in self.processes:
            info[f"{name}_log"] = str(self.log_file(sb.paths, name))
        return info

    def stop(self, sb: Sandbox) -> list[str]:
        """Stop this runtime's processes (each whole process group); what was stopped."""
        stopped = []
        for name in self.processes:
            what = stop_recorded(sb.paths.root, name, self.pid_file(sb.paths, name))
            if what:
                stopped.append(what)
        return stopped
