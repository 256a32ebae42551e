"""What each command was asked to do, declared and validated once.

Each command's settings are a dataclass composed of option groups (:class:`Target`, then the
command's own, then the shared ones such as :class:`Holder` or :class:`ReadDeadline`). A field
is typed, documented by the string right below it and defaulted here alone: ``cli.py``
generates every option from these fields (name, type, default, help text) with
:func:`~checkpoint_storage_bench.config_cli.config_options`.

A dataclass lists its bases' fields last base first, so a command's bases are written from
its last option group to its first, and its ``--help`` lists the groups in the reverse of
that order. Fields marked ``cli(option=False)`` are set by the program (the retry schedule,
test seams), never on the command line. A ``ValueError`` from validation is a usage error
(exit 2).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import click

from checkpoint_storage_bench.config_cli import Output, cli
from checkpoint_storage_bench.contract import output_key, output_key_clashes
from checkpoint_storage_bench.retry import Backoff

Settle = Literal["kubernetes", "provider"]
OnInfeasible = Literal["fail", "rollback"]
BackendName = Literal["kubernetes", "local"]
SETTLE_MODES: tuple[str, ...] = get_args(Settle)
INFEASIBLE_ACTIONS: tuple[str, ...] = get_args(OnInfeasible)
BACKENDS: tuple[str, ...] = get_args(BackendName)

DEFAULT_TIMEOUT = {"kubernetes": 1800.0, "provider": 4 * 3600.0}
"""``--timeout`` by ``--settle``: Kubernetes settles in seconds to minutes; an EBS volume
can stay ``optimizing`` for hours (docs/storage-profile.md, "Timeouts")."""
LEASE_DURATION = 6 * 3600.0
"""Default Lease duration: outlasts the longest default wait, renewed by every switch."""
HEARTBEAT_INTERVAL = 30.0
"""Seconds between two "waiting" lines of a switch at most often."""
WATCH_TIMEOUT = 300.0
"""Longest single watch request of a switch, in seconds (re-listed afterwards)."""
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


_FILE = click.Path(dir_okay=False, path_type=Path)
"""A file that the command writes or reads (it need not exist)."""


@dataclass(kw_only=True)
class Options:
    """The end of the chain of checks: each option group checks its own fields in
    ``__post_init__`` after calling ``super().__post_init__()``, so a command's settings are
    checked group by group, the first group first."""

    def __post_init__(self) -> None:
        pass


@dataclass(kw_only=True)
class Target(Options):
    """Where a command acts: the claim and how to reach it (every command's first options)."""

    namespace: str = field(metadata=cli(flag=("--namespace", "-n")))
    """The claim's namespace."""

    claim: str
    """The PersistentVolumeClaim's name."""

    kubeconfig: str | None = field(
        default=None, metadata=cli(click_type=click.Path(exists=True, dir_okay=False))
    )
    """Else in-cluster config, else the default kubeconfig."""

    backend: BackendName = "kubernetes"
    """local: the embedded sandbox, no Kubernetes."""

    profiles_file: Path | None = field(default=None, metadata=cli(click_type=_FILE))
    """Sandbox profiles (default: connections/sandbox-profiles.yaml under $SANDBOX_ROOT or
    the working directory)."""

    backoff: Backoff = field(default_factory=Backoff, metadata=cli(option=False))
    """Retry schedule for throttled or failing API calls."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_label("--namespace", self.namespace)
        check_subdomain("--claim", self.claim)
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}")


@dataclass(kw_only=True)
class Holder(Options):
    """Who acts on the claim's Lease (switch, release, renew)."""

    holder: str | None = field(
        default=None, metadata=cli(envvar="STORAGE_PROFILE_HOLDER", show_envvar=False)
    )
    """Who holds the claim's Lease [default: $STORAGE_PROFILE_HOLDER, else inside a Polyaxon
    run its pipeline's uuid (else the run's), else user@host]."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.holder is not None:
            check_holder(self.holder)


@dataclass(kw_only=True)
class ReadDeadline(Options):
    """renew, release, status and plan only read (or write a Lease): one short deadline for
    all (always their last option)."""

    timeout: float = 60.0
    """Overall deadline in seconds for every API call."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_seconds("--timeout", self.timeout)


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


def _timeout_defaults() -> dict[str, Any]:
    return {f"{settle}_timeout": f"{seconds:g}" for settle, seconds in DEFAULT_TIMEOUT.items()}


@dataclass(kw_only=True)
class SwitchOptions(Target):
    """The options ``switch`` alone takes, after the target's."""

    target: str = field(metadata=cli(flag="--to"))
    """The VolumeAttributesClass (or profile)."""

    timeout: float | None = field(default=None, metadata=cli(help_values=_timeout_defaults))
    """Overall deadline in seconds (positive, finite) [default: {kubernetes_timeout} with
    --settle kubernetes, {provider_timeout} with --settle provider: an EBS volume can stay
    optimizing for hours]."""

    pending_grace: float = 120.0
    """Seconds a Pending modify status may last."""

    settle: Settle = "provider"
    """provider: also wait for the cloud (EBS optimizing)."""

    on_infeasible: OnInfeasible = "fail"
    """rollback: switch back to the previous class, wait, still exit 4."""

    dry_run: bool = field(default=False, metadata=cli(flag="--dry-run"))
    """Preflight and print the patch; change nothing."""

    force: bool = field(default=False, metadata=cli(flag="--force"))
    """Switch even past the provider's rate limit."""

    stop_after_failure: bool = field(default=False, metadata=cli(flag="--stop-after-failure"))
    """Refuse (exit 3, nothing changed) when a run of the Polyaxon pipeline this switch runs
    in (its outermost run, at any depth of nesting) has failed: a pipeline's later stage does
    not switch the claim."""

    only_if_switched: bool = field(default=False, metadata=cli(flag="--only-if-switched"))
    """Do nothing (exit 0) unless the claim's ledger has a switch by this holder: a
    pipeline's restore leaves a claim it never switched alone."""

    summary_json: Path | None = field(default=None, metadata=cli(click_type=_FILE))
    """Write the report here."""

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
        check_seconds("--pending-grace", self.pending_grace, positive=False)
        if self.on_infeasible not in INFEASIBLE_ACTIONS:
            raise ValueError(f"--on-infeasible must be one of {', '.join(INFEASIBLE_ACTIONS)}")


@dataclass(kw_only=True)
class SwitchConfig(Holder, SwitchOptions):
    """Everything ``switch`` was asked to do: the target, the switch's options, the holder,
    then the Lease's duration. ``only_if_switched`` reads the holder's switches from the
    claim's ledger, or the sandbox's state on the local backend."""

    lease_duration: float = LEASE_DURATION
    """Seconds the claim's Lease lasts from this switch."""

    heartbeat: float = field(default=HEARTBEAT_INTERVAL, metadata=cli(option=False))
    """Seconds between two "waiting" lines at most often."""

    watch_timeout: float = field(default=WATCH_TIMEOUT, metadata=cli(option=False))
    """Longest single watch request, in seconds (re-listed afterwards)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_lease_duration(self.lease_duration)
        check_seconds("heartbeat", self.heartbeat)
        if self.watch_timeout <= 0:
            raise ValueError("watch_timeout must be positive")


@dataclass(kw_only=True)
class ReleaseConfig(ReadDeadline, Holder, Target):
    """What ``release`` was asked to give up: the target, whose Lease, the deadline."""


@dataclass(kw_only=True)
class Renewal(Holder):
    """Whose Lease ``renew`` extends, and by how much."""

    lease_duration: float = LEASE_DURATION
    """Seconds the claim's Lease lasts from this renewal."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_lease_duration(self.lease_duration)


@dataclass(kw_only=True)
class RenewConfig(ReadDeadline, Renewal, Target):
    """What ``renew`` was asked to extend: the target, whose Lease and by how much, the
    deadline."""


@dataclass(kw_only=True)
class StatusConfig(ReadDeadline, Output, Target):
    """What ``status`` was asked to show: the target, what to print, the deadline."""


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


class ProfileList(click.ParamType):
    """``--profiles a,b,c``: the names, in order (:func:`parse_profiles`)."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):  # noqa: ANN201
        if isinstance(value, list):
            return value
        try:
            return parse_profiles(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@dataclass(kw_only=True)
class PlanOptions(Target):
    """The options ``plan`` alone takes, after the target's."""

    profiles: list[str] = field(metadata=cli(click_type=ProfileList()))
    """The classes (sandbox profiles) the run switches to, in order, comma-separated."""

    return_to_first: bool = field(default=False, metadata=cli(flag="--return-to-first"))
    """The run ends with a switch back to the first profile (A…B…A, measures drift)."""

    restore_after: bool = field(default=False, metadata=cli(flag="--restore-after"))
    """The run ends by switching the claim to --restore-class (the pipeline's restore):
    counted as one more modification when the claim is not already on it by then."""

    restore_class: str | None = field(default=None, metadata=cli(metavar="CLASS"))
    """The class the restore switches the claim to (counted only with --restore-after)."""

    summary_json: Path | None = field(default=None, metadata=cli(click_type=_FILE))
    """Write the plan here."""

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

    @property
    def restore_to(self) -> str | None:
        """The class the run ends on after its restore (None: no restore)."""
        return self.restore_class if self.restore_after else None


@dataclass(kw_only=True)
class PlanConfig(ReadDeadline, PlanOptions):
    """What ``plan`` was asked to judge: the target, the run's profiles, the deadline."""


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
