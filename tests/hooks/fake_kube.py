"""An in-memory stand-in for the client wrapper (:class:`hooks.storage_profile.kube.Kube`):
Leases, and one claim whose list and watches a test scripts.

It answers the wrapper's methods with the objects and the named errors the wrapper itself
returns and raises, so the Lease logic is tested against the wrapper's contract; what the
wrapper does on the wire is tested against the HTTP double (``kube_double.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field

from checkpoint_storage_bench.retry import Backoff
from hooks.storage_profile.errors import Conflict, Forbidden, NotFound


@dataclass
class FakeKube:
    """Leases by (namespace, name), with kube-apiserver's resourceVersion rule for updates.

    Attributes:
        leases: The stored Leases.
        forbidden: Verbs (``read``, ``create``, ``update``) RBAC refuses.
        writes: ``(verb, body)`` of every accepted write, in order.
        before_write: Called once before the next write (another writer racing us).
    """

    leases: dict[tuple[str, str], dict] = field(default_factory=dict)
    forbidden: set[str] = field(default_factory=set)
    writes: list[tuple[str, dict]] = field(default_factory=list)
    before_write: object = None
    claim: dict | None = None
    watches: list[list[tuple[str, dict] | Exception]] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    lists: int = 0
    sleeps: list[float] = field(default_factory=list)
    backoff: Backoff = field(default_factory=lambda: Backoff(delays=(0.25, 0.5)))
    _version: int = 0

    def sleep(self, seconds: float) -> None:
        """Recorded, not slept: the backoff a caller chose is what a test asserts."""
        self.sleeps.append(seconds)

    # -- the claim ------------------------------------------------------------------------

    def list_claim(self, ns: str, name: str, deadline=None) -> tuple[dict | None, str]:
        """The claim as it stands, and a resourceVersion to watch from."""
        self.lists += 1
        self._version += 1
        return copy.deepcopy(self.claim), str(self._version)

    def watch_claim(self, ns: str, name: str, resource_version: str, timeout: float,
                    deadline=None) -> Iterator[tuple[str, dict]]:  # fmt: skip
        """The next scripted watch: its events in order (an exception raised where it
        stands); the claim follows each event. No script left: a watch that ends quietly."""
        script = self.watches.pop(0) if self.watches else []
        for item in script:
            if isinstance(item, Exception):
                raise item
            kind, obj = item
            self.claim = None if kind == "DELETED" else copy.deepcopy(obj)
            yield kind, copy.deepcopy(obj)

    def claim_events(self, ns: str, claim: dict, deadline=None) -> list[dict]:
        return copy.deepcopy(self.events)

    def _check(self, verb: str, ref: str) -> None:
        if verb in self.forbidden:
            raise Forbidden(403, f"cannot {verb} {ref}")

    def _store(self, verb: str, ns: str, body: dict) -> dict:
        self._version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self._version)
        self.leases[ns, stored["metadata"]["name"]] = stored
        self.writes.append((verb, copy.deepcopy(stored)))
        return copy.deepcopy(stored)

    def _race(self) -> None:
        hook, self.before_write = self.before_write, None
        if callable(hook):
            hook(self)

    def read_lease(self, ns: str, name: str, deadline=None) -> dict | None:
        self._check("read", f"Lease {ns}/{name}")
        lease = self.leases.get((ns, name))
        return copy.deepcopy(lease) if lease is not None else None

    def create_lease(self, ns: str, body: dict, deadline=None) -> dict:
        self._check("create", f"Lease {ns}/{body['metadata']['name']}")
        self._race()
        if (ns, body["metadata"]["name"]) in self.leases:
            raise Conflict(409, "already exists")
        return self._store("create", ns, body)

    def replace_lease(self, ns: str, name: str, body: dict, deadline=None) -> dict:
        self._check("update", f"Lease {ns}/{name}")
        self._race()
        current = self.leases.get((ns, name))
        if current is None:
            raise NotFound(404, f"Lease {ns}/{name} not found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise Conflict(409, "the object has been modified; please apply your changes")
        return self._store("update", ns, body)

    def put_lease(self, ns: str, name: str, holder: str | None, renew_time: str,
                  duration: int = 3600) -> dict:  # fmt: skip
        """Seed a Lease as another writer (or an earlier run) left it."""
        spec: dict = {"leaseDurationSeconds": duration, "acquireTime": renew_time,
                      "renewTime": renew_time, "leaseTransitions": 0}  # fmt: skip
        if holder is not None:
            spec["holderIdentity"] = holder
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": ns}, "spec": spec}  # fmt: skip
        stored = self._store("seed", ns, body)
        self.writes.pop()
        return stored
