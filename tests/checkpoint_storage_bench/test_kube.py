"""The object layer's request path and watch against a scripted transport: what the real
API server (tests/kube/test_object_layer.py) does not do on demand."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.retry import Backoff, Deadline, DeadlineExceeded


class Resp:
    def __init__(self, status: int = 200, body: Any = None, lines: list[Any] | None = None):
        self.status = status
        self.data = json.dumps(body).encode() if body is not None else b""
        self.lines = lines or []

    def stream(self, amt: Any = None, decode_content: bool = False):
        for line in self.lines:
            if isinstance(line, Exception):
                raise line
            yield (line if isinstance(line, str) else json.dumps(line)) + "\n"

    def release_conn(self) -> None:
        pass


def answer(status: int, message: str = "", retry_after: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason="Reason")
    exc.body = json.dumps({"kind": "Status", "message": message, "code": status})
    exc.headers = {"Retry-After": retry_after} if retry_after else {}
    return exc


class Api:
    """``call_api`` answers from a script, in order; records (method, path, query)."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.calls: list[tuple[str, str, dict]] = []

    def call_api(self, path: str, method: str, query_params: list, **_: Any) -> Resp:
        self.calls.append((method, path, dict(query_params)))
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def client(api: Api, slept: list[float]) -> kube.Client:
    return kube.Client(api, backoff=Backoff(delays=(0.5, 1.0, 2.0)), sleep=slept.append)  # type: ignore[arg-type]


def listing(rv: str, *names: str) -> Resp:
    items = [{"metadata": {"name": n, "namespace": "ns"}} for n in names]
    return Resp(body={"metadata": {"resourceVersion": rv}, "items": items})


def event(kind: str, name: str, rv: str) -> dict:
    return {
        "type": kind,
        "object": {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}},
    }


def test_throttling_and_server_errors_are_retried_honouring_retry_after() -> None:
    slept: list[float] = []
    api = Api(answer(429, "slow down", "3"), answer(503), Resp(body={"metadata": {"name": "a"}}))
    assert client(api, slept).get(kube.CLAIM, "a", "ns")["metadata"]["name"] == "a"
    assert slept == [3.0, 1.0]


def test_other_answers_are_errors_named_once_and_not_retried() -> None:
    slept: list[float] = []
    api = Api(answer(404), answer(403, "no"), answer(422, "bad"))
    layer = client(api, slept)
    assert layer.get(kube.CLAIM, "a", "ns") is None
    with pytest.raises(kube.Forbidden, match="answered 403: no"):
        layer.get(kube.CLAIM, "a", "ns")
    with pytest.raises(kube.Invalid):
        layer.apply(
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "a"}}
        )
    assert slept == [] and len(api.calls) == 3


def test_apply_is_one_server_side_apply_that_says_whether_it_created() -> None:
    api = Api(Resp(201, {"metadata": {"name": "a"}}), Resp(200, {"metadata": {"name": "a"}}))
    layer = client(api, [])
    doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}
    assert layer.apply(doc).created and not layer.apply(doc, force=False).created
    (method, path, query), second = api.calls[0], api.calls[1][2]
    assert (method, path) == ("PATCH", "/api/v1/namespaces/a")
    assert query["force"] == "true" and query["fieldManager"] == kube.FIELD_MANAGER
    assert "force" not in second


def test_a_dropped_watch_lists_again_and_reports_what_vanished() -> None:
    slept: list[float] = []
    api = Api(
        listing("10", "a", "b"),
        Resp(lines=["", event("MODIFIED", "a", "11"), urllib3.exceptions.ProtocolError("reset")]),
        listing("12", "a"),
        Resp(
            lines=[{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "old"}}]
        ),
        listing("13", "a", "c"),
        Resp(lines=[event("BOOKMARK", "a", "14")]),
        Resp(lines=[event("ADDED", "d", "15")]),
    )
    events = client(api, slept).watch(kube.CLAIM, "ns", deadline=Deadline(60))
    got = [(k, o["metadata"]["name"]) for k, o in (next(events) for _ in range(8))]
    assert got == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),  # the stream dropped: listed again after a pause
        ("ADDED", "a"),
        ("ADDED", "a"),  # 410 Gone: listed again at once
        ("ADDED", "c"),
        ("ADDED", "d"),  # the bookmark moved the version on: the next watch starts there
    ]
    assert slept == [0.5]
    watches = [q for m, p, q in api.calls if q.get("watch") == "true"]
    assert [q["resourceVersion"] for q in watches] == ["10", "12", "13", "14"]


