"""Wait until a claim settled on a class: list, then watch from the list's resourceVersion.

One overall deadline bounds everything. The watch is the shared object layer's
(:meth:`checkpoint_storage_bench.kube.Client.watch`): a watch that ends (the server's
timeout, or ours so that the heartbeat can speak) resumes from the last resourceVersion
seen; a 410 Gone (the resourceVersion expired) or a dropped stream re-lists and resumes;
throttling and server errors back off, honouring ``Retry-After``, and so does a watch that
ends at once without an event (:class:`~checkpoint_storage_bench.kube.ShortWatch`, counted
for the heartbeat). What is the hook's own: judging each state, the grace of a Pending
status, the heartbeat between watches. Nothing here polls: between events the hook sleeps
inside a watch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.errors import BenchError
from checkpoint_storage_bench.retry import Deadline, DeadlineExceeded, TemporaryError
from hooks.storage_profile.errors import ApiError, HookError, Infeasible, UnexpectedState
from hooks.storage_profile.heartbeat import Heartbeat
from hooks.storage_profile.kube import Kube

log = logging.getLogger(__name__)

KNOWN_STATUSES = ("Pending", "InProgress", "Infeasible")


@dataclass(frozen=True)
class ClaimClassState:
    """The fields that say where a claim's modification stands."""

    spec: str | None
    current: str | None
    status: str | None
    status_target: str | None

    @classmethod
    def of(cls, claim: dict) -> ClaimClassState:
        status = claim.get("status") or {}
        modify = status.get("modifyVolumeStatus") or {}
        return cls(
            spec=claim["spec"].get("volumeAttributesClassName"),
            current=status.get("currentVolumeAttributesClassName"),
            status=modify.get("status"),
            status_target=modify.get("targetVolumeAttributesClassName"),
        )

    def describe(self) -> str:
        """The state in a few words, for the heartbeat."""
        status = self.status or "no modify status"
        if self.status_target:
            status += f" (target {self.status_target})"
        return f"{status}; spec {self.spec or '-'}, applied {self.current or '-'}"

    def settled_on(self, target: str | None) -> bool:
        """Settled in Kubernetes terms: spec == current == target, no modify status.

        Going back to "no class" is the exception: the API leaves a previous status (e.g.
        Infeasible) in place, and nothing will ever clear it.
        """
        if target is None:
            return self.spec is None and self.current is None
        return self.spec == target and self.current == target and self.status is None


