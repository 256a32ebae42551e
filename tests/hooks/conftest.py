"""Fixtures: the Kubernetes double, a kubeconfig for it, moto EC2 with stepped states."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner
from moto import mock_aws

from hooks.storage_profile import cli
from hooks.storage_profile.config import Backoff
from hooks.storage_profile.providers import EbsProvider
from tests.hooks.kube_double import KubeDouble

FAST_BACKOFF = Backoff(initial=0.01, factor=2.0, cap=0.05, retry_after_cap=2.0, max_attempts=4)


CLAIM_WRITE = re.compile(r"^/api/v1/namespaces/[^/]+/persistentvolumeclaims/[^/]+$")


@pytest.fixture
def double() -> Iterator[KubeDouble]:
    """A started double; afterwards, checks that the hook only ever patched claims' class."""
    server = KubeDouble().start()
    yield server
    server.stop()
    for write in server.writes():
        assert write.method == "PATCH" and CLAIM_WRITE.match(write.path), write
        assert write.content_type == "application/merge-patch+json", write
        assert list(write.body) == ["spec"] and list(write.body["spec"]) == [
            "volumeAttributesClassName"
        ], write


@pytest.fixture
def kubeconfig(double: KubeDouble, tmp_path: Path) -> Path:
    return double.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture(autouse=True)
def _fast_seams(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny backoff and watch timeouts, and no provider unless a test asks for one."""
    monkeypatch.setattr(cli, "BACKOFF", FAST_BACKOFF)
    monkeypatch.setattr(cli, "WATCH_TIMEOUT", 5.0)
    monkeypatch.setattr(cli, "PROVIDER_FOR", lambda driver, pv: None)


@dataclass
class Stepper:
    """Steps moto's instant ``completed`` through the real EC2 states.

    moto answers every modification as ``completed`` at once. This layer rewrites the
    parsed ``DescribeVolumesModifications`` answer of one boto3 client: each modification
    started after ``since`` advances one state per look, along ``states``.
    """

    since: datetime
    states: list[str] = field(default_factory=lambda: ["modifying", "optimizing", "completed"])
    seen: list[str] = field(default_factory=list)
    _looks: dict[str, int] = field(default_factory=dict)

    def attach(self, client) -> None:
        client.meta.events.register("after-call.ec2.DescribeVolumesModifications", self._step)

    def _step(self, parsed: dict, **_: object) -> None:
        for mod in parsed.get("VolumesModifications", []):
            if mod["StartTime"] < self.since:
                continue
            key = f"{mod['VolumeId']}@{mod['StartTime'].isoformat()}"
            look = self._looks.get(key, 0)
            self._looks[key] = look + 1
            state = self.states[min(look, len(self.states) - 1)]
            mod["ModificationState"] = state
            mod["Progress"] = {"modifying": 10, "optimizing": 60}.get(state, 100)
            if state == "failed":
                mod["StatusMessage"] = "Stepped failure: the volume could not be modified"
            self.seen.append(state)


@dataclass
class Ec2:
    client: object
    volume_id: str


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


def modify_from_class(ec2: Ec2):
    """What the EBS CSI driver does on a successful ControllerModifyVolume: ModifyVolume."""

    def on_modify(pv: dict, vac: dict) -> None:
        params = vac.get("parameters") or {}
        kwargs: dict = {"VolumeId": pv["spec"]["csi"]["volumeHandle"]}
        if "type" in params:
            kwargs["VolumeType"] = params["type"]
        if "iops" in params:
            kwargs["Iops"] = int(params["iops"])
        if "throughput" in params:
            kwargs["Throughput"] = int(params["throughput"])
        ec2.client.modify_volume(**kwargs)

    return on_modify


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


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_hook(*args: str) -> Result:
    """Run the click command in-process, as ``python -m hooks.storage_profile`` would."""
    runner = CliRunner()
    result = runner.invoke(cli.main, list(args), catch_exceptions=False)
    return Result(result.exit_code, result.stdout, result.stderr)


def load_summary(path: Path) -> dict:
    return json.loads(path.read_text())
