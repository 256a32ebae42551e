"""``status``: the claim's desired and current class, modify status, conditions and events
(against the in-memory fake of the client wrapper, and on the wire without the right to list
events)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import run_hook
from tests.hooks.kube_double import KubeDouble
from tests.hooks.kube_state import Rbac, make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"
ROOT = Path(__file__).resolve().parents[2]


def test_status_shows_desired_current_status_conditions_and_events(fake: FakeKube):
    make_volume(fake)
    make_class(fake, "fast", iops="6000")
    fake.resizer.results["fast"] = ["InvalidArgument"]
    assert run_hook("switch", "-n", NS, "--claim", CLAIM, "--to", "fast").exit_code == 4

    text = run_hook("status", "-n", NS, "--claim", CLAIM)
    assert text.exit_code == 0, text.output
    assert "desired class  fast" in text.stdout
    assert "current class  baseline" in text.stdout
    assert "modify status  Infeasible (target fast)" in text.stdout
    assert "ModifyVolumeError=True InvalidArgument: rpc error" in text.stdout
    assert "Warning VolumeModifyFailed" in text.stdout and "Normal VolumeModify:" in text.stdout

    raw = run_hook("status", "-n", NS, "--claim", CLAIM, "-o", "json")
    data = json.loads(raw.stdout)
    assert (data["desiredClass"], data["currentClass"]) == ("fast", "baseline")
    assert data["modifyVolumeStatus"] == {
        "status": "Infeasible",
        "targetVolumeAttributesClassName": "fast",
    }
    assert data["driver"] == "ebs.csi.aws.com" and data["volume"] == "pvc-0001"
    assert [e["reason"] for e in data["events"]] == ["VolumeModify", "VolumeModifyFailed"]
    assert fake.claim_writes()[-1].verb == "patch"  # status itself wrote nothing
    assert len(fake.claim_writes()) == 1


def test_status_of_a_missing_claim(fake: FakeKube):
    result = run_hook("status", "-n", NS, "--claim", "nope")
    assert result.exit_code == 3
    assert "claim ml-team/nope not found" in result.stderr


def test_status_without_permission_to_list_events_shows_the_claim_and_says_so(
    double: KubeDouble, kubeconfig: Path
):
    make_volume(double)
    double.rbac = Rbac.from_manifests(
        ROOT / "connections" / "rbac-storage-profile.yaml", "ml-team:storage-profile-hook"
    )
    for rules in double.rbac.namespaced.values():
        rules[:] = [r for r in rules if "events" not in r["resources"]]
    target = ("-n", NS, "--claim", CLAIM, "--kubeconfig", str(kubeconfig))
    text = run_hook("status", *target)
    assert text.exit_code == 0, text.output
    assert "current class  baseline" in text.stdout
    [line] = [ln for ln in text.stdout.splitlines() if ln.startswith("  events")]
    assert line.startswith("  events         not shown: cannot list events of claim ml-team/")
    assert 'cannot list resource "events"' in line
    assert "HTTP response headers" not in text.output
    data = json.loads(run_hook("status", *target, "--output", "json").stdout)
    assert data["events"] == [] and data["currentClass"] == "baseline"
    assert 'cannot list resource "events"' in data["eventsError"]
