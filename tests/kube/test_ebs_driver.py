"""The shipped EBS manifests through the real AWS EBS CSI driver, against moto's EC2.

The chain (localcluster/ebs.py): kube-apiserver, the PV binder, csi-provisioner and
csi-resizer, the upstream driver in controller mode, moto's EC2 with IAM enforced. The hook
runs as a subprocess, as the shipped ServiceAccount on Kubernetes' side and, on AWS's side,
as an IAM user holding only connections/iam-policy-storage-profile-hook.json.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from localcluster.ebs import CONTROLLER_SERVICE_ACCOUNT, EBS_DRIVER, ZONE
from tests.kube.cluster import BASELINE, CLAIM, THROUGHPUT, wait_for
from tests.kube.ebs_cluster import EbsCluster

pytestmark = pytest.mark.kube

# A class the driver refuses: throughput spelled as GKE's driver takes it ("250Mi"), which
# EBS's cannot parse (InvalidArgument, so the resizer reports Infeasible).
MISSPELLED = "checkpoint-throughput-misspelled"
EC2_REFUSALS = ("AccessDenied", "UnauthorizedOperation")


@pytest.fixture(scope="module")
def kubeconfig(ebs: EbsCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TokenRequest token of the shipped storage-profile-hook ServiceAccount."""
    return ebs.service_account_kubeconfig(tmp_path_factory.mktemp("ebs-sa") / "kubeconfig")


@pytest.fixture
def ebs_claim(ebs: EbsCluster) -> Iterator[dict]:
    """The shipped claim, provisioned afresh (a new volume, with no modification history and
    an empty ledger), settled on checkpoint-baseline."""
    ebs.remove_claim()
    ebs.create_shipped_claim()
    yield wait_for("the claim settled on checkpoint-baseline", lambda: ebs.settled(BASELINE))


def test_the_shipped_classes_provision_a_gp3_volume_in_the_nodes_zone(
    ebs: EbsCluster, ebs_claim: dict
) -> None:
    pv = ebs.pv(ebs_claim["spec"]["volumeName"])
    handle = pv["spec"]["csi"]["volumeHandle"]
    assert pv["spec"]["csi"]["driver"] == EBS_DRIVER
    assert handle.startswith("vol-")
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["spec"]["volumeAttributesClassName"] == BASELINE
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    zones = {v for t in terms for e in t["matchExpressions"] for v in e["values"]}
    assert zones == {ZONE}

    volume = ebs.volume(handle)
    # The StorageClass's type and encryption, the baseline class's performance, the claim's size.
    assert (volume["VolumeType"], volume["Iops"], volume["Throughput"]) == ("gp3", 3000, 125)
    assert volume["Encrypted"] is True
    assert volume["Size"] == 200
    assert volume["AvailabilityZone"] == ZONE
    tags = {t["Key"]: t["Value"] for t in volume.get("Tags", [])}
    assert tags["CSIVolumeName"] == pv["metadata"]["name"]
    assert tags["kubernetes.io/created-for/pvc/name"] == CLAIM
    assert ebs.modifications(handle) == []


def test_a_switch_settles_at_the_provider_through_the_real_driver(
    ebs: EbsCluster, ebs_claim: dict, kubeconfig: Path, tmp_path: Path
) -> None:
    handle = ebs.handle(ebs_claim)
    summary = tmp_path / "switch.json"

    run = ebs.run_hook(
        kubeconfig, "switch", "--to", THROUGHPUT, "--settle", "provider",
        "--timeout", "150", "--summary-json", str(summary),
    )  # fmt: skip

    assert run.exit_code == 0, run
    report = json.loads(summary.read_text())
    assert report["outcome"] == "settled", report
    assert (report["driver"], report["volume_handle"]) == (EBS_DRIVER, handle)
    assert report["provider"] == "aws-ebs"
    assert report["provider_settled_at"] is not None
    assert any(f"EC2 modification of {handle} completed" in n for n in report["notes"]), report
    # The resizer called the driver, the driver called EC2 ModifyVolume with the class's values.
    volume = ebs.volume(handle)
    assert (volume["VolumeType"], volume["Iops"], volume["Throughput"]) == ("gp3", 6000, 250)
    (mod,) = ebs.modifications(handle)
    assert mod["ModificationState"] == "completed"
    assert (mod["TargetIops"], mod["TargetThroughput"]) == (6000, 250)
    assert ebs.settled(THROUGHPUT)
    assert (
        ebs.pv(ebs_claim["spec"]["volumeName"])["spec"]["volumeAttributesClassName"] == THROUGHPUT
    )

    # status, plan and release read the same objects.
    status = ebs.run_hook(kubeconfig, "status", "-o", "json")
    assert status.exit_code == 0, status
    state = json.loads(status.stdout)
    assert (state["desiredClass"], state["currentClass"]) == (THROUGHPUT, THROUGHPUT)
    assert state["lease"]["holder"] == report["holder"]
    assert (state["driver"], state["volumeHandle"]) == (EBS_DRIVER, handle)
    plan_file = tmp_path / "plan.json"
    plan = ebs.run_hook(
        kubeconfig, "plan", "--profiles", f"{BASELINE},{THROUGHPUT}", "--summary-json",
        str(plan_file),
    )  # fmt: skip
    assert plan.exit_code == 0, plan
    planned = json.loads(plan_file.read_text())
    assert (planned["driver"], planned["current_class"]) == (EBS_DRIVER, THROUGHPUT)
    # The switch just made is in the ledger's window; the run needs two more.
    assert (planned["ledger_in_window"], planned["modifications_needed"]) == (1, 2)
    assert planned["fits"] is True
    release = ebs.run_hook(kubeconfig, "release")
    assert release.exit_code == 0, release
    after = json.loads(ebs.run_hook(kubeconfig, "status", "-o", "json").stdout)
    assert not (after["lease"] or {}).get("holder"), after["lease"]


