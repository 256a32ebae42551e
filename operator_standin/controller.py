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

from kubernetes import client

from checkpoint_storage_bench import kube
from operator_standin.crd import (
    API_VERSION,
    FIELD_MANAGER,
    JOB_KIND,
    JOB_PLURAL,
    KFJOB_KIND,
    KFJOB_PLURAL,
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
WATCH_SECONDS = 5.0  # each watch request's length: how soon a stop is seen between watches
# The custom objects of the agent, and what the stand-in makes of them.
OBJECT_KINDS = {
    JOB_PLURAL: kube.Kind(API_VERSION, JOB_KIND, JOB_PLURAL),
    KFJOB_PLURAL: kube.Kind(API_VERSION, KFJOB_KIND, KFJOB_PLURAL),
}


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


def pods_warning(pods: Iterable[dict[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) when a pod of the Job cannot go on by itself: unschedulable, or a
    container stuck waiting (image not found, bad config) — mloperator's
    ``HasUnschedulablePods`` and its container checks."""
    for pod in pods:
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                if cond.get("reason") == "Unschedulable":
                    return "Unschedulable", cond.get("message") or "pod is unschedulable"
        statuses = [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]
        for container in statuses:
            waiting = (container.get("state") or {}).get("waiting")
            if waiting is not None and waiting.get("reason") in STUCK_WAITING:
                reason = waiting["reason"]
                return reason, f"{container['name']}: {waiting.get('message') or reason}"
    return None


def job_phase(job: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[str, str, str] | None:
    """The condition (type, reason, message) the Job's state calls for, or None for no
    change: Succeeded / Failed from the Job's conditions, Warning for a stuck pod, Running
    once a pod runs."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return SUCCEEDED, REASON, "Operation has succeeded"
        if cond.get("type") == "Failed":
            message = cond.get("message") or "Job failed"
            return FAILED, cond.get("reason") or REASON, message
    warning = pods_warning(pods)
    if warning is not None:
        return WARNING, warning[0], warning[1]
    if any((p.get("status") or {}).get("phase") == "Running" for p in pods):
        return RUNNING, REASON, "Operation is running"
    return None


KF_GROUP, KF_VERSION, PYTORCHJOB_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
PYTORCHJOB = kube.Kind(f"{KF_GROUP}/{KF_VERSION}", "PyTorchJob", PYTORCHJOB_PLURAL)
# The label the training operator puts on every pod of a job.
KF_REPLICA_LABEL = "training.kubeflow.org/job-name"
# The label the Job controller puts on every pod of a batch Job.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


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


@dataclass(frozen=True)
class RunKind:
    """What runs one kind of object: the resource the stand-in creates from it, the label
    of that resource's pods, how its state maps to a condition, and the statuses of a
    refused create that no retry can cure."""

    kind: kube.Kind
    called: str
    manifest: Callable[[dict[str, Any]], dict[str, Any]]
    pod_label: str
    phase: Callable[[dict[str, Any], list[dict[str, Any]]], tuple[str, str, str] | None]
    refused: tuple[int, ...]


# A batch Job whose pod template the API refuses (schema, admission) never runs.
BATCH_RUN = RunKind(
    kube.JOB, "Kubernetes Job", job_manifest, JOB_NAME_LABEL, job_phase, (400, 403, 422)
)
# A PyTorchJob refused by the schema or the training operator's webhook never runs, nor one
# without the training operator's CRD (404).
KUBEFLOW_RUN = RunKind(
    PYTORCHJOB, "PyTorchJob", pytorchjob_manifest, KF_REPLICA_LABEL, kfjob_phase,
    (400, 403, 404, 422),
)  # fmt: skip


@dataclass
class Reconciler:
    """Reconciles the ``polyaxon.com/v1`` objects of one kind (``plural``: ``jobs`` or
    ``kfjobs``) in one namespace, through the shared object layer (one request path: an
    answer is a :class:`checkpoint_storage_bench.kube.KubeError` named by its status)."""

    api: client.ApiClient
    namespace: str
    sink: StatusSink | None = None
    plural: str = JOB_PLURAL
    kube: kube.Client = field(init=False)
    kind: kube.Kind = field(init=False)
    runs: RunKind = field(init=False)

    def __post_init__(self) -> None:
        self.kube = kube.Client(self.api, field_manager=FIELD_MANAGER)
        self.kind = OBJECT_KINDS[self.plural]
        self.runs = KUBEFLOW_RUN if self.plural == KFJOB_PLURAL else BATCH_RUN

    # -- the object --------------------------------------------------------------------------

    def get(self, name: str) -> dict[str, Any] | None:
        return self.kube.get(self.kind, name, self.namespace)

    def names(self) -> list[str]:
        items, _ = self.kube.list(self.kind, self.namespace)
        return [item["metadata"]["name"] for item in items]

    def _store(self, obj: dict[str, Any], stored: dict[str, Any]) -> None:
        """``obj`` becomes the object as stored (new resourceVersion)."""
        obj.clear()
        obj.update(stored)

    def _patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        patch = {"status": status}
        self._store(
            obj, self.kube.patch(self.kind, name, patch, self.namespace, subresource="status")
        )

    def _set_finalizers(self, obj: dict[str, Any], finalizers: list[str]) -> None:
        # A JSON merge patch replaces the list whole; the resourceVersion makes it fail on a
        # concurrent change (the agent's clean) instead of overwriting it.
        meta = obj["metadata"]
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        self._store(obj, self.kube.patch(self.kind, meta["name"], patch, self.namespace))

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
            self._reconcile_run(obj)
            return
        if "batchJobSpec" not in obj:
            self._log(obj, FAILED, "OperatorUnsupported", "the stand-in runs batchJobSpec only")
            return
        self._reconcile_run(obj)

    def _reconcile_run(self, obj: dict[str, Any]) -> None:
        """Create what runs the object (a batch Job, a PyTorchJob) when there is none, else
        map its state and its pods' to the object's condition."""
        runs, name = self.runs, obj["metadata"]["name"]
        run = self.kube.get(runs.kind, name, self.namespace)
        if run is None:
            last = last_condition(obj.get("status") or {})
            if last is not None and last["type"] in (RUNNING, WARNING):
                # It ran and is gone: deleted by someone else (mloperator's MarkJobAsDeleted).
                self._log(obj, STOPPED, "JobDeleted", f"The underlying {runs.called} was deleted")
                return
            try:
                self.kube.request("POST", runs.kind.path(self.namespace), runs.manifest(obj))
            except kube.Conflict:
                return  # created by an earlier pass; its status comes next pass
            except kube.KubeError as exc:
                self._log(obj, WARNING, "OperatorCreateJob", exc.server_message)
                if exc.status in runs.refused:
                    self._log(obj, FAILED, "OperatorCreateJob", exc.server_message)
                return
            self._log(obj, STARTING, REASON, "Operation is starting")
            return
        selector = f"{runs.pod_label}={name}"
        pods, _ = self.kube.list(kube.POD, self.namespace, labelSelector=selector)
        phase = runs.phase(run, pods)
        if phase is not None:
            self._log(obj, *phase)

    def _delete_run(self, name: str) -> None:
        """Delete what runs the object (background: the pods get their grace period)."""
        path = self.runs.kind.path(self.namespace, name)
        try:
            self.kube.request("DELETE", path, query={"propagationPolicy": "Background"})
        except kube.NotFound:
            pass

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
        except (kube.NotFound, kube.Conflict):
            pass  # gone, or changed since read: the next pass finalizes what is left

    def _clean_up(self, obj: dict[str, Any]) -> None:
        """Delete a done object once its ``ttlSecondsAfterFinished`` has passed (right away
        without one), as mloperator's ``handleTTL`` does."""
        ttl = (obj.get("termination") or {}).get("ttlSecondsAfterFinished")
        done_at = _parse_time((obj.get("status") or {}).get("completionTime"))
        if ttl and done_at is not None:
            if (datetime.now(UTC) - done_at).total_seconds() < ttl:
                return
        self.kube.delete(self.kind, obj["metadata"]["name"], self.namespace)


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

    def _watch(self, kind: kube.Kind, name_of: Callable[[dict[str, Any]], str | None]) -> None:
        """Queue the object an event of ``kind`` names: the object layer's watch (list, then
        watch from there, resumed and listed again as it must), each request
        :data:`WATCH_SECONDS` long so that a stop is seen soon."""
        rec = self.reconciler
        while not self.stop_event.is_set():
            try:
                events = rec.kube.watch(
                    kind,
                    rec.namespace,
                    watch_seconds=WATCH_SECONDS,
                    stop=self.stop_event.is_set,
                    on_retry=lambda exc: log.debug("watch of %s: %s", kind.plural, exc),
                )
                for _, obj in events:
                    name = name_of(obj)
                    if name:
                        self._queue.put(name)
                    if self.stop_event.is_set():
                        return
            except Exception as exc:  # noqa: BLE001 - refused (no CRD yet): the resync covers it
                log.debug("watch of %s: %r", kind.plural, exc)
                self.stop_event.wait(1.0)

    def _watch_objects(self) -> None:
        self._watch(self.reconciler.kind, lambda o: o["metadata"]["name"])

    def _watch_jobs(self) -> None:
        """The resources the objects own: a change of one is its owner's change."""
        owner_kind = self.reconciler.kind.kind

        def owner(run: dict[str, Any]) -> str | None:
            for ref in run["metadata"].get("ownerReferences") or []:
                if ref.get("apiVersion") == API_VERSION and ref.get("kind") == owner_kind:
                    return ref["name"]
            return None

        self._watch(self.reconciler.runs.kind, owner)
