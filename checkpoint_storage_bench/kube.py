"""One way to reach Kubernetes: get, apply, delete, one watch, one wait under one deadline.

Objects are the API's JSON (camelCase dicts, what ``kubectl get -o json`` shows), so a
manifest file is applied as it is read. Every call goes through :meth:`Client.request`, the
one place an answer becomes an error (:func:`api_error`): throttling, server errors and a
dropped connection are a :class:`TemporaryError`, retried by the shared loop; any other
answer is a :class:`KubeError` named for its status.

A resource is a declaration (:class:`Kind`); kinds that are not declared here are found
through the API's discovery document.

>>> CLAIM.path("ml-team", "training-checkpoints")
'/api/v1/namespaces/ml-team/persistentvolumeclaims/training-checkpoints'
>>> Kind("storage.k8s.io/v1", "StorageClass", "storageclasses", namespaced=False).path()
'/apis/storage.k8s.io/v1/storageclasses'

Against a cluster (``client = Client.from_kubeconfig("admin.kubeconfig")``)::

    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}})
    client.wait(CLAIM, "data", lambda c: c and c["status"].get("phase") == "Bound",
                Deadline(60), namespace="demo")
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from checkpoint_storage_bench.errors import BenchError
from checkpoint_storage_bench.retry import (
    Backoff,
    Deadline,
    DeadlineExceeded,
    TemporaryError,
    retry,
)

log = logging.getLogger(__name__)

FIELD_MANAGER = "checkpoint-storage-bench"
# Per-request limits; near a deadline what is left of it bounds the request instead.
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
# A watch request asks the server to end it after this long; it is then resumed.
WATCH_SECONDS = 300.0
# A server that keeps a watch open past its own timeoutSeconds is cut this much later.
WATCH_GRACE = 5.0
# A watch that ends sooner than this without an event (not even a bookmark) did not watch:
# client-go's reflector backs off before the next, instead of asking again at once.
SHORT_WATCH = 1.0
CONNECTION_ERRORS = (urllib3.exceptions.HTTPError, ConnectionError)


class KubeError(BenchError):
    """An answer of the API server that is not worth another try (exit 1), with the
    server's own message.

    Attributes:
        status: The HTTP status.
        server_message: The ``message`` of the Kubernetes Status body, else the HTTP reason.
        body: The answer's body as it came (the whole Status, for a caller that quotes it).
    """

    def __init__(self, status: int, server_message: str, body: str | None = None) -> None:
        super().__init__(f"the API server answered {status}: {server_message}")
        self.status = status
        self.server_message = server_message
        self.body = body


class ShortWatch(TemporaryError):
    """A watch ended sooner than :data:`SHORT_WATCH` without an event: it did not watch."""


class Forbidden(KubeError):
    """403: RBAC or admission refused the request."""


class NotFound(KubeError):
    """404: the object (or its kind) does not exist."""


class Conflict(KubeError):
    """409: the object exists already, changed since it was read, or another field manager
    owns a field an apply sets."""


class Gone(KubeError):
    """410: a watch's resourceVersion is older than what the server still keeps."""


class Invalid(KubeError):
    """422: the object fails validation (or changes an immutable field)."""


ERRORS: dict[int, type[KubeError]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
}


def api_error(status: int, body: Any, reason: str = "", retry_after: Any = None) -> Exception:
    """An answer as what it means: :class:`TemporaryError` for throttling (429), server
    errors (5xx) and no answer (0), else the :class:`KubeError` of its status.

    >>> api_error(409, '{"message": "namespaces \\\\"a\\\\" already exists"}')
    Conflict('the API server answered 409: namespaces "a" already exists')
    >>> api_error(503, "", "Service Unavailable", "2")
    TemporaryError('the API server answered 503: Service Unavailable')
    """
    message = _message(body) or f"{reason or status}"
    # 0: no answer at all (the client's status of a failed TLS handshake).
    if status in (0, 429) or status >= 500:
        try:
            after = float(retry_after) if retry_after is not None else None
        except ValueError:
            after = None
        return TemporaryError(f"the API server answered {status}: {message}", after)
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    raw = body if isinstance(body, str) else json.dumps(body) if body is not None else None
    return ERRORS.get(status, KubeError)(status, message, raw)


def _message(body: Any) -> str | None:
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return body.strip() or None
    return body.get("message") if isinstance(body, dict) else None


