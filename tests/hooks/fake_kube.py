"""An in-memory stand-in for the client wrapper (:class:`hooks.storage_profile.kube.Kube`).

It answers the wrapper's methods from the in-memory Kubernetes of ``kube_state.py``, the
one the HTTP double serves: the objects the wrapper returns (a missing one is None, as the
wrapper's reads say), and for a refused write the error the wrapper raises, made the way
the wrapper makes it: kube-apiserver's Status (:class:`Refused`) named by
:func:`checkpoint_storage_bench.kube.api_error`. Time is the wall clock: the fake resizer's
steps fall due as it passes, and a watch waits for them up to its timeout or the deadline,
as the wrapper's does, so a switch lasts as long as it would. The wait's watch is the
shared object layer's loop (:class:`FakeLayer`) over the fake's one list and one watch
request of a claim. What the wrapper does on the wire (status codes, retries, watch
streams) is tested against the HTTP double.
"""

from __future__ import annotations

import copy
import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.kube import api_error
from checkpoint_storage_bench.retry import Backoff, Deadline
from hooks.storage_profile.errors import ApiError
from hooks.storage_profile.kube import class_patch, event_time
from tests.hooks.kube_state import KubeState, Refused


@dataclass
class Write:
    """One write the hook asked for: ``create``/``update`` of a Lease, ``patch`` of a claim
    (the merge patch the wrapper sends), and the error it met, if any."""

    verb: str
    ref: str
    body: dict
    error: ApiError | None = None

    @property
    def status(self) -> int:
        """The HTTP status the API server answered (200 for an accepted write)."""
        return self.error.status if self.error is not None else 200


def wrapper_error(refused: Refused) -> ApiError:
    """The error the wrapper raises for this answer of the API server."""
    error = api_error(refused.code, json.dumps(refused.body), refused.body["reason"])
    assert isinstance(error, ApiError), error  # a refusal, never a temporary error
    return error


