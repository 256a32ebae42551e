"""Helpers shared by the hook tests: running the CLI, stepping moto's EC2 states."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from click.testing import CliRunner

from checkpoint_storage_bench.retry import Backoff
from hooks.storage_profile import cli

FAST_BACKOFF = Backoff.exponential(0.01, factor=2.0, cap=0.05, tries=4, retry_after_cap=2.0)


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

    def modify(self, *iops: int) -> None:
        """Modify the volume outside the hook (another tool, a person), once per value."""
        for value in iops:
            self.client.modify_volume(VolumeId=self.volume_id, Iops=value)


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


def hook_command(*args: str) -> list[str]:
    """The real entry point's command line, ``python -m hooks.storage_profile ARGS``, for a
    run in a process of its own."""
    return [sys.executable, "-m", "hooks.storage_profile", *args]


def load_summary(path: Path) -> dict:
    return json.loads(path.read_text())


def write_kubeconfig(path: Path, server: str, **cluster: object) -> Path:
    """A kubeconfig for any server URL (the double writes its own)."""
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path
