"""The reconciler: a ``polyaxon.com/v1`` ``Job`` becomes a ``batch/v1`` Job, its phases are
written to the object's status and, when the object asks for it (``syncStatuses``), to the
Polyaxon API; a deleted object is a stop request; a finished one is removed.

The order of one reconcile follows mloperator's ``OperationReconciler.Reconcile``: record the
start time; on deletion, handle the finalizers (report ``stopped`` unless done, remove them);
else add the finalizers; a done object is cleaned up (deleted once its TTL is over); otherwise
reconcile the batch Job and map its state to a condition.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from operator_standin.crd import (
    API_VERSION,
    GROUP,
    JOB_KIND,
    JOB_PLURAL,
    KFJOB_KIND,
    KFJOB_PLURAL,
    VERSION,
)

log = logging.getLogger("operator_standin")

# mloperator's finalizer names: the agent's "clean" removes every finalizer by name-agnostic
# patch, so the names only matter to whoever reads the object.
LOGS_FINALIZER = "operation.logs.finalizers.polyaxon.com"
NOTIFICATIONS_FINALIZER = "operation.notifications.finalizers.polyaxon.com"
FINALIZERS = (LOGS_FINALIZER, NOTIFICATIONS_FINALIZER)

STARTING, RUNNING, WARNING = "Starting", "Running", "Warning"
SUCCEEDED, FAILED, STOPPED = "Succeeded", "Failed", "Stopped"
FINAL = (SUCCEEDED, FAILED, STOPPED)
REASON = "OperatorController"  # the reason mloperator writes on its own transitions

# Waiting reasons of a container that will not start without someone changing something.
STUCK_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
}
DEFAULT_BACKOFF_LIMIT = 0  # mloperator's default: a failed pod fails the run
DEFAULT_RESTART_POLICY = "Never"
RESYNC_SECONDS = 2.0  # a full pass over every object, for what no watch event announces


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


class StatusSink(Protocol):
    """Where a phase goes besides the object's status (the Polyaxon API)."""

    def report(self, owner: str, project: str, uuid: str, condition: dict[str, Any]) -> None: ...


@dataclass
class ApiStatusSink:
    """Posts a condition to ``POST /api/v1/{owner}/{project}/runs/{uuid}/statuses``, the
    endpoint mloperator's ``LogPolyaxonRunStatus`` calls, through Polyaxon's own client.

    A failed post is logged and dropped, as the operator does: the next transition reports
    again, and the agent's periodic checks catch a run whose object is gone.
    """

    host: str
    token: str | None = None
    _client: Any = field(default=None, init=False, repr=False)

    def _runs(self) -> Any:
        if self._client is None:
            from polyaxon._schemas.client import ClientConfig
            from polyaxon.client import PolyaxonClient

            config = ClientConfig(host=self.host, token=self.token, use_https=False)
            self._client = PolyaxonClient(config=config, token=self.token)
        return self._client.runs_v1

    def report(self, owner: str, project: str, uuid: str, condition: dict[str, Any]) -> None:
        from polyaxon._schemas.lifecycle import V1StatusCondition

        body = V1StatusCondition.get_condition(
            type=condition["type"],  # lower-cased by get_condition: "Running" -> "running"
            status=True,
            reason=condition.get("reason"),
            message=condition.get("message"),
        )
        try:
            self._runs().create_run_status(
                owner=owner, project=project, uuid=uuid, body={"condition": body}
            )
        except Exception as exc:  # noqa: BLE001 - any failure of the API is only logged
            log.warning(
                "status %s of %s/%s/%s not reported: %r", body.type, owner, project, uuid, exc
            )


def run_info(obj: dict[str, Any]) -> tuple[str, str, str] | None:
    """(owner, project, uuid) from the labels and annotations the agent's converter sets."""
    meta = obj.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    uuid = labels.get("app.kubernetes.io/instance")
    owner = annotations.get("operation.polyaxon.com/owner")
    project = annotations.get("operation.polyaxon.com/project")
    if not (uuid and owner and project):
        return None
    return owner, project, uuid


