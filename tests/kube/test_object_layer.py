"""The shared object layer (checkpoint_storage_bench/kube.py) against the real API server:
apply, get, delete, errors by status, the watch (and its re-list on 410 Gone), wait()."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.retry import Deadline, DeadlineExceeded
from tests.kube.cluster import Cluster

SPACE = "object-layer"


def config_map(name: str, **data: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": SPACE},
        "data": data,
    }


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> kube.Client:
    client = kube.Client(cluster.api)
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SPACE}})
    return client


def test_apply_creates_then_patches_and_says_which(api: kube.Client) -> None:
    api.delete(kube.CONFIG_MAP, "applied", SPACE)
    first = api.apply(config_map("applied", a="1"))
    again = api.apply(config_map("applied", a="2"))
    assert first.created and not again.created
    assert api.get(kube.CONFIG_MAP, "applied", SPACE)["data"] == {"a": "2"}


def test_apply_without_force_is_a_conflict_on_another_managers_field(api: kube.Client) -> None:
    api.apply(config_map("owned", a="1"))
    other = kube.Client(api.api, field_manager="someone-else")
    with pytest.raises(kube.Conflict, match="conflict"):
        other.apply(config_map("owned", a="2"), force=False)
    assert other.apply(config_map("owned", a="2")).get("data") == {"a": "2"}


def test_answers_become_errors_named_for_their_status(
    api: kube.Client, hook_kubeconfig: Path
) -> None:
    with pytest.raises(kube.Invalid, match="422"):
        api.apply(config_map("Not_A_Name"))
    with pytest.raises(kube.NotFound):
        api.kind("example.com/v1", "Nothing")
    hook = kube.Client.from_kubeconfig(hook_kubeconfig)
    with pytest.raises(kube.Forbidden, match="forbidden"):
        hook.get(kube.CONFIG_MAP, "applied", SPACE)


def test_get_and_delete_of_what_is_not_there(api: kube.Client) -> None:
    assert api.get(kube.CONFIG_MAP, "never-made", SPACE) is None
    assert api.delete(kube.CONFIG_MAP, "never-made", SPACE) is False


def test_kinds_not_declared_are_found_by_discovery(api: kube.Client) -> None:
    found = api.kind("apps/v1", "Deployment")
    assert (found.plural, found.namespaced) == ("deployments", True)


def test_watch_lists_then_reports_changes(api: kube.Client) -> None:
    api.apply(config_map("watched", a="1"))
    events = api.watch(
        kube.CONFIG_MAP, SPACE, deadline=Deadline(30), fieldSelector="metadata.name=watched"
    )
    assert next(events)[0] == "ADDED"
    api.apply(config_map("watched", a="2"))
    kind, obj = next(events)
    assert (kind, obj["data"]) == ("MODIFIED", {"a": "2"})
    api.delete(kube.CONFIG_MAP, "watched", SPACE)
    assert next(events)[0] == "DELETED"
    events.close()


# A kind made during the test: the API server's watch cache of it starts at its creation, so
# a resourceVersion from before is one the server no longer keeps (410 Gone, "too old").
WIDGETS = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.layer.example.com"},
    "spec": {
        "group": "layer.example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def widget(name: str, size: int = 1) -> dict:
    return {
        "apiVersion": "layer.example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": SPACE},
        "spec": {"size": size},
    }


def test_watch_lists_again_when_its_resource_version_is_gone(
    api: kube.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A resourceVersion the server no longer keeps (410 Gone) is listed again: what is
    there comes as ADDED, what the caller had that vanished as DELETED, and the watch goes
    on from the new list."""
    _, expired = api.list(kube.CONFIG_MAP, SPACE)
    api.apply(WIDGETS)
    api.wait_served(WIDGETS, Deadline(30))
    widgets = api.kind("layer.example.com/v1", "Widget")
    deadline = Deadline(30)
    while True:  # the new kind is served a moment after it is established
        try:
            api.apply(widget("survivor"), deadline=deadline)
            break
        except kube.NotFound:
            deadline.sleep(0.2, "waiting for widgets to be served")
    vanished = widget("vanished")
    events = api.watch(
        widgets, SPACE, resource_version=expired, seen=[vanished], deadline=Deadline(30)
    )
    with caplog.at_level("INFO", logger="checkpoint_storage_bench.kube"):
        relisted = [(k, o["metadata"]["name"]) for k, o in (next(events) for _ in range(2))]
    assert "expired; listing again" in caplog.text
    assert relisted == [("DELETED", "vanished"), ("ADDED", "survivor")]
    api.apply(widget("survivor", 2))
    kind, obj = next(events)
    assert (kind, obj["spec"]) == ("MODIFIED", {"size": 2})
    events.close()


def test_wait_returns_when_the_test_passes_after_a_change(api: kube.Client) -> None:
    api.apply(config_map("awaited", state="pending"))
    later = threading.Timer(1.0, lambda: api.apply(config_map("awaited", state="done")))
    later.start()
    try:
        got = api.wait(
            kube.CONFIG_MAP,
            "awaited",
            lambda o: o if o and o["data"]["state"] == "done" else None,
            Deadline(20),
            SPACE,
        )
    finally:
        later.join()
    assert got["data"] == {"state": "done"}


def test_wait_sees_a_deletion_and_an_absence(api: kube.Client) -> None:
    api.apply(config_map("doomed"))
    later = threading.Timer(1.0, lambda: api.delete(kube.CONFIG_MAP, "doomed", SPACE))
    later.start()
    try:
        assert api.wait(kube.CONFIG_MAP, "doomed", lambda o: o is None, Deadline(20), SPACE)
    finally:
        later.join()
    assert api.wait(kube.CONFIG_MAP, "doomed", lambda o: o is None, Deadline(5), SPACE)


def test_wait_ends_at_its_deadline_naming_the_object(api: kube.Client) -> None:
    api.apply(config_map("stuck", state="pending"))
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"ConfigMap object-layer/stuck; last: .*stuck"):
        api.wait(kube.CONFIG_MAP, "stuck", lambda o: o and "never" in o["data"], Deadline(2), SPACE)
    assert time.monotonic() - t0 < 2 + kube.WATCH_GRACE
