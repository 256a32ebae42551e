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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import click

from checkpoint_storage_bench.config_cli import Output, cli, flag
from checkpoint_storage_bench.contract import (
    CALIBRATED_RUNS,
    MIN_BUDGET_CHECKPOINTS,
    VERDICT_CONFIDENCE,
    VERDICT_RUNS_PER_BLOCK,
    VERDICT_WARMUP,
    WORKLOAD_BUDGETS,
    output_key,
    output_key_clashes,
)
from checkpoint_storage_bench.retry import Backoff

Settle = Literal["kubernetes", "provider"]
OnInfeasible = Literal["fail", "rollback"]
BackendName = Literal["kubernetes", "local"]
Workload = Literal["checkpoint", "scan", "materialize", "workspace"]
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

    repeats: int | None = field(default=None, metadata=cli(metavar="N"))
    """Runs of each profile per stage (the pipeline's repeats): with it the plan also says
    what the verdict can answer at its confidence, and refuses (exit 2) settings that can
    answer nothing. Unset: only the window is judged."""

    workload: Workload = "checkpoint"
    """What each stage runs (the pipeline's workload): which budget its verdict tests."""

    steps: int | None = field(default=None, metadata=cli(metavar="N"))
    """checkpoint: training steps per run (with --checkpoint-every: the checkpoints a run
    makes, which a pause budget's bound needs)."""

    checkpoint_every: int | None = field(default=None, metadata=cli(metavar="N"))
    """checkpoint: a checkpoint every N steps."""

    warmup: int = field(default=VERDICT_WARMUP, metadata=cli(metavar="N"))
    """Checkpoints at the start of each run the verdict leaves out (its --warmup)."""

    max_pause_s: float | None = field(default=None, metadata=cli(metavar="S"))
    """checkpoint budget: the longest acceptable median pause per checkpoint, seconds."""

    max_pause_share: float | None = field(default=None, metadata=cli(metavar="F"))
    """checkpoint budget: the largest acceptable share of the runtime spent paused."""

    min_au: float | None = field(default=None, metadata=cli(metavar="F"))
    """scan budget: the lowest acceptable accelerator utilization."""

    max_p99_ms: float | None = field(default=None, metadata=cli(metavar="MS"))
    """workspace budget: the highest acceptable p99 save latency, ms."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.profiles or any(not p for p in self.profiles):
            raise ValueError(f"--profiles must name at least one class, got {self.profiles!r}")
        check_comparable(self.profiles)
        self._check_answer_settings()
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

    @property
    def budgets(self) -> dict[str, float | None]:
        """Every budget option, by field name (given or not)."""
        return {name: getattr(self, name) for names in WORKLOAD_BUDGETS.values() for name in names}

    def answerability(self) -> Answerability | None:
        """What the verdict can answer with these settings (None without --repeats)."""
        if self.repeats is None:
            return None
        return answerability(
            self.profiles,
            self.return_to_first,
            self.repeats,
            self.workload,
            self.budgets,
            checkpoints=None if self.steps is None else self.steps // self.checkpoint_every,  # type: ignore[operator]
            warmup=self.warmup,
        )

    def _check_answer_settings(self) -> None:
        """Refuse (``ValueError``) settings that are not numbers the pipeline can run, and
        settings with which the verdict could say nothing about the profiles."""
        for name in ("repeats", "steps", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
        if (self.steps is None) != (self.checkpoint_every is None):
            raise ValueError("--steps and --checkpoint-every go together: a run's checkpoints")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be 0 or more, not {self.warmup}")
        for name, value in self.budgets.items():
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(
                    f"--{name.replace('_', '-')} must be a positive number, not {value}"
                )
        answer = self.answerability()
        if answer is not None and not answer.anything:
            raise ValueError(
                "the verdict could say nothing about the profiles with these settings: "
                + "; ".join(answer.refusal_reasons)
            )


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


@dataclass(frozen=True)
class Answerability:
    """What the verdict can answer at its confidence with the pipeline's settings, known
    before anything is switched.

    Attributes:
        differences: The candidates whose difference from the baseline can count: both have
            at least two runs (one run cannot be told from run-to-run variation).
        budget: Whether the budget asked can be met with confidence (None: none asked).
        limits: One sentence per question asked that cannot reach an answer.
        notes: What the settings buy less of than they seem to (not a limit).
        unasked: Why no budget answers anything, when none of the workload's was given.
    """

    differences: tuple[str, ...]
    budget: bool | None
    limits: tuple[str, ...]
    notes: tuple[str, ...]
    unasked: str = ""

    @property
    def answerable(self) -> bool:
        """Every question asked can reach an answer."""
        return not self.limits

    @property
    def anything(self) -> bool:
        """Something about the profiles can be answered: a difference, or the budget."""
        return bool(self.differences) or bool(self.budget)

    @property
    def refusal_reasons(self) -> list[str]:
        return [*self.limits, *([self.unasked] if self.unasked else [])]


def answerability(
    profiles: list[str],
    return_to_first: bool,
    repeats: int,
    workload: str,
    budgets: dict[str, float | None],
    checkpoints: int | None = None,
    warmup: int = VERDICT_WARMUP,
    confidence: float = VERDICT_CONFIDENCE,
) -> Answerability:
    """What the verdict can answer from ``repeats`` runs of each stage over ``profiles``.

    The verdict compares runs (docs/compare.md): a profile with one run has no between-run
    spread, so no difference from it counts; a profile's runs back to back are one block,
    of which at most the workload's ``VERDICT_RUNS_PER_BLOCK`` count as independent; a pause
    budget is met when every run's upper bound of its median pause is within it, which needs
    ``MIN_BUDGET_CHECKPOINTS`` measured checkpoints a run (``checkpoints`` a run, less the
    ``warmup``; None: not known, not judged).

    >>> a = answerability(["a", "b"], False, 1, "checkpoint", {"max_pause_s": 0.5}, 12)
    >>> a.differences, a.budget, a.answerable, a.anything
    ((), True, False, True)
    >>> answerability(["a", "b", "a", "b"], False, 1, "checkpoint", {}).differences
    ('b',)
    """
    stages = [*profiles, profiles[0]] if return_to_first else list(profiles)
    runs: Counter[str] = Counter()
    blocks: Counter[str] = Counter()
    previous = None
    for name in stages:
        runs[name] += repeats
        blocks[name] += name != previous
        previous = name
    baseline = profiles[0]
    candidates = [p for p in dict.fromkeys(profiles) if p != baseline]
    paired = [c for c in candidates if min(runs[c], runs[baseline]) >= 2]
    per_block = VERDICT_RUNS_PER_BLOCK[workload]
    counted = {p: min(runs[p], per_block * blocks[p]) for p in runs}
    side = {c: min(counted[c], counted[baseline]) for c in paired}
    calibrated = CALIBRATED_RUNS[workload]
    differences = tuple(c for c in paired if side[c] > calibrated.missed)
    limits: list[str] = []
    notes: list[str] = []
    level = f"{confidence:.0%}"
    per_pass = min(repeats, per_block)  # runs a pass over the profiles counts a side

    def alternation(runs_a_side: int) -> str:
        """The profiles alternating often enough to count ``runs_a_side`` a side."""
        return ",".join([*dict.fromkeys(profiles)] * -(-runs_a_side // per_pass))

    # Enough passes over the profiles to count more runs a side than the calibration missed.
    alternate = alternation(calibrated.missed + 1)
    missed = [c for c in paired if c not in differences]
    if missed:
        short = [p for p in (baseline, *missed) if counted[p] <= calibrated.missed]
        counts = [f"{p} counts {counted[p]} run{'s' * (counted[p] != 1)}" for p in short]
        limits.append(
            f"the {workload} workload: {_and(counts)} "
            f"(at most {per_block} a block of back-to-back runs), and with "
            f"{calibrated.missed} a side the calibration detected a factor of two between "
            f"classes in fewer than {level} of comparisons (docs/compare.md), so a difference "
            f"between {_and(missed)} and the baseline {baseline} would likely be missed: more "
            f"blocks of each profile (profiles that alternate: {alternate}) count more runs"
        )
    unproven = [c for c in differences if calibrated.met is None or side[c] < calibrated.met]
    if unproven:
        if calibrated.met is None:
            shown = f"with none of the designs measured (up to {calibrated.missed} a side)"
        else:
            shown = (
                f"only with {calibrated.met} a side (profiles that alternate: "
                f"{alternation(calibrated.met)})"
            )
        notes.append(
            f"the {workload} workload: {_and(unproven)} and the baseline {baseline} count "
            f"{min(side[c] for c in unproven)} runs a side, and the calibration showed both "
            f"goals (a factor of two between classes detected in at least {level} of "
            f"comparisons, one class under two names told apart in at most "
            f"{1 - confidence:.0%}) {shown} (docs/compare.md): not a limit, not a calibrated "
            "answer either"
        )
    unanswered = [c for c in candidates if c not in paired]
    if unanswered:
        lonely = [p for p in (baseline, *unanswered) if runs[p] < 2]
        limits.append(
            f"repeats {repeats}: {_and(lonely)} {'gets' if len(lonely) == 1 else 'get'} one "
            "run, and one run cannot be told from run-to-run variation, so the verdict can "
            f"claim no difference between {_and(unanswered)} and the baseline {baseline} at "
            f"{level} (repeats 2 or more give it)"
        )
    capped = [
        f"{p}: {runs[p]} runs in {blocks[p]} block{'s' if blocks[p] != 1 else ''}, counted as "
        f"{per_block * blocks[p]}"
        for p in (baseline, *candidates)
        if runs[p] > per_block * blocks[p]
    ]
    if capped:
        notes.append(
            f"repeats {repeats}: a profile's runs back to back share their block, and the "
            f"verdict counts at most {per_block} a block as independent ({'; '.join(capped)}): "
            "more repeats buy a steadier estimate, not a narrower interval; the return to the "
            "first profile, or profiles that alternate, add blocks"
        )
    own = WORKLOAD_BUDGETS[workload]
    asked = [name for name in own if budgets.get(name) is not None]
    foreign = [n for n, v in budgets.items() if v is not None and n not in own]
    if foreign:
        notes.append(
            f"{_and([flag(n) for n in foreign])}: not a budget of the {workload} workload, its "
            "verdict does not test it"
        )
    budget: bool | None = None
    if asked:
        budget = True
        measured = None if checkpoints is None else max(0, checkpoints - warmup)
        if workload == "checkpoint" and measured is not None and measured < MIN_BUDGET_CHECKPOINTS:
            budget = False
            limits.append(
                f"{checkpoints} checkpoint{'s' if checkpoints != 1 else ''} a run, "
                f"{measured} after the {warmup} warm-up: a {level} bound on a run's median "
                f"pause needs {MIN_BUDGET_CHECKPOINTS}, so no profile can meet the pause budget "
                f"with confidence (more steps, or a checkpoint more often: "
                f"{MIN_BUDGET_CHECKPOINTS + warmup} checkpoints a run)"
            )
    unasked = ""
    if not asked:
        unasked = (
            f"no budget of the {workload} workload was given ({_or([flag(n) for n in own])})"
            if own
            else f"the {workload} workload has no budget to answer instead"
        )
    return Answerability(differences, budget, tuple(limits), tuple(notes), unasked)


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
