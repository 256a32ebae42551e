"""What each command was asked to do, validated once; the retry schedule as data.

``cli.py`` parses the options into these and calls ``commands.py``; a ``ValueError`` from
validation is a usage error (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from checkpoint_storage_bench.retry import Backoff

SETTLE_MODES = ("kubernetes", "provider")
INFEASIBLE_ACTIONS = ("fail", "rollback")
BACKENDS = ("kubernetes", "local")


@dataclass(kw_only=True)
class Target:
    """Where a command acts: the claim and how to reach it.

    Attributes:
        namespace: The claim's namespace.
        claim: The claim's name.
        backend: ``kubernetes`` or ``local`` (the embedded sandbox).
        kubeconfig: A kubeconfig file; else in-cluster config, else the default kubeconfig.
        profiles_file: The sandbox's profiles file (local backend).
    """

    namespace: str
    claim: str
    backend: str = "kubernetes"
    kubeconfig: str | None = None
    profiles_file: Path | None = None

    def __post_init__(self) -> None:
        for name in ("namespace", "claim"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}")


@dataclass(kw_only=True)
class SwitchConfig(Target):
    """Everything ``switch`` was asked to do, validated once.

    Attributes:
        target: The VolumeAttributesClass (or sandbox profile) to switch to.
        timeout: Overall deadline in seconds.
        pending_grace: How long a ``Pending`` modify status may last.
        settle: ``kubernetes`` or ``provider`` (also wait for the cloud provider).
        on_infeasible: ``fail`` or ``rollback``.
        dry_run: Preflight and print the patch only.
        force: Switch even when the provider's rate limit would be exceeded.
        summary_json: Where to write the report as JSON.
        backoff: Retry schedule for throttled or failing API calls.
        watch_timeout: Longest single watch request, in seconds (re-listed afterwards).
    """

    target: str
    timeout: float = 1800.0
    pending_grace: float = 120.0
    settle: str = "provider"
    on_infeasible: str = "fail"
    dry_run: bool = False
    force: bool = False
    summary_json: Path | None = None
    backoff: Backoff = field(default_factory=Backoff)
    watch_timeout: float = 300.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.target:
            raise ValueError("--to must not be empty")
        if self.timeout <= 0:
            raise ValueError("--timeout must be positive")
        if self.pending_grace < 0:
            raise ValueError("--pending-grace must not be negative")
        if self.settle not in SETTLE_MODES:
            raise ValueError(f"--settle must be one of {', '.join(SETTLE_MODES)}")
        if self.on_infeasible not in INFEASIBLE_ACTIONS:
            raise ValueError(f"--on-infeasible must be one of {', '.join(INFEASIBLE_ACTIONS)}")
        if self.watch_timeout <= 0:
            raise ValueError("watch_timeout must be positive")


@dataclass(kw_only=True)
class StatusConfig(Target):
    """What ``status`` was asked to show.

    Attributes:
        as_json: Print JSON instead of the readable block.
        backoff: Retry schedule for throttled or failing API calls.
    """

    as_json: bool = False
    backoff: Backoff = field(default_factory=Backoff)
