"""A stand-in for Polyaxon's operator (polyaxon/mloperator), for the local node only.

Polyaxon's agent turns each queued run into a ``polyaxon.com/v1`` custom object (``Job`` for
the bundle's components) whose fields hold a pod template; on a cluster, mloperator turns
that object into a batch Job, writes its phases to the object's status and, when the object
says ``syncStatuses: true``, posts each phase to the Polyaxon API; the agent deletes the
object to stop the run, and the operator deletes it once the run is done. mloperator cannot
be had here (the Go module proxy refuses it and its dependencies, and the readable snapshot
reconciles the older ``core.polyaxon.com`` group), so this package does that part, and only
that part, in Python on the shared object layer (``checkpoint_storage_bench.kube``: one request
path, its list-then-watch, errors named once). It is not part of the shipped bundle
(``components/``, ``polyaxonfiles/``, ``connections/``): a real cluster runs the real operator
from Polyaxon's charts.

What it does (:mod:`operator_standin.controller`):

- installs CRDs for ``jobs.polyaxon.com`` and ``services.polyaxon.com`` with the names, scope,
  top-level fields and status subresource of the charts' CRDs (:mod:`operator_standin.crd`);
- for each ``Job`` object in one namespace: records the start time, adds mloperator's two
  finalizers, creates the batch Job (same name, labels, annotations, pod template,
  ``termination.backoffLimit`` / ``podFailurePolicy`` / ``activeDeadlineSeconds``, owned by
  the object);
- maps the Job and its pods to mloperator's conditions (Starting on create, Running once a
  pod runs, Warning for an unschedulable pod or a container stuck waiting, Succeeded /
  Failed from the Job's conditions, Stopped when the Job vanished after running), writes
  them to the object's status and posts each one to ``/api/v1/{owner}/{project}/runs/
  {uuid}/statuses`` when ``syncStatuses`` is set;
- on deletion (the agent's stop): posts ``stopped`` unless the run is done, deletes the batch
  Job (its pods get their grace period), removes the finalizers;
- deletes a done object after ``termination.ttlSecondsAfterFinished`` (at once without one);
- for each ``KfJob`` with a ``pytorchJobSpec`` (a ``kind: pytorchjob`` run), the same, with a
  ``kubeflow.org/v1`` PyTorchJob for Kubeflow's training operator to run instead of the batch
  Job (mloperator's ``generatePytorchJob``), its phases from the job's last condition
  (Created/Running -> Running, Succeeded, Failed, Restarting -> Warning).

What it leaves out, compared with mloperator:

- every other kind: ``Service`` objects are served by the CRD but not run (no Deployment, no
  Service), a ``KfJob`` of TFJob or MPIJob is marked Failed, and ``Cluster`` (Ray, Dask) and
  Spark have no CRD here; an unknown spec is marked Failed;
- log collection at the end (mloperator asks the streams service to archive the pod logs
  before the object goes): here the logs reach the server only through Polyaxon's sidecar;
- notifications (``notifications`` on the object, the notifications finalizer is added and
  removed but nothing is sent);
- in-place updates of a running Job when the agent ``apply``\\ s a changed object;
- ``activeDeadlineSeconds`` is left to the Job controller (the run ends Failed with
  DeadlineExceeded, where mloperator marks it Stopped); ``ttlSecondsAfterFinished`` is applied
  to the object, not copied to the Job;
- leader election, metrics, webhooks, Istio, several namespaces, concurrent reconciles, RBAC
  of its own (it runs with the kubeconfig it is given), retries with back-off (a fixed
  resync every two seconds instead).
"""
