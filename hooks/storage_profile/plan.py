"""The modification plan: before a pipeline's first switch, how many volume modifications a
run over the ordered profiles needs, and whether the provider's window allows them now.

``python -m hooks.storage_profile plan --namespace NS --claim C --profiles a,b,c
[--return-to-first]`` reads the claim, its volume's driver, the profiles' classes and the
claim's ledger of switches (``contract.LEDGER_ANNOTATION``), and changes nothing. The CLI
parses into ``config.PlanConfig`` and ``commands.run_plan`` calls this module; a refusal is
:class:`~hooks.storage_profile.errors.PlanRefused` (exit 3).

Counting: the run visits the profiles in order (then the first again with
``--return-to-first``, then the restore class with ``--restore-after``), starting from the
claim's class; a step to the class the claim is already on is no modification. Judging: the provider allows ``count`` modifications per
rolling ``window`` (``contract.MODIFICATION_WINDOWS``). The plan does not know how long the
run takes, so it assumes the worst case, that every switch of the run falls inside one
window: it fits now when the ledger's switches inside the last window plus the run's
modifications stay within ``count``; otherwise it names the earliest time old switches
have left the window, or says it never fits when the run alone needs more than ``count``.

Answering: given ``--repeats`` (and the workload, its budget, the checkpoints a run), the
plan also says what the verdict can answer at its confidence (``config.answerability``):
one line per limit, a warning (exit 0); settings that can answer nothing are refused
before the plan is made (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from checkpoint_storage_bench.contract import (
    LEDGER_ANNOTATION,
    MODIFICATION_WINDOWS,
    PLAN_ANSWER_LIMITS_OUTPUT,
    PLAN_ANSWER_NOTES_OUTPUT,
    PLAN_ANSWERABLE_OUTPUT,
    LedgerEntry,
    parse_ledger,
)
from checkpoint_storage_bench.retry import Deadline
from checkpoint_storage_bench.tracking import in_polyaxon_run, tracked_run
from hooks.storage_profile.config import Answerability
from hooks.storage_profile.errors import PlanRefused, PreflightRefused
from hooks.storage_profile.kube import Kube
from hooks.storage_profile.local import DRIVER as LOCAL_DRIVER
from hooks.storage_profile.local import SandboxProfiles
from hooks.storage_profile.preflight import unbound_driver

SCHEMA = "storage-profile-plan/1"


def utcnow() -> datetime:
    return datetime.now(UTC)


# Seam for tests: the clock the plan is judged at.
NOW = utcnow


def visits(profiles: list[str], return_to_first: bool, restore_to: str | None = None) -> list[str]:
    """The classes a run puts the claim on, in order: the profiles, the first again with
    ``return_to_first``, and the restore class last.

    >>> visits(["a", "b"], return_to_first=True, restore_to="c")
    ['a', 'b', 'a', 'c']
    """
    order = [*profiles, profiles[0]] if return_to_first else list(profiles)
    return [*order, restore_to] if restore_to is not None else order


def switches_of(
    current: str | None,
    profiles: list[str],
    return_to_first: bool,
    restore_to: str | None = None,
) -> list[tuple[str | None, str]]:
    """The (from, to) modifications a run makes: each change of class along the order.

    >>> switches_of("a", ["a", "b", "b", "c"], return_to_first=True)
    [('a', 'b'), ('b', 'c'), ('c', 'a')]
    >>> switches_of("a", ["a", "b"], return_to_first=False, restore_to="a")
    [('a', 'b'), ('b', 'a')]
    """
    order = visits(profiles, return_to_first, restore_to)
    switches: list[tuple[str | None, str]] = []
    previous = current
    for name in order:
        if name != previous:
            switches.append((previous, name))
        previous = name
    return switches


def earliest_start(
    ledger: list[LedgerEntry], needed: int, allowed: int, window: timedelta, now: datetime
) -> datetime | None:
    """When ``needed`` more modifications fit in the rolling window: ``now``, later, or never.

    Worst case: all of them fall inside one window after the start. They fit at T when the
    ledger's switches in (T − window, T] number at most ``allowed − needed``.

    Returns:
        ``now`` when they fit now; the time enough old switches have left the window; or
        None when ``needed > allowed`` (never, in one run).
    """
    if needed == 0:
        return now
    if needed > allowed:
        return None
    recent = sorted(e.at for e in ledger if e.at > now - window)
    excess = len(recent) + needed - allowed
    if excess <= 0:
        return now
    return recent[excess - 1] + window


@dataclass
class ModificationPlan:
    """What the run over the profiles needs from the claim, judged against its window."""

    backend: str
    namespace: str
    claim: str
    driver: str
    current_class: str | None
    profiles: list[str]
    return_to_first: bool
    now: datetime
    restore_to: str | None = None
    bound: bool = True
    window: tuple[int, float] | None = None
    ledger: list[LedgerEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    answer: Answerability | None = None
    """What the verdict can answer with the run's settings (None: not asked)."""
    repeats: int | None = None
    workload: str | None = None

    @property
    def switches(self) -> list[tuple[str | None, str]]:
        return switches_of(self.current_class, self.profiles, self.return_to_first, self.restore_to)

    @property
    def modifications_needed(self) -> int:
        return len(self.switches)

    @property
    def in_window(self) -> int:
        """The ledger's switches inside the last window (what the provider still counts)."""
        if self.window is None:
            return 0
        return sum(1 for e in self.ledger if e.at > self.now - timedelta(seconds=self.window[1]))

    @property
    def earliest_start(self) -> datetime | None:
        if self.window is None:
            return self.now
        allowed, seconds = self.window
        return earliest_start(
            self.ledger, self.modifications_needed, allowed, timedelta(seconds=seconds), self.now
        )

    @property
    def fits(self) -> bool:
        start = self.earliest_start
        return start is not None and start <= self.now

    def refusal(self) -> str | None:
        """Why the plan cannot start now (None when it can)."""
        if self.fits:
            return None
        allowed, seconds = self.window or (0, 0.0)
        needed = self.modifications_needed
        what = (
            f"the run over {', '.join(self.profiles)}"
            + (" and back to the first" if self.return_to_first else "")
            + (f", then restored to {self.restore_to}," if self.restore_to else "")
            + f" needs {needed} modification{'s' if needed != 1 else ''} of claim "
            f"{self.namespace}/{self.claim}, and {self.driver} allows {allowed} per "
            f"{_hours(seconds)}"
        )
        start = self.earliest_start
        if start is None:
            return (
                f"{what}: it cannot fit in one window, whenever it starts; compare at most "
                f"{allowed} change{'s' if allowed != 1 else ''} per run (fewer profiles, the "
                "claim already on the first one, no --return-to-first, or no restore)"
            )
        return (
            f"{what}; its ledger ({LEDGER_ANNOTATION}) has {self.in_window} in the last "
            f"{_hours(seconds)}: the plan fits from {_iso(start)} "
            f"(in {_duration((start - self.now).total_seconds())})"
        )

    def to_dict(self) -> dict[str, Any]:
        start = self.earliest_start
        return {
            "schema": SCHEMA,
            "backend": self.backend,
            "namespace": self.namespace,
            "claim": self.claim,
            "driver": self.driver,
            "bound": self.bound,
            "current_class": self.current_class,
            "profiles": self.profiles,
            "return_to_first": self.return_to_first,
            "restore_to": self.restore_to,
            "switches": [{"from": a, "to": b} for a, b in self.switches],
            "modifications_needed": self.modifications_needed,
            "modifications_allowed": self.window[0] if self.window else None,
            "window_s": self.window[1] if self.window else None,
            "ledger_in_window": self.in_window if self.window else None,
            "planned_at": _iso(self.now),
            "earliest_start": _iso(start) if start else None,
            "fits": self.fits,
            "refusal": self.refusal(),
            "notes": self.notes,
            "repeats": self.repeats,
            "workload": self.workload,
            PLAN_ANSWERABLE_OUTPUT: self.answer.answerable if self.answer else None,
            PLAN_ANSWER_LIMITS_OUTPUT: list(self.answer.limits) if self.answer else [],
            "answer_notes": list(self.answer.notes) if self.answer else [],
        }

    def render(self) -> str:
        order = visits(self.profiles, self.return_to_first, self.restore_to)
        switches = ", ".join(f"{a or '(none)'} -> {b}" for a, b in self.switches) or "none"
        if self.window is None:
            window = "none known (no provider limit)"
        else:
            window = (
                f"{self.window[0]} per {_hours(self.window[1])}; {self.in_window} in the last "
                f"{_hours(self.window[1])} (ledger)"
            )
        start = self.earliest_start
        lines = [
            f"plan for claim {self.namespace}/{self.claim} ({self.driver})",
            f"  current class    {self.current_class or '(none)'}",
            f"  order            {' -> '.join(order)}",
            f"  modifications    {self.modifications_needed} ({switches})",
            f"  window           {window}",
            f"  earliest start   {'never, in one run' if start is None else _iso(start)}"
            + (" (now)" if self.fits else ""),
        ]
        lines += [f"  note: {n}" for n in self.notes]
        if self.answer is not None:
            lines.append(
                f"  answerable       {'yes' if self.answer.answerable else 'no'} (repeats "
                f"{self.repeats}, {self.workload}"
                + (", no budget)" if self.answer.budget is None else ", a budget)")
            )
            lines += [f"  limit: {n}" for n in self.answer.limits]
            lines += [f"  note: {n}" for n in self.answer.notes]
        return "\n".join(lines)

    def log_to_polyaxon(self) -> bool:
        """Inside the pipeline's first op, the plan's figures become the run's outputs; a
        plan that does not fit marks the run failed (``end()`` would otherwise record
        success while the process exits 3).

        Returns:
            Whether anything was logged (only inside a Polyaxon run).
        """
        if not in_polyaxon_run():
            return False
        summary = self.to_dict()
        try:
            with tracked_run("storage-profile-plan", tags=["storage-profile"]) as tracker:
                tracker.log_inputs(
                    claim=self.claim,
                    namespace=self.namespace,
                    profiles=",".join(self.profiles),
                    return_to_first=self.return_to_first,
                    restore_to=self.restore_to,
                    driver=self.driver,
                    current_class=self.current_class,
                    **({"repeats": self.repeats, "workload": self.workload} if self.answer else {}),
                )
                tracker.log_outputs(
                    **{
                        k: summary[k]
                        for k in (
                            "modifications_needed",
                            "modifications_allowed",
                            "window_s",
                            "earliest_start",
                            "fits",
                        )
                    }
                )
                if self.answer is not None:
                    tracker.log_outputs(
                        **{
                            PLAN_ANSWERABLE_OUTPUT: self.answer.answerable,
                            PLAN_ANSWER_LIMITS_OUTPUT: "; ".join(self.answer.limits),
                            PLAN_ANSWER_NOTES_OUTPUT: "; ".join(self.answer.notes),
                        }
                    )
                reason = self.refusal()
                if reason is not None:
                    raise _RunFailed(reason)
        except _RunFailed:
            pass
        return True