class FakeKube(KubeState):
    """The wrapper's methods over an in-memory state.

    Attributes:
        calls: The wrapper's methods called, by name, in order.
        requested: Every write asked for, in order, with the error the wrapper raised.
        watched: ``(namespace, name, resourceVersion)`` of every watch.
        forbidden: Lease verbs (``read``, ``create``, ``update``) RBAC refuses.
        before_write: Called once before the next Lease write (another writer racing us).
        watches: Scripted watches: each stands for the next watch, its events in order (an
            exception raised where it stands), the claim following each event.
        lost_answers: How many of the next claim patches land but lose their answer: the
            wrapper's retry then meets the patch's own change (409).
        sleeps: The waits of a caller's backoff (recorded, not slept).
    """

    def __init__(self) -> None:
        super().__init__()
        self.backoff = Backoff(delays=(0.25, 0.5))
        self.calls: list[str] = []
        self.requested: list[Write] = []
        self.watched: list[tuple[str, str, str]] = []
        self.forbidden: set[str] = set()
        self.before_write: Callable[[FakeKube], None] | None = None
        self.watches: list[list[tuple[str, dict] | Exception]] = []
        self.lost_answers = 0
        self.sleeps: list[float] = []
        self._due: list[tuple[float, int, tuple, Iterator[float]]] = []
        self._order = itertools.count()

    # -- the clock --------------------------------------------------------------------------

    def run(self, key: tuple, steps: Iterator[float]) -> None:
        self._due = [due for due in self._due if due[2] != key]
        self._due.append((time.monotonic(), next(self._order), key, steps))

    def later(self, seconds: float, action: Callable[[], None]) -> None:
        """Do ``action`` ``seconds`` from now (another actor, in the background)."""

        def steps() -> Iterator[float]:
            yield seconds
            action()

        self.run(("later", next(self._order)), steps())

    def advance(self) -> None:
        """Carry out, in order, every step that fell due by now."""
        now = time.monotonic()
        while due := [d for d in self._due if d[0] <= now]:
            step = min(due)
            self._due.remove(step)
            at, order, key, steps = step
            seconds = next(steps, None)
            if seconds is not None:
                self._due.append((at + seconds, order, key, steps))

    def sleep(self, seconds: float) -> None:
        """Recorded, not slept: the backoff a caller chose is what a test asserts."""
        self.sleeps.append(seconds)

    @property
    def client(self) -> FakeLayer:
        """The object layer with this fake as its transport (its watch loop runs as is)."""
        return FakeLayer(self)

    def count(self, method: str) -> int:
        return self.calls.count(method)

    @property
    def writes(self) -> list[Write]:
        """The writes the API server accepted."""
        return [w for w in self.requested if w.error is None]

    def claim_writes(self) -> list[Write]:
        """The patches of claims asked for (not the Lease writes), accepted or not."""
        return [w for w in self.requested if w.verb == "patch"]

    # -- reads ------------------------------------------------------------------------------

    def _called(self, method: str, what: str, deadline: Deadline | None) -> None:
        """Record the call and let time catch up; like the wrapper's, a call starts only
        before the deadline (``what`` is the wrapper's name for it)."""
        self.calls.append(method)
        self.advance()
        if deadline is not None:
            deadline.check(what)

    def read_claim(self, ns: str, name: str, deadline: Deadline | None = None) -> dict | None:
        self._called("read_claim", f"read claim {ns}/{name}", deadline)
        return self.get("PersistentVolumeClaim", name, ns)

    def read_pv(self, name: str, deadline: Deadline | None = None) -> dict | None:
        self._called("read_pv", f"read PersistentVolume {name}", deadline)
        return self.get("PersistentVolume", name)

    def read_class(self, name: str, deadline: Deadline | None = None) -> dict | None:
        self._called("read_class", f"read VolumeAttributesClass {name}", deadline)
        return self.get("VolumeAttributesClass", name)

    def read_storage_class(self, name: str, deadline: Deadline | None = None) -> dict | None:
        self._called("read_storage_class", f"read StorageClass {name}", deadline)
        return self.get("StorageClass", name)

    def list_claim(
        self, ns: str, name: str, deadline: Deadline | None = None
    ) -> tuple[dict | None, str]:
        self._called("list_claim", f"list claim {ns}/{name}", deadline)
        items = [listed(o) for o in self.of_kind("PersistentVolumeClaim", ns)
                 if o["metadata"]["name"] == name]  # fmt: skip
        return (items[0] if items else None), str(self.rv)

    def claim_events(self, ns: str, claim: dict, deadline: Deadline | None = None) -> list[dict]:
        meta = claim["metadata"]
        self._called("claim_events", f"list events of claim {ns}/{meta['name']}", deadline)
        selector = [("involvedObject.kind", "PersistentVolumeClaim"),
                    ("involvedObject.name", meta["name"])]  # fmt: skip
        if meta.get("uid"):
            selector.append(("involvedObject.uid", meta["uid"]))
        return sorted(map(listed, self.of_kind("Event", ns, selector)), key=event_time)

    def pods(self, ns: str, deadline: Deadline | None = None) -> list[dict]:
        self._called("pods", f"list pods in {ns}", deadline)
        return [listed(o) for o in self.of_kind("Pod", ns)]

    # -- the watch --------------------------------------------------------------------------

    def watch_claim(
        self, ns: str, name: str, version: str, timeout: float, deadline: Deadline | None = None
    ) -> Iterator[tuple[str, dict]]:
        """The claim's changes after resourceVersion ``version`` as they happen, then a
        bookmark when the watch's whole seconds are over; nothing more once the deadline
        passed."""
        self.calls.append("watch_claim")
        self.watched.append((ns, name, version))
        if self.watches:
            yield from self._scripted(ns, name, self.watches.pop(0))
            return
        ends = time.monotonic() + max(1, int(timeout))
        sent = int(version)
        while True:
            for version, kind, obj in list(self.history):
                meta = obj["metadata"]
                if version > sent and (meta["namespace"], meta["name"]) == (ns, name):
                    sent = version
                    yield kind, copy.deepcopy(obj)
            now = time.monotonic()
            left = deadline.remaining() if deadline is not None else ends - now
            if left <= 0:
                return
            if now >= ends:
                bookmark = {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(self.rv)}}  # fmt: skip
                yield "BOOKMARK", bookmark
                return
            time.sleep(max(0.0, min([ends, now + left, *(due[0] for due in self._due)]) - now))
            self.advance()

    def _scripted(self, ns: str, name: str, script: list) -> Iterator[tuple[str, dict]]:
        for item in script:
            if isinstance(item, Exception):
                raise item
            kind, obj = item
            with self.lock:
                if kind == "DELETED":
                    self.objects.pop(("PersistentVolumeClaim", ns, name), None)
                else:
                    self.objects["PersistentVolumeClaim", ns, name] = copy.deepcopy(obj)
            yield kind, copy.deepcopy(obj)

    # -- writes -----------------------------------------------------------------------------

    def _refuse(self, write: Write, refused: Refused) -> ApiError:
        write.error = wrapper_error(refused)
        return write.error

    def patch_claim_class(
        self, ns: str, name: str, target: str | None, deadline: Deadline | None = None, *identity
    ) -> dict:
        """The patch the wrapper sends: :func:`class_patch` of ``target`` and the rest of the
        wrapper's arguments (uid, resourceVersion, annotations)."""
        self._called("patch_claim_class", f"patch claim {ns}/{name}", deadline)
        body = class_patch(target, *identity)
        write = Write("patch", f"{ns}/{name}", body)
        self.requested.append(write)
        try:
            stored = self.patch_claim(ns, name, body)
            if self.lost_answers:
                self.lost_answers -= 1
                write = Write("patch", f"{ns}/{name}", copy.deepcopy(body))
                self.requested.append(write)
                self.patch_claim(ns, name, body)  # the wrapper's retry
        except Refused as refused:
            raise self._refuse(write, refused) from None
        return stored

    def read_lease(self, ns: str, name: str, deadline: Deadline | None = None) -> dict | None:
        self._called("read_lease", f"read Lease {ns}/{name}", deadline)
        self._check("read", f"Lease {ns}/{name}")
        return self.get("Lease", name, ns)

    def create_lease(self, ns: str, body: dict, deadline: Deadline | None = None) -> dict:
        return self._write_lease("create", ns, body["metadata"]["name"], body, deadline)

    def replace_lease(
        self, ns: str, name: str, body: dict, deadline: Deadline | None = None
    ) -> dict:
        return self._write_lease("update", ns, name, body, deadline)

    def _write_lease(
        self, verb: str, ns: str, name: str, body: dict, deadline: Deadline | None
    ) -> dict:
        self._called(f"{verb}_lease", f"{verb} Lease {ns}/{name}", deadline)
        self._check(verb, f"Lease {ns}/{name}")
        race, self.before_write = self.before_write, None
        if race is not None:
            race(self)
        write = Write(verb, f"{ns}/{name}", copy.deepcopy(body))
        self.requested.append(write)
        try:
            stored, _ = self.write_lease(verb, ns, name, body)
        except Refused as refused:
            raise self._refuse(write, refused) from None
        return stored

    def _check(self, verb: str, ref: str) -> None:
        if verb in self.forbidden:
            raise wrapper_error(Refused(403, "Forbidden", f"cannot {verb} {ref}"))