def test_a_watch_that_ends_at_once_is_retried_after_a_pause() -> None:
    slept: list[float] = []
    api = Api(
        listing("1", "a"), Resp(lines=[]), listing("2", "a"), Resp(lines=[event("ADDED", "b", "3")])
    )
    events = client(api, slept).watch(kube.CLAIM, "ns")
    assert [(k, o["metadata"]["name"]) for k, o in (next(events) for _ in range(3))] == [
        ("ADDED", "a"),
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]
    assert slept == [0.5]


def test_wait_ends_by_its_deadline_naming_the_last_state() -> None:
    now = [0.0]
    deadline = Deadline(5, clock=lambda: now[0])
    api = Api(listing("1", "a"), Resp(lines=[]))
    scripted = api.call_api

    def call_api(path: str, method: str, query_params: list, **kw: Any) -> Resp:
        if dict(query_params).get("watch"):
            now[0] = 6.0  # the watch outlived the deadline
        return scripted(path, method, query_params, **kw)

    api.call_api = call_api  # type: ignore[method-assign]
    with pytest.raises(DeadlineExceeded, match="PersistentVolumeClaim ns/a; last: .*a"):
        client(api, []).wait(kube.CLAIM, "a", lambda o: False, deadline, "ns")


def test_no_answer_is_told_to_the_caller_before_it_is_retried() -> None:
    """A caller that knows the server was never reached refuses at once (the hook's exit 3);
    once the server answered, a refused connection is a restart, retried."""
    told: list[tuple[str, str]] = []

    def never_reached(what: str, exc: BaseException) -> None:
        told.append((what, type(exc).__name__))
        if not layer.answered:
            raise RuntimeError(f"unreachable: {what}")

    refused = urllib3.exceptions.NewConnectionError(None, "Connection refused")  # type: ignore[arg-type]
    api = Api(refused, Resp(body={"metadata": {"name": "a"}}), refused, Resp(body={}))
    slept: list[float] = []
    layer = kube.Client(api, backoff=Backoff(delays=(0.5,)), sleep=slept.append,  # type: ignore[arg-type]
                        on_connection_error=never_reached)  # fmt: skip
    with pytest.raises(RuntimeError, match="unreachable: GET /api/v1/namespaces/ns/pers"):
        layer.get(kube.CLAIM, "a", "ns")
    assert not layer.answered and slept == []
    assert layer.get(kube.CLAIM, "a", "ns") is not None and layer.answered
    assert layer.get(kube.CLAIM, "a", "ns") == {}  # refused once, then answered
    assert slept == [0.5] and [t for _, t in told] == ["NewConnectionError"] * 2


def test_a_failed_tls_handshake_is_no_answer_not_an_attribute_error() -> None:
    class Tls(Api):
        def call_api(self, *args: Any, **kwargs: Any) -> Resp:
            # What the official client does: ApiException(status=0), then it fails to
            # decode the missing body.
            try:
                raise ApiException(status=0, reason="SSLError\ncertificate verify failed")
            except ApiException as e:
                e.body.decode("utf-8")
            raise AssertionError("unreachable")

    told: list[BaseException] = []
    layer = kube.Client(Tls(), backoff=Backoff(delays=()), on_connection_error=lambda w, e: told.append(e))  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(kube.TemporaryError, match="TLS failed: SSLError"):
        layer.get(kube.CLAIM, "a", "ns")
    assert isinstance(told[0], ApiException) and told[0].status == 0


