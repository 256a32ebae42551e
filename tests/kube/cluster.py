"""Helpers for the tier that runs against the real control plane (localcluster/controlplane.py).

Objects are handled as the API's JSON (camelCase dicts), like the hook does; reads, deletes
and waits go through the shared object layer (checkpoint_storage_bench/kube.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.retry import Deadline
from localcluster.client import AdminClient
from localcluster.controlplane import NODE_NAME, write_kubeconfig

REPO = Path(__file__).resolve().parents[2]
CONNECTIONS = REPO / "connections"
NAMESPACE = "ml-team"
CLAIM = "training-checkpoints"
SERVICE_ACCOUNT = "storage-profile-hook"
BASELINE, THROUGHPUT = "checkpoint-baseline", "checkpoint-throughput"
# A class the driver refuses: `tier` is not in --accepted-mutable-parameter-names.
REFUSED = "checkpoint-refused"
STORAGE_CLASS_FILE = CONNECTIONS / "storageclass-hostpath.yaml"
CLASSES_FILE = CONNECTIONS / "vac-hostpath.yaml"
RBAC_FILE = CONNECTIONS / "rbac-storage-profile.yaml"
CLAIM_FILE = CONNECTIONS / "claim-training-checkpoints.yaml"


def load_docs(path: Path) -> list[dict]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d]


def is_manifest(doc: Any) -> bool:
    return isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 30.0, interval: float = 0.2) -> Any:
    """Poll ``fn`` until it returns something truthy; fail with ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


@dataclass
class HookRun:
    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def __str__(self) -> str:
        return f"$ {' '.join(self.argv)}\nexit {self.exit_code}\n{self.output}"


