"""The client wrapper (kube.py) on the wire: how it names the answers and what it sends,
against the double, which behaves like kube-apiserver where the hook depends on it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from checkpoint_storage_bench.contract import LEDGER_ANNOTATION, LedgerEntry, format_ledger
from checkpoint_storage_bench.kube import CLAIM as KIND_CLAIM
from hooks.storage_profile.errors import ApiError, Conflict, Forbidden, Gone, Invalid, NotFound
from hooks.storage_profile.kube import Kube, load_api_client
from tests.hooks.helpers import FAST_BACKOFF
from tests.hooks.kube_double import KubeDouble
from tests.hooks.kube_state import make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"


@pytest.fixture
def kube(double: KubeDouble, kubeconfig: Path) -> Kube:
    return Kube(load_api_client(str(kubeconfig)), FAST_BACKOFF)


def patch_class(double: KubeDouble, kube: Kube, target: str | None) -> dict:
    """Patch the claim's class as the hook does: with its uid and resourceVersion, and a
    ledger entry when it sets a class."""
    meta = double.get("PersistentVolumeClaim", CLAIM, NS)["metadata"]
    ledger = None
    if target is not None:
        entry = LedgerEntry(datetime.now(UTC), None, target, "test")
        ledger = {LEDGER_ANNOTATION: format_ledger([entry])}
    return kube.patch_claim_class(
        NS, CLAIM, target, None, meta["uid"], meta["resourceVersion"], ledger
    )


def watch_claim(kube: Kube, version: str) -> list[tuple[str, dict]]:
    """One watch request of the claim, as the wait makes it through the object layer."""
    events = kube.client.stream(
        KIND_CLAIM, NS, resource_version=version, seconds=1, fieldSelector=f"metadata.name={CLAIM}"
    )
    return list(events)


def test_watch_resumes_from_a_resource_version(double: KubeDouble, kube: Kube):
    make_volume(double)
    _, version = kube.list_claim(NS, CLAIM)
    for value in ("a", "b"):
        double.update(
            "PersistentVolumeClaim",
            CLAIM,
            NS,
            lambda c, v=value: c["metadata"].setdefault("labels", {}).update(x=v),
        )
    events = watch_claim(kube, version)
    kinds = [kind for kind, _ in events]
    assert kinds == ["MODIFIED", "MODIFIED", "BOOKMARK"]
    versions = [int(obj["metadata"]["resourceVersion"]) for _, obj in events]
    assert versions[0] > int(version) and versions == sorted(versions)
    # Resuming from the first event's version replays only what came after it.
    again = watch_claim(kube, str(versions[0]))
    assert [obj["metadata"]["labels"]["x"] for kind, obj in again if kind == "MODIFIED"] == ["b"]


def test_compaction_answers_410(double: KubeDouble, kube: Kube):
    make_volume(double)
    _, version = kube.list_claim(NS, CLAIM)
    double.update(
        "PersistentVolumeClaim",
        CLAIM,
        NS,
        lambda c: c["metadata"].setdefault("labels", {}).update(x="1"),
    )
    double.compact()
    with pytest.raises(Gone) as info:
        watch_claim(kube, version)
    assert info.value.status == 410
    _, fresh = kube.list_claim(NS, CLAIM)
    assert [k for k, _ in watch_claim(kube, fresh)] == ["BOOKMARK"]


def test_class_change_on_unbound_claim_is_422(double: KubeDouble, kube: Kube):
    make_volume(double, bound=False)
    with pytest.raises(Invalid) as info:
        patch_class(double, kube, "fast")
    assert info.value.status == 422
    assert "spec is immutable after creation except resources.requests" in info.value.body


def test_nil_after_a_class_was_applied_is_422(double: KubeDouble, kube: Kube):
    make_volume(double, current="baseline")
    with pytest.raises(Invalid) as info:
        patch_class(double, kube, None)
    assert info.value.status == 422
    assert "update from non-nil value to nil is forbidden" in info.value.body


def test_nil_is_allowed_while_nothing_was_applied(double: KubeDouble, kube: Kube):
    make_volume(double, current=None)
    make_class(double, "fast")
    double.resizer.results["fast"] = ["InvalidArgument"]
    patch_class(double, kube, "fast")
    double.resizer.driver_delay = 0.0
    patched = patch_class(double, kube, None)
    assert patched["spec"].get("volumeAttributesClassName") is None


def test_other_spec_changes_are_422(double: KubeDouble, kube: Kube):
    make_volume(double)
    with pytest.raises(Invalid) as info:
        kube.client.patch(KIND_CLAIM, CLAIM, {"spec": {"storageClassName": "other"}}, NS)
    assert info.value.status == 422
    double.requests.clear()  # this write was the test's, not the hook's


def test_a_claim_of_another_driver_is_ignored_by_the_resizer(double: KubeDouble, kube: Kube):
    import time

    make_volume(double, driver="pd.csi.storage.gke.io")
    make_class(double, "fast")
    patch_class(double, kube, "fast")
    time.sleep(0.4)
    claim = double.get("PersistentVolumeClaim", CLAIM, NS)
    assert "modifyVolumeStatus" not in claim["status"]
    assert claim["status"]["currentVolumeAttributesClassName"] == "baseline"


def test_retries_throttled_reads(double: KubeDouble, kube: Kube):
    make_volume(double)
    double.fail("GET", "persistentvolumeclaims/training-checkpoints$", 429, times=2)
    assert kube.read_claim(NS, CLAIM)["metadata"]["name"] == CLAIM
    assert [r.status for r in double.requests] == [429, 429, 200]


def test_a_patch_is_refused_when_its_preconditions_do_not_hold(double: KubeDouble, kube: Kube):
    make_volume(double)
    make_class(double, "fast")
    meta = double.get("PersistentVolumeClaim", CLAIM, NS)["metadata"]
    stale = str(int(meta["resourceVersion"]) - 1)
    with pytest.raises(Conflict) as info:
        kube.patch_claim_class(NS, CLAIM, "fast", None, meta["uid"], stale, {"a": "b"})
    assert info.value.status == 409
    assert "the object has been modified" in info.value.body
    with pytest.raises(Invalid) as info:
        kube.patch_claim_class(
            NS, CLAIM, "fast", None, "another-uid", meta["resourceVersion"], {"a": "b"}
        )
    assert info.value.status == 422
    assert "metadata.uid: Invalid value" in info.value.body
    claim = double.get("PersistentVolumeClaim", CLAIM, NS)
    assert claim["spec"]["volumeAttributesClassName"] == "baseline"
    double.requests.clear()  # these writes were the test's, not the hook's


def test_leases_are_written_as_kube_apiserver_writes_them(double: KubeDouble, kube: Kube):
    """What tests/kube/test_double_parity.py found the real server doing with Leases."""

    def lease(name: str, **spec) -> dict:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 60, **spec},
        }

    def refused(call, *args) -> ApiError:
        with pytest.raises(ApiError) as info:
            call(*args)
        return info.value

    name = "storage-profile-probe"
    # A PUT of a Lease that does not exist creates it (create-on-update).
    created = kube.replace_lease(NS, name, lease(name))
    assert created["spec"]["holderIdentity"] == "a" and double.requests[-1].status == 201
    exists = refused(kube.create_lease, NS, lease(name))
    assert exists.status == 409 and isinstance(exists, Conflict)  # AlreadyExists
    # An update must carry the current resourceVersion: none is 422, an old one 409.
    assert refused(kube.replace_lease, NS, name, lease(name)).status == 422
    stale = lease(name)
    stale["metadata"]["resourceVersion"] = "1"
    modified = refused(kube.replace_lease, NS, name, stale)
    assert modified.status == 409 and isinstance(modified, Conflict)
    # leaseDurationSeconds is an int32 > 0; a fractional or too large one does not decode
    # (400), zero is invalid (422); MicroTimes have six fractional digits.
    for spec, status in (
        ({"leaseDurationSeconds": 60.0}, 400),
        ({"leaseDurationSeconds": 2**31}, 400),
        ({"leaseDurationSeconds": 0}, 422),
        ({"renewTime": "2026-01-01T00:00:00Z"}, 400),
    ):
        error = refused(kube.create_lease, NS, lease("storage-profile-other", **spec))
        assert error.status == status, (spec, error.body)
    assert double.get("Lease", "storage-profile-other", NS) is None


@pytest.mark.parametrize(
    "status, error",
    [(400, ApiError), (403, Forbidden), (404, NotFound), (409, Conflict), (410, Gone),
     (422, Invalid)],
)  # fmt: skip
def test_the_wrapper_names_each_answer_once(double: KubeDouble, kube: Kube, status, error):
    """Callers catch a name, never compare a status: the wrapper maps the answer."""
    make_volume(double)
    double.fail("GET", "persistentvolumeclaims/training-checkpoints$", status)
    with pytest.raises(ApiError) as info:
        kube.client.request("GET", KIND_CLAIM.path(NS, CLAIM))
    assert type(info.value) is error and info.value.status == status
    assert str(info.value) == f"the API server answered {status}: injected fault"
    assert [r.status for r in double.requests] == [status]  # judged, not retried