class _RunFailed(Exception):
    """Raised inside the tracked run so that the run is recorded as failed."""


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h"


def _duration(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


# ------------------------------------------------------------------------- the backends


def plan_kubernetes(
    kube: Kube,
    namespace: str,
    claim_name: str,
    profiles: list[str],
    return_to_first: bool,
    now: datetime,
    deadline: Deadline | None = None,
    restore_to: str | None = None,
) -> ModificationPlan:
    """Read the claim, its volume, the classes and the ledger; judge nothing yet.

    Every API call ends by ``deadline`` (``DeadlineExceeded``, exit 5).

    Raises:
        PlanRefused: The claim or a class is missing, a class is for another driver, the
            ledger is not one, or an unbound claim names another class than the first.
    """
    ref = f"{namespace}/{claim_name}"
    claim = kube.read_claim(namespace, claim_name, deadline)
    if claim is None:
        raise PlanRefused(f"claim {ref} not found")
    named = visits(profiles, return_to_first, restore_to)
    classes = {name: kube.read_class(name, deadline) for name in dict.fromkeys(named)}
    missing = [name for name, vac in classes.items() if vac is None]
    if missing:
        raise PlanRefused(f"VolumeAttributesClass not found: {', '.join(missing)}")
    drivers = {name: vac["driverName"] for name, vac in classes.items() if vac is not None}

    spec_class = claim["spec"].get("volumeAttributesClassName")
    status = claim.get("status") or {}
    volume = claim["spec"].get("volumeName")
    bound = status.get("phase") == "Bound" and bool(volume)
    notes = []
    if bound:
        pv = kube.read_pv(volume, deadline)
        csi = (pv or {}).get("spec", {}).get("csi")
        if not csi:
            raise PlanRefused(f"claim {ref} is not bound to a CSI volume (PV {volume})")
        driver = csi["driver"]
        other = {n: d for n, d in drivers.items() if d != driver}
        if other:
            raise PlanRefused(
                f"the volume of claim {ref} is provisioned by {driver}, but "
                + ", ".join(f"{n} is for {d}" for n, d in other.items())
            )
        applied = status.get("currentVolumeAttributesClassName")
        if applied != spec_class:
            notes.append(
                f"a modification to {spec_class} is under way (applied: {applied}); it is "
                "counted as the claim's class"
            )
    else:
        try:
            provisioner, unknown = unbound_driver(kube, claim, ref, deadline)
        except PreflightRefused as exc:
            raise PlanRefused(str(exc)) from exc
        if unknown:
            notes.append(unknown)
        if provisioner is not None:
            # The external-provisioner refuses another driver's class: the claim never binds.
            other = {n: d for n, d in drivers.items() if d != provisioner}
            if other:
                raise PlanRefused(
                    f"claim {ref} is not bound yet and will be provisioned by {provisioner} "
                    f"(StorageClass {claim['spec'].get('storageClassName')}), but "
                    + ", ".join(f"{n} is for {d}" for n, d in other.items())
                )
        if len(set(drivers.values())) > 1:
            raise PlanRefused(
                "the profiles' classes are for different drivers: "
                + ", ".join(f"{n}: {d}" for n, d in drivers.items())
            )
        driver = drivers[profiles[0]]
        if profiles[0] != spec_class:
            raise PlanRefused(
                f"claim {ref} is not bound yet and names {spec_class or 'no class'}: its class "
                "applies when the volume is provisioned and cannot change before, so the "
                f"first profile must be {spec_class or 'its class'} (not {profiles[0]}); put "
                "it first, or re-create the claim with spec.volumeAttributesClassName: "
                f"{profiles[0]}"
            )
        notes.append(
            f"claim {ref} is not bound: {spec_class} applies when its first pod provisions it"
        )
    annotations = claim["metadata"].get("annotations") or {}
    try:
        ledger = parse_ledger(annotations.get(LEDGER_ANNOTATION))
    except (ValueError, TypeError) as exc:
        raise PlanRefused(
            f"the annotation {LEDGER_ANNOTATION} of claim {ref} is not a ledger of switches "
            f"({exc}); fix or remove it"
        ) from exc
    window = MODIFICATION_WINDOWS.get(driver)
    if window is None:
        notes.append(f"no modification window known for {driver}: any number fits")
    return ModificationPlan(
        backend="kubernetes",
        namespace=namespace,
        claim=claim_name,
        driver=driver,
        current_class=spec_class,
        profiles=profiles,
        return_to_first=return_to_first,
        now=now,
        restore_to=restore_to,
        bound=bound,
        window=window,
        ledger=ledger,
        notes=notes,
    )


def plan_local(
    sandbox: SandboxProfiles,
    namespace: str,
    claim: str,
    profiles: list[str],
    return_to_first: bool,
    now: datetime,
    restore_to: str | None = None,
) -> ModificationPlan:
    """The sandbox: profiles are directories, and nothing limits how often they change.

    Raises:
        PlanRefused: Another claim, or a profile the sandbox does not have.
    """
    if (namespace, claim) != (sandbox.namespace, sandbox.claim):
        raise PlanRefused(
            f"the sandbox has claim {sandbox.namespace}/{sandbox.claim}, not {namespace}/{claim}"
        )
    named = visits(profiles, return_to_first, restore_to)
    unknown = [p for p in dict.fromkeys(named) if p not in sandbox.profiles]
    if unknown:
        raise PlanRefused(
            f"unknown sandbox profile {', '.join(unknown)} "
            f"(known: {', '.join(sorted(sandbox.profiles))})"
        )
    current = sandbox.current()
    return ModificationPlan(
        backend="local",
        namespace=namespace,
        claim=claim,
        driver=LOCAL_DRIVER,
        current_class=current.name if current else None,
        profiles=profiles,
        return_to_first=return_to_first,
        now=now,
        restore_to=restore_to,
        notes=["local backend: switches are symlink changes, no provider window"],
    )
