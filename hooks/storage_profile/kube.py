"""The few Kubernetes API calls the hook makes, through the shared object layer
(checkpoint_storage_bench/kube.py: one request path with its retries, errors named once),
returning plain dicts.

Objects are kept as the API's JSON (camelCase dicts), so what the hook reads is exactly
what ``kubectl get -o json`` shows. What stays here is the hook's own: loading its
configuration, and refusing at once (exit 3) a server that was never reached.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.retry import Backoff, Deadline, within
from hooks.storage_profile.errors import ApiError, Forbidden, HookError, PreflightRefused

log = logging.getLogger(__name__)


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
    """The hook's reads and writes of claims, volumes, classes, events, pods and Leases,
    through the shared object layer (:class:`checkpoint_storage_bench.kube.Client`).

    Args:
        api_client: The official client's ``ApiClient``.
        backoff: Retry schedule for temporary errors.
        sleep: Injectable sleep (tests record it).

    Attributes:
        client: The object layer on ``api_client``.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.backoff = backoff or Backoff()
        self.sleep = sleep
        self.host = api_client.configuration.host
        self.client = kube.Client(
            api_client,
            backoff=self.backoff,
            sleep=sleep,
            on_connection_error=self._connection_failed,
        )

    @property
    def answered(self) -> bool:
        """Whether the API server ever answered. Until it has, a refused connection or a
        failed TLS handshake is a configuration problem, refused at once (exit 3) with its
        cause; afterwards it is a restart or a blip, retried."""
        return self.client.answered

    def _connection_failed(self, what: str, exc: BaseException) -> None:
        cause = unreachable(exc)
        if isinstance(exc, ApiException) and not exc.status:
            cause = f"TLS with the API server failed: {exc.reason}"
        if cause is not None and not self.answered:
            raise PreflightRefused(f"{what}: {cause} ({self.host})") from exc

    def _read(
        self, what: str, kind: kube.Kind, name: str, ns: str | None, deadline: Deadline | None
    ) -> dict | None:
        """The object or None, with Forbidden as a refusal (exit 3)."""
        try:
            return self.client.get(kind, name, ns, deadline, what)
        except Forbidden as exc:
            raise PreflightRefused(f"forbidden to {what}: {exc.server_message}") from exc
        except ApiError as exc:
            raise HookError(f"{what} failed: {exc.server_message}") from exc

    # -- reads ----------------------------------------------------------------------------

    def read_claim(self, ns: str, name: str, deadline: Deadline | None = None) -> dict | None:
        return self._read(f"read claim {ns}/{name}", kube.CLAIM, name, ns, deadline)

    def read_pv(self, name: str, deadline: Deadline | None = None) -> dict | None:
        return self._read(f"read PersistentVolume {name}", kube.VOLUME, name, None, deadline)

    def read_class(self, name: str, deadline: Deadline | None = None) -> dict | None:
        return self._read(
            f"read VolumeAttributesClass {name}", kube.VOLUME_ATTRIBUTES_CLASS, name, None, deadline
        )

    def read_storage_class(self, name: str, deadline: Deadline | None = None) -> dict | None:
        return self._read(f"read StorageClass {name}", kube.STORAGE_CLASS, name, None, deadline)

    def list_claim(
        self, ns: str, name: str, deadline: Deadline | None = None
    ) -> tuple[dict | None, str]:
        """The claim (or None) and the list's resourceVersion, to watch from."""
        items, version = self.client.list(
            kube.CLAIM,
            ns,
            deadline,
            f"list claim {ns}/{name}",
            fieldSelector=f"metadata.name={name}",
        )
        return (items[0] if items else None), version

    def claim_events(self, ns: str, claim: dict, deadline: Deadline | None = None) -> list[dict]:
        """Events about the claim, oldest first."""
        meta = claim["metadata"]
        selector = f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={meta['name']}"
        if meta.get("uid"):
            selector += f",involvedObject.uid={meta['uid']}"
        what = f"list events of claim {ns}/{meta['name']}"
        items, _ = self.client.list(kube.EVENT, ns, deadline, what, fieldSelector=selector)
        return sorted(items, key=event_time)

    def pods(self, ns: str, deadline: Deadline | None = None) -> list[dict]:
        """Pods of the namespace (to see which nodes mount a claim)."""
        try:
            items, _ = self.client.list(kube.POD, ns, deadline, f"list pods in {ns}")
        except Forbidden as exc:
            raise PreflightRefused(f"forbidden to list pods: {exc.server_message}") from exc
        return items

    # -- leases -----------------------------------------------------------------------------

    def read_lease(self, ns: str, name: str, deadline: Deadline | None = None) -> dict | None:
        """The Lease, or None; other answers (Forbidden, …) raise their :class:`ApiError`."""
        return self.client.get(kube.LEASE, name, ns, deadline, f"read Lease {ns}/{name}")

    def create_lease(self, ns: str, body: dict, deadline: Deadline | None = None) -> dict:
        what = f"create Lease {ns}/{body['metadata']['name']}"
        return self.client.request("POST", kube.LEASE.path(ns), body, deadline=deadline, what=what)

    def replace_lease(
        self, ns: str, name: str, body: dict, deadline: Deadline | None = None
    ) -> dict:
        """Replace the Lease; its ``metadata.resourceVersion`` makes a concurrent write 409."""
        what = f"update Lease {ns}/{name}"
        return self.client.request(
            "PUT", kube.LEASE.path(ns, name), body, deadline=deadline, what=what
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
        """One JSON merge patch of ``spec.volumeAttributesClassName`` (``None`` sends null):
        the exact ``kubectl patch --type=merge`` of the docs. The uid and resourceVersion
        are preconditions; ``annotations`` (the ledger) change in the same write
        (:func:`class_patch`).
        """
        body = class_patch(target, uid, resource_version, annotations)
        return self.client.patch(
            kube.CLAIM, name, body, ns, deadline, what=f"patch claim {ns}/{name}"
        )


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