def test_a_class_the_driver_refuses_is_rolled_back_and_nothing_is_lost(
    ebs: EbsCluster, ebs_claim: dict, kubeconfig: Path, tmp_path: Path
) -> None:
    ebs.apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttributesClass",
            "metadata": {"name": MISSPELLED},
            "driverName": EBS_DRIVER,
            "parameters": {"type": "gp3", "iops": "6000", "throughput": "250Mi"},
        }
    )
    handle = ebs.handle(ebs_claim)
    summary = tmp_path / "switch.json"

    run = ebs.run_hook(
        kubeconfig, "switch", "--to", MISSPELLED, "--settle", "provider",
        "--on-infeasible", "rollback", "--timeout", "150", "--summary-json", str(summary),
    )  # fmt: skip

    assert run.exit_code == 4, run
    report = json.loads(summary.read_text())
    assert report["rolled_back"] is True, report
    assert "Could not parse throughput" in run.output, run
    # Back on the class it had, on the same volume, which EC2 never modified.
    claim = wait_for("the claim settled on checkpoint-baseline", lambda: ebs.settled(BASELINE))
    assert claim["spec"]["volumeName"] == ebs_claim["spec"]["volumeName"]
    assert claim["status"]["phase"] == "Bound"
    assert ebs.handle(claim) == handle
    volume = ebs.volume(handle)
    assert (volume["VolumeType"], volume["Iops"], volume["Throughput"]) == ("gp3", 3000, 125)
    assert volume["State"] == "available"
    # The rollback's ControllerModifyVolume asked for the values the volume has: the driver
    # sends EC2 nothing then (a ModifyVolume that changes nothing still counts against AWS's
    # modifications per volume).
    assert ebs.modifications(handle) == []


def test_the_hooks_iam_policy_allows_its_ec2_calls_and_nothing_more(
    ebs: EbsCluster, ebs_claim: dict
) -> None:
    handle = ebs.handle(ebs_claim)
    hook = ebs.moto.client("ec2", ebs.hook_credentials())

    assert hook.describe_volumes_modifications(VolumeIds=[handle])["VolumesModifications"] == []
    for name, call in (
        ("DescribeVolumes", lambda: hook.describe_volumes(VolumeIds=[handle])),
        ("ModifyVolume", lambda: hook.modify_volume(VolumeId=handle, Iops=4000)),
        ("DeleteVolume", lambda: hook.delete_volume(VolumeId=handle)),
    ):
        with pytest.raises(ClientError) as refused:
            call()
        assert refused.value.response["Error"]["Code"] in EC2_REFUSALS, name
    assert ebs.volume(handle)["Iops"] == 3000


def test_the_hook_refuses_to_switch_when_its_iam_user_lacks_the_policy(
    ebs: EbsCluster, ebs_claim: dict, kubeconfig: Path
) -> None:
    # A user who may read volumes, but not their modifications (the one call the hook makes).
    other = ebs.moto.create_user(
        "storage-profile-hook-without-policy",
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "ec2:DescribeVolumes", "Resource": "*"}],
        },
    )

    run = ebs.run_hook(
        kubeconfig, "switch", "--to", THROUGHPUT, "--settle", "provider", "--timeout", "60",
        credentials=other,
    )  # fmt: skip

    assert run.exit_code == 3, run
    assert "DescribeVolumesModifications" in run.output, run
    # Refused before the patch: the claim and the volume are as they were.
    assert ebs.settled(BASELINE)
    assert ebs.volume(ebs.handle(ebs_claim))["Iops"] == 3000


def test_the_controller_rbac_grants_the_class_reads_a_switch_needs_and_no_secrets(
    ebs: EbsCluster,
) -> None:
    user = f"system:serviceaccount:kube-system:{CONTROLLER_SERVICE_ACCOUNT}"

    def allowed(verb: str, resource: str, group: str = "", sub: str = "") -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system"],
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": sub,
                    "namespace": "ml-team",
                },
            },
        }
        answer = ebs.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return answer["status"].get("allowed", False)

    for verb in ("get", "list", "watch"):
        assert allowed(verb, "volumeattributesclasses", "storage.k8s.io"), verb
    assert allowed("patch", "persistentvolumeclaims", sub="status")
    assert allowed("create", "persistentvolumes")
    assert not allowed("patch", "persistentvolumeclaims")  # the claim's spec is the hook's
    assert not allowed("get", "secrets")
    assert not allowed("create", "volumeattributesclasses", "storage.k8s.io")
