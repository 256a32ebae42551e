"""What each command was asked to do, validated once; the retry schedule as data.

``cli.py`` parses the options into these and calls ``commands.py``; a ``ValueError`` from
validation is a usage error (exit 2).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from checkpoint_storage_bench.contract import output_key, output_key_clashes
from checkpoint_storage_bench.retry import Backoff

SETTLE_MODES = ("kubernetes", "provider")
INFEASIBLE_ACTIONS = ("fail", "rollback")
BACKENDS = ("kubernetes", "local")

DEFAULT_TIMEOUT = {"kubernetes": 1800.0, "provider": 4 * 3600.0}
"""``--timeout`` by ``--settle``: Kubernetes settles in seconds to minutes; an EBS volume
can stay ``optimizing`` for hours (docs/storage-profile.md, "Timeouts")."""
LEASE_DURATION = 6 * 3600.0
"""Default Lease duration: outlasts the longest default wait, renewed by every switch."""
HEARTBEAT_INTERVAL = 30.0
LEASE_DURATION_MAX = 2**31 - 1
"""A Lease's ``leaseDurationSeconds`` is an int32: kube-apiserver cannot decode more (400)."""

# Kubernetes object names: a namespace is a DNS-1123 label, a claim and a class DNS-1123
# subdomains. Checked here because a name like ".." would otherwise become part of a URL
# path (``--claim ..`` asked for the namespace itself). Always ``fullmatch``: ``$`` also
# matches before a trailing newline, which would let ``"claim\n"`` through.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_LABEL)
DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def check_label(option: str, value: str) -> None:
    """Refuse a namespace that is not a DNS-1123 label (``ValueError``)."""
    if len(value) > 63 or not DNS1123_LABEL.fullmatch(value):
        raise ValueError(
            f"{option} {value!r} is not a valid namespace name (DNS-1123 label: at most 63 "
            "lowercase letters, digits and '-', starting and ending with a letter or digit)"
        )


def check_subdomain(option: str, value: str) -> None:
    """Refuse a name that is not a DNS-1123 subdomain (``ValueError``)."""
    if len(value) > 253 or not DNS1123_SUBDOMAIN.fullmatch(value):
        raise ValueError(
            f"{option} {value!r} is not a valid object name (DNS-1123 subdomain: at most 253 "
            "lowercase letters, digits, '-' and '.', each part starting and ending with a "
            "letter or digit)"
        )


def check_seconds(option: str, value: float, positive: bool = True) -> None:
    """Refuse a duration that is NaN, infinite, or not positive (``ValueError``).

    ``inf`` or ``nan`` would mean no deadline at all (``nan`` compares false to everything).
    """
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        kind = "a positive" if positive else "a non-negative"
        raise ValueError(f"{option} must be {kind}, finite number of seconds, not {value}")


def check_holder(holder: str) -> None:
    """Refuse an empty or unprintable holder id (``ValueError``); any other string will do
    (a Lease's ``holderIdentity`` is free text)."""
    if not holder.strip() or not holder.isprintable() or len(holder) > 253:
        raise ValueError(f"--holder must be 1 to 253 printable characters, not {holder!r}")


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
        check_label("--namespace", self.namespace)
        check_subdomain("--claim", self.claim)
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}")


def check_lease_duration(seconds: float) -> None:
    """Refuse a ``--lease-duration`` a Lease cannot store.

    Raises:
        ValueError: Not finite, or outside 1 to :data:`LEASE_DURATION_MAX` seconds.
    """
    check_seconds("--lease-duration", seconds)
    if not 1 <= seconds <= LEASE_DURATION_MAX:
        # The Lease stores whole seconds, more than 0 (422) and at most an int32 (400).
        raise ValueError(
            f"--lease-duration must be 1 to {LEASE_DURATION_MAX} seconds, not {seconds:g}"
        )


@dataclass(kw_only=True)
class SwitchConfig(Target):
    """Everything ``switch`` was asked to do, validated once.

    Attributes:
        target: The VolumeAttributesClass (or sandbox profile) to switch to.
        timeout: Overall deadline in seconds (default by ``settle``: :data:`DEFAULT_TIMEOUT`).
        pending_grace: How long a ``Pending`` modify status may last.
        settle: ``kubernetes`` or ``provider`` (also wait for the cloud provider).
        on_infeasible: ``fail`` or ``rollback``.
        dry_run: Preflight and print the patch only.
        force: Switch even when the provider's rate limit would be exceeded.
        stop_after_failure: Refuse (exit 3) when a run of the Polyaxon pipeline this switch
            runs in (its outermost run) has failed: a pipeline's later stage does not switch
            the claim.
        only_if_switched: Do nothing (exit 0) unless the holder switched the claim before
            (its ledger, or the sandbox's state): a pipeline's restore leaves a claim it never
            touched alone.
        summary_json: Where to write the report as JSON.
        holder: Who holds the claim's Lease (None: :func:`lease.default_holder`).
        lease_duration: Seconds the Lease lasts from this switch.
        heartbeat: Seconds between two "waiting" lines at most often.
        backoff: Retry schedule for throttled or failing API calls.
        watch_timeout: Longest single watch request, in seconds (re-listed afterwards).
    """

    target: str
    timeout: float | None = None
    pending_grace: float = 120.0
    settle: str = "provider"
    on_infeasible: str = "fail"
    dry_run: bool = False
    force: bool = False
    stop_after_failure: bool = False
    only_if_switched: bool = False
    summary_json: Path | None = None
    holder: str | None = None
    lease_duration: float = LEASE_DURATION
    heartbeat: float = HEARTBEAT_INTERVAL
    backoff: Backoff = field(default_factory=Backoff)
    watch_timeout: float = 300.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.target:
            raise ValueError("--to must not be empty")
        if self.backend == "kubernetes":
            check_subdomain("--to", self.target)
        if self.settle not in SETTLE_MODES:
            raise ValueError(f"--settle must be one of {', '.join(SETTLE_MODES)}")
        if self.timeout is None:
            self.timeout = DEFAULT_TIMEOUT[self.settle]
        check_seconds("--timeout", self.timeout)
        check_lease_duration(self.lease_duration)
        check_seconds("heartbeat", self.heartbeat)
        if self.holder is not None:
            check_holder(self.holder)
        check_seconds("--pending-grace", self.pending_grace, positive=False)
        if self.on_infeasible not in INFEASIBLE_ACTIONS:
            raise ValueError(f"--on-infeasible must be one of {', '.join(INFEASIBLE_ACTIONS)}")
        if self.watch_timeout <= 0:
            raise ValueError("watch_timeout must be positive")