def test_a_deadline_passed_while_retrying_names_the_last_error() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    api = Api(answer(503, "etcd is slow"), answer(503, "etcd is slow"))
    layer = kube.Client(api, backoff=Backoff(delays=(4.0, 4.0)), sleep=sleep)  # type: ignore[arg-type]
    with pytest.raises(DeadlineExceeded, match="last error: the API server answered 503: etcd"):
        layer.get(kube.CLAIM, "a", "ns", deadline=Deadline(5, clock=lambda: now[0]))


def test_an_error_keeps_the_body_the_server_sent() -> None:
    api = Api(answer(409, "the object has been modified"))
    with pytest.raises(kube.Conflict) as info:
        client(api, []).patch(kube.CLAIM, "a", {}, "ns")
    assert info.value.server_message == "the object has been modified"
    assert json.loads(info.value.body)["code"] == 409


def test_a_watch_that_trickles_blank_lines_ends_by_the_deadline() -> None:
    now = [0.0]

    class Trickle(Resp):
        def stream(self, amt: Any = None, decode_content: bool = False):
            yield json.dumps(event("MODIFIED", "a", "2")) + "\n"
            while True:  # blank lines for ever, as the clock passes the deadline
                now[0] += 1.0
                yield "\n"

    deadline = Deadline(5, clock=lambda: now[0])
    events = client(Api(Trickle()), []).stream(
        kube.CLAIM, "ns", resource_version="1", seconds=60, deadline=deadline
    )
    assert [k for k, _ in events] == ["MODIFIED"]
    assert 5.0 <= now[0] <= 6.0


def test_a_call_can_be_named_for_its_errors() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    api = Api(answer(503))
    layer = kube.Client(api, backoff=Backoff(delays=(9.0,)), sleep=sleep)  # type: ignore[arg-type]
    with pytest.raises(DeadlineExceeded, match="passed while read claim ns/a"):
        layer.get(kube.CLAIM, "a", "ns", Deadline(5, clock=lambda: now[0]), what="read claim ns/a")


def test_a_version_that_expires_again_after_a_fresh_list_backs_off() -> None:
    slept: list[float] = []
    retried: list[Exception] = []
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "old"}}
    api = Api(
        listing("1", "a"),
        Resp(lines=[gone]),
        listing("2", "a"),
        Resp(lines=[gone]),  # expired again at once: a pause before the next list
        listing("3", "a"),
        Resp(lines=[]),  # ended at once without an event: a longer pause
        listing("4", "a"),
        Resp(lines=[event("MODIFIED", "a", "5")]),
    )
    events = client(api, slept).watch(kube.CLAIM, "ns", on_retry=retried.append)
    assert [k for k, _ in (next(events) for _ in range(5))] == ["ADDED"] * 4 + ["MODIFIED"]
    assert slept == [0.5, 1.0]
    assert "expired 2 times in a row" in str(retried[0])
    assert isinstance(retried[1], kube.ShortWatch)


def test_a_list_again_that_fails_is_retried_after_a_pause_not_raised() -> None:
    slept: list[float] = []
    api = Api(
        listing("1", "a"),
        Resp(lines=[event("MODIFIED", "a", "2"), urllib3.exceptions.ProtocolError("reset")]),
        answer(503),
        answer(503),  # the server restarting: the list fails after its own tries
        listing("3", "a"),
        Resp(lines=[event("MODIFIED", "a", "4")]),
    )
    layer = kube.Client(api, backoff=Backoff(delays=(0.5,)), sleep=slept.append)  # type: ignore[arg-type]
    events = layer.watch(kube.CLAIM, "ns")
    assert [k for k, _ in (next(events) for _ in range(4))] == [
        "ADDED",
        "MODIFIED",
        "ADDED",
        "MODIFIED",
    ]
    assert len(slept) == 3
