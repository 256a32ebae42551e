"""One pipeline at a time on a claim: a ``coordination.k8s.io`` Lease named after it.

``switch`` takes the Lease (or renews it, when it already holds it) before it patches;
another holder's Lease that has not expired refuses the switch (exit 3), naming the holder
and when the Lease expires; an expired one is taken over. ``renew`` extends a Lease this
holder still holds (a stage renews it between its fio sweep and its training runs) and
refuses one it lost. ``release`` gives it up (the pipeline's last op, ``trigger: all_done``). The Lease is advisory: ``kubectl`` can still
change the claim, which the waits notice (another writer → exit 1).

The holder id: ``--holder``, else inside a Polyaxon run the pipeline's uuid (the run's
pipeline, else the run's own uuid), else ``user@host``.
"""

from __future__ import annotations

import getpass
import logging
import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from checkpoint_storage_bench.contract import lease_name
from checkpoint_storage_bench.retry import Deadline, DeadlineExceeded, within
from checkpoint_storage_bench.tracking import outermost_run, polyaxon_run
from hooks.storage_profile.config import LEASE_DURATION
from hooks.storage_profile.errors import (
    ApiError,
    Conflict,
    Forbidden,
    HookError,
    Invalid,
    PreflightRefused,
)
from hooks.storage_profile.kube import Kube

log = logging.getLogger(__name__)
T = TypeVar("T")

MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"
PIPELINE_LOOKUP_TIMEOUT = 10.0


def utcnow() -> datetime:
    return datetime.now(UTC)


def microtime(at: datetime) -> str:
    """A Lease's ``MicroTime``: RFC 3339 with microseconds, UTC."""
    return at.astimezone(UTC).strftime(MICROTIME)


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True)
class LeaseState:
    """Who holds a claim's Lease and until when."""

    holder: str | None
    renewed: datetime | None
    duration: float

    @classmethod
    def of(cls, lease: dict) -> LeaseState:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or None,
            renewed=parse_time(spec.get("renewTime") or spec.get("acquireTime")),
            duration=float(spec.get("leaseDurationSeconds") or 0),
        )

    @property
    def expires(self) -> datetime | None:
        return None if self.renewed is None else self.renewed + timedelta(seconds=self.duration)

    def fresh(self, now: datetime) -> bool:
        """Held, and not expired."""
        return self.holder is not None and self.expires is not None and self.expires > now


def pipeline_of_run(owner: str, project: str, run_uuid: str) -> str | None:
    """The uuid of the pipeline a Polyaxon run belongs to, asked from Polyaxon's API; None
    when the run has no pipeline or the API failed."""
    try:
        return parent_run(owner, project, run_uuid)
    except Exception as exc:  # noqa: BLE001 - any failure falls back to the run uuid
        log.warning("cannot ask Polyaxon for the pipeline of run %s: %s", run_uuid, exc)
        return None


def ask_polyaxon(
    fn: Callable[[], T], what: str, deadline: Deadline | None, otherwise: str
) -> T | None:
    """``fn``'s answer from Polyaxon's API (which may be unreachable from the pod), waited
    for at most :data:`PIPELINE_LOOKUP_TIMEOUT` and never past the command's ``deadline``;
    None without an answer by then, said in a warning with what happens ``otherwise``."""
    seconds = PIPELINE_LOOKUP_TIMEOUT
    if deadline is not None:
        seconds = max(0.01, min(seconds, deadline.remaining()))
    try:
        return within(fn, what=what, deadline=Deadline(seconds))
    except DeadlineExceeded as exc:
        log.warning("%s; %s", exc, otherwise)
        return None


def parent_run(owner: str, project: str, run_uuid: str) -> str | None:
    """The uuid of the run's direct pipeline (None: it has none), asked from Polyaxon's API.

    Raises:
        Exception: Whatever the API client raised (the caller decides what that means).
    """
    from polyaxon.client import RunClient

    run = RunClient(owner=owner, project=project, run_uuid=run_uuid)
    run.refresh_data()
    pipeline = getattr(run.run_data, "pipeline", None)
    return getattr(pipeline, "uuid", None) if pipeline else None


def failed_runs_below(owner: str, project: str, root: str) -> list[str]:
    """The names of the failed runs whose ``controller`` is ``root``, asked from Polyaxon's
    API. haupt sets every run's controller to the outermost run of its tree, at any depth
    of nesting, so for the outermost run this is every failed run of the whole tree.

    Raises:
        Exception: Whatever the API client raised.
    """
    from polyaxon.client import RunClient

    found = RunClient(owner=owner, project=project).list(
        query=f"controller:{root}, status:failed", limit=100
    )
    return [r.name or r.uuid for r in found.results or []]


