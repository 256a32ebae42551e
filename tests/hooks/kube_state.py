"""The in-memory Kubernetes behind both test doubles: objects, kube-apiserver's write rules,
and a fake external-resizer.

The HTTP double (``kube_double.py``) serves this state over the wire; the in-memory fake
(``fake_kube.py``) answers the client wrapper's methods from it. Both refuse a write with
the same :class:`Refused` (kube-apiserver's status code and Status body), so a rule is
written once: the PVC update rules of the field notes (422 for an unbound claim, 422 for
nil after a class was applied), the patch preconditions, and the Lease rules found by
``tests/kube/test_double_parity.py``. The resizer acts like external-resizer v2 (see
:class:`FakeResizer`) on either one's clock (:meth:`KubeState.run`).
"""

from __future__ import annotations

import copy
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from checkpoint_storage_bench.contract import lease_name

CLAIMS = "persistentvolumeclaims"
CLUSTER_SCOPED = {"PersistentVolume", "VolumeAttributesClass", "StorageClass"}
IMMUTABLE_SPEC = (
    "spec is immutable after creation except resources.requests and "
    "volumeAttributesClassName for bound claims"
)
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
INT32 = (-(2**31), 2**31 - 1)
MICROTIME_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
MICROTIME_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")
LEASES = ("coordination.k8s.io", "leases")


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


def details(group: str, resource: str, name: str | None, **more: Any) -> dict:
    """A Status body's ``details`` for one object (as kube-apiserver writes them)."""
    out: dict[str, Any] = {"name": name} if name else {}
    if group:
        out["group"] = group
    out["kind"] = resource
    return {**out, **more}


def cause(reason: str, message: str, field_path: str) -> dict:
    return {"reason": reason, "message": message, "field": field_path}


