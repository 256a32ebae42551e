"""A claim shared over time: a fresh unbound claim, the ledger of switches on the claim, and
the Lease that keeps one pipeline at a time on it."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from checkpoint_storage_bench.contract import (
    LEASE_NAME_MAX,
    LEASE_PREFIX,
    LEDGER_ANNOTATION,
    LedgerEntry,
    format_ledger,
    lease_name,
    parse_ledger,
)
from checkpoint_storage_bench.retry import Deadline
from hooks.storage_profile import report as report_module
from hooks.storage_profile.config import DNS1123_SUBDOMAIN
from hooks.storage_profile.errors import PreflightRefused
from hooks.storage_profile.lease import default_holder, refuse_after_failure
from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import Ec2, Stepper, load_summary, modify_from_class, run_hook
from tests.hooks.kube_state import make_class, make_lease, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"


def switch(*extra: str, to: str = "fast"):
    return run_hook(
        "switch", "-n", NS, "--claim", CLAIM, "--to", to, "--settle", "kubernetes", *extra
    )


def release(holder: str, claim: str = CLAIM):
    return run_hook("release", "-n", NS, "--claim", claim, "--holder", holder)


def ledger(fake: FakeKube) -> list[LedgerEntry]:
    claim = fake.get("PersistentVolumeClaim", CLAIM, NS)
    return parse_ledger((claim["metadata"].get("annotations") or {}).get(LEDGER_ANNOTATION))


def seed_ledger(fake: FakeKube, *hours_ago: float) -> list[LedgerEntry]:
    now = datetime.now(UTC).replace(microsecond=0)
    entries = [
        LedgerEntry(now - timedelta(hours=h), "baseline", "fast", "pipeline-old") for h in hours_ago
    ]
    annotate_ledger(fake, format_ledger(entries))
    return sorted(entries, key=lambda e: e.at)


def annotate_ledger(fake: FakeKube, value: str) -> None:
    """Set the claim's ledger annotation as another writer would (by hand, an older hook)."""

    def annotate(claim: dict) -> None:
        claim["metadata"].setdefault("annotations", {})[LEDGER_ANNOTATION] = value

    fake.update("PersistentVolumeClaim", CLAIM, NS, annotate)


# ----------------------------------------------------------------- a fresh unbound claim


