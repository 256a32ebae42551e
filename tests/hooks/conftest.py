"""Fixtures: the in-memory fake of the client wrapper as the CLI's connection, the HTTP
double and a kubeconfig for it, moto EC2 with stepped states."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from checkpoint_storage_bench.contract import LEASE_PREFIX, LEDGER_ANNOTATION, parse_ledger
from hooks.storage_profile import backends, cli
from hooks.storage_profile.providers import EbsProvider
from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import FAST_BACKOFF, Ec2, Stepper
from tests.hooks.kube_double import KubeDouble
from tests.hooks.kube_state import KubeState, make_class, make_volume

CLAIM_WRITE = re.compile(r"^/api/v1/namespaces/[^/]+/persistentvolumeclaims/[^/]+$")
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    """The in-memory fake, as every subcommand's connection to Kubernetes; afterwards,
    checks that the hook only ever patched claims' class (and ledger) and wrote the claims'
    Leases."""
    kube = FakeKube()
    monkeypatch.setattr(backends, "connect", lambda cfg, deadline: kube)
    yield kube
    for write in kube.writes:
        if write.verb == "patch":
            assert_class_patch(write.body)
        else:
            assert write.body["metadata"]["name"].startswith(LEASE_PREFIX), write


@pytest.fixture
def double() -> Iterator[KubeDouble]:
    """A started HTTP double; afterwards, checks that the hook only ever patched claims'
    class (and ledger) and wrote the claims' Leases, on the wire."""
    server = KubeDouble().start()
    yield server
    server.stop()
    for write in server.writes():
        if "/leases" in write.path:
            assert_lease_write(write)
        else:
            assert_claim_class_patch(write)


def assert_class_patch(body: dict) -> None:
    """A patch of a claim's class, with its uid and resourceVersion as preconditions and,
    when it sets a class, the ledger annotation and nothing else."""
    assert sorted(body) == ["metadata", "spec"], body
    assert list(body["spec"]) == ["volumeAttributesClassName"], body
    meta = body["metadata"]
    assert set(meta) - {"annotations"} == {"resourceVersion", "uid"}, body
    if body["spec"]["volumeAttributesClassName"] is not None:
        assert list(meta["annotations"]) == [LEDGER_ANNOTATION], body
        parse_ledger(meta["annotations"][LEDGER_ANNOTATION])


def assert_claim_class_patch(write) -> None:
    """On the wire: one claim's class patch (:func:`assert_class_patch`), as a merge patch."""
    assert write.method == "PATCH" and CLAIM_WRITE.match(write.path), write
    assert write.content_type == "application/merge-patch+json", write
    assert_class_patch(write.body)


def assert_lease_write(write) -> None:
    """A create (POST) or update (PUT) of the Lease named after a claim, nothing else."""
    ns = write.path.split("/")[5]
    name = write.body["metadata"]["name"]
    assert name.startswith(LEASE_PREFIX), write
    if write.method == "POST":
        assert write.path == LEASES.format(ns=ns), write
    else:
        assert write.method == "PUT" and write.path == f"{LEASES.format(ns=ns)}/{name}", write


def seed_cluster(state: KubeState) -> None:
    """A bound EBS claim settled on ``baseline`` and two classes of its driver."""
    make_volume(state)
    make_class(state, "baseline", type="gp3", iops="3000", throughput="125")
    make_class(state, "fast", type="gp3", iops="6000", throughput="250")


@pytest.fixture
def cluster(fake: FakeKube) -> FakeKube:
    """The fake with :func:`seed_cluster`'s claim and classes."""
    seed_cluster(fake)
    return fake


@pytest.fixture
def wire_cluster(double: KubeDouble) -> KubeDouble:
    """The HTTP double with :func:`seed_cluster`'s claim and classes."""
    seed_cluster(double)
    return double


@pytest.fixture
def kubeconfig(double: KubeDouble, tmp_path: Path) -> Path:
    return double.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture(autouse=True)
def _fast_seams(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny backoff and watch timeouts, no provider unless a test asks for one, and a fixed
    holder (outside Polyaxon the default would be user@host)."""
    monkeypatch.setattr(cli, "BACKOFF", FAST_BACKOFF)
    monkeypatch.setenv("STORAGE_PROFILE_HOLDER", "pipeline-a")
    monkeypatch.setattr(cli, "WATCH_TIMEOUT", 5.0)
    monkeypatch.setattr(cli, "PROVIDER_FOR", lambda driver, pv: None)


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Ec2]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        client = boto3.client("ec2", region_name="us-east-1")
        volume = client.create_volume(
            AvailabilityZone="us-east-1a", Size=200, VolumeType="gp3", Iops=3000, Throughput=125
        )
        yield Ec2(client, volume["VolumeId"])


@pytest.fixture
def use_ebs(monkeypatch: pytest.MonkeyPatch, ec2: Ec2):
    """Route the CLI's provider lookup to a real EbsProvider on a stepped moto client."""

    def install(stepper: Stepper, **kwargs) -> EbsProvider:
        client = boto3.client("ec2", region_name="us-east-1")
        stepper.attach(client)
        provider = EbsProvider(ec2=client, poll_interval=0.01, **kwargs)
        monkeypatch.setattr(
            cli, "PROVIDER_FOR", lambda driver, pv: provider if driver == provider.driver else None
        )
        return provider

    return install