@dataclass(frozen=True)
class Kind:
    """A resource: its ``apiVersion``, ``kind``, plural and scope."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


NAMESPACE = Kind("v1", "Namespace", "namespaces", namespaced=False)
NODE = Kind("v1", "Node", "nodes", namespaced=False)
POD = Kind("v1", "Pod", "pods")
EVENT = Kind("v1", "Event", "events")
CLAIM = Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
VOLUME = Kind("v1", "PersistentVolume", "persistentvolumes", namespaced=False)
SERVICE_ACCOUNT = Kind("v1", "ServiceAccount", "serviceaccounts")
CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases")
JOB = Kind("batch/v1", "Job", "jobs")
STORAGE_CLASS = Kind("storage.k8s.io/v1", "StorageClass", "storageclasses", namespaced=False)
VOLUME_ATTRIBUTES_CLASS = Kind(
    "storage.k8s.io/v1", "VolumeAttributesClass", "volumeattributesclasses", namespaced=False
)
ROLE = Kind("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLE_BINDING = Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
CRD = Kind(
    "apiextensions.k8s.io/v1",
    "CustomResourceDefinition",
    "customresourcedefinitions",
    namespaced=False,
)


def established(definition: dict | None) -> bool:
    """Whether a CustomResourceDefinition's ``Established`` condition is true: the first
    half of :meth:`Client.wait_served` (discovery names the kind a moment later)."""
    conditions = ((definition or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


KINDS = {
    (k.api_version, k.kind): k
    for k in (NAMESPACE, NODE, POD, EVENT, CLAIM, VOLUME, SERVICE_ACCOUNT, CONFIG_MAP, LEASE)
    + (JOB, STORAGE_CLASS, VOLUME_ATTRIBUTES_CLASS, ROLE, ROLE_BINDING, CRD)
}


class Stored(dict):
    """An object as the server answered it; ``created``: that answer was a 201 (the call
    made the object, as an apply does when there was none)."""

    created: bool = False


def load_manifests(path: Path) -> list[dict]:
    """The objects of a YAML file (documents without ``apiVersion`` and ``kind`` are left
    out); a file that cannot be read is a one-line error."""
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as exc:
        raise BenchError(f"cannot read manifests {path}: {exc}") from exc
    return [d for d in docs if isinstance(d, dict) and "apiVersion" in d and "kind" in d]


@dataclass
class Client:
    """The API server of one ``ApiClient`` (a kubeconfig, in-cluster config).

    Args:
        api: The official client's ``ApiClient`` (only its transport and credentials are used).
        field_manager: Who applies (server-side apply's field manager).
        backoff: The retries of a :class:`TemporaryError`.
        sleep: Injectable for tests.
        on_connection_error: Called with what was asked and the cause when a request got no
            answer (refused, unresolvable, TLS), before it counts as temporary: a caller
            that knows the server can never be reached raises its own error there.

    Attributes:
        answered: Whether the server ever answered (any status) on this client.
    """

    api: k8s.ApiClient
    field_manager: str = FIELD_MANAGER
    backoff: Backoff = field(default_factory=lambda: Backoff(delays=(0.5, 1.0, 2.0, 4.0)))
    sleep: Callable[[float], None] = time.sleep
    on_connection_error: Callable[[str, BaseException], None] | None = None
    answered: bool = False
    _kinds: dict[tuple[str, str], Kind] = field(default_factory=lambda: dict(KINDS))

    @classmethod
    def from_kubeconfig(cls, path: Path | str, **kwargs: Any) -> Client:
        return cls(k8s_config.new_client_from_config(str(path)), **kwargs)

    # -- the one request path ----------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
        deadline: Deadline | None = None,
        read_timeout: float = READ_TIMEOUT,
        stream: bool = False,
        what: str | None = None,
    ) -> Any:
        """One call, retried while it fails for a temporary reason; the decoded JSON body
        (``stream``: the open response, for :meth:`watch`). ``what`` names the call in
        errors and log lines (default: method and path).

        Raises:
            KubeError: The server's answer (:func:`api_error`).
            TemporaryError: Still temporary after the last try.
            DeadlineExceeded: ``deadline`` passed between tries (naming the last error).
        """
        what = what or f"{method} {path}"
        last: list[TemporaryError] = []

        def once() -> Any:
            timeout: float | tuple[float, float] = (CONNECT_TIMEOUT, read_timeout)
            if deadline is not None:
                left = deadline.check(what)
                if left < CONNECT_TIMEOUT + read_timeout:
                    timeout = max(0.05, left)
            try:
                resp = self._call(path, method, query, content_type, body, timeout)
            except ApiException as exc:
                if not exc.status:  # no answer: the connection itself (TLS) failed
                    error = self._no_answer(what, exc, f"TLS failed: {exc.reason}")
                else:
                    self.answered = True
                    error = api_error(
                        exc.status, exc.body, exc.reason, (exc.headers or {}).get("Retry-After")
                    )
                if isinstance(error, TemporaryError):
                    last[:] = [error]
                raise error from exc
            except CONNECTION_ERRORS as exc:
                last[:] = [self._no_answer(what, exc, str(exc))]
                raise last[0] from exc
            self.answered = True
            if stream:
                return resp
            data = json.loads(resp.data) if resp.data else None
            if isinstance(data, dict):
                data = Stored(data)
                data.created = resp.status == 201
            return data

        try:
            return retry(once, what=what, backoff=self.backoff, deadline=deadline, sleep=self.sleep)
        except DeadlineExceeded as exc:
            if not last:
                raise
            raise DeadlineExceeded(f"{exc.format_message()} (last error: {last[0]})") from exc

    def _call(
        self,
        path: str,
        method: str,
        query: dict[str, Any] | None,
        content_type: str,
        body: Any,
        timeout: float | tuple[float, float],
    ) -> Any:
        try:
            return self.api.call_api(
                path,
                method,
                query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=timeout,
            )
        except AttributeError as exc:
            # The client turns a TLS failure into ApiException(status=0) and then fails to
            # decode its missing body: that exception is the cause.
            tls = exc.__context__
            if isinstance(tls, ApiException) and not tls.status:
                raise tls from None
            raise

    def _no_answer(self, what: str, exc: BaseException, cause: str) -> TemporaryError:
        if self.on_connection_error is not None:
            self.on_connection_error(what, exc)
        return TemporaryError(f"{what}: no answer from the API server: {cause}")

    # -- objects -----------------------------------------------------------------------------

    def kind(self, api_version: str, kind: str, deadline: Deadline | None = None) -> Kind:
        """The declared kind, else the one the server's discovery names; with a ``deadline``,
        discovery is read again until it names the kind (a new CRD's kind is listed a moment
        after the CRD is Established).

        Raises:
            NotFound: Discovery does not name the kind (by the deadline, when one is given).
        """
        found = self._kinds.get((api_version, kind))
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        while found is None:
            try:
                listing = self.request("GET", base, deadline=deadline)
            except NotFound:
                listing = {"resources": []}
            for res in listing.get("resources", []):
                if res.get("kind") == kind and "/" not in res["name"]:
                    found = Kind(api_version, kind, res["name"], res["namespaced"])
                    self._kinds[(api_version, kind)] = found
                    break
            else:
                missing = NotFound(404, f"the server has no kind {kind} in {api_version}")
                if deadline is None:
                    raise missing
                try:
                    deadline.sleep(0.2, f"waiting for discovery to name {kind} in {api_version}")
                except DeadlineExceeded:
                    raise missing from None
        return found

    def get(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        deadline: Deadline | None = None,
        what: str | None = None,
    ) -> dict | None:
        """The object, or None when there is none."""
        try:
            return self.request("GET", kind.path(namespace, name), deadline=deadline, what=what)
        except NotFound:
            return None

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        deadline: Deadline | None = None,
        what: str | None = None,
        **selectors: str,
    ) -> tuple[list[dict], str]:
        """The objects (``fieldSelector=``, ``labelSelector=``) and the list's resourceVersion."""
        listing = self.request(
            "GET", kind.path(namespace), query=selectors, deadline=deadline, what=what
        )
        return listing.get("items") or [], listing["metadata"]["resourceVersion"]

    def apply(
        self,
        doc: dict,
        *,
        force: bool = True,
        dry_run: bool = False,
        strict: bool = True,
        deadline: Deadline | None = None,
    ) -> dict:
        """Server-side apply ``doc``: create it or patch the fields it names, in one request.

        ``force``: take over fields another manager set (a :class:`Conflict` otherwise);
        ``strict``: unknown fields are an :class:`Invalid`. The stored object comes back
        (:class:`Stored`: ``created`` when there was none).
        """
        meta = doc.get("metadata") or {}
        kind = self.kind(doc["apiVersion"], doc["kind"])
        query = {
            "fieldManager": self.field_manager,
            "force": "true" if force else None,
            "fieldValidation": "Strict" if strict else "Ignore",
            "dryRun": "All" if dry_run else None,
        }
        return self.request(
            "PATCH",
            kind.path(meta.get("namespace"), meta["name"]),
            doc,
            query=query,
            content_type="application/apply-patch+yaml",
            deadline=deadline,
        )

    def apply_file(self, path: Path, *, namespace: str | None = None, **kwargs: Any) -> list[dict]:
        """Apply every object of a YAML file; namespaced ones go to ``namespace`` when given."""
        applied = []
        for doc in load_manifests(path):
            if namespace and self.kind(doc["apiVersion"], doc["kind"]).namespaced:
                doc["metadata"]["namespace"] = namespace
            applied.append(self.apply(doc, **kwargs))
        return applied

    def patch(
        self,
        kind: Kind,
        name: str,
        patch: dict,
        namespace: str | None = None,
        deadline: Deadline | None = None,
        subresource: str | None = None,
        what: str | None = None,
    ) -> dict:
        """A JSON merge patch (a ``metadata.resourceVersion`` in it makes it conditional), of
        the object or of its ``subresource`` (``status``)."""
        path = kind.path(namespace, name) + (f"/{subresource}" if subresource else "")
        return self.request(
            "PATCH",
            path,
            patch,
            content_type="application/merge-patch+json",
            deadline=deadline,
            what=what,
        )

    def delete(
        self, kind: Kind, name: str, namespace: str | None = None, deadline: Deadline | None = None
    ) -> bool:
        """Ask for the object's deletion; False when there was none."""
        try:
            self.request("DELETE", kind.path(namespace, name), deadline=deadline)
        except NotFound:
            return False
        return True

    # -- watching ----------------------------------------------------------------------------

    def watch(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        seen: Iterable[dict] = (),
        deadline: Deadline | None = None,
        watch_seconds: float | Callable[[], float] = WATCH_SECONDS,
        stop: Callable[[], bool] = lambda: False,
        on_retry: Callable[[Exception], None] = lambda error: None,
        **selectors: str,
    ) -> Iterator[tuple[str, dict]]:
        """``(type, object)`` for every object, then for every change: list, then watch from
        the list's resourceVersion, for ever (or until ``deadline``, or ``stop()`` between
        watches).

        The listed objects come as ``ADDED``. A watch the server ends is resumed from the
        last resourceVersion seen; a 410 Gone (that version is no longer kept) lists again at
        once (after a pause when the fresh list's version expired too), a dropped stream or a
        watch that ended at once (:class:`ShortWatch`) after a growing pause (``on_retry`` is
        told why first), and what vanished meanwhile comes as ``DELETED``. Starting
        from ``resource_version`` skips the first list; ``seen`` are the objects the caller
        has at that version (a later list reports their deletion). ``watch_seconds`` (a
        number, or a callable asked before each watch) bounds each watch request.

        Raises:
            DeadlineExceeded: ``deadline`` passed.
            KubeError: Another answer than 410 (e.g. :class:`Forbidden`).
        """
        known = {_key(o): o for o in seen}
        version = resource_version
        failures = expired = 0
        while not stop():
            try:
                if version is None:
                    items, version = self.list(kind, namespace, deadline, **selectors)
                    listed = {_key(o): o for o in items}
                    for key in [k for k in known if k not in listed]:
                        yield "DELETED", known.pop(key)
                    for key, obj in listed.items():
                        known[key] = obj
                        yield "ADDED", obj
                seconds = watch_seconds() if callable(watch_seconds) else watch_seconds
                opened, seen = time.monotonic(), 0
                events = self.stream(
                    kind,
                    namespace,
                    resource_version=version,
                    seconds=seconds,
                    deadline=deadline,
                    **selectors,
                )
                for kind_, obj in events:
                    seen += 1
                    version = obj["metadata"].get("resourceVersion") or version
                    if kind_ == "BOOKMARK":
                        continue
                    if kind_ == "DELETED":
                        known.pop(_key(obj), None)
                    else:
                        known[_key(obj)] = obj
                    failures = expired = 0
                    yield kind_, obj
                if not seen and time.monotonic() - opened < SHORT_WATCH:
                    raise ShortWatch(f"a watch of {kind.plural} ended at once without an event")
                continue  # the server ended the watch: resumed from the last version seen
            except Gone:
                expired += 1
                if expired == 1:
                    log.info(
                        "watch of %s: resourceVersion %s expired; listing again",
                        kind.plural,
                        version,
                    )
                    version = None
                    continue
                version = None
                # Expiring again and again: back off instead of hammering the server.
                error: Exception = TemporaryError(
                    f"a watch of {kind.plural} expired {expired} times in a row"
                )
            except (TemporaryError, *CONNECTION_ERRORS) as exc:
                version = None
                error = exc
            # Resumed from a fresh list after a growing pause: a server that drops every
            # watch gets one request per pause, not one per round trip.
            on_retry(error)
            delay = self.backoff.delay(failures, getattr(error, "retry_after", None))
            failures += 1
            log.warning(
                "watch of %s dropped (%s); listing again in %.1fs", kind.plural, error, delay
            )
            if deadline is not None:
                deadline.sleep(delay, f"watching {kind.plural}", self.sleep)
            else:
                self.sleep(delay)

    def stream(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        resource_version: str,
        seconds: float = WATCH_SECONDS,
        deadline: Deadline | None = None,
        **selectors: str,
    ) -> Iterator[tuple[str, dict]]:
        """One watch request from ``resource_version``: ``(type, object)`` for every event,
        bookmarks too, until the server ends it after ``seconds`` (cut :data:`WATCH_GRACE`
        later when it does not), or ``deadline`` passed.

        Raises:
            Gone: ``resource_version`` is no longer kept (list again).
            KubeError: Another answer, or an ``ERROR`` event.
            TemporaryError: The watch could not be opened (throttled, no answer).
            urllib3.exceptions.HTTPError: The stream dropped.
        """
        if deadline is not None:
            seconds = min(seconds, deadline.check(f"watching {kind.plural}"))
        query = dict(
            selectors,
            watch="true",
            resourceVersion=resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(max(1, int(seconds))),
        )
        resp = self.request(
            "GET",
            kind.path(namespace),
            query=query,
            deadline=deadline,
            read_timeout=seconds + WATCH_GRACE,
            stream=True,
        )
        ends = time.monotonic() + max(1, int(seconds)) + WATCH_GRACE
        try:
            for line in iter_resp_lines(resp):
                # Checked on blank lines too: a server that trickles them past its timeout
                # (or past the deadline) keeps the read from ever timing out.
                if time.monotonic() > ends or (deadline is not None and deadline.remaining() <= 0):
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                type_, obj = event["type"], event["object"]
                if type_ == "ERROR":
                    raise api_error(obj.get("code") or 500, obj)
                yield type_, obj
        finally:
            resp.release_conn()

    def wait(
        self,
        kind: Kind,
        name: str,
        test: Callable[[dict | None], Any],
        deadline: Deadline,
        namespace: str | None = None,
    ) -> Any:
        """Until ``test(object)`` is truthy (the object is None while there is none): read and
        test, then watch and test again on every change, all under ``deadline``; returns
        what ``test`` returned.

        Raises:
            DeadlineExceeded: Naming the object and the last state tested.
        """
        ref = f"{kind.kind} {namespace + '/' if namespace else ''}{name}"
        selector = f"metadata.name={name}"
        last: dict | None = None
        try:
            items, version = self.list(kind, namespace, deadline, fieldSelector=selector)
            last = items[0] if items else None
            result = test(last)
            if result:
                return result
            events = self.watch(
                kind,
                namespace,
                resource_version=version,
                seen=items,
                deadline=deadline,
                fieldSelector=selector,
            )
            for event, obj in events:
                last = None if event == "DELETED" else obj
                result = test(last)
                if result:
                    return result
        except DeadlineExceeded as exc:
            raise DeadlineExceeded(f"{exc.format_message()}: {ref}; last: {_brief(last)}") from exc
        raise AssertionError("unreachable: the watch ends only by its deadline")

    def wait_served(self, definition: dict, deadline: Deadline) -> None:
        """Until the API server serves a CustomResourceDefinition's kind: the definition is
        Established and discovery names the kind in every served version (before that, an
        apply of the kind is a 404)."""
        self.wait(CRD, definition["metadata"]["name"], established, deadline)
        spec = definition["spec"]
        for version in spec["versions"]:
            if version.get("served", True):
                self.kind(f"{spec['group']}/{version['name']}", spec["names"]["kind"], deadline)


def _key(obj: dict) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _brief(obj: dict | None) -> str:
    if obj is None:
        return "none"
    return json.dumps({"metadata.name": obj["metadata"]["name"], "status": obj.get("status")})