class Cluster(AdminClient):
    """The admin's view of a started control plane, plus what the tests share.

    Attributes:
        kube: The object layer on the admin's client (same field manager as ``apply``).
    """

    def claim(self, name: str = CLAIM, namespace: str = NAMESPACE) -> dict | None:
        return self.kube.get(kube.CLAIM, name, namespace)

    def pv(self, name: str) -> dict | None:
        return self.kube.get(kube.VOLUME, name)

    def patch_claim(self, patch: dict, name: str = CLAIM, namespace: str = NAMESPACE) -> dict:
        return self.request(
            "PATCH", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}", patch
        )

    def events(self, name: str = CLAIM, namespace: str = NAMESPACE) -> list[dict]:
        items, _ = self.kube.list(
            kube.EVENT,
            namespace,
            fieldSelector=f"involvedObject.name={name},involvedObject.kind=PersistentVolumeClaim",
        )
        return items

    # -- manifests -------------------------------------------------------------------------------

    def create_dry_run(self, doc: dict) -> dict:
        """POST with dryRun=All and fieldValidation=Strict: admission and validation, no write."""
        kind = self.kube.kind(doc["apiVersion"], doc["kind"])
        path = kind.path(doc.get("metadata", {}).get("namespace"))
        return self.request("POST", path, doc, dryRun="All", fieldValidation="Strict")

    # -- the cluster's fixed parts ---------------------------------------------------------------

    def bootstrap(self) -> None:
        """Namespace, node, the hostpath StorageClass and classes, the hook's RBAC."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other-team"}})
        # No kubelet: a Node object only, for volume.kubernetes.io/selected-node to name.
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": NODE_NAME, "labels": {"kubernetes.io/hostname": NODE_NAME}},
            }
        )
        self.apply_file(STORAGE_CLASS_FILE)
        self.apply_file(CLASSES_FILE)
        self.apply_file(RBAC_FILE)
        # A class of the same driver with a parameter the driver does not accept.
        self.apply(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "VolumeAttributesClass",
                "metadata": {"name": REFUSED},
                "driverName": "hostpath.csi.k8s.io",
                "parameters": {"iops": "9000", "throughput": "500", "tier": "gold"},
            }
        )

    def storage_class_name(self) -> str:
        return load_docs(STORAGE_CLASS_FILE)[0]["metadata"]["name"]

    def shipped_claim(self, name: str = CLAIM, namespace: str = NAMESPACE) -> dict:
        """connections/claim-training-checkpoints.yaml with only storageClassName changed
        (to the hostpath class), and optionally another name/namespace for bystanders."""
        (doc,) = load_docs(CLAIM_FILE)
        doc["metadata"]["name"] = name
        doc["metadata"]["namespace"] = namespace
        doc["spec"]["storageClassName"] = self.storage_class_name()
        return doc

    def create_bound_claim(self, name: str = CLAIM, namespace: str = NAMESPACE) -> dict:
        """Apply the claim, select the node as the scheduler would, wait until it is Bound
        and its volume settled on the class it was created with."""
        self.apply(self.shipped_claim(name, namespace))
        self.patch_claim(
            {"metadata": {"annotations": {"volume.kubernetes.io/selected-node": NODE_NAME}}},
            name,
            namespace,
        )
        return self.kube.wait(kube.CLAIM, name, _bound, Deadline(60), namespace)

    def delete_claim(self, name: str = CLAIM, namespace: str = NAMESPACE) -> None:
        """Delete the claim, then wait until it and its (Delete-policy) volume are gone."""
        claim = self.claim(name, namespace)
        if claim is None:
            return
        pv_name = claim["spec"].get("volumeName")
        self.kube.delete(kube.CLAIM, name, namespace)
        self.kube.wait(kube.CLAIM, name, _gone, Deadline(30), namespace)
        if pv_name:
            self.kube.wait(kube.VOLUME, pv_name, _gone, Deadline(60))

    def settled(self, cls: str, name: str = CLAIM, namespace: str = NAMESPACE) -> dict | None:
        """The claim, if spec and current class are ``cls`` and no modification is pending."""
        claim = self.claim(name, namespace)
        if claim is None:
            return None
        status = claim.get("status") or {}
        if (
            claim["spec"].get("volumeAttributesClassName") == cls
            and status.get("currentVolumeAttributesClassName") == cls
            and not status.get("modifyVolumeStatus")
        ):
            return claim
        return None

    # -- the hook's identity -------------------------------------------------------------------

    def token(self, service_account: str = SERVICE_ACCOUNT, namespace: str = NAMESPACE) -> str:
        """A token of the hook's ServiceAccount."""
        return self.service_account_token(service_account, namespace)

    def service_account_kubeconfig(self, path: Path) -> Path:
        return write_kubeconfig(
            path,
            self.plane.server,
            self.plane.pki.ca_crt,
            user={"token": self.token()},
            user_name=f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}",
            namespace=NAMESPACE,
        )


def _gone(obj: dict | None) -> bool:
    return obj is None


def _bound(claim: dict | None) -> dict | None:
    if claim and (claim.get("status") or {}).get("phase") == "Bound":
        return claim
    return None


def run_hook(kubeconfig: Path, *args: str, timeout: float = 120) -> HookRun:
    """``python -m hooks.storage_profile ARGS --kubeconfig K`` as a subprocess from the repo root."""
    sub, *rest = args
    argv = [sys.executable, "-m", "hooks.storage_profile", sub, "--kubeconfig", str(kubeconfig)]
    argv += rest
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    done = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    return HookRun(argv, done.returncode, done.stdout, done.stderr)


def switch(kubeconfig: Path, target: str, *extra: str, timeout: float = 120) -> HookRun:
    return run_hook(
        kubeconfig,
        "switch",
        "--namespace",
        NAMESPACE,
        "--claim",
        CLAIM,
        "--to",
        target,
        "--settle",
        "kubernetes",
        # The hook's own deadline (exit 5) comes well before the subprocess timeout.
        "--timeout",
        str(int(timeout / 2)),
        *extra,
        timeout=timeout,
    )


def names(items: Iterable[dict]) -> list[str]:
    return [i["metadata"]["name"] for i in items]
