"""A stateful Kubernetes API test double speaking real HTTP on loopback.

It serves the endpoints the storage-profile hook uses, the way kube-apiserver does:
resourceVersions on every change, list + watch with resume from a resourceVersion and
``410 Expired`` once history is compacted, merge patches, the PVC update rules of the
field notes (422 for an unbound claim, 422 for nil after a class was applied), Status
bodies for errors, and optional RBAC from a Role manifest. A fake external-resizer acts
on claims like external-resizer v2 (see ``FakeResizer``).

The official ``kubernetes`` client reaches it through a kubeconfig (:meth:`write_kubeconfig`).
Every request is recorded, so tests can assert exactly what was written.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from checkpoint_storage_bench.contract import lease_name

CLAIMS = "persistentvolumeclaims"
# (api group, resource) -> kind
KINDS = {
    ("", CLAIMS): "PersistentVolumeClaim",
    ("", "persistentvolumes"): "PersistentVolume",
    ("", "events"): "Event",
    ("", "pods"): "Pod",
    ("storage.k8s.io", "volumeattributesclasses"): "VolumeAttributesClass",
    ("coordination.k8s.io", "leases"): "Lease",
}
CLUSTER_SCOPED = {"PersistentVolume", "VolumeAttributesClass"}
# Field selectors kube-apiserver 1.34 accepts for claims (anything else is a 400); events and
# pods accept many more, which the double does not check.
CLAIM_FIELD_SELECTORS = ("metadata.name", "metadata.namespace")
IMMUTABLE_SPEC = (
    "spec is immutable after creation except resources.requests and "
    "volumeAttributesClassName for bound claims"
)
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
PATH_RE = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[a-z0-9.]+)/v1)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[a-z]+)(?:/(?P<name>[^/]+))?$"
)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def qualified(group: str, resource: str) -> str:
    """How kube-apiserver names a resource in messages: ``resource[.group]``."""
    return f"{resource}.{group}" if group else resource


def details(group: str, resource: str, name: str | None) -> dict:
    """A Status body's ``details`` for one object (as kube-apiserver writes them)."""
    out: dict[str, str] = {"name": name} if name else {}
    if group:
        out["group"] = group
    out["kind"] = resource
    return out


INT32 = (-(2**31), 2**31 - 1)
MICROTIME_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
MICROTIME_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")