def refuse_after_failure(
    environ: dict[str, str] | None = None,
    parent_of: Callable[[str, str, str], str | None] | None = None,
    failed_below: Callable[[str, str, str], list[str]] | None = None,
    deadline: Deadline | None = None,
) -> None:
    """Refuse the switch (``PreflightRefused``, nothing changed) when a run of the Polyaxon
    pipeline this switch runs in has failed (``--stop-after-failure``), at any depth.

    A Polyaxon mapping starts its next run after one failed, and haupt's failure early
    stopping never fires for a mapping nested in a pipeline (it counts the runs whose
    ``controller`` is the mapping: the outermost run is theirs). So a later stage's switch
    is where the pipeline stops changing the claim: the claim stays on the class the last
    good switch left. The pipeline is found from this run itself (``POLYAXON_RUN_INSTANCE``)
    by following ``pipeline`` up to the outermost run, and its failed runs are those whose
    ``controller`` it is: the same query however deeply the stages are nested. Outside a
    Polyaxon run there is no pipeline to ask; an API that fails, or does not answer within
    :data:`PIPELINE_LOOKUP_TIMEOUT` (never past ``deadline``), is said in a warning: neither
    refuses.
    """
    run = polyaxon_run(environ)
    if run is None:
        return
    owner, project, run_uuid = run
    parent_of = parent_of or parent_run
    failed_below = failed_below or failed_runs_below

    def failed_in_tree() -> tuple[str, list[str]] | None:
        try:
            root = outermost_run(owner, project, run_uuid, parent_of)
            return root, (failed_below(owner, project, root) if root != run_uuid else [])
        except Exception as exc:  # noqa: BLE001 - an unreachable API does not stop the switch
            log.warning("cannot ask Polyaxon for the failed runs of run %s's pipeline: %s; "
                        "switching anyway", run_uuid, exc)  # fmt: skip
            return None

    found = ask_polyaxon(
        failed_in_tree,
        f"asking Polyaxon for the failed runs of run {run_uuid}'s pipeline",
        deadline,
        otherwise="switching anyway",
    )
    if found is not None and found[1]:
        root, failed = found
        raise PreflightRefused(
            f"pipeline {root} has failed op(s) ({', '.join(sorted(set(failed)))}): no later "
            "stage switches the claim (--stop-after-failure); nothing was changed"
        )


def default_holder(
    environ: dict[str, str] | None = None,
    pipeline_of: Callable[[str, str, str], str | None] = pipeline_of_run,
    deadline: Deadline | None = None,
) -> str:
    """The holder id when ``--holder`` is not given.

    Inside a Polyaxon run (``POLYAXON_RUN_INSTANCE`` = ``owner.project.runs.uuid``): the
    pipeline's uuid, else the run's; outside: ``user@host``. The lookup of the pipeline
    (the API may be unreachable from the pod) waits at most
    :data:`PIPELINE_LOOKUP_TIMEOUT`, and never past the command's ``deadline``: it is
    part of the command's ``--timeout``.
    """
    run = polyaxon_run(environ)
    if run is not None:
        owner, project, run_uuid = run
        pipeline = ask_polyaxon(
            lambda: pipeline_of(owner, project, run_uuid),
            f"asking Polyaxon for the pipeline of run {run_uuid}",
            deadline,
            otherwise="the holder is the run itself",
        )
        return pipeline or run_uuid
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for the uid (some containers)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


