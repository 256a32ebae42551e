"""``switch`` on Kubernetes, against the in-memory fake of the client wrapper and its fake
external-resizer (what a switch meets on the wire is test_switch_wire.py's)."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

from checkpoint_storage_bench.contract import LEDGER_ANNOTATION, parse_ledger
from hooks.storage_profile import report as report_module
from tests.hooks.conftest import assert_class_patch
from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import load_summary, run_hook
from tests.hooks.kube_state import claim_state, make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"


def switch(*extra: str, to: str = "fast", claim: str = CLAIM):
    return run_hook(
        "switch", "-n", NS, "--claim", claim, "--to", to, "--settle", "kubernetes", *extra
    )


def assert_only_claim_patched(kube: FakeKube, expected: list[str | None]) -> None:
    """Every write was a patch of the named claim's class field (and its ledger), or one of
    its Lease; nothing else."""
    assert all(w.ref.startswith(f"{NS}/") for w in kube.writes)
    writes = [w for w in kube.claim_writes() if w.status < 400]
    assert [w.ref for w in writes] == [f"{NS}/{CLAIM}"] * len(expected)
    for write, target in zip(writes, expected, strict=True):
        assert_class_patch(write.body)
        assert write.body["spec"] == {"volumeAttributesClassName": target}


def test_switch_settles_and_reports(cluster: FakeKube, tmp_path: Path):
    summary = tmp_path / "out" / "switch.json"
    result = switch("--summary-json", str(summary))
    assert result.exit_code == 0, result.output
    assert claim_state(cluster) == ("fast", "fast", None)
    assert_only_claim_patched(cluster, ["fast"])
    # Waited with one list and a watch from its resourceVersion, not by polling the claim.
    assert cluster.count("list_claim") == 1 and cluster.count("watch_claim") == 1
    assert cluster.count("read_claim") == 1  # the preflight read
    [(ns, name, version)] = cluster.watched
    assert (ns, name) == (NS, CLAIM) and int(version) > 0

    data = load_summary(summary)
    claim = cluster.get("PersistentVolumeClaim", CLAIM, NS)
    assert data["schema"] == "storage-profile-switch/1"
    assert data["claim_uid"] == claim["metadata"]["uid"]
    assert (data["pv"], data["volume_handle"], data["driver"]) == (
        "pvc-0001",
        "vol-0123456789abcdef0",
        "ebs.csi.aws.com",
    )
    assert (data["previous_class"], data["target_class"], data["applied_class"]) == (
        "baseline",
        "fast",
        "fast",
    )
    assert data["class_parameters"] == {"type": "gp3", "iops": "6000", "throughput": "250"}
    assert data["outcome"] == "settled" and data["exit_code"] == 0 and data["patched"]
    # The fake resizer takes delay + driver_delay (0.25 s) to settle.
    assert 0.2 <= data["k8s_settle_s"] < 5
    assert data["requested_at"] < data["k8s_settled_at"]
    assert data["provider_settled_at"] is None and data["total_settle_s"] == data["k8s_settle_s"]
    assert "baseline -> fast" in result.stdout and "k8s settled" in result.stdout
    # The resizer really went through InProgress before settling.
    reasons = [o["reason"] for o in cluster.of_kind("Event")]
    assert reasons == ["VolumeModify", "VolumeModifySuccessful"]


def test_already_on_target_succeeds_without_patching(cluster: FakeKube, tmp_path: Path):
    summary = tmp_path / "s.json"
    result = switch("--summary-json", str(summary), to="baseline")
    assert result.exit_code == 0, result.output
    assert cluster.claim_writes() == []
    data = load_summary(summary)
    assert data["outcome"] == "already-settled" and not data["patched"]
    assert data["applied_class"] == "baseline"


def test_already_requested_still_waits_for_the_modification(cluster: FakeKube):
    # Someone asked for "fast" already; the resizer is about to act on it.
    old = cluster.get("PersistentVolumeClaim", CLAIM, NS)
    new = cluster.update(
        "PersistentVolumeClaim",
        CLAIM,
        NS,
        lambda c: c["spec"].__setitem__("volumeAttributesClassName", "fast"),
    )
    cluster.resizer.driver_delay = 0.5
    cluster.resizer.on_claim_update(old, new)
    result = switch()
    assert result.exit_code == 0, result.output
    assert cluster.claim_writes() == []
    assert claim_state(cluster) == ("fast", "fast", None)
    assert "not patched" in result.stdout


def test_dry_run_prints_the_patch_and_changes_nothing(cluster: FakeKube):
    result = switch("--dry-run")
    assert result.exit_code == 0, result.output
    claim = cluster.get("PersistentVolumeClaim", CLAIM, NS)["metadata"]
    patch = json.loads(result.stderr.split("-p '", 1)[1].split("'", 1)[0])
    ledger = patch["metadata"].pop("annotations")
    assert patch == {
        "metadata": {"uid": claim["uid"], "resourceVersion": claim["resourceVersion"]},
        "spec": {"volumeAttributesClassName": "fast"},
    }
    [entry] = parse_ledger(ledger[LEDGER_ANNOTATION])
    assert (entry.from_class, entry.to_class, entry.holder) == ("baseline", "fast", "pipeline-a")
    assert cluster.lease() is None  # a dry run takes no Lease
    assert "--type=merge" in result.stderr
    assert cluster.claim_writes() == []
    assert claim_state(cluster) == ("baseline", "baseline", None)


def test_the_dry_run_command_line_is_quoted_for_a_shell(cluster: FakeKube):
    holder = "it's me'; touch /tmp/pwned; echo '"
    result = switch("--dry-run", "--holder", holder)
    assert result.exit_code == 0, result.output
    [line] = [ln for ln in result.stderr.splitlines() if ln.startswith("dry run: ")]
    argv = shlex.split(line.split("would patch: ", 1)[1])
    assert argv[:7] == [
        "kubectl", "patch", f"persistentvolumeclaims/{CLAIM}", "-n", NS, "--type=merge", "-p",
    ]  # fmt: skip
    assert len(argv) == 8
    [entry] = parse_ledger(json.loads(argv[7])["metadata"]["annotations"][LEDGER_ANNOTATION])
    assert entry.holder == holder


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "claim ml-team/other not found"),
        (
            lambda d: d.delete("VolumeAttributesClass", "fast"),
            "VolumeAttributesClass fast not found",
        ),
        (
            lambda d: make_class(d, "fast", driver="pd.csi.storage.gke.io", iops="5000"),
            "is for driver pd.csi.storage.gke.io",
        ),
        (
            lambda d: d.update(
                "PersistentVolume", "pvc-0001", None, lambda p: p["spec"].pop("csi")
            ),
            "is not a CSI volume",
        ),
        (
            lambda d: (d.delete("PersistentVolumeClaim", CLAIM, NS), make_volume(d, bound=False)),
            "(no volume yet) and asks for baseline, not fast",
        ),
    ],
    ids=["claim-missing", "class-missing", "driver-mismatch", "not-csi", "unbound"],
)
def test_preflight_refuses_before_any_write(cluster: FakeKube, setup, message: str):
    setup(cluster)
    claim = "other" if "other" in message else CLAIM
    result = switch(claim=claim)
    assert result.exit_code == 3, result.output
    assert message in result.stderr
    assert cluster.claim_writes() == []


def test_api_server_422_on_unbound_claim_is_a_refusal(
    cluster: FakeKube, monkeypatch: pytest.MonkeyPatch
):
    # Preflight saw a bound claim, but the API server's rule decides (a race, or a stale
    # read): its 422 must end as "refused", with the server's message.
    from hooks.storage_profile import switch as switch_module

    real = switch_module.preflight

    def racing_preflight(*args, **kwargs):
        plan = real(*args, **kwargs)
        changed = cluster.update(
            "PersistentVolumeClaim",
            CLAIM,
            NS,
            lambda c: c["status"].__setitem__("phase", "Pending"),
        )
        # As if preflight had judged the current claim wrongly: the patch's preconditions
        # hold, so the server's own rule (422) is what refuses it.
        plan.claim["metadata"]["resourceVersion"] = changed["metadata"]["resourceVersion"]
        return plan

    monkeypatch.setattr(switch_module, "preflight", racing_preflight)
    result = switch()
    assert result.exit_code == 3, result.output
    assert "spec is immutable after creation except resources.requests" in result.stderr
    assert [w.status for w in cluster.claim_writes()] == [422]


def test_infeasible_fails_at_once(cluster: FakeKube, tmp_path: Path):
    cluster.resizer.results["fast"] = ["InvalidArgument"]
    summary = tmp_path / "s.json"
    started = time.monotonic()
    result = switch("--summary-json", str(summary))
    assert result.exit_code == 4, result.output
    assert time.monotonic() - started < 5
    assert "Infeasible" in result.stderr and "code = InvalidArgument" in result.stderr
    assert claim_state(cluster)[2]["status"] == "Infeasible"
    assert_only_claim_patched(cluster, ["fast"])
    data = load_summary(summary)
    assert data["outcome"] == "infeasible" and data["exit_code"] == 4
    assert data["applied_class"] == "baseline"


def test_infeasible_rolls_back_and_still_exits_infeasible(cluster: FakeKube, tmp_path: Path):
    cluster.resizer.results["fast"] = ["InvalidArgument"]
    summary = tmp_path / "s.json"
    result = switch("--on-infeasible", "rollback", "--summary-json", str(summary))
    assert result.exit_code == 4, result.output
    assert "rolling claim ml-team/training-checkpoints back to baseline" in result.stderr
    assert claim_state(cluster) == ("baseline", "baseline", None)
    assert_only_claim_patched(cluster, ["fast", "baseline"])
    data = load_summary(summary)
    assert data["outcome"] == "rolled-back" and data["rolled_back"]
    assert data["applied_class"] == "baseline"
    # The rollback ran a normal modification through the resizer.
    assert cluster.resizer.calls == [("fast", "InvalidArgument"), ("baseline", "ok")]


def test_no_rollback_to_a_class_that_is_gone(cluster: FakeKube):
    cluster.resizer.results["fast"] = ["InvalidArgument"]
    cluster.delete("VolumeAttributesClass", "baseline")
    result = switch("--on-infeasible", "rollback")
    assert result.exit_code == 4, result.output
    assert "rollback to baseline failed: VolumeAttributesClass baseline no longer exists" in (
        result.stderr
    )
    assert_only_claim_patched(cluster, ["fast"])


def test_internal_errors_are_warnings_and_retried(cluster: FakeKube, tmp_path: Path):
    cluster.resizer.results["fast"] = ["Internal", "Internal", "ok"]
    summary = tmp_path / "s.json"
    result = switch("--summary-json", str(summary))
    assert result.exit_code == 0, result.output
    assert "warning: ModifyVolumeError (Internal): rpc error: code = Internal" in result.stderr
    assert "warning: event VolumeModifyFailed: rpc error: code = Internal" in result.stderr
    assert claim_state(cluster) == ("fast", "fast", None)
    assert [c[1] for c in cluster.resizer.calls] == ["Internal", "Internal", "ok"]
    # Every status change arrived on the one watch: no polling, no re-list.
    assert cluster.count("list_claim") == 1 and cluster.count("watch_claim") == 1
    assert any("ModifyVolumeError" in w for w in load_summary(summary)["warnings"])


def test_pending_fails_after_grace_with_the_event_reason(cluster: FakeKube):
    # The class disappears between preflight and the resizer's look (e.g. deleted by its
    # owner): the resizer marks the claim Pending and never re-queues it.
    cluster.on_patch = lambda claim: cluster.delete("VolumeAttributesClass", "fast")
    started = time.monotonic()
    result = switch("--pending-grace", "1")
    elapsed = time.monotonic() - started
    assert result.exit_code == 4, result.output
    assert 'stayed Pending for 1s: VolumeModifyFailed: VAC "fast" does not exist.' in (
        result.stderr
    )
    assert 1 <= elapsed < 6
    # Faithful to the resizer: creating the class later does not move the claim.
    make_class(cluster, "fast", iops="6000")
    time.sleep(0.4)
    cluster.advance()
    assert claim_state(cluster)[2]["status"] == "Pending"


def test_pending_within_grace_keeps_waiting(cluster: FakeKube):
    # Pending until the class is back and the resizer restarts (which re-queues the claim).
    deleted = cluster.get("VolumeAttributesClass", "fast")
    cluster.on_patch = lambda claim: cluster.delete("VolumeAttributesClass", "fast")

    def restore() -> None:
        cluster.put(deleted)
        cluster.resizer.restart()

    cluster.later(0.5, restore)
    result = switch("--pending-grace", "10")
    assert result.exit_code == 0, result.output
    assert claim_state(cluster) == ("fast", "fast", None)


def test_unknown_status_fails(cluster: FakeKube):
    cluster.resizer.results["fast"] = ["status:Rejected"]
    result = switch()
    assert result.exit_code == 1, result.output
    assert "unknown modify status 'Rejected'" in result.stderr


def test_deadline_passed(cluster: FakeKube, tmp_path: Path):
    cluster.resizer.results["fast"] = ["Internal"] * 1000
    summary = tmp_path / "s.json"
    started = time.monotonic()
    result = switch("--timeout", "1.5", "--summary-json", str(summary))
    assert result.exit_code == 5, result.output
    assert time.monotonic() - started < 6
    assert "deadline of 1.5s passed" in result.stderr
    assert load_summary(summary)["outcome"] == "deadline"


def test_spec_changed_by_another_writer_fails(cluster: FakeKube):
    cluster.resizer.driver_delay = 1.0

    def revert(claim: dict) -> None:
        # A GitOps controller restores the old reference right after our patch.
        cluster.update(
            "PersistentVolumeClaim",
            CLAIM,
            NS,
            lambda c: c["spec"].__setitem__("volumeAttributesClassName", "baseline"),
        )

    cluster.on_patch = revert
    result = switch()
    assert result.exit_code == 1, result.output
    assert "another writer" in result.stderr


def test_warns_when_rwo_claim_is_mounted_on_two_nodes(cluster: FakeKube):
    for i, node in enumerate(["node-a", "node-b"]):
        cluster.put(
            {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"name": f"trainer-{i}", "namespace": NS},
                "spec": {
                    "nodeName": node,
                    "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": CLAIM}}],
                },
                "status": {"phase": "Running"},
            }
        )
    result = switch()
    assert result.exit_code == 0, result.output
    assert "ReadWriteOnce but pods on 2 nodes mount it (node-a, node-b)" in result.stderr


def test_logs_to_polyaxon_inside_a_run(
    cluster: FakeKube, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    # Inside a run the tracker logs to that run; here checkpoint_storage_bench.tracking falls back to an
    # offline run, which records the same inputs and outputs.
    monkeypatch.setattr(report_module, "in_polyaxon_run", lambda: True)
    result = switch("--summary-json", str(tmp_path / "s.json"))
    assert result.exit_code == 0, result.output
    runs = list((tmp_path / "plx-offline" / "runs").glob("*/run.plx.json"))
    assert len(runs) == 1
    record = json.loads(runs[0].read_text())
    assert record["inputs"]["claim"] == CLAIM and record["inputs"]["target_class"] == "fast"
    assert record["inputs"]["previous_class"] == "baseline"
    assert record["inputs"]["volume_handle"] == "vol-0123456789abcdef0"
    assert record["outputs"]["applied_class"] == "fast"
    assert record["outputs"]["k8s_settle_s"] > 0
    assert record["status"] == "succeeded"


def test_no_polyaxon_record_outside_a_run(cluster: FakeKube, tmp_path: Path):
    assert switch().exit_code == 0
    assert not (tmp_path / "plx-offline").exists()


def test_failed_switch_marks_the_polyaxon_run_failed(
    cluster: FakeKube, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setattr(report_module, "in_polyaxon_run", lambda: True)
    cluster.resizer.results["fast"] = ["InvalidArgument"]
    assert switch().exit_code == 4
    record = json.loads(
        next((tmp_path / "plx-offline" / "runs").glob("*/run.plx.json")).read_text()
    )
    assert record["status"] == "failed"
    assert record["inputs"]["target_class"] == "fast"
    assert record["outputs"]["applied_class"] == "baseline"


def test_rollback_returns_to_the_applied_class_not_the_last_request(
    cluster: FakeKube, tmp_path: Path
):
    make_class(cluster, "medium", type="gp3", iops="4000", throughput="200")
    cluster.resizer.results["fast"] = ["InvalidArgument"]
    assert switch().exit_code == 4  # leaves spec=fast, current=baseline
    cluster.resizer.results["medium"] = ["InvalidArgument"]
    summary = tmp_path / "s.json"
    result = switch("--on-infeasible", "rollback", "--summary-json", str(summary), to="medium")
    assert result.exit_code == 4, result.output
    assert claim_state(cluster) == ("baseline", "baseline", None)
    data = load_summary(summary)
    assert (data["previous_class"], data["applied_class"]) == ("baseline", "baseline")
    assert data["rolled_back"]
    assert "back to baseline" in result.stderr


def test_a_claim_recreated_between_preflight_and_patch_is_not_patched(
    cluster: FakeKube, monkeypatch: pytest.MonkeyPatch
):
    from hooks.storage_profile import switch as switch_module

    real = switch_module.preflight

    def recreating_preflight(*args, **kwargs):
        plan = real(*args, **kwargs)
        # Deleted and re-created under the same name, now on another driver's volume.
        cluster.delete("PersistentVolumeClaim", CLAIM, NS)
        make_volume(cluster, pv="pvc-0002", driver="disk.csi.example.com", current=None)
        return plan

    monkeypatch.setattr(switch_module, "preflight", recreating_preflight)
    result = switch()
    assert result.exit_code == 3, result.output
    assert "deleted and re-created since it was read" in result.stderr
    assert claim_state(cluster)[0] is None  # the new claim never got the class
    assert [w.status for w in cluster.claim_writes()] == [409]


def test_a_claim_changed_between_preflight_and_patch_is_not_patched(
    cluster: FakeKube, monkeypatch: pytest.MonkeyPatch
):
    from hooks.storage_profile import switch as switch_module

    real = switch_module.preflight

    def racing_preflight(*args, **kwargs):
        plan = real(*args, **kwargs)
        cluster.update(  # someone else asks for another class meanwhile
            "PersistentVolumeClaim",
            CLAIM,
            NS,
            lambda c: c["spec"].__setitem__("volumeAttributesClassName", "baseline-2"),
        )
        return plan

    monkeypatch.setattr(switch_module, "preflight", racing_preflight)
    result = switch()
    assert result.exit_code == 3, result.output
    assert "changed since it was read" in result.stderr
    assert claim_state(cluster)[0] == "baseline-2"


def test_a_lost_patch_answer_is_recognised_behind_a_ledger_entry_dated_later(cluster: FakeKube):
    # An entry dated after now (a clock ahead, a hand edit) sorts after ours: the switch
    # finds its own entry by what it is, not by where it sorts.
    ahead = '[{"at":"2099-01-01T00:00:00Z","from":"fast","to":"baseline","holder":"clock-ahead"}]'
    cluster.update(
        "PersistentVolumeClaim",
        CLAIM,
        NS,
        lambda c: c["metadata"].setdefault("annotations", {}).__setitem__(LEDGER_ANNOTATION, ahead),
    )
    cluster.lost_answers = 1
    result = switch()
    assert result.exit_code == 0, result.output
    assert [w.status for w in cluster.claim_writes()] == [200, 409]
    assert claim_state(cluster) == ("fast", "fast", None)
    claim = cluster.get("PersistentVolumeClaim", CLAIM, NS)
    ledger = parse_ledger(claim["metadata"]["annotations"][LEDGER_ANNOTATION])
    assert [(e.to_class, e.holder) for e in ledger] == [
        ("fast", "pipeline-a"),
        ("baseline", "clock-ahead"),
    ]


def test_pending_on_a_class_that_exists_now_is_refused_at_once(cluster: FakeKube):
    # An earlier request for "fast" met a missing class: Pending, and the resizer will not
    # look again now that the class exists.
    cluster.update(
        "PersistentVolumeClaim",
        CLAIM,
        NS,
        lambda c: (
            c["spec"].__setitem__("volumeAttributesClassName", "fast"),
            c["status"].__setitem__("modifyVolumeStatus", {"status": "Pending"}),
        ),
    )
    started = time.monotonic()
    result = switch("--pending-grace", "3")
    assert result.exit_code == 3, result.output
    assert time.monotonic() - started < 2.5
    assert "Pending on VolumeAttributesClass fast, which exists now" in result.stderr
    assert cluster.claim_writes() == []