class FakeLayer(kube.Client):
    """The shared object layer whose one list and one watch request of a claim answer from
    the fake (:meth:`FakeKube.list_claim`, :meth:`FakeKube.watch_claim`, counted as the
    wrapper's): what the layer does around them (resume, list again, back off with the
    fake's backoff, recorded sleeps) is its own code."""

    def __init__(self, fake: FakeKube) -> None:
        super().__init__(None, backoff=fake.backoff, sleep=fake.sleep)  # type: ignore[arg-type]
        self.fake = fake

    def list(  # type: ignore[override]
        self, kind: kube.Kind, namespace: str, deadline: Deadline | None = None,
        what: str | None = None, **selectors: str,
    ) -> tuple[list[dict], str]:  # fmt: skip
        claim, version = self.fake.list_claim(namespace, _named(selectors), deadline)
        return ([claim] if claim is not None else []), version

    def stream(  # type: ignore[override]
        self, kind: kube.Kind, namespace: str, *, resource_version: str,
        seconds: float = kube.WATCH_SECONDS, deadline: Deadline | None = None, **selectors: str,
    ) -> Iterator[tuple[str, dict]]:  # fmt: skip
        return self.fake.watch_claim(
            namespace, _named(selectors), resource_version, seconds, deadline
        )


def _named(selectors: dict[str, str]) -> str:
    assert selectors["fieldSelector"].startswith("metadata.name="), selectors
    return selectors["fieldSelector"].removeprefix("metadata.name=")


def listed(obj: dict) -> dict:
    """An object as a list answer carries it: without kind and apiVersion."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
