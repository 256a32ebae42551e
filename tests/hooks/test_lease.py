"""The claim's Lease: taking it (a create race lost on cue, an expired one taken over) and
renewing it between a stage's fio sweep and its training runs, against an in-memory fake of
the client wrapper; the CLI through the double is test_claim_sharing.py's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from checkpoint_storage_bench.contract import lease_name
from checkpoint_storage_bench.retry import Deadline
from hooks.storage_profile.errors import EXIT_PREFLIGHT, PreflightRefused
from hooks.storage_profile.lease import ClaimLease, microtime
from tests.hooks.fake_kube import FakeKube
from tests.hooks.kube_state import make_lease

NS, CLAIM = "ml-team", "training-checkpoints"
NAME = lease_name(CLAIM)
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def lease(kube: FakeKube, holder: str = "pipeline-a", duration: float = 7200) -> ClaimLease:
    return ClaimLease(kube, NS, CLAIM, holder, duration, now=lambda: NOW)  # type: ignore[arg-type]


def seeded(holder: str | None, renewed_ago: float) -> FakeKube:
    kube = FakeKube()
    make_lease(kube, holder, renewed_ago, now=NOW)
    return kube


def test_renew_extends_our_lease_from_now_and_keeps_its_history():
    kube = seeded("pipeline-a", renewed_ago=600)
    before = kube.read_lease(NS, NAME)
    note = lease(kube).renew(Deadline(10))
    assert note == (
        f"renewed Lease {NS}/{NAME} as pipeline-a until "
        f"{(NOW + timedelta(seconds=7200)):%Y-%m-%dT%H:%M:%SZ}"
    )
    (write,) = kube.writes
    assert write.verb == "update"
    spec = write.body["spec"]
    assert spec["renewTime"] == microtime(NOW) and spec["leaseDurationSeconds"] == 7200
    assert spec["holderIdentity"] == "pipeline-a"
    assert spec["acquireTime"] == before["spec"]["acquireTime"]
    assert spec["leaseTransitions"] == before["spec"]["leaseTransitions"]


def test_renew_keeps_an_expired_lease_nobody_took():
    # Nobody could have switched the claim without taking the Lease first.
    kube = seeded("pipeline-a", renewed_ago=10 * 3600)
    assert lease(kube).renew(Deadline(10)).startswith("renewed Lease")
    assert kube.read_lease(NS, NAME)["spec"]["renewTime"] == microtime(NOW)


@pytest.mark.parametrize(
    "holder, renewed_ago, said",
    [("pipeline-b", 60, "is held by pipeline-b"), ("pipeline-b", 10 * 3600, "is held by pipeline-b"),
     (None, 60, "is not held (released)")],
    ids=["taken-fresh", "taken-expired", "released"],
)  # fmt: skip
def test_renew_refuses_a_lease_this_holder_lost(holder, renewed_ago, said):
    kube = seeded(holder, renewed_ago)
    with pytest.raises(PreflightRefused) as info:
        lease(kube).renew(Deadline(10))
    assert info.value.exit_code == EXIT_PREFLIGHT
    assert f"Lease {NS}/{NAME} {said}, not by pipeline-a: not renewed" in str(info.value)
    assert kube.writes == []


def test_renew_refuses_when_there_is_no_lease():
    kube = FakeKube()
    with pytest.raises(PreflightRefused, match="does not exist, not by pipeline-a"):
        lease(kube).renew(Deadline(10))
    assert kube.writes == [] and kube.lease() is None


def test_renew_reads_again_after_a_concurrent_write_and_judges_what_it_finds():
    kube = seeded("pipeline-a", renewed_ago=60)

    def taken(fake: FakeKube) -> None:  # another holder takes it between our read and write
        make_lease(fake, "pipeline-b", now=NOW)

    kube.before_write = taken
    with pytest.raises(PreflightRefused, match="is held by pipeline-b"):
        lease(kube).renew(Deadline(10))
    assert kube.read_lease(NS, NAME)["spec"]["holderIdentity"] == "pipeline-b"


def test_renew_forbidden_by_rbac_is_a_refusal():
    kube = seeded("pipeline-a", renewed_ago=60)
    kube.forbidden.add("update")
    with pytest.raises(PreflightRefused, match=f"cannot update Lease {NS}/{NAME}: cannot update"):
        lease(kube).renew(Deadline(10))


def test_acquire_creates_a_missing_lease_for_the_duration():
    kube = FakeKube()
    note = lease(kube, duration=90.5).acquire(Deadline(10))
    assert note.startswith(f"took Lease {NS}/{NAME} as pipeline-a until ")
    (write,) = kube.writes
    spec = write.body["spec"]
    assert write.verb == "create" and spec["holderIdentity"] == "pipeline-a"
    assert spec["leaseDurationSeconds"] == 91  # whole seconds, rounded up
    assert spec["acquireTime"] == spec["renewTime"] == microtime(NOW)
    assert spec["leaseTransitions"] == 0


def test_acquire_that_loses_the_create_race_reads_again_and_refuses_the_winner():
    kube = FakeKube()

    def won(fake: FakeKube) -> None:  # another pipeline creates it between our read and create
        make_lease(fake, "pipeline-b", now=NOW)

    kube.before_write = won
    with pytest.raises(PreflightRefused, match="is held by pipeline-b until"):
        lease(kube).acquire(Deadline(10))
    assert kube.writes == []
    assert kube.read_lease(NS, NAME)["spec"]["holderIdentity"] == "pipeline-b"


def test_acquire_takes_over_an_expired_lease_counting_the_transition():
    kube = seeded("pipeline-b", renewed_ago=10 * 3600)
    note = lease(kube).acquire(Deadline(10))
    assert f"took over Lease {NS}/{NAME} from pipeline-b, whose lease expired at" in note
    spec = kube.read_lease(NS, NAME)["spec"]
    assert spec["holderIdentity"] == "pipeline-a" and spec["leaseTransitions"] == 1
    assert spec["acquireTime"] == microtime(NOW)