class Refused(Exception):
    """kube-apiserver's refusal of a request: its status code and its Status body."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.body = status_body(code, reason, message, details)


def not_found(group: str, resource: str, name: str) -> Refused:
    return Refused(
        404, "NotFound", f'{qualified(group, resource)} "{name}" not found',
        details(group, resource, name),
    )  # fmt: skip


def conflict(group: str, resource: str, name: str) -> Refused:
    return Refused(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(group, resource)} "{name}": the object '
        "has been modified; please apply your changes to the latest version and try again",
        details(group, resource, name),
    )


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

    def refusal(
        self, denied: str, group: str, resource: str, ns: str | None, name: str | None
    ) -> Refused:
        """kube-apiserver's 403 for ``denied`` (the request's verb, or the create an update
        of a missing object would be): it names the object of the URL or of a
        metadata.name selector, the user and the scope."""
        what = qualified(group, resource) + (f' "{name}"' if name else "")
        scope = f'in the namespace "{ns}"' if ns else "at the cluster scope"
        message = (
            f'{what} is forbidden: User "{self.user}" cannot {denied} resource '
            f'"{resource}" in API group "{group}" {scope}'
        )
        return Refused(403, "Forbidden", message, details(group, resource, name))


class KubeState:
    """Objects by (kind, namespace, name), each change with a new resourceVersion.

    Attributes:
        history: ``(resourceVersion, type, object)`` of every change of a claim, to watch.
        on_patch: Called after each accepted patch of a claim (another writer reacting).
        rbac: When set, the rules in force (the HTTP double checks every request).
        resizer: The fake external-resizer.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.rv = 1000
        self.objects: dict[tuple[str, str | None, str], dict] = {}
        self.history: list[tuple[int, str, dict]] = []
        self.on_patch: Callable[[dict], None] | None = None
        self.rbac: Rbac | None = None
        self.resizer = FakeResizer(self)

    def run(self, key: tuple, steps: Iterator[float]) -> None:
        """Run ``steps`` in the background, on this state's clock: each step yields the
        seconds until the next. A run of the same ``key`` replaces the one before."""
        raise NotImplementedError

    def changed(self, type_: str, obj: dict) -> None:
        """Called (under the lock) after each change of a claim, for its watchers."""

    # -- objects ---------------------------------------------------------------------------

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

    def of_kind(self, kind: str, ns: str | None = None, selector: list | None = None) -> list:
        """The objects of ``kind`` (in ``ns``, when given) that ``selector`` matches."""
        with self.lock:
            return [
                copy.deepcopy(o)
                for (k, o_ns, _), o in self.objects.items()
                if k == kind and (ns is None or o_ns == ns) and matches(o, selector or [])
            ]

    def lease(self, claim: str = "training-checkpoints", ns: str = "ml-team") -> dict | None:
        return self.get("Lease", lease_name(claim), ns)

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

    def _record(self, type_: str, obj: dict) -> None:
        self.history.append((self.rv, type_, copy.deepcopy(obj)))
        self.changed(type_, obj)

    # -- kube-apiserver's write rules -----------------------------------------------------

    def patch_claim(self, ns: str, name: str, patch: dict) -> dict:
        """A merge patch of a claim, as kube-apiserver 1.34 applies it; the stored claim.

        Raises:
            Refused: 404 for a missing claim; the preconditions, in kube-apiserver's order:
                the resourceVersion is compared when the store applies the update (409),
                the uid when the update is validated afterwards (metadata.uid is immutable:
                422); 422 for a spec change the PVC rules forbid.
        """
        with self.lock:
            old = self.get("PersistentVolumeClaim", name, ns)
            if old is None:
                raise not_found("", CLAIMS, name)
            preconditions = patch.get("metadata") or {}
            version = preconditions.get("resourceVersion")
            if version is not None and version != old["metadata"]["resourceVersion"]:
                raise conflict("", CLAIMS, name)
            uid = preconditions.get("uid")
            if uid is not None and uid != old["metadata"]["uid"]:
                immutable = f'Invalid value: "{uid}": field is immutable'
                raise Refused(
                    422,
                    "Invalid",
                    f'PersistentVolumeClaim "{name}" is invalid: metadata.uid: {immutable}',
                    # Twice, as kube-apiserver 1.34 lists it: the generic update checks the
                    # object meta, and the claim's own validation again.
                    details("", "PersistentVolumeClaim", name,
                            causes=[cause("FieldValueInvalid", immutable, "metadata.uid")] * 2),
                )  # fmt: skip
            new = merge_patch(old, patch)
            new["status"] = old.get("status")  # status is a subresource
            new["metadata"] = merge_patch(
                old["metadata"],
                {k: v for k, v in preconditions.items() if k in ("labels", "annotations")},
            )
            error = _claim_update_error(old, new)
            if error:
                field_path, why = error.split(": ", 1)
                raise Refused(
                    422,
                    "Invalid",
                    f'PersistentVolumeClaim "{name}" is invalid: {error}',
                    details("", "PersistentVolumeClaim", name,
                            causes=[cause("FieldValueForbidden", why, field_path)]),
                )  # fmt: skip
            stored = old if new == old else self.put(new)
        if new != old:
            self.resizer.on_claim_update(old, stored)
            if self.on_patch:
                self.on_patch(stored)
        return stored

    def write_lease(self, verb: str, ns: str, name: str | None, lease: Any) -> tuple[dict, bool]:
        """Create or replace a Lease, as kube-apiserver 1.34 does; the stored Lease and
        whether it was created.

        A body that does not decode into a Lease (a fractional or out-of-range
        ``leaseDurationSeconds``, a time that is not a MicroTime) is a 400; the name comes
        from the body on create (409 AlreadyExists when taken), from the path on update,
        where the body's resourceVersion must be given (422) and be the current one (409
        Conflict). An update of a Lease that does not exist creates it: the Lease strategy
        allows create-on-update, and the caller needs the create permission too.

        Raises:
            Refused: What kube-apiserver answers instead.
        """
        group, resource = LEASES
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
            raise Refused(422, "Invalid", f'Lease "{meta.get("name", "")}" is invalid: {invalid}')
        undecodable = lease_decode_error(spec)
        if undecodable:
            raise Refused(
                400, "BadRequest",
                f'Lease in version "v1" cannot be handled as a Lease: {undecodable}',
            )  # fmt: skip
        name = meta["name"]
        with self.lock:
            old = self.get("Lease", name, ns)
            if verb == "update" and old is None and self.rbac is not None:
                if not self.rbac.allows("create", group, resource, ns, name):
                    raise self.rbac.refusal("create", group, resource, ns, name)
            if verb == "update" and old is not None:
                if not meta.get("resourceVersion"):
                    must = "Invalid value: 0: must be specified for an update"
                    raise Refused(
                        422,
                        "Invalid",
                        f'{qualified(group, resource)} "{name}" is invalid: '
                        f"metadata.resourceVersion: {must}",
                        details(group, resource, name,
                                causes=[cause("FieldValueInvalid", must,
                                              "metadata.resourceVersion")]),
                    )  # fmt: skip
                if meta["resourceVersion"] != old["metadata"]["resourceVersion"]:
                    raise conflict(group, resource, name)
            duration = spec.get("leaseDurationSeconds")
            if duration is not None and duration <= 0:
                why = f"Invalid value: {duration}: must be greater than 0"
                raise Refused(
                    422,
                    "Invalid",
                    f'Lease.{group} "{name}" is invalid: spec.leaseDurationSeconds: {why}',
                    details(group, "Lease", name,
                            causes=[cause("FieldValueInvalid", why, "spec.leaseDurationSeconds")]),
                )  # fmt: skip
            if verb == "create" and old is not None:
                raise Refused(
                    409, "AlreadyExists", f'{qualified(group, resource)} "{name}" already exists',
                    details(group, resource, name),
                )  # fmt: skip
            lease = copy.deepcopy(lease)
            lease["metadata"] = {
                "name": name,
                "namespace": ns,
                **({"uid": old["metadata"]["uid"]} if old else {}),
            }
            return self.put(lease), old is None


