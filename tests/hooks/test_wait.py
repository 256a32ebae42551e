"""How the wait judges a claim's states and recovers from a watch's end, against an
in-memory fake of the client wrapper (what the watch sends on the wire is
test_kube_wire.py's)."""

from __future__ import annotations

import re

import pytest

from checkpoint_storage_bench.retry import Deadline
from hooks.storage_profile.errors import (
    ApiError,
    Gone,
    HookError,
    Infeasible,
    UnexpectedState,
)
from hooks.storage_profile.wait import ClaimWaiter
from tests.hooks.fake_kube import FakeKube

NS, CLAIM = "ml-team", "training-checkpoints"


def claim(spec: str | None = "fast", current: str | None = "baseline", status: str | None = None,
          uid: str = "u-1", conditions: list | None = None) -> dict:  # fmt: skip
    state: dict = {"phase": "Bound", "currentVolumeAttributesClassName": current}
    if status is not None:
        state["modifyVolumeStatus"] = {"status": status, "targetVolumeAttributesClassName": spec}
    if conditions:
        state["conditions"] = conditions
    return {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": NS, "uid": uid},
        "spec": {"volumeAttributesClassName": spec, "volumeName": "pvc-0001"},
        "status": state,
    }


SETTLED = claim(current="fast")


def fake(stored: dict) -> FakeKube:
    kube = FakeKube()
    kube.put(stored)
    return kube


def waiter(kube: FakeKube, **kwargs) -> ClaimWaiter:
    kwargs.setdefault("pending_grace", 120.0)
    return ClaimWaiter(kube, NS, CLAIM, Deadline(30), uid="u-1", **kwargs)  # type: ignore[arg-type]


def test_settles_when_the_watch_reports_the_class_applied():
    kube = fake(claim(status="InProgress"))
    kube.watches = [[("MODIFIED", claim(status="InProgress")), ("MODIFIED", SETTLED)]]
    assert waiter(kube).wait("fast") == SETTLED
    assert kube.count("list_claim") == 1 and kube.sleeps == []


def test_an_expired_watch_lists_again_at_once_and_backs_off_when_it_keeps_expiring():
    kube = fake(claim(status="InProgress"))
    gone = Gone(410, "too old resource version")
    kube.watches = [[gone], [gone], [("MODIFIED", SETTLED)]]
    assert waiter(kube).wait("fast") == SETTLED
    # The first expiry re-lists without a pause; the second in a row backs off once.
    assert kube.count("list_claim") == 3 and kube.sleeps == [0.25]


def test_an_answer_the_wait_does_not_judge_ends_it_with_the_servers_message():
    kube = fake(claim(status="InProgress"))
    kube.watches = [[ApiError(400, "bad field selector")]]
    with pytest.raises(HookError) as info:
        waiter(kube).wait("fast")
    assert (
        str(info.value) == f"waiting for claim {NS}/{CLAIM} to settle on fast: bad field selector"
    )


@pytest.mark.parametrize(
    "event, said",
    [(("DELETED", claim()), "was deleted while waiting"),
     (("MODIFIED", claim(uid="u-2")), "was deleted and re-created (its uid changed)"),
     (("MODIFIED", claim(spec="other")), "now asks for other, not fast: another writer"),
     (("MODIFIED", claim(status="Surprising")), "has unknown modify status 'Surprising'")],
    ids=["deleted", "recreated", "other-writer", "unknown-status"],
)  # fmt: skip
def test_states_that_never_settle_are_unexpected(event, said):
    kube = fake(claim(status="InProgress"))
    kube.watches = [[event]]
    with pytest.raises(UnexpectedState, match=re.escape(said)):
        waiter(kube).wait("fast")


def test_infeasible_names_the_claims_error_condition():
    error = {"type": "ModifyVolumeError", "reason": "InvalidArgument", "message": "iops too high"}
    kube = fake(claim(status="InProgress"))
    kube.watches = [[("MODIFIED", claim(status="Infeasible", conditions=[error]))]]
    warnings: list[str] = []
    with pytest.raises(Infeasible) as info:
        waiter(kube, warn=warnings.append).wait("fast")
    assert str(info.value) == (
        f"modification of claim {NS}/{CLAIM} to fast is Infeasible: InvalidArgument: iops too high"
    )
    assert warnings == ["ModifyVolumeError (InvalidArgument): iops too high"]


def test_pending_fails_once_the_grace_is_over():
    clock = iter([0.0, 0.0, 5.0, 11.0, 11.0, 11.0])
    kube = fake(claim(status="Pending"))
    kube.watches = [[("MODIFIED", claim(status="Pending"))]] * 3
    kube.add_event(claim(), "Warning", "VolumeModifyFailed", "no class")
    with pytest.raises(Infeasible, match="stayed Pending for 10s: VolumeModifyFailed: no class"):
        waiter(kube, pending_grace=10.0, clock=lambda: next(clock, 11.0)).wait("fast")
