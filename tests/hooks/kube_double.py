"""A Kubernetes API test double speaking real HTTP on loopback, for what the hook does on
the wire.

It serves the in-memory state of ``kube_state.py`` (objects, kube-apiserver's write rules,
the fake external-resizer) at the endpoints the storage-profile hook uses, the way
kube-apiserver does: list + watch with resume from a resourceVersion and ``410 Expired``
once history is compacted, merge patches, Status bodies for errors, optional RBAC from a
Role manifest, and injected faults (error answers, ``Retry-After``, lost answers, watches
that drop, hang, stall or close).

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
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.hooks.kube_state import (
    CLAIMS,
    LEASES,
    KubeState,
    Refused,
    matches,
    not_found,
    parse_selector,
    status_body,
)

# (api group, resource) -> kind
KINDS = {
    ("", CLAIMS): "PersistentVolumeClaim",
    ("", "persistentvolumes"): "PersistentVolume",
    ("", "events"): "Event",
    ("", "pods"): "Pod",
    ("storage.k8s.io", "volumeattributesclasses"): "VolumeAttributesClass",
    ("storage.k8s.io", "storageclasses"): "StorageClass",
    LEASES: "Lease",
}
# Field selectors kube-apiserver 1.34 accepts for claims (anything else is a 400); events and
# pods accept many more, which the double does not check.
CLAIM_FIELD_SELECTORS = ("metadata.name", "metadata.namespace")
PATH_RE = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[a-z0-9.]+)/v1)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[a-z]+)(?:/(?P<name>[^/]+))?$"
)


@dataclass
class Recorded:
    """One request the double answered."""

    method: str
    path: str
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


class KubeDouble(KubeState):
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
        rbac: When set, requests its rules do not allow get 403.
    """

    def __init__(self) -> None:
        super().__init__()
        self.compacted_rv = 0
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.watch_faults: deque[str | None] = deque()
        self._watchers: set[tuple[asyncio.Queue, str, tuple]] = set()
        self._tasks: dict[tuple, asyncio.Task] = {}
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
        for task in self._tasks.values():
            task.cancel()
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

    # -- the state's clock: the server's loop ---------------------------------------------------

    def run(self, key: tuple, steps: Iterator[float]) -> None:
        """On the server's loop: the resizer starts from a request's handler."""

        async def drive() -> None:
            for seconds in steps:
                await asyncio.sleep(seconds)

        if key in self._tasks:
            self._tasks[key].cancel()
        self._tasks[key] = asyncio.get_running_loop().create_task(drive())

    def changed(self, type_: str, obj: dict) -> None:
        for queue, ns, selector in list(self._watchers):
            if obj["metadata"]["namespace"] == ns and matches(obj, selector):
                assert self.loop is not None
                self.loop.call_soon_threadsafe(queue.put_nowait, (type_, copy.deepcopy(obj)))

    def compact(self) -> None:
        """Forget the watch history, as etcd compaction does: older resume points get 410."""
        with self.lock:
            self.history.clear()
            self.compacted_rv = self.rv

    # -- faults and what was asked ----------------------------------------------------------

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

    def count(self, verb: str, resource: str = CLAIMS) -> int:
        return sum(1 for r in self.requests if r.verb == verb and f"/{resource}" in r.path)

    # -- HTTP ----------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        match = PATH_RE.match(request.path)
        query = dict(request.query)
        body = await request.read()
        request["raw_body"] = body
        if not match or (match["group"] or "", match["resource"]) not in KINDS:
            return self._answer(
                request,
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
                verb,
                fault.status,
                status_body(fault.status, reason, "injected fault"),
                headers,
            )
        if self.rbac is not None:
            # RBAC authorizes list/watch by name only through a metadata.name selector.
            auth_name = name or dict(selector).get("metadata.name")
            if not self.rbac.allows(verb, group, resource, ns, auth_name):
                refused = self.rbac.refusal(verb, group, resource, ns, auth_name)
                return self._answer(request, verb, refused.code, refused.body)
        if kind == "PersistentVolumeClaim" and verb in ("list", "watch"):
            unknown = [key for key, _ in selector if key not in CLAIM_FIELD_SELECTORS]
            if unknown:
                known = ", ".join(f'"{k}"' for k in CLAIM_FIELD_SELECTORS)
                return self._answer(
                    request,
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
                    {k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                    for o in self.of_kind(kind, ns, selector)
                ]
                listing = {
                    "kind": f"{kind}List",
                    "apiVersion": f"{group}/v1" if group else "v1",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": items,
                }
            return self._answer(request, verb, 200, listing)
        if verb == "get":
            obj = self.get(kind, name, ns)
            if obj is None:
                refused = not_found(group, resource, name)
                return self._answer(request, verb, refused.code, refused.body)
            return self._answer(request, verb, 200, obj)
        if verb == "patch" and kind == "PersistentVolumeClaim":
            return self._patch_claim(request, ns, name, body)
        if verb in ("create", "update") and kind == "Lease":
            return self._write_lease(request, verb, ns, name, body)
        return self._answer(
            request,
            verb,
            405,
            status_body(
                405, "MethodNotAllowed", f"the double does not implement {verb} {resource}"
            ),
        )

    def _answer(
        self,
        request: web.Request,
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
                verb,
                request.headers.get("Content-Type"),
                body,
                code,
            )
        )
        return web.json_response(payload, status=code, headers=headers)

    def _patch_claim(self, request: web.Request, ns: str, name: str, raw: bytes) -> web.Response:
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
                "patch",
                415,
                # kube-apiserver also takes JSON patches and apply patches; the double does not.
                status_body(415, "UnsupportedMediaType", "415: Unsupported Media Type", {}),
                body=patch,
            )
        try:
            stored = self.patch_claim(ns, name, patch)
        except Refused as refused:
            return self._answer(request, "patch", refused.code, refused.body, body=patch)
        return self._answer(request, "patch", 200, stored, body=patch)

    def _write_lease(
        self, request: web.Request, verb: str, ns: str, name: str | None, raw: bytes
    ) -> web.Response:
        """Create (POST, 201) or replace (PUT: 200, or 201 when it created the Lease)."""
        try:
            lease = json.loads(raw)
        except ValueError:
            lease = None
        try:
            stored, created = self.write_lease(verb, ns, name, lease)
        except Refused as refused:
            return self._answer(request, verb, refused.code, refused.body, body=lease)
        return self._answer(request, verb, 201 if created else 200, stored, body=lease)

    async def _open_stream(self, request: web.Request) -> web.StreamResponse:
        """Record the watch and send its headers: the stream is open."""
        self.requests.append(Recorded(request.method, request.path, "watch"))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        return resp

    async def _watch(
        self, request: web.Request, ns: str, selector: list, query: dict
    ) -> web.StreamResponse:
        fault = self.watch_faults.popleft() if self.watch_faults else None
        assert self._closing is not None
        if fault == "hang":
            # Accepts the request and never answers: only the client's timeout ends it.
            self.requests.append(Recorded(request.method, request.path, "watch"))
            await self._closing.wait()
            return web.Response(status=503)
        if fault in ("stall", "trickle"):
            # A stream that outlives its timeoutSeconds: silent, or alive with blank lines.
            resp = await self._open_stream(request)
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
            resp = await self._open_stream(request)
            await resp.write_eof()
            return resp
        if fault == "gone-http":
            return self._answer(
                request,
                "watch",
                410,
                status_body(410, "Expired", "too old resource version"),
            )
        # The hook watches from the resourceVersion of a list, never from "any" (0).
        version = int(query["resourceVersion"])
        resp = await self._open_stream(request)
        sent = [version]

        async def send(type_: str, obj: dict) -> None:
            if type_ in ("ADDED", "MODIFIED", "DELETED"):
                sent.append(int(obj["metadata"]["resourceVersion"]))
            await resp.write(json.dumps({"type": type_, "object": obj}).encode() + b"\n")

        with self.lock:
            expired = fault == "gone" or version < self.compacted_rv
            if not expired:
                queue: asyncio.Queue = asyncio.Queue()
                watcher = (queue, ns, tuple(selector))
                self._watchers.add(watcher)
                backlog = [
                    (t, o)
                    for rv, t, o in self.history
                    if rv > version and o["metadata"]["namespace"] == ns and matches(o, selector)
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
