"""The cloud identity and encryption the bundle ships: IAM/KMS policy documents parsed and
checked for exactly the actions they must grant, the GCP custom role, and the commented
ServiceAccount annotations validated strictly against Kubernetes 1.34 once uncommented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.bundle.bundle import CONNECTIONS, ROOT, load_yaml_documents

ACTION = re.compile(r"^[a-z0-9-]+:[A-Za-z]+\*?$")


def policy(name: str) -> dict:
    doc = json.loads((CONNECTIONS / name).read_text())
    assert doc["Version"] == "2012-10-17"
    assert doc["Statement"], name
    for statement in doc["Statement"]:
        assert statement["Effect"] == "Allow", statement
        assert set(statement) <= {"Sid", "Effect", "Principal", "Action", "Resource", "Condition"}
        for action in actions_of(statement):
            assert ACTION.match(action), action
    return doc


def actions_of(statement: dict) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else list(action)


def all_actions(doc: dict) -> list[str]:
    return [a for s in doc["Statement"] for a in actions_of(s)]


def hook_ec2_actions() -> set[str]:
    """The IAM actions of every EC2 call in the hook's code (boto3's snake_case names)."""
    source = "\n".join(p.read_text() for p in (ROOT / "hooks").rglob("*.py"))
    return {
        "ec2:" + "".join(part.title() for part in name.split("_"))
        for name in re.findall(r"\.(describe_[a-z_]+|modify_[a-z_]+)\(", source)
    }


def test_the_hooks_aws_policy_grants_exactly_what_it_calls() -> None:
    called = hook_ec2_actions()
    assert called, "no EC2 call found in hooks/"
    doc = policy("iam-policy-storage-profile-hook.json")
    actions = all_actions(doc)
    # Exactly: nothing the code does not call (least privilege), nothing it calls missing.
    assert sorted(actions) == sorted(called) and len(actions) == len(set(actions))
    # Describe* calls have no resource-level permissions: "*" is the only resource they take.
    assert all(s["Resource"] == "*" and "Principal" not in s for s in doc["Statement"])


def test_the_docs_name_exactly_the_hooks_aws_calls() -> None:
    bundle = (ROOT / "docs" / "bundle.md").read_text()
    (row,) = [line for line in bundle.splitlines() if line.startswith("| EKS |")]
    assert set(re.findall(r"`(ec2:[A-Za-z]+)`", row)) == hook_ec2_actions(), row


def test_pod_identity_trust() -> None:
    (statement,) = policy("iam-trust-pod-identity.json")["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(actions_of(statement)) == ["sts:AssumeRole", "sts:TagSession"]


def test_the_ebs_drivers_kms_grants() -> None:
    grants, use = policy("iam-policy-ebs-csi-kms.json")["Statement"]
    assert sorted(actions_of(grants)) == ["kms:CreateGrant", "kms:ListGrants", "kms:RevokeGrant"]
    # Grants only for AWS resources (EBS), never to arbitrary principals.
    assert grants["Condition"] == {"Bool": {"kms:GrantIsForAWSResource": "true"}}
    assert sorted(actions_of(use)) == sorted(
        ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]
    )
    for statement in (grants, use):
        (key,) = statement["Resource"]
        assert re.match(r"^arn:aws:kms:[a-z0-9-]+:\d{12}:key/", key), key


def test_hyperpod_driver_role_and_key_policy() -> None:
    doc = policy("iam-policy-ebs-csi-hyperpod.json")
    assert sorted(all_actions(doc)) == [
        "eks:DescribeCluster",
        "sagemaker:AttachClusterNodeVolume",
        "sagemaker:DetachClusterNodeVolume",
    ]
    key = policy("kms-key-policy-hyperpod.json")
    assert sorted(all_actions(key)) == ["kms:CreateGrant", "kms:DescribeKey"]
    (create,) = [s for s in key["Statement"] if actions_of(s) == ["kms:CreateGrant"]]
    condition = create["Condition"]
    assert condition["StringEquals"]["kms:ViaService"].startswith("ec2.")
    assert condition["ForAnyValue:StringEquals"] == {"kms:EncryptionContextKeys": "aws:ebs:id"}
    assert condition["Bool"] == {"kms:GrantIsForAWSResource": True}
    assert condition["ForAllValues:StringEquals"] == {"kms:GrantOperations": ["Decrypt"]}
    assert all("Principal" in s for s in key["Statement"])  # a key policy names principals


def test_the_gcp_custom_role() -> None:
    role = yaml.safe_load((CONNECTIONS / "gcp-role-storage-profile-hook.yaml").read_text())
    assert set(role) == {"title", "description", "stage", "includedPermissions"}
    assert role["includedPermissions"] == ["compute.disks.get"]
    assert role["stage"] == "GA"


def uncommented_variants(path: Path) -> dict[str, dict]:
    """The ServiceAccount with each commented ``annotations:`` block switched on."""
    text = path.read_text()
    variants = {}
    for match in re.finditer(
        r"^  # --- (?P<name>[^\n]+)\n(?P<block>(?:  # (?!---)[^\n]*\n)+)", text, re.MULTILINE
    ):
        block = re.sub(r"^  # ", "  ", match["block"], flags=re.MULTILINE)
        (doc,) = [d for d in yaml.safe_load_all(text.replace(match["block"], block)) if d]
        variants[match["name"]] = doc
    return variants


def test_serviceaccount_annotations_are_valid_once_uncommented() -> None:
    path = CONNECTIONS / "serviceaccount-identity-examples.yaml"
    (as_shipped,) = [d for d in load_yaml_documents(path) if d]
    assert "annotations" not in as_shipped["metadata"]  # applying it as is changes nothing
    rbac = [
        d
        for d in load_yaml_documents(CONNECTIONS / "rbac-storage-profile.yaml")
        if d and d["kind"] == "ServiceAccount"
    ]
    assert [d["metadata"] for d in rbac] == [as_shipped["metadata"]]

    variants = uncommented_variants(path)
    assert set(variants) == {
        "EKS (IRSA)",
        "GKE (Workload Identity, linked to a Google service account)",
    }
    for doc in variants.values():
        assert kubernetes_validate.validate(doc, "1.34.0", strict=True)
    (irsa,) = variants["EKS (IRSA)"]["metadata"]["annotations"].items()
    assert irsa[0] == "eks.amazonaws.com/role-arn"
    assert re.match(r"^arn:aws:iam::\d{12}:role/storage-profile-hook$", irsa[1])
    (gke,) = variants["GKE (Workload Identity, linked to a Google service account)"]["metadata"][
        "annotations"
    ].items()
    assert gke[0] == "iam.gke.io/gcp-service-account"
    assert re.match(r"^[a-z][a-z0-9-]+@[A-Z_a-z0-9-]+\.iam\.gserviceaccount\.com$", gke[1])


def test_the_ebs_storage_class_encrypts() -> None:
    path = CONNECTIONS / "storageclass-ebs-gp3.yaml"
    (sc,) = load_yaml_documents(path)
    assert sc["parameters"]["encrypted"] == "true"
    assert "kmsKeyId" not in sc["parameters"]  # the AWS-managed key unless one is named
    # The optional customer-managed key, commented in place, is a valid parameter once on.
    text = path.read_text()
    line = re.search(r"^  # (kmsKeyId: arn:aws:kms:[^\n]+)$", text, re.MULTILINE)
    assert line, "the commented kmsKeyId example is missing"
    (with_key,) = yaml.safe_load_all(text.replace(line[0], "  " + line[1]))
    assert with_key["parameters"]["kmsKeyId"].startswith("arn:aws:kms:")
    assert kubernetes_validate.validate(with_key, "1.34.0", strict=True)


def test_the_docs_name_every_identity_file() -> None:
    bundle = (ROOT / "docs" / "bundle.md").read_text()
    for name in (
        "iam-policy-storage-profile-hook.json",
        "iam-trust-pod-identity.json",
        "iam-policy-ebs-csi-kms.json",
        "iam-policy-ebs-csi-hyperpod.json",
        "kms-key-policy-hyperpod.json",
        "gcp-role-storage-profile-hook.yaml",
        "serviceaccount-identity-examples.yaml",
    ):
        assert name in bundle, name
    assert "/opt/sagemaker" in bundle


@pytest.mark.parametrize("path", sorted(CONNECTIONS.glob("*.json")), ids=lambda p: p.name)
def test_every_policy_document_parses(path: Path) -> None:
    policy(path.name)