def lease_decode_error(spec: dict) -> str | None:
    """Why kube-apiserver cannot decode a Lease's spec (its 400 message), or None.

    ``leaseDurationSeconds`` and ``leaseTransitions`` are int32: a fractional or
    out-of-range number does not decode. ``acquireTime``/``renewTime`` are MicroTimes:
    RFC 3339 with exactly six fractional digits.
    """
    for key in ("leaseDurationSeconds", "leaseTransitions"):
        value = spec.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = "string" if isinstance(value, str) else type(value).__name__
            return (
                f"json: cannot unmarshal {kind} into Go struct field "
                f"LeaseSpec.spec.{key} of type int32"
            )
        if isinstance(value, float) or not INT32[0] <= value <= INT32[1]:
            return (
                f"json: cannot unmarshal number {value!r} into Go struct field "
                f"LeaseSpec.spec.{key} of type int32"
            )
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, str) and MICROTIME_RE.fullmatch(value)):
            # Go names where parsing stopped; the double names the value and the layout.
            return f'parsing time "{value}" as "{MICROTIME_LAYOUT}": not a MicroTime'
    return None


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def lookup(obj: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def parse_selector(selector: str | None) -> list[tuple[str, str]]:
    if not selector:
        return []
    return [tuple(term.split("=", 1)) for term in selector.split(",") if term]  # type: ignore[misc]


def matches(obj: dict, selector: list[tuple[str, str]]) -> bool:
    return all(str(lookup(obj, key) or "") == value for key, value in selector)


@dataclass
class Recorded:
    """One request the double answered."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    content_type: str | None = None
    body: Any = None
    status: int = 200
    at: float = field(default_factory=time.monotonic)


@dataclass
class Fault:
    """An injected error answer for matching requests.

    With ``lost`` the request is carried out and only its answer is replaced by the error,
    as when a connection drops after the server acted.
    """

    method: str
    path_re: str
    status: int
    times: int = 1
    retry_after: str | None = None
    lost: bool = False


@dataclass
class Rbac:
    """Role rules in force for the (single) caller, as loaded from manifests."""

    namespaced: dict[str, list[dict]] = field(default_factory=dict)
    cluster: list[dict] = field(default_factory=list)
    user: str = "system:serviceaccount:ml-team:storage-profile-hook"

    @classmethod
    def from_manifests(cls, path: Path, service_account: str) -> Rbac:
        """Rules bound to ``namespace:name`` service account by the manifests in ``path``."""
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        roles = {
            (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
            for d in docs
            if d["kind"] in ("Role", "ClusterRole")
        }
        sa_ns, sa_name = service_account.split(":")
        rbac = cls(user=f"system:serviceaccount:{sa_ns}:{sa_name}")
        for binding in docs:
            if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            if not any(
                s.get("kind") == "ServiceAccount"
                and s["name"] == sa_name
                and s.get("namespace") == sa_ns
                for s in binding.get("subjects", [])
            ):
                continue
            ref = binding["roleRef"]
            role_ns = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
            rules = roles[(ref["kind"], role_ns, ref["name"])].get("rules", [])
            if binding["kind"] == "RoleBinding":
                rbac.namespaced.setdefault(binding["metadata"]["namespace"], []).extend(rules)
            else:
                rbac.cluster.extend(rules)
        return rbac

    def allows(
        self, verb: str, group: str, resource: str, ns: str | None, name: str | None
    ) -> bool:
        rules = self.cluster + (self.namespaced.get(ns, []) if ns else [])
        for rule in rules:
            if (
                verb in rule.get("verbs", [])
                and group in rule.get("apiGroups", [])
                and resource in rule.get("resources", [])
            ):
                names = rule.get("resourceNames")
                if not names or (name is not None and name in names):
                    return True
        return False


class KubeDouble:
    """The double; start it, seed objects, point a kubeconfig at it.

    Attributes:
        requests: Every request answered, in order.
        watch_faults: Per watch request, in order: ``"gone"`` (an ERROR event 410 Expired in
            the stream), ``"gone-http"`` (HTTP 410 before any stream), ``"drop"`` (cut the
            connection mid-stream), ``"hang"`` (never answer, not even headers),
            ``"stall"`` (headers, then silence past ``timeoutSeconds``), ``"trickle"``
            (headers, then a blank line now and then, never ending), ``"close"`` (headers,
            then the end of the stream at once, without an event, as an overloaded server
            or a proxy may) or None (behave).
        on_patch: Called (on the server thread) after each accepted PATCH of a claim.
        rbac: When set, requests its rules do not allow get 403.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.rv = 1000
        self.objects: dict[tuple[str, str | None, str], dict] = {}
        self.history: list[tuple[int, str, dict]] = []
        self.compacted_rv = 0
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.watch_faults: deque[str | None] = deque()
        self.on_patch: Callable[[dict], None] | None = None
        self.rbac: Rbac | None = None
        self.resizer = FakeResizer(self)
        self._watchers: set[tuple[asyncio.Queue, str, tuple]] = set()
        self._closing: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port = 0
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> KubeDouble:
        ready = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self._serve())
            ready.set()
            self.loop.run_forever()

        self._thread = threading.Thread(target=run, name="kube-double", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the Kubernetes double did not start")
        return self

    async def _serve(self) -> None:
        self._closing = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        fut.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        assert self._thread is not None
        self._thread.join(10)

    async def _shutdown(self) -> None:
        assert self._closing is not None
        self._closing.set()  # ends the hanging and stalled answers
        self.resizer.cancel_all()
        for queue, _, _ in list(self._watchers):
            queue.put_nowait(None)
        assert self._runner is not None
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "hook", "user": {"token": "storage-profile-hook"}}],
            "contexts": [
                {
                    "name": "double",
                    "context": {"cluster": "double", "user": "hook", "namespace": namespace},
                }
            ],
            "current-context": "double",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def run_in_loop(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop (for resizer work started from a test)."""
        assert self.loop is not None

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    # -- state ---------------------------------------------------------------------------

    def get(self, kind: str, name: str, ns: str | None = None) -> dict | None:
        with self.lock:
            obj = self.objects.get((kind, None if kind in CLUSTER_SCOPED else ns, name))
            return copy.deepcopy(obj)

    def put(self, obj: dict) -> dict:
        """Create or replace an object (as a controller would); bumps its resourceVersion."""
        obj = copy.deepcopy(obj)
        kind = obj["kind"]
        meta = obj.setdefault("metadata", {})
        ns = None if kind in CLUSTER_SCOPED else meta.setdefault("namespace", "default")
        key = (kind, ns, meta["name"])
        with self.lock:
            old = self.objects.get(key)
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault(
                "creationTimestamp", old["metadata"]["creationTimestamp"] if old else now_rfc3339()
            )
            self.rv += 1
            meta["resourceVersion"] = str(self.rv)
            self.objects[key] = obj
            if kind == "PersistentVolumeClaim":
                self._record("ADDED" if old is None else "MODIFIED", obj)
        return copy.deepcopy(obj)

    def delete(self, kind: str, name: str, ns: str | None = None) -> None:
        with self.lock:
            obj = self.objects.pop((kind, None if kind in CLUSTER_SCOPED else ns, name))
            self.rv += 1
            if kind == "PersistentVolumeClaim":
                obj = copy.deepcopy(obj)
                obj["metadata"]["resourceVersion"] = str(self.rv)
                self._record("DELETED", obj)

    def update(self, kind: str, name: str, ns: str | None, fn: Callable[[dict], None]) -> dict:
        """Change an object in place under the lock; bumps resourceVersion if it changed."""
        with self.lock:
            obj = self.get(kind, name, ns)
            if obj is None:
                raise KeyError(name)
            before = copy.deepcopy(obj)
            fn(obj)
            if obj == before:
                return obj
            return self.put(obj)

    def compact(self) -> None:
        """Forget the watch history, as etcd compaction does: older resume points get 410."""
        with self.lock:
            self.history.clear()
            self.compacted_rv = self.rv

    def add_event(self, involved: dict, type_: str, reason: str, message: str) -> None:
        meta = involved["metadata"]
        self.put(
            {
                "kind": "Event",
                "apiVersion": "v1",
                "metadata": {
                    "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}",
                    "namespace": meta.get("namespace", "default"),
                },
                "involvedObject": {
                    "kind": involved["kind"],
                    "name": meta["name"],
                    "namespace": meta.get("namespace"),
                    "uid": meta["uid"],
                    "apiVersion": "v1",
                },
                "type": type_,
                "reason": reason,
                "message": message,
                "count": 1,
                "source": {"component": f"external-resizer {self.resizer.driver}"},
                "reportingComponent": f"external-resizer {self.resizer.driver}",
                "firstTimestamp": now_rfc3339(),
                "lastTimestamp": now_rfc3339(),
            }
        )

    def fail(
        self,
        method: str,
        path_re: str,
        status: int,
        times: int = 1,
        retry_after: str | None = None,
        lost: bool = False,
    ) -> None:
        """Answer the next ``times`` matching requests with ``status`` (after carrying them
        out when ``lost``)."""
        with self.lock:
            self.faults.append(Fault(method, path_re, status, times, retry_after, lost))

    def writes(self) -> list[Recorded]:
        return [r for r in self.requests if r.method not in ("GET", "HEAD")]

    def claim_writes(self) -> list[Recorded]:
        """Writes to claims (not to their Leases)."""
        return [r for r in self.writes() if f"/{CLAIMS}/" in r.path]

    def lease(self, claim: str = "training-checkpoints", ns: str = "ml-team") -> dict | None:
        return self.get("Lease", lease_name(claim), ns)

    def count(self, verb: str, resource: str = CLAIMS) -> int:
        return sum(1 for r in self.requests if r.verb == verb and f"/{resource}" in r.path)

    def _record(self, type_: str, obj: dict) -> None:
        self.history.append((self.rv, type_, copy.deepcopy(obj)))
        for queue, ns, selector in list(self._watchers):
            if obj["metadata"]["namespace"] == ns and matches(obj, selector):
                assert self.loop is not None
                self.loop.call_soon_threadsafe(queue.put_nowait, (type_, copy.deepcopy(obj)))

    # -- HTTP ----------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        match = PATH_RE.match(request.path)
        query = dict(request.query)
        body = await request.read()
        request["raw_body"] = body
        if not match or (match["group"] or "", match["resource"]) not in KINDS:
            return self._answer(
                request,
                query,
                "unknown",
                404,
                status_body(404, "NotFound", "the server could not find the requested resource"),
            )
        group, resource = match["group"] or "", match["resource"]
        ns, name = match["ns"], match["name"]
        kind = KINDS[(group, resource)]
        verb = {
            "GET": "get"
            if name
            else ("watch" if query.get("watch", "").lower() in ("true", "1") else "list"),
            "PATCH": "patch",
            "PUT": "update",
            "POST": "create",
            "DELETE": "delete",
        }.get(request.method, request.method.lower())
        selector = parse_selector(query.get("fieldSelector"))
        with self.lock:
            fault = next(
                (
                    f
                    for f in self.faults
                    if f.method == request.method
                    and re.search(f.path_re, request.path)
                    and f.times > 0
                ),
                None,
            )
            if fault:
                fault.times -= 1
        if fault and fault.lost:
            request["lost"] = fault  # carried out below; _answer replaces the answer
        elif fault:
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            reason = {429: "TooManyRequests", 503: "ServiceUnavailable"}.get(
                fault.status, "InternalError"
            )
            return self._answer(
                request,
                query,
                verb,
                fault.status,
                status_body(fault.status, reason, "injected fault"),
                headers,
            )
        if self.rbac is not None:
            # RBAC authorizes list/watch by name only through a metadata.name selector.
            auth_name = name or dict(selector).get("metadata.name")
            if not self.rbac.allows(verb, group, resource, ns, auth_name):
                return self._forbidden(request, query, verb, verb, group, resource, ns, auth_name)
        if kind == "PersistentVolumeClaim" and verb in ("list", "watch"):
            unknown = [key for key, _ in selector if key not in CLAIM_FIELD_SELECTORS]
            if unknown:
                known = ", ".join(f'"{k}"' for k in CLAIM_FIELD_SELECTORS)
                return self._answer(
                    request,
                    query,
                    verb,
                    400,
                    status_body(
                        400,
                        "BadRequest",
                        f'"{unknown[0]}" is not a known field selector: only {known}',
                    ),
                )
        if verb == "watch":
            return await self._watch(request, ns, selector, query)
        if verb == "list":
            with self.lock:
                # List items carry no kind/apiVersion (watch events' objects do).
                items = [
                    {k: v for k, v in copy.deepcopy(o).items() if k not in ("kind", "apiVersion")}
                    for (k, o_ns, _), o in self.objects.items()
                    if k == kind and (ns is None or o_ns == ns) and matches(o, selector)
                ]
                listing = {
                    "kind": f"{kind}List",
                    "apiVersion": f"{group}/v1" if group else "v1",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": items,
                }
            return self._answer(request, query, verb, 200, listing)
        if verb == "get":
            obj = self.get(kind, name, ns)
            if obj is None:
                return self._answer(
                    request,
                    query,
                    verb,
                    404,
                    status_body(
                        404,
                        "NotFound",
                        f'{qualified(group, resource)} "{name}" not found',
                        details(group, resource, name),
                    ),
                )
            return self._answer(request, query, verb, 200, obj)
        if verb == "patch" and kind == "PersistentVolumeClaim":
            return self._patch_claim(request, query, ns, name, body)
        if verb in ("create", "update") and kind == "Lease":
            return self._write_lease(request, query, verb, ns, name, body)
        return self._answer(
            request,
            query,
            verb,
            405,
            status_body(
                405, "MethodNotAllowed", f"the double does not implement {verb} {resource}"
            ),
        )

    def _forbidden(
        self,
        request: web.Request,
        query: dict,
        verb: str,
        denied: str,
        group: str,
        resource: str,
        ns: str | None,
        name: str | None,
        body: Any = None,
    ) -> web.Response:
        """kube-apiserver's 403 for ``denied`` (the request's verb, or the create an update
        of a missing object would be): it names the object of the URL or of a
        metadata.name selector, the user and the scope."""
        assert self.rbac is not None
        what = qualified(group, resource) + (f' "{name}"' if name else "")
        scope = f'in the namespace "{ns}"' if ns else "at the cluster scope"
        message = (
            f'{what} is forbidden: User "{self.rbac.user}" cannot {denied} resource '
            f'"{resource}" in API group "{group}" {scope}'
        )
        payload = status_body(403, "Forbidden", message, details(group, resource, name))
        return self._answer(request, query, verb, 403, payload, body=body)

    def _answer(
        self,
        request: web.Request,
        query: dict,
        verb: str,
        code: int,
        payload: dict,
        headers: dict | None = None,
        body: Any = None,
    ) -> web.Response:
        if body is None and request.get("raw_body"):
            try:
                body = json.loads(request["raw_body"])
            except ValueError:
                body = request["raw_body"]
        lost = request.get("lost")
        if lost is not None:
            code, payload = lost.status, status_body(lost.status, "InternalError", "answer lost")
        self.requests.append(
            Recorded(
                request.method,
                request.path,
                query,
                verb,
                request.headers.get("Content-Type"),
                body,
                code,
            )
        )
        return web.json_response(payload, status=code, headers=headers)

    def _patch_claim(
        self, request: web.Request, query: dict, ns: str, name: str, raw: bytes
    ) -> web.Response:
        content_type = request.headers.get("Content-Type", "")
        try:
            patch = json.loads(raw)
        except ValueError:
            patch = None
        if content_type not in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ) or not isinstance(patch, dict):
            return self._answer(
                request,
                query,
                "patch",
                415,
                # kube-apiserver also takes JSON patches and apply patches; the double does not.
                status_body(415, "UnsupportedMediaType", "415: Unsupported Media Type", {}),
                body=patch,
            )
        with self.lock:
            old = self.get("PersistentVolumeClaim", name, ns)
            if old is None:
                return self._answer(
                    request,
                    query,
                    "patch",
                    404,
                    status_body(
                        404,
                        "NotFound",
                        f'persistentvolumeclaims "{name}" not found',
                        details("", CLAIMS, name),
                    ),
                    body=patch,
                )
            # Preconditions, in kube-apiserver's order: the resourceVersion is compared when
            # the store applies the update (409 Conflict), the uid when the update is
            # validated afterwards (metadata.uid is immutable: 422).
            preconditions = patch.get("metadata") or {}
            version = preconditions.get("resourceVersion")
            if version is not None and version != old["metadata"]["resourceVersion"]:
                return self._answer(
                    request,
                    query,
                    "patch",
                    409,
                    status_body(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on persistentvolumeclaims "{name}": '
                        "the object has been modified; please apply your changes to the latest "
                        "version and try again",
                        details("", CLAIMS, name),
                    ),
                    body=patch,
                )
            uid = preconditions.get("uid")
            if uid is not None and uid != old["metadata"]["uid"]:
                return self._answer(
                    request,
                    query,
                    "patch",
                    422,
                    status_body(
                        422,
                        "Invalid",
                        f'PersistentVolumeClaim "{name}" is invalid: metadata.uid: Invalid '
                        f'value: "{uid}": field is immutable',
                        {
                            "name": name,
                            "kind": "PersistentVolumeClaim",
                            # Twice, as kube-apiserver 1.34 lists it: the generic update
                            # checks the object meta, and the claim's own validation again.
                            "causes": [
                                {
                                    "reason": "FieldValueInvalid",
                                    "message": f'Invalid value: "{uid}": field is immutable',
                                    "field": "metadata.uid",
                                }
                            ]
                            * 2,
                        },
                    ),
                    body=patch,
                )
            new = merge_patch(old, patch)
            new["status"] = old.get("status")  # status is a subresource
            new["metadata"] = merge_patch(
                old["metadata"],
                {
                    k: v
                    for k, v in (patch.get("metadata") or {}).items()
                    if k in ("labels", "annotations")
                },
            )
            error = self._validate_claim_update(old, new)
            if error:
                field_path, cause = error.split(": ", 1)
                return self._answer(
                    request,
                    query,
                    "patch",
                    422,
                    status_body(
                        422,
                        "Invalid",
                        f'PersistentVolumeClaim "{name}" is invalid: {error}',
                        {
                            "name": name,
                            "kind": "PersistentVolumeClaim",
                            "causes": [
                                {
                                    "reason": "FieldValueForbidden",
                                    "message": cause,
                                    "field": field_path,
                                }
                            ],
                        },
                    ),
                    body=patch,
                )
            stored = old if new == old else self.put(new)
        if new != old:
            self.resizer.on_claim_update(old, stored)
            if self.on_patch:
                self.on_patch(stored)
        return self._answer(request, query, "patch", 200, stored, body=patch)

    def _write_lease(
        self, request: web.Request, query: dict, verb: str, ns: str, name: str | None, raw: bytes
    ) -> web.Response:
        """Create (POST) or replace (PUT) a Lease, as kube-apiserver 1.34 does.

        A body that does not decode into a Lease (a fractional or out-of-range
        ``leaseDurationSeconds``, a time that is not a MicroTime) is a 400; the name comes
        from the body on create (409 AlreadyExists when taken), from the path on update,
        where the body's resourceVersion must be given (422) and be the current one (409
        Conflict). A PUT of a Lease that does not exist creates it (201): the Lease strategy
        allows create-on-update, and the caller needs the create permission too.
        """
        group, resource = "coordination.k8s.io", "leases"
        try:
            lease = json.loads(raw)
        except ValueError:
            lease = None
        meta = (lease or {}).get("metadata") or {}
        spec = (lease or {}).get("spec") or {}
        invalid = None
        if not isinstance(lease, dict) or lease.get("kind") != "Lease":
            invalid = "the body is not a Lease"
        elif not meta.get("name") or (verb == "update" and meta["name"] != name):
            invalid = "metadata.name: Invalid value: the name of the object does not match"
        elif len(meta["name"]) > 253 or not DNS1123_SUBDOMAIN.fullmatch(meta["name"]):
            invalid = (
                f'metadata.name: Invalid value: "{meta["name"]}": a lowercase RFC 1123 '
                "subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                "and must start and end with an alphanumeric character (must be no more "
                "than 253 characters)"
            )
        if invalid:
            return self._answer(
                request,
                query,
                verb,
                422,
                status_body(
                    422, "Invalid", f'Lease "{meta.get("name", "")}" is invalid: {invalid}'
                ),
                body=lease,
            )
        undecodable = lease_decode_error(spec)
        if undecodable:
            return self._answer(
                request,
                query,
                verb,
                400,
                status_body(
                    400,
                    "BadRequest",
                    f'Lease in version "v1" cannot be handled as a Lease: {undecodable}',
                ),
                body=lease,
            )
        lease_name = meta["name"]
        with self.lock:
            old = self.get("Lease", lease_name, ns)
            if verb == "update" and old is None and self.rbac is not None:
                if not self.rbac.allows("create", group, resource, ns, lease_name):
                    return self._forbidden(
                        request, query, verb, "create", group, resource, ns, lease_name, lease
                    )
            if verb == "update" and old is not None:
                version = meta.get("resourceVersion")
                if not version:
                    return self._answer(
                        request,
                        query,
                        verb,
                        422,
                        status_body(
                            422,
                            "Invalid",
                            f'{qualified(group, resource)} "{lease_name}" is invalid: '
                            "metadata.resourceVersion: Invalid value: 0: must be specified "
                            "for an update",
                            {
                                **details(group, resource, lease_name),
                                "causes": [
                                    {
                                        "reason": "FieldValueInvalid",
                                        "message": "Invalid value: 0: must be specified for "
                                        "an update",
                                        "field": "metadata.resourceVersion",
                                    }
                                ],
                            },
                        ),
                        body=lease,
                    )
                if version != old["metadata"]["resourceVersion"]:
                    return self._answer(
                        request,
                        query,
                        verb,
                        409,
                        status_body(
                            409,
                            "Conflict",
                            f"Operation cannot be fulfilled on {qualified(group, resource)} "
                            f'"{lease_name}": the object has been modified; please apply your '
                            "changes to the latest version and try again",
                            details(group, resource, lease_name),
                        ),
                        body=lease,
                    )
            duration = spec.get("leaseDurationSeconds")
            if duration is not None and duration <= 0:
                cause = f"Invalid value: {duration}: must be greater than 0"
                return self._answer(
                    request,
                    query,
                    verb,
                    422,
                    status_body(
                        422,
                        "Invalid",
                        f'Lease.{group} "{lease_name}" is invalid: spec.leaseDurationSeconds: '
                        f"{cause}",
                        {
                            **details(group, "Lease", lease_name),
                            "causes": [
                                {
                                    "reason": "FieldValueInvalid",
                                    "message": cause,
                                    "field": "spec.leaseDurationSeconds",
                                }
                            ],
                        },
                    ),
                    body=lease,
                )
            if verb == "create" and old is not None:
                return self._answer(
                    request,
                    query,
                    verb,
                    409,
                    status_body(
                        409,
                        "AlreadyExists",
                        f'{qualified(group, resource)} "{lease_name}" already exists',
                        details(group, resource, lease_name),
                    ),
                    body=lease,
                )
            lease = copy.deepcopy(lease)
            lease["metadata"] = {
                "name": lease_name,
                "namespace": ns,
                **({"uid": old["metadata"]["uid"]} if old else {}),
            }
            stored = self.put(lease)
        return self._answer(request, query, verb, 200 if old else 201, stored, body=lease)

    @staticmethod
    def _validate_claim_update(old: dict, new: dict) -> str | None:
        old_spec, new_spec = dict(old["spec"]), dict(new["spec"])
        for spec in (old_spec, new_spec):
            spec.pop("resources", None)
        vac_changed = old_spec.pop("volumeAttributesClassName", None) != new_spec.pop(
            "volumeAttributesClassName", None
        )
        bound = (old.get("status") or {}).get("phase") == "Bound"
        if old_spec != new_spec or (vac_changed and not bound):
            return f"spec: Forbidden: {IMMUTABLE_SPEC}"
        if (
            vac_changed
            and new["spec"].get("volumeAttributesClassName") is None
            and (old.get("status") or {}).get("currentVolumeAttributesClassName")
        ):
            return (
                "spec.volumeAttributesClassName: Forbidden: update from non-nil value to "
                "nil is forbidden"
            )
        return None

    async def _watch(
        self, request: web.Request, ns: str, selector: list, query: dict
    ) -> web.StreamResponse:
        fault = self.watch_faults.popleft() if self.watch_faults else None
        assert self._closing is not None
        if fault == "hang":
            # Accepts the request and never answers: only the client's timeout ends it.
            self.requests.append(Recorded(request.method, request.path, query, "watch"))
            await self._closing.wait()
            return web.Response(status=503)
        if fault in ("stall", "trickle"):
            # A stream that outlives its timeoutSeconds: silent, or alive with blank lines.
            self.requests.append(Recorded(request.method, request.path, query, "watch"))
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            while not self._closing.is_set():
                try:
                    await asyncio.wait_for(self._closing.wait(), 0.3)
                except TimeoutError:
                    if fault == "trickle":
                        try:
                            await resp.write(b"\n")
                        except (ConnectionResetError, RuntimeError):
                            break
            return resp
        if fault == "close":
            self.requests.append(Recorded(request.method, request.path, query, "watch"))
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        if fault == "gone-http":
            return self._answer(
                request,
                query,
                "watch",
                410,
                status_body(410, "Expired", "too old resource version"),
            )
        self.requests.append(Recorded(request.method, request.path, query, "watch"))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        sent = [int(query.get("resourceVersion") or 0)]

        async def send(type_: str, obj: dict) -> None:
            if type_ in ("ADDED", "MODIFIED", "DELETED"):
                sent.append(int(obj["metadata"]["resourceVersion"]))
            await resp.write(json.dumps({"type": type_, "object": obj}).encode() + b"\n")

        version = query.get("resourceVersion") or "0"
        with self.lock:
            expired = fault == "gone" or (version != "0" and int(version) < self.compacted_rv)
            if not expired:
                queue: asyncio.Queue = asyncio.Queue()
                watcher = (queue, ns, tuple(selector))
                self._watchers.add(watcher)
                if version == "0":
                    backlog = [
                        ("ADDED", o)
                        for (k, o_ns, _), o in self.objects.items()
                        if k == "PersistentVolumeClaim" and o_ns == ns and matches(o, selector)
                    ]
                else:
                    backlog = [
                        (t, o)
                        for rv, t, o in self.history
                        if rv > int(version)
                        and o["metadata"]["namespace"] == ns
                        and matches(o, selector)
                    ]
        if expired:
            await send(
                "ERROR",
                status_body(
                    410, "Expired", f"too old resource version: {version} ({self.compacted_rv})"
                ),
            )
            return resp
        try:
            if fault == "drop":
                # A mid-stream cut: the chunked body never terminates properly.
                await asyncio.sleep(0.1)
                assert request.transport is not None
                request.transport.abort()
                return resp
            for type_, obj in backlog:
                await send(type_, copy.deepcopy(obj))
            deadline = self.loop.time() + float(query.get("timeoutSeconds") or 1800)
            while (left := deadline - self.loop.time()) > 0:
                try:
                    item = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if item is None:
                    break
                await send(*item)
            if query.get("allowWatchBookmarks", "").lower() == "true":
                # Like kube-apiserver's, a bookmark never skips an event of this watch: a
                # change recorded but not yet delivered (it races the stream's end) holds it
                # at the last event sent.
                with self.lock:
                    pending = any(
                        rv > max(sent) and o["metadata"]["namespace"] == ns and matches(o, selector)
                        for rv, _, o in self.history
                    )
                    mark = max(sent) if pending else self.rv
                await send(
                    "BOOKMARK",
                    {
                        "kind": "PersistentVolumeClaim",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(mark)},
                    },
                )
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass
        finally:
            self._watchers.discard(watcher)
        return resp


class FakeResizer:
    """external-resizer v2's modify path, on the double's loop.

    Attributes:
        driver: The CSI driver it serves; claims of other drivers are ignored silently.
        results: Per class name, driver call outcomes to use in order: ``"ok"``,
            ``"InvalidArgument"``, ``"Internal"``, or ``"status:X"`` (set an unknown status
            X); when exhausted, ``"ok"``.
        on_modify: Called with (pv, class) on each successful driver call (EC2 via moto).
        delay: Seconds before the resizer reacts to a change.
        driver_delay: Seconds a driver call takes.
        retry_delay: Backoff after a final error.
    """

    def __init__(self, double: KubeDouble) -> None:
        self.double = double
        self.driver = "ebs.csi.aws.com"
        self.results: dict[str, list[str]] = {}
        self.on_modify: Callable[[dict, dict], None] | None = None
        self.delay = 0.05
        self.driver_delay = 0.2
        self.retry_delay = 0.1
        self.calls: list[tuple[str, str]] = []
        self._tasks: dict[tuple[str, str], asyncio.Task] = {}

    def cancel_all(self) -> None:
        for task in self._tasks.values():
            task.cancel()

    def restart(self) -> None:
        """A resizer restart re-queues every claim whose spec differs from its current class."""
        with self.double.lock:
            claims = [
                o for (k, _, _), o in self.double.objects.items() if k == "PersistentVolumeClaim"
            ]
        for claim in claims:
            if claim["spec"].get("volumeAttributesClassName") != (claim.get("status") or {}).get(
                "currentVolumeAttributesClassName"
            ):
                self._start(claim["metadata"]["namespace"], claim["metadata"]["name"])

    def _start(self, ns: str, name: str) -> None:
        key = (ns, name)
        if key in self._tasks:
            self._tasks[key].cancel()
        self._tasks[key] = asyncio.get_running_loop().create_task(self._modify(ns, name))

    def on_claim_update(self, old: dict, new: dict) -> None:
        if old["spec"].get("volumeAttributesClassName") == new["spec"].get(
            "volumeAttributesClassName"
        ):
            return
        self._start(new["metadata"]["namespace"], new["metadata"]["name"])

    def _set_status(self, ns: str, name: str, fn: Callable[[dict], None]) -> dict:
        def change(claim: dict) -> None:
            fn(claim.setdefault("status", {}))

        return self.double.update("PersistentVolumeClaim", name, ns, change)

    async def _modify(self, ns: str, name: str) -> None:
        double = self.double
        await asyncio.sleep(self.delay)
        claim = double.get("PersistentVolumeClaim", name, ns)
        target = claim["spec"].get("volumeAttributesClassName")
        pv = double.get("PersistentVolume", claim["spec"].get("volumeName") or "")
        driver = (pv or {}).get("spec", {}).get("csi", {}).get("driver")
        if target is None or driver != self.driver:
            return  # nothing to modify, or another driver's volume: ignored silently
        vac = double.get("VolumeAttributesClass", target)
        if vac is None:
            # Target field untouched, a Warning event, and no requeue when the class appears.
            self._set_status(ns, name, partial(_with_status, "Pending", None))
            double.add_event(
                claim, "Warning", "VolumeModifyFailed", f'VAC "{target}" does not exist.'
            )
            return
        while True:
            claim = self._set_status(ns, name, partial(_in_progress, target))
            double.add_event(
                claim,
                "Normal",
                "VolumeModify",
                f"external resizer is modifying volume {name} with vac {target}",
            )
            await asyncio.sleep(self.driver_delay)
            queue = self.results.get(target) or []
            result = queue.pop(0) if queue else "ok"
            self.calls.append((target, result))
            if result == "ok":
                if self.on_modify:
                    self.on_modify(pv, vac)
                double.update(
                    "PersistentVolume", pv["metadata"]["name"], None, partial(_pv_class, target)
                )
                claim = self._set_status(ns, name, partial(_settled, target))
                double.add_event(
                    claim,
                    "Normal",
                    "VolumeModifySuccessful",
                    f"external resizer modified volume {name} with vac {target} successfully",
                )
                return
            if result.startswith("status:"):
                self._set_status(ns, name, partial(_with_status, result.split(":", 1)[1], target))
                return
            message = (
                f"rpc error: code = {result} desc = Could not modify volume "
                f'"{pv["spec"]["csi"]["volumeHandle"]}"'
            )
            final = result == "InvalidArgument"
            claim = self._set_status(ns, name, partial(_failed, target, result, message, final))
            double.add_event(claim, "Warning", "VolumeModifyFailed", message)
            if final:
                return  # retried only every --retry-interval-max (minutes): not in a test
            await asyncio.sleep(self.retry_delay)


# Status changes of the resizer, applied to a claim's status dict.
MODIFY_CONDITIONS = ("ModifyingVolume", "ModifyVolumeError")


def _without(status: dict, kinds: tuple[str, ...]) -> list[dict]:
    return [c for c in status.get("conditions", []) if c["type"] not in kinds]


def _with_status(value: str, target: str | None, status: dict) -> None:
    modify = dict(status.get("modifyVolumeStatus") or {})
    modify["status"] = value
    if target is not None:
        modify["targetVolumeAttributesClassName"] = target
    status["modifyVolumeStatus"] = modify


def _in_progress(target: str, status: dict) -> None:
    _with_status("InProgress", target, status)
    status["conditions"] = _without(status, ("ModifyingVolume",)) + [
        {"type": "ModifyingVolume", "status": "True", "lastTransitionTime": now_rfc3339()}
    ]


def _settled(target: str, status: dict) -> None:
    status.pop("modifyVolumeStatus", None)
    status["currentVolumeAttributesClassName"] = target
    status["conditions"] = _without(status, MODIFY_CONDITIONS)


def _failed(target: str, code: str, message: str, final: bool, status: dict) -> None:
    _with_status("Infeasible" if final else "InProgress", target, status)
    status["conditions"] = _without(status, MODIFY_CONDITIONS) + [
        {
            "type": "ModifyVolumeError",
            "status": "True",
            "reason": code,
            "message": message,
            "lastTransitionTime": now_rfc3339(),
        }
    ]


def _pv_class(target: str, pv: dict) -> None:
    pv["spec"]["volumeAttributesClassName"] = target


def make_volume(
    double: KubeDouble,
    *,
    ns: str = "ml-team",
    claim: str = "training-checkpoints",
    pv: str = "pvc-0001",
    driver: str = "ebs.csi.aws.com",
    handle: str = "vol-0123456789abcdef0",
    current: str | None = "baseline",
    bound: bool = True,
    access_mode: str = "ReadWriteOnce",
) -> dict:
    """Seed a bound claim and its CSI PV already settled on ``current``."""
    if bound:
        double.put(
            {
                "kind": "PersistentVolume",
                "apiVersion": "v1",
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "200Gi"},
                    "accessModes": [access_mode],
                    "csi": {"driver": driver, "volumeHandle": handle, "fsType": "ext4"},
                    "volumeAttributesClassName": current,
                    "claimRef": {"namespace": ns, "name": claim},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "topology.kubernetes.io/zone",
                                            "operator": "In",
                                            "values": ["us-east-1a"],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
                "status": {"phase": "Bound"},
            }
        )
    status: dict[str, Any] = {"phase": "Bound" if bound else "Pending"}
    if bound and current:
        status["currentVolumeAttributesClassName"] = current
    return double.put(
        {
            "kind": "PersistentVolumeClaim",
            "apiVersion": "v1",
            "metadata": {"name": claim, "namespace": ns},
            "spec": {
                "accessModes": [access_mode],
                "storageClassName": "ebs-gp3",
                "resources": {"requests": {"storage": "200Gi"}},
                "volumeAttributesClassName": current,
                **({"volumeName": pv} if bound else {}),
            },
            "status": status,
        }
    )


def make_lease(
    double: KubeDouble,
    holder: str | None,
    renewed_ago: float = 0.0,
    duration: int = 3600,
    ns: str = "ml-team",
    claim: str = "training-checkpoints",
) -> dict:
    """Seed the claim's Lease, held by ``holder``, renewed ``renewed_ago`` seconds ago."""
    from datetime import timedelta

    renewed = (datetime.now(UTC) - timedelta(seconds=renewed_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec: dict[str, Any] = {
        "leaseDurationSeconds": duration,
        "acquireTime": renewed,
        "renewTime": renewed,
        "leaseTransitions": 0,
    }
    if holder is not None:
        spec["holderIdentity"] = holder
    return double.put(
        {
            "kind": "Lease",
            "apiVersion": "coordination.k8s.io/v1",
            "metadata": {"name": f"storage-profile-{claim}", "namespace": ns},
            "spec": spec,
        }
    )


def make_class(
    double: KubeDouble, name: str, driver: str = "ebs.csi.aws.com", **parameters: str
) -> dict:
    return double.put(
        {
            "kind": "VolumeAttributesClass",
            "apiVersion": "storage.k8s.io/v1",
            "metadata": {"name": name},
            "driverName": driver,
            "parameters": parameters or {"type": "gp3", "iops": "3000", "throughput": "125"},
        }
    )
