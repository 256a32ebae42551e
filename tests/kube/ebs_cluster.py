"""The EBS chain's cluster (localcluster/ebs.py): the shipped EBS manifests, applied unchanged.

Helpers only; the tests are tests/kube/test_ebs_*.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from checkpoint_storage_bench import kube
from localcluster.controlplane import ControlPlane
from localcluster.ebs import EBS_DRIVER, Credentials, EbsChain
from tests.kube.cluster import (
    CLAIM,
    CLAIM_FILE,
    CONNECTIONS,
    NAMESPACE,
    RBAC_FILE,
    Cluster,
    HookRun,
    load_docs,
    wait_for,
)

STORAGE_CLASS_FILE = CONNECTIONS / "storageclass-ebs-gp3.yaml"
CLASSES_FILE = CONNECTIONS / "vac-ebs-gp3.yaml"
HOOK_POLICY_FILE = CONNECTIONS / "iam-policy-storage-profile-hook.json"
HOOK_USER = "storage-profile-hook"


class EbsCluster(Cluster):
    """The admin's view of the EBS chain's plane, and moto's EC2 as its administrator."""

    def __init__(self, plane: ControlPlane, chain: EbsChain) -> None:
        super().__init__(plane)
        self.chain = chain
        self.moto = chain.moto
        self.ec2 = chain.moto.client("ec2")
        self._hook_credentials: Credentials | None = None

    def bootstrap(self) -> None:
        """The namespace, the shipped EBS StorageClass and classes, the hook's RBAC."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        self.apply_file(STORAGE_CLASS_FILE)
        self.apply_file(CLASSES_FILE)
        self.apply_file(RBAC_FILE)
        self.wait_for_default_service_account(NAMESPACE)

    # -- the claim -----------------------------------------------------------------------------

    def create_shipped_claim(self) -> dict:
        """connections/claim-training-checkpoints.yaml as shipped, its node selected as the
        scheduler does for its first pod; returns it once Bound."""
        (doc,) = load_docs(CLAIM_FILE)
        self.apply(doc)
        self.patch_claim(
            {
                "metadata": {
                    "annotations": {"volume.kubernetes.io/selected-node": self.chain.node_name}
                }
            }
        )
        return wait_for(
            "the shipped claim bound to an EBS volume",
            lambda: (c := self.claim()) and (c.get("status") or {}).get("phase") == "Bound" and c,
            timeout=120,
        )

    def remove_claim(self) -> None:
        """Delete the claim, then its Retained PV and EBS volume, as the StorageClass's
        comment says an operator does by hand."""
        claim = self.claim()
        if claim is None:
            return
        pv_name = claim["spec"].get("volumeName")
        handle = None
        if pv_name and (pv := self.pv(pv_name)) is not None:
            handle = pv["spec"]["csi"]["volumeHandle"]
        self.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{CLAIM}")
        wait_for("the claim deleted", lambda: self.claim() is None)
        if pv_name:
            self.kube.delete(kube.VOLUME, pv_name)
            wait_for(f"volume {pv_name} deleted", lambda: self.pv(pv_name) is None)
        if handle:
            self.ec2.delete_volume(VolumeId=handle)

    def handle(self, claim: dict | None = None) -> str:
        claim = claim or self.claim()
        assert claim is not None
        pv = self.pv(claim["spec"]["volumeName"])
        assert pv is not None
        assert pv["spec"]["csi"]["driver"] == EBS_DRIVER
        return pv["spec"]["csi"]["volumeHandle"]

    def volume(self, handle: str) -> dict:
        """What EC2 says of the volume."""
        (volume,) = self.ec2.describe_volumes(VolumeIds=[handle])["Volumes"]
        return volume

    def modifications(self, handle: str) -> list[dict]:
        return self.ec2.describe_volumes_modifications(VolumeIds=[handle])["VolumesModifications"]

    # -- the hook -----------------------------------------------------------------------------

    def hook_credentials(self) -> Credentials:
        """An IAM user holding only the shipped policy of the hook (made once)."""
        if self._hook_credentials is None:
            policy = json.loads(HOOK_POLICY_FILE.read_text())
            self._hook_credentials = self.moto.create_user(HOOK_USER, policy)
        return self._hook_credentials

    def run_hook(
        self,
        kubeconfig: Path,
        *args: str,
        credentials: Credentials | None = None,
        timeout: float = 180,
    ) -> HookRun:
        """``python -m hooks.storage_profile ARGS`` as the shipped ServiceAccount and, on
        AWS's side, as ``credentials`` (default: the user holding the hook's policy)."""
        sub, *rest = args
        argv = [sys.executable, "-m", "hooks.storage_profile", sub, "--kubeconfig", str(kubeconfig)]
        argv += ["--namespace", NAMESPACE, "--claim", CLAIM, *rest]
        env: dict[str, Any] = {
            k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("AWS_")
        }
        env.update(self.moto.env(credentials or self.hook_credentials()))
        done = subprocess.run(
            argv,
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return HookRun(argv, done.returncode, done.stdout, done.stderr)