def last_condition(status: dict[str, Any]) -> dict[str, Any] | None:
    conditions = status.get("conditions") or []
    return conditions[-1] if conditions else None


def is_done(status: dict[str, Any]) -> bool:
    return any(
        c.get("type") in FINAL and c.get("status") == "True" for c in status.get("conditions") or []
    )


def log_condition(status: dict[str, Any], kind: str, reason: str, message: str) -> bool:
    """Append a condition the way mloperator's ``logCondition`` does: nothing when the last
    condition already says the same (type, status, reason), except for a final one; a
    condition of the same type is replaced, so the list holds each type once, newest last."""
    conditions = list(status.get("conditions") or [])
    current = conditions[-1] if conditions else None
    stamp = now_iso()
    new = {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastUpdateTime": stamp,
        "lastTransitionTime": stamp,
    }
    if (
        current is not None
        and (current["type"], current["status"], current.get("reason")) == (kind, "True", reason)
        and kind not in FINAL
    ):
        return False
    if current is not None and current["status"] == "True":
        new["lastTransitionTime"] = current.get("lastTransitionTime", stamp)
    status["conditions"] = [c for c in conditions if c["type"] != kind] + [new]
    return True


def job_manifest(obj: dict[str, Any]) -> dict[str, Any]:
    """The batch Job for a ``polyaxon.com/v1`` Job (mloperator's ``GenerateJob``): same name,
    namespace, labels and annotations; its pod template (the template's own metadata kept,
    the object's labels and annotations added, as the operator copies them to the pod);
    ``termination`` mapped to the Job's backoff limit, pod failure policy, deadline and TTL;
    owned by the object,
    so that deleting it deletes the Job and its pods."""
    meta = obj["metadata"]
    spec = obj["batchJobSpec"]
    template = dict(spec["template"])
    pod_meta = dict(template.get("metadata") or {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **(meta.get("labels") or {})}
    pod_meta["annotations"] = {
        **(pod_meta.get("annotations") or {}),
        **(meta.get("annotations") or {}),
    }
    pod_spec = dict(template["spec"])
    pod_spec.setdefault("restartPolicy", DEFAULT_RESTART_POLICY)
    termination = obj.get("termination") or {}
    job_spec: dict[str, Any] = {
        "backoffLimit": termination.get("backoffLimit", DEFAULT_BACKOFF_LIMIT),
        "template": {"metadata": pod_meta, "spec": pod_spec},
    }
    if termination.get("activeDeadlineSeconds") is not None:
        job_spec["activeDeadlineSeconds"] = termination["activeDeadlineSeconds"]
    if termination.get("podFailurePolicy"):
        # Which failures another pod can fix (the training's: a lost node, an upload that
        # failed); without it every failure is retried up to the backoff limit.
        job_spec["podFailurePolicy"] = termination["podFailurePolicy"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": obj.get("kind", JOB_KIND),
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": job_spec,
    }


def pods_warning(pods: Iterable[Any]) -> tuple[str, str] | None:
    """(reason, message) when a pod of the Job cannot go on by itself: unschedulable, or a
    container stuck waiting (image not found, bad config) — mloperator's
    ``HasUnschedulablePods`` and its container checks."""
    for pod in pods:
        for cond in pod.status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                if cond.reason == "Unschedulable":
                    return "Unschedulable", cond.message or "pod is unschedulable"
        statuses = [
            *(pod.status.init_container_statuses or []),
            *(pod.status.container_statuses or []),
        ]
        for container in statuses:
            waiting = container.state.waiting if container.state else None
            if waiting is not None and waiting.reason in STUCK_WAITING:
                return waiting.reason, f"{container.name}: {waiting.message or waiting.reason}"
    return None


def job_phase(job: Any, pods: list[Any]) -> tuple[str, str, str] | None:
    """The condition (type, reason, message) the Job's state calls for, or None for no
    change: Succeeded / Failed from the Job's conditions, Warning for a stuck pod, Running
    once a pod runs."""
    status = job.status
    for cond in status.conditions or []:
        if cond.status != "True":
            continue
        if cond.type == "Complete":
            return SUCCEEDED, REASON, "Operation has succeeded"
        if cond.type == "Failed":
            message = cond.message or "Job failed"
            return FAILED, cond.reason or REASON, message
    warning = pods_warning(pods)
    if warning is not None:
        return WARNING, warning[0], warning[1]
    if any(p.status.phase == "Running" for p in pods):
        return RUNNING, REASON, "Operation is running"
    return None


KF_GROUP, KF_VERSION, PYTORCHJOB_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
# The label the training operator puts on every pod of a job.
KF_REPLICA_LABEL = "training.kubeflow.org/job-name"


def pytorchjob_manifest(obj: dict[str, Any]) -> dict[str, Any]:
    """The ``kubeflow.org/v1`` PyTorchJob for a ``KfJob`` with a ``pytorchJobSpec``, as
    mloperator's ``generatePytorchJob`` writes it: same name, namespace and labels; each
    replica's pod template with the object's labels and annotations added; ``termination``
    mapped to the run policy's backoff limit (0 without one) and deadline, with the
    ``cleanPodPolicy`` and ``schedulingPolicy`` the agent wrote, and the ``elasticPolicy``.

    Two differences, both so that nothing is lost: mloperator sets the run policy's TTL to 0
    when the run has none, so the training operator deletes a finished job at once and its
    last phase can be missed; here the TTL is copied only when set (the job goes with the
    object, which owns it). And, like mloperator, the agent's ``nProcPerNode`` is not copied:
    mloperator reads ``nprocPerNode`` and drops it, so the training operator sets no
    ``PET_NPROC_PER_NODE`` and counts one rank per pod in ``WORLD_SIZE`` (the component's
    torchrun line names ``--nproc-per-node`` itself)."""
    meta = obj["metadata"]
    spec = obj["pytorchJobSpec"]
    labels = dict(meta.get("labels") or {})
    annotations = dict(meta.get("annotations") or {})
    replicas = {}
    for kind, replica in (spec.get("replicaSpecs") or {}).items():
        template = replica["template"]
        pod_meta = dict(template.get("metadata") or {})
        replicas[kind] = {
            "replicas": replica.get("replicas", 1),
            "template": {
                "metadata": {
                    "labels": {**(pod_meta.get("labels") or {}), **labels},
                    "annotations": {**(pod_meta.get("annotations") or {}), **annotations},
                },
                "spec": template["spec"],
            },
        }
        if replica.get("restartPolicy"):
            replicas[kind]["restartPolicy"] = replica["restartPolicy"]
    termination = obj.get("termination") or {}
    run_policy: dict[str, Any] = {
        "backoffLimit": termination.get("backoffLimit", DEFAULT_BACKOFF_LIMIT),
    }
    if termination.get("activeDeadlineSeconds") is not None:
        run_policy["activeDeadlineSeconds"] = termination["activeDeadlineSeconds"]
    if termination.get("ttlSecondsAfterFinished") is not None:
        run_policy["ttlSecondsAfterFinished"] = termination["ttlSecondsAfterFinished"]
    for key in ("cleanPodPolicy", "schedulingPolicy"):
        if spec.get(key):
            run_policy[key] = spec[key]
    job_spec: dict[str, Any] = {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas}
    if spec.get("elasticPolicy"):
        job_spec["elasticPolicy"] = spec["elasticPolicy"]
    return {
        "apiVersion": f"{KF_GROUP}/{KF_VERSION}",
        "kind": "PyTorchJob",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KFJOB_KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": job_spec,
    }


def kfjob_phase(job: dict[str, Any], pods: list[Any]) -> tuple[str, str, str] | None:
    """The condition a Kubeflow job's state calls for (mloperator's ``reconcileKFJobStatus``):
    Warning for a stuck pod; else from the job's last condition: Created or Running ->
    Running, Succeeded, Failed, Restarting -> Warning; None for no change."""
    warning = pods_warning(pods)
    if warning is not None:
        return WARNING, warning[0], warning[1]
    conditions = (job.get("status") or {}).get("conditions") or []
    if not conditions:
        return None
    last = conditions[-1]
    kind, reason = last.get("type"), last.get("reason") or REASON
    message = last.get("message") or ""
    if kind in ("Created", "Running"):
        return RUNNING, REASON, "Operation is running"
    if kind == "Succeeded":
        return SUCCEEDED, REASON, "Operation has succeeded"
    if kind == "Failed":
        return FAILED, reason, message or "Job failed"
    if kind == "Restarting":
        return WARNING, reason, message or "Job is restarting"
    return None


@dataclass
class Reconciler:
    """Reconciles the ``polyaxon.com/v1`` objects of one kind (``plural``: ``jobs`` or
    ``kfjobs``) in one namespace."""

    api: client.ApiClient
    namespace: str
    sink: StatusSink | None = None
    plural: str = JOB_PLURAL
    custom: client.CustomObjectsApi = field(init=False)
    batch: client.BatchV1Api = field(init=False)
    core: client.CoreV1Api = field(init=False)

    def __post_init__(self) -> None:
        self.custom = client.CustomObjectsApi(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.core = client.CoreV1Api(self.api)

    # -- the object --------------------------------------------------------------------------

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, self.plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def names(self) -> list[str]:
        listed = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, self.plural
        )
        return [item["metadata"]["name"] for item in listed.get("items", [])]

    def _patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        """Write ``status``; ``obj`` becomes the object as stored (new resourceVersion)."""
        stored = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, self.plural, obj["metadata"]["name"], {"status": status}
        )
        obj.clear()
        obj.update(stored)

    def _set_finalizers(self, obj: dict[str, Any], finalizers: list[str]) -> None:
        # A JSON merge patch replaces the list whole; the resourceVersion makes it fail on a
        # concurrent change (the agent's clean) instead of overwriting it.
        meta = obj["metadata"]
        stored = self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            self.plural,
            meta["name"],
            {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}},
        )
        obj.clear()
        obj.update(stored)

    def _sync(self, obj: dict[str, Any], condition: dict[str, Any]) -> None:
        if self.sink is None or not obj.get("syncStatuses"):
            return
        info = run_info(obj)
        if info is None:
            log.info("%s: no run owner/project/uuid, status not synced", obj["metadata"]["name"])
            return
        self.sink.report(*info, condition)

    def _log(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        status = dict(obj.get("status") or {})
        if not log_condition(status, kind, reason, message):
            return
        if kind in FINAL:
            status["completionTime"] = now_iso()
        status["lastReconcileTime"] = now_iso()
        self._patch_status(obj, status)
        log.info("%s: %s (%s) %s", obj["metadata"]["name"], kind, reason, message)
        self._sync(obj, status["conditions"][-1])

    # -- one pass ----------------------------------------------------------------------------

    def reconcile(self, name: str) -> None:
        obj = self.get(name)
        if obj is None:
            return
        meta = obj["metadata"]
        status = dict(obj.get("status") or {})
        if meta.get("deletionTimestamp"):
            self._finalize(obj)
            return
        if "startTime" not in status:
            status["startTime"] = now_iso()
            self._patch_status(obj, status)
        finalizers = list(meta.get("finalizers") or [])
        missing = [f for f in FINALIZERS if f not in finalizers]
        if missing:
            self._set_finalizers(obj, finalizers + missing)
        if is_done(obj.get("status") or {}):
            self._clean_up(obj)
            return
        if self.plural == KFJOB_PLURAL:
            if "pytorchJobSpec" not in obj:
                self._log(obj, FAILED, "OperatorUnsupported", "the stand-in runs PyTorchJobs only")
                return
            self._reconcile_kfjob(obj)
            return
        if "batchJobSpec" not in obj:
            self._log(obj, FAILED, "OperatorUnsupported", "the stand-in runs batchJobSpec only")
            return
        self._reconcile_job(obj)

    def _reconcile_job(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        try:
            job = self.batch.read_namespaced_job(name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            job = None
        if job is None:
            last = last_condition(obj.get("status") or {})
            if last is not None and last["type"] in (RUNNING, WARNING):
                # It ran and is gone: deleted by someone else (mloperator's MarkJobAsDeleted).
                self._log(obj, STOPPED, "JobDeleted", "The underlying Kubernetes Job was deleted")
                return
            try:
                self.batch.create_namespaced_job(self.namespace, job_manifest(obj))
            except ApiException as exc:
                if exc.status == 409:
                    return  # created by an earlier pass; its status comes next pass
                self._log(obj, WARNING, "OperatorCreateJob", _api_message(exc))
                if exc.status in (400, 403, 422):
                    # The pod template itself is refused: no retry makes it valid.
                    self._log(obj, FAILED, "OperatorCreateJob", _api_message(exc))
                return
            self._log(obj, STARTING, REASON, "Operation is starting")
            return
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"batch.kubernetes.io/job-name={name}"
        ).items
        phase = job_phase(job, pods)
        if phase is not None:
            self._log(obj, *phase)

    def _read_pytorchjob(self, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                KF_GROUP, KF_VERSION, self.namespace, PYTORCHJOB_PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _reconcile_kfjob(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        job = self._read_pytorchjob(name)
        if job is None:
            last = last_condition(obj.get("status") or {})
            if last is not None and last["type"] in (RUNNING, WARNING):
                self._log(obj, STOPPED, "JobDeleted", "The underlying PyTorchJob was deleted")
                return
            try:
                self.custom.create_namespaced_custom_object(
                    KF_GROUP, KF_VERSION, self.namespace, PYTORCHJOB_PLURAL,
                    pytorchjob_manifest(obj),
                )  # fmt: skip
            except ApiException as exc:
                if exc.status == 409:
                    return
                self._log(obj, WARNING, "OperatorCreateJob", _api_message(exc))
                if exc.status in (400, 403, 404, 422):
                    # Refused by the schema or the training operator's webhook, or no
                    # training operator's CRD: no retry makes it run.
                    self._log(obj, FAILED, "OperatorCreateJob", _api_message(exc))
                return
            self._log(obj, STARTING, REASON, "Operation is starting")
            return
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{KF_REPLICA_LABEL}={name}"
        ).items
        phase = kfjob_phase(job, pods)
        if phase is not None:
            self._log(obj, *phase)

    def _delete_run(self, name: str) -> None:
        """Delete what runs the object (background: the pods get their grace period)."""
        try:
            if self.plural == KFJOB_PLURAL:
                self.custom.delete_namespaced_custom_object(
                    KF_GROUP, KF_VERSION, self.namespace, PYTORCHJOB_PLURAL, name,
                    propagation_policy="Background",
                )  # fmt: skip
            else:
                self.batch.delete_namespaced_job(
                    name, self.namespace, propagation_policy="Background"
                )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _finalize(self, obj: dict[str, Any]) -> None:
        """A stop request (the agent deletes the object) or the clean-up of a done run."""
        meta = obj["metadata"]
        ours = [f for f in meta.get("finalizers") or [] if f in FINALIZERS]
        if not ours:
            return
        if not is_done(obj.get("status") or {}):
            self._sync(
                obj,
                {
                    "type": STOPPED,
                    "reason": "OperatorFinalizer",
                    "message": "Operation stopped in finalizer",
                },
            )
        # Background propagation: the pods get their grace period, the object does not wait.
        self._delete_run(meta["name"])
        rest = [f for f in meta.get("finalizers") or [] if f not in FINALIZERS]
        try:
            self._set_finalizers(obj, rest)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _clean_up(self, obj: dict[str, Any]) -> None:
        """Delete a done object once its ``ttlSecondsAfterFinished`` has passed (right away
        without one), as mloperator's ``handleTTL`` does."""
        ttl = (obj.get("termination") or {}).get("ttlSecondsAfterFinished")
        done_at = _parse_time((obj.get("status") or {}).get("completionTime"))
        if ttl and done_at is not None:
            if (datetime.now(UTC) - done_at).total_seconds() < ttl:
                return
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, self.plural, obj["metadata"]["name"]
            )
        except ApiException as exc:
            if exc.status != 404:
                raise


def _api_message(exc: ApiException) -> str:
    import json

    try:
        return json.loads(exc.body).get("message") or str(exc.reason)
    except (TypeError, ValueError):
        return f"{exc.status} {exc.reason}"


@dataclass
class Controller:
    """Watches the namespace's ``polyaxon.com/v1`` Jobs and the batch Jobs they own, and runs
    the reconciler on every object an event names, plus a full pass every
    :data:`RESYNC_SECONDS` (pod states announce themselves through no watched object)."""

    reconciler: Reconciler
    resync: float = RESYNC_SECONDS
    stop_event: threading.Event = field(default_factory=threading.Event)
    on_error: Callable[[str, Exception], None] | None = None
    _queue: queue.Queue[str] = field(default_factory=queue.Queue, init=False)
    _threads: list[threading.Thread] = field(default_factory=list, init=False)

    def start(self) -> Controller:
        for target in (self._watch_objects, self._watch_jobs, self._loop):
            thread = threading.Thread(target=target, name=target.__name__, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def run_forever(self) -> None:
        self.start()
        try:
            while not self.stop_event.wait(0.5):
                pass
        finally:
            self.stop()

    def _loop(self) -> None:
        rec = self.reconciler
        next_resync = 0.0
        while not self.stop_event.is_set():
            if time.monotonic() >= next_resync:
                try:
                    for name in rec.names():
                        self._queue.put(name)
                except Exception as exc:  # noqa: BLE001 - the API may be restarting
                    self._error("list", exc)
                next_resync = time.monotonic() + self.resync
            try:
                name = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                rec.reconcile(name)
            except Exception as exc:  # noqa: BLE001 - one object's failure stops no other
                self._error(name, exc)

    def _error(self, what: str, exc: Exception) -> None:
        log.warning("reconcile %s: %r", what, exc)
        if self.on_error is not None:
            self.on_error(what, exc)

    def _watch(self, list_fn: Callable[..., Any], name_of: Callable[[Any], str | None], *args):
        while not self.stop_event.is_set():
            try:
                stream = watch.Watch().stream(list_fn, *args, timeout_seconds=5)
                for event in stream:
                    name = name_of(event["object"])
                    if name:
                        self._queue.put(name)
                    if self.stop_event.is_set():
                        break
            except Exception as exc:  # noqa: BLE001 - watches expire and reconnect
                log.debug("watch: %r", exc)
                self.stop_event.wait(1.0)

    def _watch_objects(self) -> None:
        rec = self.reconciler
        self._watch(
            rec.custom.list_namespaced_custom_object,
            lambda o: o["metadata"]["name"],
            GROUP,
            VERSION,
            rec.namespace,
            rec.plural,
        )

    def _watch_jobs(self) -> None:
        rec = self.reconciler
        if rec.plural == KFJOB_PLURAL:

            def kf_owner(job: dict[str, Any]) -> str | None:
                for ref in job["metadata"].get("ownerReferences") or []:
                    if ref.get("apiVersion") == API_VERSION and ref.get("kind") == KFJOB_KIND:
                        return ref["name"]
                return None

            self._watch(
                rec.custom.list_namespaced_custom_object,
                kf_owner,
                KF_GROUP,
                KF_VERSION,
                rec.namespace,
                PYTORCHJOB_PLURAL,
            )
            return

        def owner(job: Any) -> str | None:
            for ref in job.metadata.owner_references or []:
                if ref.api_version == API_VERSION and ref.kind == JOB_KIND:
                    return ref.name
            return None

        self._watch(self.reconciler.batch.list_namespaced_job, owner, self.reconciler.namespace)