@dataclass(kw_only=True)
class ReleaseConfig(Target):
    """What ``release`` was asked to give up.

    Attributes:
        holder: Whose Lease it is (None: :func:`lease.default_holder`).
        timeout: Overall deadline in seconds.
        backoff: Retry schedule for throttled or failing API calls.
    """

    holder: str | None = None
    timeout: float = 60.0
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_seconds("--timeout", self.timeout)
        if self.holder is not None:
            check_holder(self.holder)


@dataclass(kw_only=True)
class RenewConfig(ReleaseConfig):
    """What ``renew`` was asked to extend.

    Attributes:
        lease_duration: Seconds the Lease lasts from this renewal.
    """

    lease_duration: float = LEASE_DURATION

    def __post_init__(self) -> None:
        super().__post_init__()
        check_lease_duration(self.lease_duration)


@dataclass(kw_only=True)
class StatusConfig(Target):
    """What ``status`` was asked to show.

    Attributes:
        as_json: Print JSON instead of the readable block.
        timeout: Overall deadline in seconds.
        backoff: Retry schedule for throttled or failing API calls.
    """

    as_json: bool = False
    timeout: float = 60.0
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_seconds("--timeout", self.timeout)


def parse_profiles(text: str) -> list[str]:
    """``a,b,c`` → ``["a", "b", "c"]``; a name may repeat, but none may be empty.

    >>> parse_profiles("checkpoint-baseline, checkpoint-throughput")
    ['checkpoint-baseline', 'checkpoint-throughput']

    Raises:
        ValueError: No profile, or an empty name.
    """
    names = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"--profiles must be class names separated by commas, got {text!r}")
    return names


@dataclass(kw_only=True)
class PlanConfig(Target):
    """What ``plan`` was asked to judge.

    Attributes:
        profiles: The classes (sandbox profiles) the run switches to, in order.
        return_to_first: The run ends with a switch back to the first profile.
        restore_after: The run ends by switching the claim to ``restore_class``.
        restore_class: The class of the restore (counted only with ``restore_after``).
        summary_json: Where to write the plan as JSON.
        timeout: Overall deadline in seconds.
        backoff: Retry schedule for throttled or failing API calls.
    """

    profiles: list[str]
    return_to_first: bool = False
    restore_after: bool = False
    restore_class: str | None = None
    summary_json: Path | None = None
    timeout: float = 60.0
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.profiles or any(not p for p in self.profiles):
            raise ValueError(f"--profiles must name at least one class, got {self.profiles!r}")
        check_comparable(self.profiles)
        if self.restore_after and not self.restore_class:
            raise ValueError("--restore-after needs --restore-class: the class it restores")
        if self.backend == "kubernetes":
            # Class names become URL paths, as --to does for switch.
            for name in self.profiles:
                check_subdomain("--profiles", name)
            if self.restore_to is not None:
                check_subdomain("--restore-class", self.restore_to)
        check_seconds("--timeout", self.timeout)

    @property
    def restore_to(self) -> str | None:
        """The class the run ends on after its restore (None: no restore)."""
        return self.restore_class if self.restore_after else None


def check_comparable(profiles: list[str]) -> None:
    """Refuse profiles that cannot make a comparison (``ValueError``), before any switch.

    One distinct class has nothing to compare with (the verdict would refuse it only after
    every stage ran); two names that differ only in ``-`` and ``.`` share their output
    names (``gp3-fast`` and ``gp3.fast``), so one's figures would overwrite the other's.
    """
    if len(set(profiles)) < 2:
        raise ValueError(
            f"--profiles must name at least two different classes to compare, got "
            f"{','.join(profiles)!r}"
        )
    clashes = output_key_clashes(profiles)
    if clashes:
        a, b = clashes[0]
        raise ValueError(
            f"--profiles {a} and {b} have the same output name {output_key(a)!r} ('-' and "
            "'.' both become '_'): their figures would overwrite each other; rename one class"
        )