def test_an_unbound_claim_created_with_the_class_is_a_no_op(
    fake: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    make_volume(fake, bound=False, current="fast")  # WaitForFirstConsumer, no pod yet
    make_class(fake, "fast", iops="6000")
    monkeypatch.setattr(report_module, "in_polyaxon_run", lambda: True)
    summary = tmp_path / "s.json"
    result = run_hook(
        "switch", "-n", NS, "--claim", CLAIM, "--to", "fast",
        "--summary-json", str(summary),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "the class applies when its volume is provisioned" in result.stderr
    data = load_summary(summary)
    assert data["unbound_noop"] is True and data["outcome"] == "unbound-noop"
    assert data["applied_class"] == "fast" and not data["patched"]
    assert (data["k8s_settle_s"], data["provider_settle_s"], data["total_settle_s"]) == (0, 0, 0)
    assert any("applies when its volume is provisioned" in n for n in data["notes"])
    assert fake.claim_writes() == []
    assert fake.lease()["spec"]["holderIdentity"] == "pipeline-a"  # measured next: held
    record = json.loads(
        next((tmp_path / "plx-offline" / "runs").glob("*/run.plx.json")).read_text()
    )
    assert record["outputs"]["unbound_noop"] is True
    assert record["outputs"]["applied_class"] == "fast"
    assert record["outputs"]["total_settle_s"] == 0


def test_a_bound_switch_reports_unbound_noop_false(cluster: FakeKube, tmp_path):
    summary = tmp_path / "s.json"
    assert switch("--summary-json", str(summary)).exit_code == 0
    assert load_summary(summary)["unbound_noop"] is False


@pytest.mark.parametrize("requested", ["baseline", None])
def test_an_unbound_claim_asking_for_another_class_is_refused_with_what_to_do(
    fake: FakeKube, requested: str | None
):
    make_volume(fake, bound=False, current=requested)
    make_class(fake, "fast", iops="6000")
    result = switch()
    assert result.exit_code == 3, result.output
    assert "the class of an unbound claim cannot change" in result.stderr
    assert "Create the claim with spec.volumeAttributesClassName: fast" in result.stderr
    assert fake.requested == []


def test_an_unbound_claim_asking_for_a_missing_class_is_refused(fake: FakeKube):
    make_volume(fake, bound=False, current="fast")
    result = switch()
    assert result.exit_code == 3, result.output
    assert "VolumeAttributesClass fast not found" in result.stderr


GKE = "pd.csi.storage.gke.io"


def test_an_unbound_claim_asking_for_another_drivers_class_is_refused(fake: FakeKube):
    # Its StorageClass's provisioner (EBS) would refuse a GKE class: the claim would never
    # bind, and the stage's fio op would wait for it forever.
    make_volume(fake, bound=False, current="hyperdisk-fast")
    make_class(fake, "hyperdisk-fast", driver=GKE, iops="6000", throughput="290Mi")
    result = switch(to="hyperdisk-fast")
    assert result.exit_code == 3, result.output
    assert f"VolumeAttributesClass hyperdisk-fast is for driver {GKE}" in result.stderr
    assert "will be provisioned by ebs.csi.aws.com" in result.stderr
    assert fake.requested == [] and fake.lease() is None


def test_an_unbound_claim_whose_storage_class_is_missing_is_refused(fake: FakeKube):
    make_volume(fake, bound=False, current="fast")
    make_class(fake, "fast", iops="6000")
    fake.delete("StorageClass", "ebs-gp3")
    result = switch()
    assert result.exit_code == 3, result.output
    assert "its StorageClass ebs-gp3 does not exist" in result.stderr
    assert fake.requested == []


def test_an_unbound_claim_without_a_storage_class_is_a_no_op_with_a_warning(fake: FakeKube):
    make_volume(fake, bound=False, current="fast")
    make_class(fake, "fast", iops="6000")
    fake.update("PersistentVolumeClaim", CLAIM, NS, lambda c: c["spec"].pop("storageClassName"))
    result = switch()
    assert result.exit_code == 0, result.output
    assert "names no StorageClass: its provisioner" in result.stderr


# ------------------------------------------------------------------- the ledger of switches


def test_each_switch_appends_to_the_ledger_in_the_same_patch(cluster: FakeKube):
    cluster.update(
        "PersistentVolumeClaim",
        CLAIM,
        NS,
        lambda c: c["metadata"].setdefault("annotations", {}).update(team="ml"),
    )
    started = datetime.now(UTC).replace(microsecond=0)
    assert switch().exit_code == 0
    assert switch(to="baseline").exit_code == 0
    entries = ledger(cluster)
    assert [(e.from_class, e.to_class, e.holder) for e in entries] == [
        ("baseline", "fast", "pipeline-a"),
        ("fast", "baseline", "pipeline-a"),
    ]
    assert all(started <= e.at <= datetime.now(UTC) for e in entries)
    # One write per switch to the claim: the class and the ledger together.
    patches = [w for w in cluster.claim_writes() if w.status == 200]
    assert [p.body["spec"]["volumeAttributesClassName"] for p in patches] == ["fast", "baseline"]
    assert all(LEDGER_ANNOTATION in p.body["metadata"]["annotations"] for p in patches)
    claim = cluster.get("PersistentVolumeClaim", CLAIM, NS)
    assert claim["metadata"]["annotations"]["team"] == "ml"  # others untouched


def test_the_switch_reports_the_ledger_it_left(
    cluster: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The verdict reads the claim's switches from the hook run's ``ledger`` output."""
    monkeypatch.setattr(report_module, "in_polyaxon_run", lambda: True)
    summary = tmp_path / "s.json"
    assert switch("--summary-json", str(summary)).exit_code == 0
    written = cluster.get("PersistentVolumeClaim", CLAIM, NS)["metadata"]["annotations"][
        LEDGER_ANNOTATION
    ]
    assert load_summary(summary)["ledger"] == written
    record = json.loads(
        next((tmp_path / "plx-offline" / "runs").glob("*/run.plx.json")).read_text()
    )
    assert [(e.from_class, e.to_class) for e in parse_ledger(record["outputs"]["ledger"])] == [
        ("baseline", "fast")
    ]


def test_a_no_op_switch_adds_no_entry(cluster: FakeKube):
    assert switch(to="baseline").exit_code == 0
    assert ledger(cluster) == []


def test_a_rollback_is_recorded_too(cluster: FakeKube):
    cluster.resizer.results["fast"] = ["InvalidArgument"]
    assert switch("--on-infeasible", "rollback").exit_code == 4
    assert [(e.from_class, e.to_class) for e in ledger(cluster)] == [
        ("baseline", "fast"),
        ("fast", "baseline"),
    ]


def test_the_window_is_enforced_from_the_ledger_naming_the_next_slot(cluster: FakeKube):
    seeded = seed_ledger(cluster, 1, 2, 3, 20)  # EBS: 4 per rolling 24 h
    result = switch()
    assert result.exit_code == 3, result.output
    assert "has 4 switches in the last 24 h" in result.stderr
    next_at = seeded[0].at + timedelta(hours=24)  # when the 20 h old one leaves the window
    assert f"the next from {next_at:%Y-%m-%dT%H:%M:%SZ}" in result.stderr
    assert cluster.claim_writes() == [] and cluster.lease() is None

    forced = switch("--force")
    assert forced.exit_code == 0, forced.output
    assert "warning: --force: the claim's ledger" in forced.stderr
    assert len(ledger(cluster)) == 5


def test_switches_older_than_the_window_do_not_count(cluster: FakeKube):
    seed_ledger(cluster, 25, 26, 27, 30)
    assert switch().exit_code == 0


def test_the_gke_window_is_one_per_four_hours(fake: FakeKube):
    make_volume(fake, driver="pd.csi.storage.gke.io")
    make_class(fake, "fast", driver="pd.csi.storage.gke.io", iops="5000")
    seeded = seed_ledger(fake, 1)
    result = switch()
    assert result.exit_code == 3, result.output
    assert "pd.csi.storage.gke.io allows 1 per 4 h" in result.stderr
    assert f"the next from {seeded[0].at + timedelta(hours=4):%Y-%m-%dT%H:%M:%SZ}" in result.stderr


def test_a_hand_written_annotation_is_refused_unless_forced(cluster: FakeKube):
    annotate_ledger(cluster, "switched twice yesterday")
    result = switch()
    assert result.exit_code == 3, result.output
    assert "is not a ledger of switches" in result.stderr
    forced = switch("--force")
    assert forced.exit_code == 0, forced.output
    assert [e.to_class for e in ledger(cluster)] == ["fast"]


BAD_LEDGERS = {
    "nested": "[" * 100_000 + "]" * 100_000,
    "end-of-calendar": json.dumps(
        [{"at": "9999-12-31T23:59:59Z", "from": "baseline", "to": "fast"}] * 4
    ),
}


@pytest.mark.parametrize("value", list(BAD_LEDGERS.values()), ids=list(BAD_LEDGERS))
def test_a_ledger_no_reader_can_use_is_refused_by_every_subcommand(cluster: FakeKube, value: str):
    annotate_ledger(cluster, value)
    target = ("-n", NS, "--claim", CLAIM)
    for args in (("--dry-run",), ()):
        refused = switch(*args)
        assert refused.exit_code == 3, refused.output
        assert "is not a ledger of switches" in refused.stderr
        assert "fix or remove it (--force starts a new ledger)" in refused.stderr
    planned = run_hook("plan", *target, "--profiles", "baseline,fast")
    assert planned.exit_code == 3, planned.output
    assert "is not a ledger of switches" in planned.stderr
    shown = run_hook("status", *target)
    assert shown.exit_code == 0, shown.output
    assert "switches       not a ledger: " in shown.stdout
    assert cluster.claim_writes() == []
    forced = switch("--force")
    assert forced.exit_code == 0, forced.output
    assert "starting a new one" in forced.stderr
    assert [e.to_class for e in ledger(cluster)] == ["fast"]


@pytest.fixture
def ebs_cluster(cluster: FakeKube, ec2: Ec2) -> FakeKube:
    cluster.update(
        "PersistentVolume",
        "pvc-0001",
        None,
        lambda pv: pv["spec"]["csi"].__setitem__("volumeHandle", ec2.volume_id),
    )
    cluster.resizer.on_modify = modify_from_class(ec2)
    return cluster


def test_the_provider_is_a_second_source_and_the_stricter_wins(
    ebs_cluster: FakeKube, ec2: Ec2, use_ebs
):
    # EC2 saw 4 modifications just now (the next fits in 24 h); the ledger 4 from 20-23 h
    # ago (the next fits in 1 h): EC2's later time wins.
    ec2.modify(3100, 3200, 3300, 3400)
    seed_ledger(ebs_cluster, 20, 21, 22, 23)
    use_ebs(Stepper(since=datetime.now(UTC) + timedelta(seconds=1)))
    result = switch("--settle", "provider")
    assert result.exit_code == 3, result.output
    assert "has 4 switches in the last 24 h" in result.stderr  # the ledger's refusal
    assert "modified 4 times in the last 24 h" in result.stderr  # EC2's refusal
    ec2_next = max(
        m["StartTime"]
        for m in ec2.client.describe_volumes_modifications(VolumeIds=[ec2.volume_id])[
            "VolumesModifications"
        ]
    )
    assert "the stricter: the next switch is allowed from " in result.stderr
    stricter = result.stderr.split("the stricter: the next switch is allowed from ")[1][:20]
    assert stricter > f"{datetime.now(UTC) + timedelta(hours=23):%Y-%m-%dT%H:%M:%SZ}"
    assert ec2_next  # EC2 has the history the stricter time comes from


def test_the_ledger_refuses_where_the_provider_sees_nothing(ebs_cluster: FakeKube, use_ebs):
    # AWS may list only a volume's latest modification: the ledger still counts all four.
    seed_ledger(ebs_cluster, 1, 2, 3, 4)
    use_ebs(Stepper(since=datetime.now(UTC) + timedelta(seconds=1)))
    result = switch("--settle", "provider")
    assert result.exit_code == 3, result.output
    assert "has 4 switches in the last 24 h" in result.stderr


# ------------------------------------------------------------------------------ the Lease


def test_a_switch_takes_the_lease_and_renews_its_own(cluster: FakeKube):
    first = switch()
    assert first.exit_code == 0, first.output
    lease = cluster.lease()
    assert lease["spec"]["holderIdentity"] == "pipeline-a"
    assert lease["spec"]["leaseDurationSeconds"] == 6 * 3600
    assert "took Lease ml-team/storage-profile-training-checkpoints as pipeline-a" in first.stderr
    second = switch(to="baseline")
    assert second.exit_code == 0, second.output
    renewed = cluster.lease()
    assert "renewed Lease" in second.stderr
    assert renewed["spec"]["renewTime"] > lease["spec"]["renewTime"]
    assert renewed["spec"]["acquireTime"] == lease["spec"]["acquireTime"]
    assert renewed["spec"]["leaseTransitions"] == 0


# Valid claim names of the longest length (253), cut for the Lease where a "-" or "." falls.
LONG_CLAIMS = [
    ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]),
    "x" * 225 + "-" + "y" * 27,
    "x" * 225 + "." + "y" * 27,
    "x" * 224 + "--" + "y" * 27,
]


@pytest.mark.parametrize(
    "claim", LONG_CLAIMS, ids=["labels", "dash-at-cut", "dot-at-cut", "dashes-at-cut"]
)
def test_a_long_claim_name_gets_a_lease_name_that_fits(claim: str):
    assert len(claim) == 253 and DNS1123_SUBDOMAIN.fullmatch(claim)
    name = lease_name(claim)
    assert len(name) <= LEASE_NAME_MAX and DNS1123_SUBDOMAIN.fullmatch(name), name
    assert name.startswith(LEASE_PREFIX) and name == lease_name(claim)  # stable
    # Two long claims that differ only past the cut get two Leases.
    assert lease_name(claim[:-1] + "z") != name
    assert lease_name(CLAIM) == f"{LEASE_PREFIX}{CLAIM}"  # a name that fits is kept as is


def test_a_switch_of_a_long_claim_takes_its_lease(fake: FakeKube):
    claim = LONG_CLAIMS[0]
    make_volume(fake, claim=claim)
    make_class(fake, "fast", type="gp3", iops="6000", throughput="250")
    result = run_hook(
        "switch", "-n", NS, "--claim", claim, "--to", "fast",
        "--settle", "kubernetes",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lease = fake.lease(claim, NS)
    assert lease is not None and lease["spec"]["holderIdentity"] == "pipeline-a"
    status = run_hook("status", "-n", NS, "--claim", claim)
    assert f"lease          {lease_name(claim)}: pipeline-a" in status.stdout


def test_another_holders_fresh_lease_refuses_naming_holder_and_expiry(cluster: FakeKube):
    make_lease(cluster, "pipeline-b", renewed_ago=60, duration=3600)
    for extra in ((), ("--dry-run",)):
        result = switch(*extra)
        assert result.exit_code == 3, result.output
        assert "is held by pipeline-b until " in result.stderr
        expires = result.stderr.split("is held by pipeline-b until ")[1][:20]
        expected = datetime.now(UTC) + timedelta(seconds=3540)
        assert abs(datetime.fromisoformat(expires.replace("Z", "+00:00")) - expected) < timedelta(
            seconds=30
        )
    assert cluster.claim_writes() == []
    assert cluster.lease()["spec"]["holderIdentity"] == "pipeline-b"


def test_an_expired_lease_is_taken_over(cluster: FakeKube):
    make_lease(cluster, "pipeline-b", renewed_ago=7200, duration=3600)
    result = switch()
    assert result.exit_code == 0, result.output
    assert "took over Lease ml-team/storage-profile-training-checkpoints from pipeline-b" in (
        result.stderr
    )
    spec = cluster.lease()["spec"]
    assert spec["holderIdentity"] == "pipeline-a" and spec["leaseTransitions"] == 1


def test_release_gives_the_lease_up_for_the_next_pipeline(cluster: FakeKube):
    assert switch().exit_code == 0
    other = release("pipeline-b")
    assert other.exit_code == 3, other.output
    assert "is held by pipeline-a until" in other.stderr and "not released" in other.stderr
    mine = release("pipeline-a")
    assert mine.exit_code == 0, mine.output
    assert "released Lease ml-team/storage-profile-training-checkpoints" in mine.stdout
    assert "holderIdentity" not in cluster.lease()["spec"]
    again = release("pipeline-a")
    assert again.exit_code == 0 and "nothing to release" in again.stdout
    # The next pipeline can switch now.
    nxt = switch("--holder", "pipeline-b", to="baseline")
    assert nxt.exit_code == 0, nxt.output
    assert cluster.lease()["spec"]["holderIdentity"] == "pipeline-b"


def test_release_without_a_lease_or_of_an_expired_one_is_a_no_op(cluster: FakeKube):
    none = release("pipeline-a")
    assert none.exit_code == 0 and "nothing to release" in none.stdout
    make_lease(cluster, "pipeline-b", renewed_ago=7200, duration=3600)
    expired = release("pipeline-a")
    assert expired.exit_code == 0 and "expired" in expired.stdout
    assert cluster.lease()["spec"]["holderIdentity"] == "pipeline-b"


def renew(holder: str, *extra: str):
    return run_hook("renew", "-n", NS, "--claim", CLAIM, "--holder", holder, *extra)


def test_renew_extends_the_stages_lease_and_refuses_one_it_lost(cluster: FakeKube):
    assert switch().exit_code == 0
    taken = cluster.lease()
    mine = renew("pipeline-a", "--lease-duration", "7200")
    assert mine.exit_code == 0, mine.output
    assert "renewed Lease ml-team/storage-profile-training-checkpoints as pipeline-a" in mine.stdout
    spec = cluster.lease()["spec"]
    assert spec["leaseDurationSeconds"] == 7200 and spec["renewTime"] > taken["spec"]["renewTime"]
    other = renew("pipeline-b")
    assert other.exit_code == 3, other.output
    assert "is held by pipeline-a, not by pipeline-b: not renewed" in other.stderr
    assert release("pipeline-a").exit_code == 0
    lost = renew("pipeline-a")
    assert lost.exit_code == 3 and "is not held (released)" in lost.stderr, lost.output
    assert "holderIdentity" not in cluster.lease()["spec"]


@pytest.mark.parametrize("seconds", ["0", "2147483648", "nan"])
def test_renew_with_a_lease_duration_the_api_cannot_store_is_a_usage_error(seconds: str):
    result = run_hook("renew", "-n", NS, "--claim", CLAIM, "--lease-duration", seconds)
    assert result.exit_code == 2, result.output
    assert "--lease-duration" in result.output


def test_renew_on_the_local_backend_is_a_no_op():
    result = run_hook(
        "renew", "--backend", "local", "-n", "sandbox", "--claim", CLAIM, "--holder", "x"
    )
    assert result.exit_code == 0, result.output
    assert "no Lease; nothing to renew" in result.stdout


def test_release_on_the_local_backend_is_a_no_op():
    result = run_hook(
        "release", "--backend", "local", "-n", "sandbox", "--claim", CLAIM, "--holder", "x"
    )
    assert result.exit_code == 0, result.output
    assert "no Lease" in result.stdout


def test_status_shows_the_lease_and_the_ledger(cluster: FakeKube):
    assert switch().exit_code == 0
    args = ("status", "-n", NS, "--claim", CLAIM)
    data = json.loads(run_hook(*args, "--output", "json").stdout)
    assert data["lease"]["holder"] == "pipeline-a"
    assert [(e["from"], e["to"]) for e in data["ledger"]] == [("baseline", "fast")]
    text = run_hook(*args).stdout
    assert "lease          storage-profile-training-checkpoints: pipeline-a, until" in text
    assert "baseline -> fast (pipeline-a)" in text


def test_the_default_holder():
    def pipeline(owner: str, project: str, run: str) -> str | None:
        assert (owner, project) == ("acme", "bench")
        return {"run-1": "pipeline-9"}.get(run)

    inside = {"POLYAXON_RUN_INSTANCE": "acme.bench.runs.run-1"}
    assert default_holder(inside, pipeline) == "pipeline-9"
    alone = {"POLYAXON_RUN_INSTANCE": "acme.bench.runs.run-2"}
    assert default_holder(alone, pipeline) == "run-2"  # a run outside a pipeline
    outside = default_holder({}, pipeline)
    assert "@" in outside and outside.split("@")[1]


# A two-profile run as haupt records it: wrapper > comparison (matrix) > general DAG >
# stages (matrix) > stage DAG > switch/train. Every run's controller is the outermost one.
PARENTS = {
    "wrapper": None,
    "comparison": "wrapper",
    "general": "comparison",
    "plan": "general",
    "stages": "general",
    "stage-0": "stages",
    "switch-0": "stage-0",
    "train-0": "stage-0",
    "stage-1": "stages",
    "switch-1": "stage-1",
    "lonely": None,
}


def polyaxon_tree(failed: dict[str, str]):
    """``parent_of`` and ``failed_below`` answered from :data:`PARENTS`, ``failed`` being the
    failed runs by uuid (their names as values); the queries they were asked, in order."""
    asked: list[tuple[str, ...]] = []

    def parent_of(owner: str, project: str, run: str) -> str | None:
        assert (owner, project) == ("acme", "bench")
        asked.append(("parent", run))
        return PARENTS[run]

    def controller(run: str) -> str | None:
        top = PARENTS[run]
        while top is not None and PARENTS[top] is not None:
            top = PARENTS[top]
        return top

    def failed_below(owner: str, project: str, root: str) -> list[str]:
        asked.append(("failed", root))
        return [name for run, name in failed.items() if controller(run) == root]

    return parent_of, failed_below, asked


def inside(run: str) -> dict[str, str]:
    return {"POLYAXON_RUN_INSTANCE": f"acme.bench.runs.{run}"}


def test_a_later_stage_refuses_to_switch_after_a_failed_run_of_its_pipeline():
    parent_of, failed_below, asked = polyaxon_tree({"train-0": "train", "stage-0": "stages"})
    with pytest.raises(PreflightRefused, match=r"pipeline wrapper has failed op\(s\) \(stages, tr"):
        refuse_after_failure(inside("switch-1"), parent_of, failed_below)
    assert PreflightRefused.exit_code == 3
    # Up the chain to the outermost run, then one query for the runs it controls: the
    # general pipeline (the Lease's holder) controls none of them, nested as it is.
    assert asked == [
        *[("parent", r) for r in ("switch-1", "stage-1", "stages", "general", "comparison")],
        ("parent", "wrapper"),
        ("failed", "wrapper"),
    ]
    parent_of, failed_below, _ = polyaxon_tree({})
    refuse_after_failure(inside("switch-1"), parent_of, failed_below)  # nothing failed
    refuse_after_failure({}, parent_of, failed_below)  # outside a Polyaxon run: nobody to ask
    # A switch that is no pipeline's op has nothing to stop it.
    parent_of, failed_below, asked = polyaxon_tree({"train-0": "train"})
    refuse_after_failure(inside("lonely"), parent_of, failed_below)
    assert ("failed", "lonely") not in asked


def test_a_failed_lookup_does_not_stop_the_switch(caplog):
    def broken(*_: str) -> str | None:
        raise ConnectionError("no route to the API")

    parent_of, failed_below, _ = polyaxon_tree({"train-0": "train"})
    refuse_after_failure(inside("switch-1"), broken, failed_below)
    refuse_after_failure(inside("switch-1"), parent_of, broken)
    assert caplog.text.count("switching anyway") == 2


def test_an_unanswered_failure_lookup_does_not_stop_the_switch(caplog):
    def slow(*_: str) -> list[str]:
        time.sleep(5)
        return ["train"]

    parent_of, _, _ = polyaxon_tree({})
    started = time.monotonic()
    refuse_after_failure(inside("switch-1"), parent_of, slow, deadline=Deadline(0.2))
    assert time.monotonic() - started < 2
    assert "switching anyway" in caplog.text


def test_stop_after_failure_outside_a_polyaxon_run_switches(cluster: FakeKube):
    result = switch("--stop-after-failure", "--holder", "pipeline-a")
    assert result.exit_code == 0, result.output
    claim = cluster.get("PersistentVolumeClaim", CLAIM, NS)
    assert claim["spec"]["volumeAttributesClassName"] == "fast"


@pytest.mark.parametrize("holder", ["", "   ", "a\nb"])
def test_a_blank_or_unprintable_holder_is_a_usage_error(holder: str):
    result = run_hook("switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--holder", holder)
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize("seconds", ["0.5", "2147483648", "1e10"])
def test_a_lease_duration_the_api_cannot_store_is_a_usage_error(seconds: str):
    # leaseDurationSeconds is an int32 greater than 0: kube-apiserver refuses 0 (422) and
    # cannot even decode more than 2^31-1 (400), so the hook refuses both before asking.
    result = run_hook(
        "switch", "-n", NS, "--claim", CLAIM, "--to", "x", "--lease-duration", seconds
    )
    assert result.exit_code == 2, result.output
    assert "--lease-duration must be 1 to 2147483647 seconds" in result.stderr


def test_a_fractional_lease_duration_is_rounded_up(cluster: FakeKube):
    result = switch("--lease-duration", "90.2")
    assert result.exit_code == 0, result.output
    assert cluster.lease()["spec"]["leaseDurationSeconds"] == 91


# ------------------------------------------------- a restore only after its own pipeline's switch


def test_a_restore_leaves_a_claim_its_pipeline_never_switched_alone(cluster: FakeKube, tmp_path):
    # Another pipeline's switches in the ledger, none by this holder (its plan refused, say):
    # nothing is patched, no Lease is taken, and the exit is 0 (the restore did its job).
    seed_ledger(cluster, 5)
    summary = tmp_path / "restore.json"
    result = switch("--only-if-switched", "--summary-json", str(summary), to="fast")
    assert result.exit_code == 0, result.output
    assert "was never switched by pipeline-a (--only-if-switched)" in result.output
    assert cluster.requested == [] and cluster.get("Lease", lease_name(CLAIM), NS) is None
    data = load_summary(summary)
    assert data["outcome"] == "not-switched" and data["patched"] is False
    claim = cluster.get("PersistentVolumeClaim", CLAIM, NS)
    assert claim["spec"]["volumeAttributesClassName"] == "baseline"


def test_a_restore_switches_back_after_its_own_pipelines_switch(cluster: FakeKube):
    assert switch().exit_code == 0  # a stage of pipeline-a: baseline -> fast
    result = switch("--only-if-switched", to="baseline")
    assert result.exit_code == 0, result.output
    assert [(e.from_class, e.to_class, e.holder) for e in ledger(cluster)] == [
        ("baseline", "fast", "pipeline-a"),
        ("fast", "baseline", "pipeline-a"),
    ]


def test_a_restore_with_an_unreadable_ledger_changes_nothing(cluster: FakeKube):
    annotate_ledger(cluster, "not json")
    result = switch("--only-if-switched", to="fast")
    assert result.exit_code == 3, result.output
    assert "whether pipeline-a switched the claim is unknown" in result.stderr
    assert cluster.requested == []
