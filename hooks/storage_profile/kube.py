"""The few Kubernetes API calls the hook makes, with retries, returning plain dicts.

Objects are kept as the API's JSON (camelCase dicts), so what the hook reads is exactly
what ``kubectl get -o json`` shows.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from checkpoint_storage_bench.retry import Backoff, Deadline, TemporaryError, retry
from hooks.storage_profile.errors import HookError, PreflightRefused

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
# Errors of the connection itself (reset, refused, truncated chunk): worth retrying.
CONNECTION_ERRORS = (urllib3.exceptions.HTTPError, ConnectionError)


def load_api_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client from ``kubeconfig``, else in-cluster config, else the default kubeconfig.

    Raises:
        PreflightRefused: No usable configuration.
    """
    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except ConfigException:
                config.load_kube_config(client_configuration=configuration)
    except (ConfigException, OSError) as exc:
        raise PreflightRefused(f"no usable Kubernetes configuration: {exc}") from exc
    return client.ApiClient(configuration)


def retry_after_seconds(exc: ApiException) -> float | None:
    """The ``Retry-After`` header of a response, in seconds, if it has a numeric one."""
    value = (exc.headers or {}).get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def api_message(exc: ApiException) -> str:
    """The ``message`` of a Kubernetes Status body, else the HTTP reason."""
    try:
        return json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{exc.status} {exc.reason}"


def classify(exc: Exception) -> Exception:
    """Turn throttling, server errors and broken connections into :class:`TemporaryError`."""
    if isinstance(exc, ApiException) and (exc.status == 429 or exc.status >= 500):
        return TemporaryError(
            f"API server answered {exc.status}: {api_message(exc)}", retry_after_seconds(exc)
        )
    if isinstance(exc, CONNECTION_ERRORS):
        return TemporaryError(f"connection to the API server failed: {exc}")
    return exc


class Kube:
    """Typed access to claims, volumes, classes, events and pods.

    Args:
        api_client: The official client's ``ApiClient``.
        backoff: Retry schedule for temporary errors.
        sleep: Injectable sleep (tests record it).
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.storage = client.StorageV1Api(api_client)
        self.backoff = backoff or Backoff()
        self.sleep = sleep

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
            TemporaryError: Still failing after ``backoff.tries`` tries.
            DeadlineExceeded: The deadline passed while retrying.
            ApiException: Any other API error (404, 403, 422, …), for the caller to judge.
        """
        if deadline is not None:
            # A server that accepts the connection and never answers must not outlive it.
            kwargs.setdefault("_request_timeout", (10, max(1.0, min(60.0, deadline.remaining()))))

        def once() -> Any:
            try:
                resp = fn(*args, _preload_content=False, **kwargs)
                return json.loads(resp.data)
            except (ApiException, *CONNECTION_ERRORS) as exc:
                error = classify(exc)
                if isinstance(error, TemporaryError):
                    raise error from exc
                raise

        return retry(once, what=what, backoff=self.backoff, deadline=deadline, sleep=self.sleep)

    def _read(
        self, what: str, fn: Callable[..., Any], *args: Any, deadline: Deadline | None = None
    ) -> dict | None:
        """Like :meth:`call` for a single object, with 404 as None and 403 as a refusal."""
        try:
            return self.call(what, fn, *args, deadline=deadline)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 403:
                raise PreflightRefused(f"forbidden to {what}: {api_message(exc)}") from exc
            raise HookError(f"{what} failed: {api_message(exc)}") from exc

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
        except ApiException as exc:
            if exc.status == 403:
                raise PreflightRefused(f"forbidden to list pods: {api_message(exc)}") from exc
            raise
        return body.get("items") or []

    # -- the one write ----------------------------------------------------------------------

    def patch_claim_class(
        self, ns: str, name: str, target: str | None, deadline: Deadline | None = None
    ) -> dict:
        """One JSON merge patch of ``spec.volumeAttributesClassName`` (``None`` sends null).

        A dict body would go out as a strategic merge patch, which cannot carry ``null``;
        the merge patch is also the exact ``kubectl patch --type=merge`` of the docs.
        """
        body = {"spec": {"volumeAttributesClassName": target}}
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
        self, ns: str, name: str, resource_version: str, timeout: float
    ) -> Iterator[tuple[str, dict]]:
        """Stream ``(type, object)`` events of one claim from ``resource_version``.

        Ends when the server closes the stream after ``timeout`` seconds. A 410, a
        throttled start or a dropped connection raise (ApiException / urllib3 errors);
        the caller re-lists.
        """
        seconds = max(1, int(timeout))
        stream = watch.Watch().stream(
            self.core.list_namespaced_persistent_volume_claim,
            ns,
            field_selector=f"metadata.name={name}",
            resource_version=resource_version,
            timeout_seconds=seconds,
            allow_watch_bookmarks=True,
            # The read timeout outlives the server-side timeout, so a silent, dead
            # connection still ends.
            _request_timeout=(10, seconds + 15),
        )
        for event in stream:
            if event is None:  # the client yields None for a blank or undecodable line
                continue
            yield event["type"], event["raw_object"]


def event_time(event: dict) -> str:
    """Sort key of an event: its latest timestamp (RFC 3339 strings sort in time order)."""
    return (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or event["metadata"].get("creationTimestamp")
        or ""
    )
