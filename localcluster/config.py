"""The settings of the local cluster's command lines, each declared once.

``python -m localcluster build|start|stop|status`` (one dataclass per command, sharing
``--node``, ``--bin-dir`` and ``--state-dir``) and ``python -m localcluster.cluster_dns``.
Each field is typed and documented by the string right below it; the click options are
generated from them (:func:`checkpoint_storage_bench.config_cli.config_options`), and
``__post_init__`` refuses settings that contradict each other (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from checkpoint_storage_bench.config_cli import cli
from localcluster.errors import BadUsage
from localcluster.state import default_state_dir


@dataclass(kw_only=True)
class Target:
    """What a command acts on: the control plane alone, or the plane and a node."""

    node: bool = field(default=False, metadata=cli(flag="--node"))
    """The control plane and a node (root; docs/node.md)."""


@dataclass(kw_only=True)
class Binaries(Target):
    bin_dir: Path | None = None
    """The built binaries (default: `scripts/controlplane.sh bin-dir`)."""


@dataclass(kw_only=True)
class StatusConfig(Target):
    """``status``: the recorded processes of a state directory."""

    state_dir: Path | None = None
    """The state directory (default: $TMPDIR/csb-controlplane-UID, with --node
    $TMPDIR/csb-node-UID)."""

    @property
    def state(self) -> Path:
        """The state directory given, else the default of this kind of cluster."""
        return self.state_dir or default_state_dir(self.node)


@dataclass(kw_only=True)
class ClusterConfig(StatusConfig, Binaries):
    """``start`` and ``stop``: the binaries and the state directory."""


@dataclass(kw_only=True)
class BuildConfig(Binaries):
    """``build``: all the binaries, or the ones named."""

    names: tuple[str, ...] = field(
        default=(),
        metadata=cli(argument=True, multiple=True, click_type=str, metavar="[NAME]..."),
    )
    """Only these binaries (default: all)."""

    def __post_init__(self) -> None:
        if self.node and self.names:
            raise BadUsage("build --node builds every binary; name none")


@dataclass(kw_only=True)
class DnsConfig:
    """``python -m localcluster.cluster_dns``: where to listen, and the API server to ask."""

    kubeconfig: Path
    """The kubeconfig of the API server the answers come from."""

    listen: str = field(metadata=cli(metavar="ADDRESS[:PORT]"))
    """The address to answer on (port 53 by default)."""

    def __post_init__(self) -> None:
        _, _, port = self.listen.partition(":")
        if port and not port.isdigit():
            raise BadUsage(f"bad --listen {self.listen!r}: the port is not a number")

    @property
    def host(self) -> str:
        return self.listen.partition(":")[0]

    @property
    def port(self) -> int:
        return int(self.listen.partition(":")[2] or 53)
