"""The few Kubernetes API calls the hook makes, with retries, returning plain dicts.

Objects are kept as the API's JSON (camelCase dicts), so what the hook reads is exactly
what ``kubectl get -o json`` shows.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from checkpoint_storage_bench.retry import (
    Backoff,
    Deadline,
    DeadlineExceeded,
    TemporaryError,
    retry,
    within,
)
from hooks.storage_profile.errors import (
    ApiError,
    Forbidden,
    HookError,
    NotFound,
    PreflightRefused,
    api_error,
)

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
# Errors of the connection itself (reset, refused, truncated chunk): worth retrying.
CONNECTION_ERRORS = (urllib3.exceptions.HTTPError, ConnectionError)
# Per-request limits when the deadline is far; near it, what is left bounds the request.
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
# A server that keeps a watch open past its own timeoutSeconds (or trickles blank lines)
# is cut this long after it should have ended.
WATCH_GRACE = 5.0


def request_timeout(read: float, deadline: Deadline | None) -> float | tuple[float, float]:
    """The client's ``_request_timeout``: (connect, read), or near the deadline one total.

    A number is urllib3's ``total``: connect and read together never outlast what is left.
    """
    if deadline is None:
        return (CONNECT_TIMEOUT, read)
    left = deadline.remaining()
    if left > CONNECT_TIMEOUT + read:
        return (CONNECT_TIMEOUT, read)
    return max(0.05, left)


def load_api_client(kubeconfig: str | None, deadline: Deadline | None = None) -> client.ApiClient:
    """An API client from ``kubeconfig``, else in-cluster config, else the default kubeconfig.

    Loading ends by ``deadline``: a kubeconfig's ``exec`` credential plugin runs here, for
    as long as it likes.

    Raises:
        PreflightRefused: No usable configuration (missing, or a kubeconfig that does not
            parse: a YAML error or a wrong shape surfaces from the loader as such).
    """
    configuration = client.Configuration()
    source = f" in {kubeconfig}" if kubeconfig else ""
    server_field = ["clusters[].cluster.server of the current context"]

    def load() -> None:
        if kubeconfig:
            _check_kubeconfig_shape(Path(kubeconfig))
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            return
        try:
            config.load_incluster_config(client_configuration=configuration)
            server_field[0] = "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT"
        except ConfigException:
            default = Path(os.path.expanduser(config.KUBE_CONFIG_DEFAULT_LOCATION))
            if os.pathsep not in config.KUBE_CONFIG_DEFAULT_LOCATION and default.is_file():
                _check_kubeconfig_shape(default)
            config.load_kube_config(client_configuration=configuration)

    try:
        within(load, what=f"loading the Kubernetes configuration{source}", deadline=deadline)
    except (
        ConfigException,
        OSError,
        yaml.YAMLError,
        TypeError,
        ValueError,
        KeyError,
        AttributeError,
    ) as exc:
        raise PreflightRefused(
            f"no usable Kubernetes configuration{source}: {type(exc).__name__}: {exc}"
        ) from exc
    problem = server_problem(configuration.host)
    if problem is not None:
        # Retrying cannot cure it: refused at once instead of at the deadline.
        raise PreflightRefused(
            f"no usable Kubernetes configuration{source}: {server_field[0]} {problem}"
        )
    # urllib3 would retry each request 3 more times by itself, each with the full timeout
    # and outside our deadline: the shared retry loop is the only one.
    configuration.retries = False
    return client.ApiClient(configuration)


def server_problem(host: str | None) -> str | None:
    """Why the API server's URL cannot be used (missing, unparsable, not http(s)), if so.

    >>> server_problem("https://10.0.0.1:6443") is None
    True
    >>> server_problem("http://host:abc")
    "'http://host:abc' is not a URL: Failed to parse: 'host:abc' is not a valid host or port"
    """
    if not host:
        return "is missing"
    try:
        url = urllib3.util.parse_url(host)
    except urllib3.exceptions.LocationParseError as exc:
        return f"{host!r} is not a URL: {exc}"
    if url.scheme not in ("http", "https") or not url.host:
        return f"{host!r} is not an http:// or https:// URL with a host"
    return None


def _check_kubeconfig_shape(path: Path) -> None:
    """Refuse a kubeconfig whose current context names entries of the wrong shape, naming
    the field (the client's loader would fail on them with an ``AttributeError``).

    Raises:
        ConfigException: A field of the current context is not what a kubeconfig holds.
    """
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        raise ConfigException("the file is not a kubeconfig mapping")
    current = doc.get("current-context")
    if current is None:
        return  # the loader names what is missing
    named = {}
    for kind, field in (("contexts", "context"), ("clusters", "cluster"), ("users", "user")):
        entries = doc.get(kind) or []
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ConfigException(f"{kind} must be a list of mappings")
        named[kind] = {e.get("name"): (e.get(field), f"{kind}[{e.get('name')}].{field}")
                       for e in entries}  # fmt: skip
    context, where = named["contexts"].get(current, (None, None))
    if context is None:
        return
    if not isinstance(context, dict):
        raise ConfigException(f"{where} must be a mapping, not {type(context).__name__}")
    for kind, key in (("clusters", "cluster"), ("users", "user")):
        value, where = named[kind].get(context.get(key), (None, None))
        if value is not None and not isinstance(value, dict):
            raise ConfigException(f"{where} must be a mapping, not {type(value).__name__}")
    cluster, where = named["clusters"].get(context.get("cluster"), (None, None))
    if isinstance(cluster, dict) and not isinstance(cluster.get("server", ""), str):
        raise ConfigException(f"{where}.server must be a string")


def unreachable(exc: BaseException) -> str | None:
    """Why the API server cannot be reached at all (refused, unresolvable, TLS), if so."""
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, urllib3.exceptions.SSLError):
        return f"TLS with the API server failed: {exc}"
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return f"cannot connect to the API server: {exc}"
    return None


class Kube:
    """Typed access to claims, volumes, classes, events and pods.

    Args:
        api_client: The official client's ``ApiClient``.
        backoff: Retry schedule for temporary errors.
        sleep: Injectable sleep (tests record it).

    Attributes:
        answered: Whether the API server ever answered. Until it has, a refused connection
            or a failed TLS handshake is a configuration problem, refused at once (exit 3)
            with its cause; afterwards it is a restart or a blip, retried.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.storage = client.StorageV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.backoff = backoff or Backoff()
        self.sleep = sleep
        self.host = api_client.configuration.host
        self.answered = False

    # -- plumbing ---------------------------------------------------------------------------

    def call(
        self,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        deadline: Deadline | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``fn`` and decode its JSON, retrying temporary errors with backoff.

        Raises:
            PreflightRefused: The API server was never reached (refused, TLS).
            TemporaryError: Still failing after ``backoff.tries`` tries.
            DeadlineExceeded: The deadline passed while retrying (naming the last error).
            ApiError: Any other answer (NotFound, Forbidden, Invalid, …), named once here
                for the caller to judge.
        """
        last: list[TemporaryError] = []

        def once() -> Any:
            # A server that accepts the connection and never answers must not outlive the
            # deadline: every try is bounded by what is left of it.
            timeout = request_timeout(READ_TIMEOUT, deadline)
            try:
                try:
                    resp = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
                except AttributeError as exc:
                    # The client turns a TLS failure into ApiException(status=0, reason=…)
                    # and then fails to decode its missing body: that exception is the cause.
                    tls = exc.__context__
                    if isinstance(tls, ApiException) and tls.status == 0:
                        raise tls from None
                    raise
                data = json.loads(resp.data)
            except ApiException as exc:
                if exc.status == 0:  # no answer: the connection itself (TLS) failed
                    error = self._connection_failed(
                        what, exc, f"TLS with the API server failed: {exc.reason}"
                    )
                    last[:] = [error]
                    raise error from exc
                self.answered = True
                error = api_error(exc)
                if isinstance(error, TemporaryError):
                    last[:] = [error]
                raise error from exc
            except CONNECTION_ERRORS as exc:
                error = self._connection_failed(what, exc, unreachable(exc))
                last[:] = [error]
                raise error from exc
            self.answered = True
            return data

        try:
            return retry(once, what=what, backoff=self.backoff, deadline=deadline, sleep=self.sleep)
        except DeadlineExceeded as exc:
            if not last:
                raise
            raise DeadlineExceeded(f"{exc} (last error: {last[0]})") from exc

    def _connection_failed(
        self, what: str, exc: Exception, unreachable_cause: str | None
    ) -> TemporaryError:
        """A failed connection: refused at once (exit 3) if the server was never reached
        and the cause says it cannot be (refused, TLS); else worth another try."""
        if unreachable_cause is not None and not self.answered:
            raise PreflightRefused(f"{what}: {unreachable_cause} ({self.host})") from exc
        return TemporaryError(f"connection to the API server failed: {unreachable_cause or exc}")

    def _read(
        self, what: str, fn: Callable[..., Any], *args: Any, deadline: Deadline | None = None
    ) -> dict | None:
        """Like :meth:`call` for a single object, with NotFound as None and Forbidden as a
        refusal."""
        try:
            return self.call(what, fn, *args, deadline=deadline)
        except NotFound:
            return None
        except Forbidden as exc:
            raise PreflightRefused(f"forbidden to {what}: {exc.server_message}") from exc
        except ApiError as exc:
            raise HookError(f"{what} failed: {exc.server_message}") from exc

    # -- reads ----------------------------------------------------------------------------

    def read_claim(self, ns: str, name: str, deadline: Deadline | None = None) -> dict | None:
        return self._read(
            f"read claim {ns}/{name}",
            self.core.read_namespaced_persistent_volume_claim,
            name,
            ns,
            deadline=deadline,
        )

    def read_pv(self, name: str, deadline: Deadline | None = None) -> dict | None:
        return self._read(
            f"read PersistentVolume {name}",
            self.core.read_persistent_volume,
            name,
            deadline=deadline,
        )

    def read_class(self, name: str, deadline: Deadline | None = None) -> dict | None:
        return self._read(
            f"read VolumeAttributesClass {name}",
            self.storage.read_volume_attributes_class,
            name,
            deadline=deadline,
        )

    def read_storage_class(self, name: str, deadline: Deadline | None = None) -> dict | None:
        return self._read(
            f"read StorageClass {name}",
            self.storage.read_storage_class,
            name,
            deadline=deadline,
        )

    def list_claim(
        self, ns: str, name: str, deadline: Deadline | None = None
    ) -> tuple[dict | None, str]:
        """The claim (or None) and the list's resourceVersion, to watch from."""
        body = self.call(
            f"list claim {ns}/{name}",
            self.core.list_namespaced_persistent_volume_claim,
            ns,
            field_selector=f"metadata.name={name}",
            deadline=deadline,
        )
        items = body.get("items") or []
        return (items[0] if items else None), body["metadata"]["resourceVersion"]

    def claim_events(self, ns: str, claim: dict, deadline: Deadline | None = None) -> list[dict]:
        """Events about the claim, oldest first."""
        meta = claim["metadata"]
        selector = f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={meta['name']}"
        if meta.get("uid"):
            selector += f",involvedObject.uid={meta['uid']}"
        body = self.call(
            f"list events of claim {ns}/{meta['name']}",
            self.core.list_namespaced_event,
            ns,
            field_selector=selector,
            deadline=deadline,
        )
        return sorted(body.get("items") or [], key=event_time)

    def pods(self, ns: str, deadline: Deadline | None = None) -> list[dict]:
        """Pods of the namespace (to see which nodes mount a claim)."""
        try:
            body = self.call(
                f"list pods in {ns}", self.core.list_namespaced_pod, ns, deadline=deadline
            )
        except Forbidden as exc:
            raise PreflightRefused(f"forbidden to list pods: {exc.server_message}") from exc
        return body.get("items") or []

    # -- leases -----------------------------------------------------------------------------

    def read_lease(self, ns: str, name: str, deadline: Deadline | None = None) -> dict | None:
        """The Lease, or None; other answers (Forbidden, …) raise their :class:`ApiError`."""
        try:
            return self.call(
                f"read Lease {ns}/{name}",
                self.coordination.read_namespaced_lease,
                name,
                ns,
                deadline=deadline,
            )
        except NotFound:
            return None

    def create_lease(self, ns: str, body: dict, deadline: Deadline | None = None) -> dict:
        return self.call(
            f"create Lease {ns}/{body['metadata']['name']}",
            self.coordination.create_namespaced_lease,
            ns,
            body,
            deadline=deadline,
        )

    def replace_lease(
        self, ns: str, name: str, body: dict, deadline: Deadline | None = None
    ) -> dict:
        """Replace the Lease; its ``metadata.resourceVersion`` makes a concurrent write 409."""
        return self.call(
            f"update Lease {ns}/{name}",
            self.coordination.replace_namespaced_lease,
            name,
            ns,
            body,
            deadline=deadline,
        )

    # -- the one write to the claim ---------------------------------------------------------

    def patch_claim_class(
        self,
        ns: str,
        name: str,
        target: str | None,
        deadline: Deadline | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        annotations: dict[str, str] | None = None,
    ) -> dict:
        """One JSON merge patch of ``spec.volumeAttributesClassName`` (``None`` sends null).

        A dict body would go out as a strategic merge patch, which cannot carry ``null``;
        the merge patch is also the exact ``kubectl patch --type=merge`` of the docs. The
        uid and resourceVersion are preconditions; ``annotations`` (the ledger) change in
        the same write (:func:`class_patch`).
        """
        body = class_patch(target, uid, resource_version, annotations)
        return self.call(
            f"patch claim {ns}/{name}",
            self.core.patch_namespaced_persistent_volume_claim,
            name,
            ns,
            body,
            _content_type=MERGE_PATCH,
            deadline=deadline,
        )

    # -- watch ----------------------------------------------------------------------------

    def watch_claim(
        self,
        ns: str,
        name: str,
        resource_version: str,
        timeout: float,
        deadline: Deadline | None = None,
    ) -> Iterator[tuple[str, dict]]:
        """Stream ``(type, object)`` events of one claim from ``resource_version``.

        Ends when the server closes the stream after ``timeout`` seconds, or at the latest
        :data:`WATCH_GRACE` later (a server that ignores its timeout or trickles blank
        lines). An expired resourceVersion (:class:`Gone`), a throttled start
        (:class:`TemporaryError`), any other answer (:class:`ApiError`) or a dropped
        connection (urllib3 errors) raise; the caller re-lists. A silent connection ends by
        the deadline.
        """
        seconds = max(1, int(timeout))
        ends = time.monotonic() + seconds + WATCH_GRACE
        stream = watch.Watch().stream(
            self.core.list_namespaced_persistent_volume_claim,
            ns,
            field_selector=f"metadata.name={name}",
            resource_version=resource_version,
            timeout_seconds=seconds,
            allow_watch_bookmarks=True,
            # The read timeout outlives the server-side timeout, so a healthy quiet watch
            # is not cut, but a silent, dead one still ends by the deadline.
            _request_timeout=request_timeout(seconds + WATCH_GRACE, deadline),
        )
        try:
            for event in stream:
                if event is not None:  # the client yields None for a blank or undecodable line
                    yield event["type"], event["raw_object"]
                if time.monotonic() > ends or (deadline is not None and deadline.remaining() <= 0):
                    return
        except ApiException as exc:
            raise api_error(exc) from exc
        finally:
            stream.close()


def class_patch(
    target: str | None,
    uid: str | None = None,
    resource_version: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict:
    """The merge patch of a claim's class, with the claim's identity as preconditions.

    The API server refuses the patch with 409 Conflict when the claim's resourceVersion is
    no longer ``resource_version`` (it changed, or was deleted and re-created, since it was
    read), and with 422 when its uid is not ``uid``: the class never lands on a claim that
    preflight did not check. ``annotations`` are set in the same write (a merge patch
    leaves the claim's other annotations alone).

    >>> class_patch("fast", "u-1", "42")
    {'metadata': {'uid': 'u-1', 'resourceVersion': '42'}, 'spec': {'volumeAttributesClassName': 'fast'}}
    """
    body: dict = {"spec": {"volumeAttributesClassName": target}}
    metadata: dict = {
        key: value
        for key, value in (("uid", uid), ("resourceVersion", resource_version))
        if value is not None
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"metadata": metadata, **body} if metadata else body


def event_time(event: dict) -> str:
    """Sort key of an event: its latest timestamp (RFC 3339 strings sort in time order)."""
    return (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or event["metadata"].get("creationTimestamp")
        or ""
    )
