"""The operator stand-in's settings, declared once: :class:`OperatorConfig`.

Each field is typed and documented by the string right below it; the click options of
``python -m operator_standin`` are generated from them
(:func:`checkpoint_storage_bench.config_cli.config_options`), each also read from the
environment variable Polyaxon's agent (or the kube tooling) sets for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from checkpoint_storage_bench.config_cli import cli


@dataclass(kw_only=True)
class OperatorConfig:
    """One namespace's ``polyaxon.com/v1`` Jobs and KfJobs, run with one kubeconfig."""

    namespace: str = field(metadata=cli(envvar="POLYAXON_K8S_NAMESPACE"))
    """The namespace whose Jobs and KfJobs to run."""

    kubeconfig: Path = field(metadata=cli(envvar="KUBECONFIG"))
    """The cluster's kubeconfig."""

    api_host: str | None = field(default=None, metadata=cli(envvar="POLYAXON_HOST", metavar="URL"))
    """Polyaxon API to post statuses to (none: status only on the objects)."""

    install_crds: bool = field(default=False, metadata=cli(flag="--install-crds"))
    """Create the CRDs first."""

    verbose: bool = field(default=False, metadata=cli(flag=("-v", "--verbose")))
    """Log at debug level."""

    def __post_init__(self) -> None:
        if not self.namespace:
            raise ValueError("--namespace is empty")