class ClaimWaiter:
    """Watches one claim until it settled on a class, or fails for a reason.

    Args:
        kube: The API access.
        namespace: The claim's namespace.
        name: The claim's name.
        deadline: The overall deadline.
        pending_grace: How long ``Pending`` may last before failing.
        watch_timeout: Longest single watch request.
        warn: Called with each new warning (a ``ModifyVolumeError``, a failed-modify event).
        clock: Monotonic clock for the pending grace (injectable).
        uid: The claim's uid from preflight; a claim re-created under the same name fails.
        stale: The claim's state before our patch. A Pending/Infeasible status left from an
            earlier attempt is not judged until it changes or the grace period passes: the
            resizer may simply not have seen our patch yet.
        heartbeat: Told the claim's state as it changes; speaks between watches.
    """

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        deadline: Deadline,
        pending_grace: float,
        watch_timeout: float = 300.0,
        warn: Callable[[str], None] = log.warning,
        clock: Callable[[], float] = time.monotonic,
        uid: str | None = None,
        stale: ClaimClassState | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.deadline = deadline
        self.pending_grace = pending_grace
        self.watch_timeout = watch_timeout
        self.warn = warn
        self.clock = clock
        self.uid = uid
        self.heartbeat = heartbeat
        self._stale = (
            stale if stale is not None and stale.status in ("Pending", "Infeasible") else None
        )
        self._pending_since: float | None = None
        self._seen_warnings: set[str] = set()
        self._watch_ends = 0.0
        self.short_watches = 0

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def wait(self, target: str | None) -> dict:
        """Block until the claim settled on ``target``; return the settled claim.

        Raises:
            Infeasible: ``Infeasible`` status, or ``Pending`` beyond the grace period.
            UnexpectedState: Unknown status, the claim deleted or its spec changed by others.
            DeadlineExceeded: The deadline passed first.
        """
        what = f"waiting for claim {self.ref} to settle on {target}"
        self._pending_since = None
        try:
            self.deadline.check(what)
            claim, version = self.kube.list_claim(self.namespace, self.name, self.deadline)
            while True:
                claim, version, settled = self._watch(claim, version, target)
                if settled:
                    assert claim is not None
                    return claim
        except ApiError as exc:
            raise HookError(f"{what}: {exc.server_message}") from exc
        except DeadlineExceeded as exc:
            raise DeadlineExceeded(
                f"deadline of {self.deadline.seconds:g}s passed while {what}"
            ) from exc

    def _watch(
        self, claim: dict | None, version: str, target: str | None
    ) -> tuple[dict | None, str, bool]:
        """Judge the claim, then its changes through the object layer's watch (which
        resumes, lists again and backs off); between two watches the claim is judged again
        (a Pending that outlived its grace fails even when nothing changed) and the
        heartbeat speaks. Returns the last claim, its version and whether it settled; a
        Pending status that started in this watch ends it early, for the next watch to be
        bounded by what is left of the grace."""
        last = [claim]

        def between() -> bool:
            if self._judge(last[0], target):
                return True
            self._beat()
            return False

        events = self.kube.client.watch(
            kube.CLAIM,
            self.namespace,
            resource_version=version,
            seen=[claim] if claim is not None else [],
            deadline=self.deadline,
            watch_seconds=self._next_watch_seconds,
            stop=between,
            on_retry=self._retried,
            fieldSelector=f"metadata.name={self.name}",
        )
        with closing(events):
            for kind_, obj in events:
                version = obj["metadata"].get("resourceVersion") or version
                last[0] = None if kind_ == "DELETED" else obj
                if self._judge(last[0], target):
                    return obj, version, True
                self._beat()
                if self._grace_ends_before(self._watch_ends):
                    return last[0], version, False
        return last[0], version, True  # between() found it settled

    def _next_watch_seconds(self) -> float:
        seconds = self._watch_seconds()
        self._watch_ends = self.clock() + seconds
        return seconds

    def _retried(self, error: Exception) -> None:
        if isinstance(error, kube.ShortWatch):
            self.short_watches += 1
            if self.heartbeat is not None:
                self.heartbeat.short_watches = self.short_watches

    def _grace_ends_before(self, moment: float) -> bool:
        if self._pending_since is None:
            return False
        return self._pending_since + self.pending_grace < moment - 0.5

    def _beat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.beat()

    def _watch_seconds(self) -> float:
        seconds = min(self.watch_timeout, self.deadline.remaining())
        if self.heartbeat is not None:
            # End the watch when the next heartbeat is due, so a quiet wait still speaks.
            seconds = min(seconds, self.heartbeat.seconds_to_next() + 0.05)
        if self._pending_since is not None:
            grace_left = self._pending_since + self.pending_grace - self.clock()
            seconds = min(seconds, grace_left)
        return max(1.0, seconds)

    def _judge(self, claim: dict | None, target: str | None) -> bool:
        """True when settled; raise when it never will; False to keep waiting."""
        if claim is None:
            raise UnexpectedState(f"claim {self.ref} was deleted while waiting")
        if self.uid is not None and claim["metadata"].get("uid") != self.uid:
            raise UnexpectedState(f"claim {self.ref} was deleted and re-created (its uid changed)")
        state = ClaimClassState.of(claim)
        if self.heartbeat is not None:
            self.heartbeat.kubernetes = state.describe()
        if state.spec != target:
            raise UnexpectedState(
                f"claim {self.ref} now asks for {state.spec}, not {target}: another writer "
                "(a GitOps controller?) changed spec.volumeAttributesClassName"
            )
        if state.settled_on(target):
            return True
        self._surface_conditions(claim)
        if self._stale is not None:
            if (state.status, state.status_target) == (
                self._stale.status,
                self._stale.status_target,
            ):
                # Still what an earlier attempt left: give the resizer the grace period.
                self._check_grace(f"{state.status} (as an earlier attempt left it)", claim)
                return False
            self._stale, self._pending_since = None, None
        if state.status is None:
            self._pending_since = None
            return False  # the resizer has not picked up this request yet
        if state.status not in KNOWN_STATUSES:
            raise UnexpectedState(
                f"claim {self.ref} has unknown modify status {state.status!r} "
                f"(known: {', '.join(KNOWN_STATUSES)})"
            )
        if state.status == "Pending":
            # Judged before the target: Pending does not update targetVolumeAttributesClassName.
            self._check_grace("Pending", claim)
            return False
        self._pending_since = None
        if state.status_target not in (None, target):
            return False  # an older modification is still finishing
        if state.status == "InProgress":
            if self._has_condition(claim, "ModifyVolumeError"):
                self._surface_events(claim)
            return False
        if state.status == "Infeasible":
            raise Infeasible(
                f"modification of claim {self.ref} to {target} is Infeasible: {self._reason(claim)}"
            )
        raise AssertionError(f"unhandled modify status {state.status!r}")

    def _check_grace(self, what: str, claim: dict) -> None:
        """Start or continue the grace period; raise Infeasible once it is over."""
        now = self.clock()
        if self._pending_since is None:
            self._pending_since = now
        if now - self._pending_since >= self.pending_grace:
            raise Infeasible(
                f"claim {self.ref} stayed {what} for {self.pending_grace:g}s: {self._reason(claim)}"
            )

    @staticmethod
    def _has_condition(claim: dict, kind: str) -> bool:
        return any(
            c.get("type") == kind for c in (claim.get("status") or {}).get("conditions") or []
        )

    def _surface_conditions(self, claim: dict) -> None:
        for cond in (claim.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "ModifyVolumeError":
                self._warn_once(f"ModifyVolumeError ({cond.get('reason')}): {cond.get('message')}")

    def _surface_events(self, claim: dict) -> None:
        try:
            events = self.kube.claim_events(self.namespace, claim, self.deadline)
        except (BenchError, TemporaryError) as exc:
            log.info("could not read events of %s: %s", self.ref, exc)
            return
        for event in events:
            if event.get("reason") == "VolumeModifyFailed":
                self._warn_once(f"event VolumeModifyFailed: {event.get('message')}")

    def _warn_once(self, message: str) -> None:
        if message not in self._seen_warnings:
            self._seen_warnings.add(message)
            self.warn(message)

    def _reason(self, claim: dict) -> str:
        """The claim's error condition (it belongs to the current status), else its latest
        warning event (events outlive the attempt that raised them), else unknown."""
        for cond in (claim.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "ModifyVolumeError":
                return f"{cond.get('reason')}: {cond.get('message')}"
        try:
            events = self.kube.claim_events(self.namespace, claim, self.deadline)
        except (BenchError, TemporaryError) as exc:
            events = []
            log.info("could not read events of %s: %s", self.ref, exc)
        warnings = [e for e in events if e.get("type") == "Warning"]
        if warnings:
            last = warnings[-1]
            return f"{last.get('reason')}: {last.get('message')}"
        return "no event or condition gives a reason"