class ClaimLease:
    """The Lease guarding one claim.

    Args:
        kube: The API access.
        namespace: The claim's (and the Lease's) namespace.
        claim: The claim's name.
        holder: Our holder id.
        duration: Lease duration in seconds (set on each acquire or renewal).
        now: Wall clock (Lease times are wall-clock times).
    """

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        claim: str,
        holder: str,
        duration: float = LEASE_DURATION,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.claim = claim
        self.name = lease_name(claim)
        self.holder = holder
        self.duration = duration
        self.now = now

    @property
    def seconds(self) -> int:
        """``leaseDurationSeconds``: whole seconds (an int32), rounded up, so the Lease never
        lasts less than asked."""
        return math.ceil(self.duration)

    @property
    def ref(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def _refuse_if_held(self, lease: dict | None) -> None:
        if lease is None:
            return
        state = LeaseState.of(lease)
        if state.holder != self.holder and state.fresh(self.now()):
            raise PreflightRefused(
                f"claim {self.namespace}/{self.claim} is held by {state.holder} until "
                f"{state.expires:%Y-%m-%dT%H:%M:%SZ} ({self.ref}): another pipeline is "
                "measuring on it; wait until it is released or expires (or, if that pipeline "
                f"is gone, release it: release --holder {state.holder})"
            )

    def check(self, deadline: Deadline) -> None:
        """Refuse when another holder's Lease is fresh (a dry run: nothing written)."""
        self._refuse_if_held(self._read(deadline))

    def acquire(self, deadline: Deadline) -> str:
        """Take the Lease, renew ours, or take over an expired one; return a note.

        Raises:
            PreflightRefused: Another holder's Lease is fresh, or RBAC forbids it.
        """
        for _ in range(3):
            lease = self._read(deadline)
            self._refuse_if_held(lease)
            now = self.now()
            expires = microtime(now + timedelta(seconds=self.duration))[:19] + "Z"
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {
                        "holderIdentity": self.holder,
                        "leaseDurationSeconds": self.seconds,
                        "acquireTime": microtime(now),
                        "renewTime": microtime(now),
                        "leaseTransitions": 0,
                    },
                }
                if self._write("create", body, deadline):
                    return f"took {self.ref} as {self.holder} until {expires}"
                continue
            state = LeaseState.of(lease)
            spec = dict(lease.get("spec") or {})
            ours = state.holder == self.holder
            spec.update(
                holderIdentity=self.holder,
                leaseDurationSeconds=self.seconds,
                renewTime=microtime(now),
            )
            if not ours:
                spec["acquireTime"] = microtime(now)
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            body = {**lease, "spec": spec}
            if self._write("update", body, deadline):
                if ours:
                    return f"renewed {self.ref} as {self.holder} until {expires}"
                if state.holder is None:
                    return f"took {self.ref} (released before) as {self.holder} until {expires}"
                return (
                    f"took over {self.ref} from {state.holder}, whose lease expired at "
                    f"{state.expires:%Y-%m-%dT%H:%M:%SZ}; held by {self.holder} until {expires}"
                )
        raise PreflightRefused(f"{self.ref} kept changing while it was being taken; try again")

    def renew(self, deadline: Deadline) -> str:
        """Extend our Lease by ``duration`` from now; return a note.

        Only a Lease this holder still holds is renewed, even one that expired (nobody took
        it: another pipeline would have had to take it first to switch the claim). A Lease
        that is gone, released or taken by another holder is not taken here: the claim may
        have been switched since this stage's switch, so what would be measured next is
        not known to be on this stage's class.

        Raises:
            PreflightRefused: The Lease is not held by this holder, or RBAC forbids it.
        """
        for _ in range(3):
            lease = self._read(deadline)
            state = LeaseState.of(lease) if lease is not None else None
            if state is None or state.holder != self.holder:
                held = (
                    "does not exist"
                    if state is None
                    else (
                        f"is held by {state.holder}" if state.holder else "is not held (released)"
                    )
                )
                raise PreflightRefused(
                    f"{self.ref} {held}, not by {self.holder}: not renewed; the claim may "
                    "have been switched since this holder's switch, so nothing more is "
                    "measured on it"
                )
            assert lease is not None
            now = self.now()
            spec = dict(lease.get("spec") or {})
            spec.update(leaseDurationSeconds=self.seconds, renewTime=microtime(now))
            if self._write("update", {**lease, "spec": spec}, deadline):
                expires = microtime(now + timedelta(seconds=self.duration))[:19] + "Z"
                return f"renewed {self.ref} as {self.holder} until {expires}"
        raise PreflightRefused(f"{self.ref} kept changing while it was being renewed; try again")

    def release(self, deadline: Deadline) -> str:
        """Give the Lease up when we hold it; return a note.

        The Lease stays, without a holder (deleting it would need another permission).

        Raises:
            PreflightRefused: Another holder's Lease is fresh, or RBAC forbids it.
        """
        for _ in range(3):
            lease = self._read(deadline)
            if lease is None:
                return f"no {self.ref}: nothing to release"
            state = LeaseState.of(lease)
            if state.holder is None:
                return f"{self.ref} is not held: nothing to release"
            if state.holder != self.holder:
                if not state.fresh(self.now()):
                    return (
                        f"{self.ref} is held by {state.holder}, not {self.holder}, and expired at "
                        f"{state.expires:%Y-%m-%dT%H:%M:%SZ}: nothing to release"
                    )
                raise PreflightRefused(
                    f"{self.ref} is held by {state.holder} until "
                    f"{state.expires:%Y-%m-%dT%H:%M:%SZ}, not by {self.holder}: not released"
                )
            spec = dict(lease.get("spec") or {})
            spec.pop("holderIdentity", None)
            spec["renewTime"] = microtime(self.now())
            if self._write("update", {**lease, "spec": spec}, deadline):
                return f"released {self.ref} (held by {self.holder})"
        raise PreflightRefused(f"{self.ref} kept changing while it was being released; try again")

    def _read(self, deadline: Deadline) -> dict | None:
        try:
            return self.kube.read_lease(self.namespace, self.name, deadline)
        except ApiError as exc:
            raise self._refusal("read", exc) from exc

    def _write(self, verb: str, body: dict, deadline: Deadline) -> bool:
        """Create or update; False when someone else wrote it first (a conflict: read
        again)."""
        try:
            if verb == "create":
                self.kube.create_lease(self.namespace, body, deadline)
            else:
                self.kube.replace_lease(self.namespace, self.name, body, deadline)
        except Conflict:
            return False
        except ApiError as exc:
            raise self._refusal(verb, exc) from exc
        return True

    def _refusal(self, verb: str, exc: ApiError) -> HookError:
        # RBAC, or the API server's validation: nothing was written either way.
        if isinstance(exc, (Forbidden, Invalid)):
            return PreflightRefused(f"cannot {verb} {self.ref}: {exc.server_message}")
        return HookError(f"{verb} {self.ref} failed: {exc.server_message}")