def _claim_update_error(old: dict, new: dict) -> str | None:
    """What the PVC update validation refuses (``field: Forbidden: why``), if anything."""
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


class FakeResizer:
    """external-resizer v2's modify path, on its state's clock.

    Attributes:
        driver: The CSI driver it serves; claims of other drivers are ignored silently.
        results: Per class name, driver call outcomes to use in order: ``"ok"``,
            ``"InvalidArgument"``, ``"Internal"``, or ``"status:X"`` (set an unknown status
            X); when exhausted, ``"ok"``.
        on_modify: Called with (pv, class) on each successful driver call (EC2 via moto).
        delay: Seconds before the resizer reacts to a change.
        driver_delay: Seconds a driver call takes.
        retry_delay: Backoff after a final error.
        calls: ``(class, outcome)`` of every driver call.
    """

    def __init__(self, state: KubeState) -> None:
        self.state = state
        self.driver = "ebs.csi.aws.com"
        self.results: dict[str, list[str]] = {}
        self.on_modify: Callable[[dict, dict], None] | None = None
        self.delay = 0.05
        self.driver_delay = 0.2
        self.retry_delay = 0.1
        self.calls: list[tuple[str, str]] = []

    def restart(self) -> None:
        """A resizer restart re-queues every claim whose spec differs from its current class."""
        for claim in self.state.of_kind("PersistentVolumeClaim"):
            if claim["spec"].get("volumeAttributesClassName") != (claim.get("status") or {}).get(
                "currentVolumeAttributesClassName"
            ):
                self.start(claim["metadata"]["namespace"], claim["metadata"]["name"])

    def start(self, ns: str, name: str) -> None:
        """Queue the claim (again): its modification starts over after :attr:`delay`."""
        self.state.run(("resize", ns, name), self._modify(ns, name))

    def on_claim_update(self, old: dict, new: dict) -> None:
        if old["spec"].get("volumeAttributesClassName") != new["spec"].get(
            "volumeAttributesClassName"
        ):
            self.start(new["metadata"]["namespace"], new["metadata"]["name"])

    def _set_status(self, ns: str, name: str, fn: Callable[[dict], None]) -> dict:
        def change(claim: dict) -> None:
            fn(claim.setdefault("status", {}))

        return self.state.update("PersistentVolumeClaim", name, ns, change)

    def _modify(self, ns: str, name: str) -> Iterator[float]:
        state = self.state
        yield self.delay
        claim = state.get("PersistentVolumeClaim", name, ns)
        target = claim["spec"].get("volumeAttributesClassName")
        pv = state.get("PersistentVolume", claim["spec"].get("volumeName") or "")
        driver = (pv or {}).get("spec", {}).get("csi", {}).get("driver")
        if target is None or driver != self.driver:
            return  # nothing to modify, or another driver's volume: ignored silently
        vac = state.get("VolumeAttributesClass", target)
        if vac is None:
            # Target field untouched, a Warning event, and no requeue when the class appears.
            self._set_status(ns, name, partial(_with_status, "Pending", None))
            state.add_event(
                claim, "Warning", "VolumeModifyFailed", f'VAC "{target}" does not exist.'
            )
            return
        while True:
            claim = self._set_status(ns, name, partial(_in_progress, target))
            state.add_event(
                claim,
                "Normal",
                "VolumeModify",
                f"external resizer is modifying volume {name} with vac {target}",
            )
            yield self.driver_delay
            queue = self.results.get(target) or []
            result = queue.pop(0) if queue else "ok"
            self.calls.append((target, result))
            if result == "ok":
                if self.on_modify:
                    self.on_modify(pv, vac)
                state.update(
                    "PersistentVolume", pv["metadata"]["name"], None, partial(_pv_class, target)
                )
                claim = self._set_status(ns, name, partial(_settled, target))
                state.add_event(
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
            state.add_event(claim, "Warning", "VolumeModifyFailed", message)
            if final:
                return  # retried only every --retry-interval-max (minutes): not in a test
            yield self.retry_delay


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


def claim_state(
    state: KubeState, ns: str = "ml-team", claim: str = "training-checkpoints"
) -> tuple[str | None, str | None, dict | None]:
    """Where a claim's class stands: (spec, current, modifyVolumeStatus)."""
    obj = state.get("PersistentVolumeClaim", claim, ns)
    status = obj.get("status") or {}
    return (
        obj["spec"].get("volumeAttributesClassName"),
        status.get("currentVolumeAttributesClassName"),
        status.get("modifyVolumeStatus"),
    )


# -- seeding ---------------------------------------------------------------------------------


def make_volume(
    state: KubeState,
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
    """Seed a bound claim and its CSI PV already settled on ``current`` (unbound: the
    claim alone), and the claim's StorageClass, provisioned by ``driver``."""
    make_storage_class(state, "ebs-gp3", driver)
    if bound:
        zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}
        state.put(
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
                        "required": {"nodeSelectorTerms": [{"matchExpressions": [zone]}]}
                    },
                },
                "status": {"phase": "Bound"},
            }
        )
    status: dict[str, Any] = {"phase": "Bound" if bound else "Pending"}
    if bound and current:
        status["currentVolumeAttributesClassName"] = current
    return state.put(
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
    state: KubeState,
    holder: str | None,
    renewed_ago: float = 0.0,
    duration: int = 3600,
    ns: str = "ml-team",
    claim: str = "training-checkpoints",
    now: datetime | None = None,
) -> dict:
    """Seed the claim's Lease, held by ``holder``, renewed ``renewed_ago`` seconds before
    ``now`` (the wall clock's, unless given)."""
    renewed = ((now or datetime.now(UTC)) - timedelta(seconds=renewed_ago)).astimezone(UTC)
    stamp = renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec: dict[str, Any] = {
        "leaseDurationSeconds": duration,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": 0,
    }
    if holder is not None:
        spec["holderIdentity"] = holder
    return state.put(
        {
            "kind": "Lease",
            "apiVersion": "coordination.k8s.io/v1",
            "metadata": {"name": lease_name(claim), "namespace": ns},
            "spec": spec,
        }
    )


def make_storage_class(state: KubeState, name: str, provisioner: str) -> dict:
    return state.put(
        {
            "kind": "StorageClass",
            "apiVersion": "storage.k8s.io/v1",
            "metadata": {"name": name},
            "provisioner": provisioner,
            "volumeBindingMode": "WaitForFirstConsumer",
        }
    )


def make_class(
    state: KubeState, name: str, driver: str = "ebs.csi.aws.com", **parameters: str
) -> dict:
    return state.put(
        {
            "kind": "VolumeAttributesClass",
            "apiVersion": "storage.k8s.io/v1",
            "metadata": {"name": name},
            "driverName": driver,
            "parameters": parameters or {"type": "gp3", "iops": "3000", "throughput": "125"},
        }
    )
