"""The node's cluster DNS (localcluster/cluster_dns.py): a Service's name gets its addresses,
an unknown name NXDOMAIN, over a real UDP socket as a pod's resolver asks."""

from __future__ import annotations

import socket
import struct
import threading

import pytest
from click.testing import CliRunner, Result

from localcluster import cluster_dns as dns

NAME = "job-master-0.ml-team.svc.cluster.local"


class Table:
    """Stands for the API server: one headless Service with two ready pods."""

    def lookup(self, name: str) -> list[str] | None:
        if dns.SERVICE_NAME.match(name) is None:
            return None
        if name == "starting.ml-team.svc.cluster.local":
            return []  # a headless Service whose pod has no address yet
        return ["10.244.0.7", "10.244.0.8"] if name == NAME else None


def header(packet: bytes) -> tuple[int, ...]:
    return struct.unpack("!HHHHHH", packet[:12])


def addresses(packet: bytes) -> list[str]:
    count = header(packet)[3]
    return [
        socket.inet_ntoa(packet[len(packet) - 16 * (count - i) + 12 :][:4]) for i in range(count)
    ]


def test_a_services_name_gets_its_addresses() -> None:
    reply = dns.answer(Table(), dns.query(NAME, ident=7))
    ident, flags, questions, answers, _, _ = header(reply)
    assert (ident, flags & 0xF, questions, answers) == (7, dns.NOERROR, 1, 2)
    assert flags & 0x8000 and flags & 0x0400  # a response, authoritative
    assert addresses(reply) == ["10.244.0.7", "10.244.0.8"]


def test_an_unknown_name_is_nxdomain_and_another_type_empty() -> None:
    assert header(dns.answer(Table(), dns.query("nope.ml-team.svc.cluster.local")))[1] & 0xF == 3
    assert header(dns.answer(Table(), dns.query("example.org")))[1] & 0xF == dns.NXDOMAIN
    aaaa = header(dns.answer(Table(), dns.query(NAME, qtype=28)))
    assert (aaaa[1] & 0xF, aaaa[3]) == (dns.NOERROR, 0)


def test_a_service_without_a_pod_address_does_not_exist_yet() -> None:
    # As CoreDNS answers: a client waiting for the name (the worker's init container) retries
    # instead of taking an empty answer for a resolved name.
    name = "starting.ml-team.svc.cluster.local"
    assert header(dns.answer(Table(), dns.query(name)))[1] & 0xF == dns.NXDOMAIN
    assert header(dns.answer(Table(), dns.query(name, qtype=28)))[1] & 0xF == dns.NOERROR


def test_a_malformed_query_is_a_format_error() -> None:
    assert header(dns.answer(Table(), b"\x00\x09" + b"\x01" * 11))[1] & 0xF == dns.FORMERR
    assert header(dns.answer(Table(), b"\x00"))[1] & 0xF == dns.FORMERR


def test_the_server_answers_over_udp() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    threading.Thread(target=dns.serve, args=(Table(), "127.0.0.1", port), daemon=True).start()
    for _ in range(50):
        if dns.answers("127.0.0.1", port, timeout=0.1):
            break
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        sock.sendto(dns.query(NAME), ("127.0.0.1", port))
        assert addresses(sock.recv(512)) == ["10.244.0.7", "10.244.0.8"]


class Objects:
    """Stands for the object layer: Services and pods as the API's JSON."""

    def __init__(self, services: dict[str, dict], pods: list[dict]) -> None:
        self.services, self.pods, self.selectors = services, pods, []

    def get(self, kind, name: str, namespace: str) -> dict | None:
        assert (kind, namespace) == (dns.SERVICE, "ml-team")
        return self.services.get(name)

    def list(self, kind, namespace: str, **selectors: str) -> tuple[list[dict], str]:
        assert kind.plural == "pods" and namespace == "ml-team"
        self.selectors.append(selectors)
        return self.pods, "1"


def pod(ip: str | None, phase: str) -> dict:
    return {"status": {"phase": phase, **({"podIP": ip} if ip else {})}}


def test_the_resolver_reads_a_services_address_or_its_pods_by_selector() -> None:
    headless = {"spec": {"clusterIP": "None", "selector": {"role": "master", "job": "j"}}}
    objects = Objects(
        {"job-master-0": headless, "web": {"spec": {"clusterIP": "10.96.0.9"}}},
        # Running or Pending (ready or not: torchrun resolves its own name early), never a
        # finished pod's or one without an address.
        [pod("10.244.0.8", "Running"), pod("10.244.0.7", "Pending"), pod("10.244.0.6", "Failed")]
        + [pod(None, "Pending")],
    )
    resolver = dns.Resolver(objects)
    assert resolver.lookup(NAME) == ["10.244.0.7", "10.244.0.8"]
    assert objects.selectors == [{"labelSelector": "job=j,role=master"}]
    assert resolver.lookup("web.ml-team.svc.cluster.local") == ["10.96.0.9"]
    assert resolver.lookup("nope.ml-team.svc.cluster.local") is None
    assert resolver.lookup("example.org") is None


def _run_cli(*args: str) -> Result:
    return CliRunner().invoke(dns.main, list(args), prog_name="python -m localcluster.cluster_dns")


def test_the_command_line_takes_a_kubeconfig_and_an_address_to_listen_on() -> None:
    done = _run_cli("--help")
    assert done.exit_code == 0
    assert "--kubeconfig PATH" in done.stdout and "--listen ADDRESS[:PORT]" in done.stdout
    assert _run_cli("--listen", "127.0.0.1").exit_code == 2  # --kubeconfig is required
    assert _run_cli("--kubeconfig", "k", "--listen", "1.2.3.4", "--port", "53").exit_code == 2


def test_a_listen_address_whose_port_is_no_number_is_a_usage_error() -> None:
    done = _run_cli("--kubeconfig", "k", "--listen", "127.0.0.1:dns")
    assert done.exit_code == 2
    assert done.stderr == (
        "localcluster: error: bad --listen '127.0.0.1:dns': the port is not a number\n"
    )


def test_an_address_taken_is_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dns.Resolver, "from_kubeconfig", classmethod(lambda cls, path: Table()))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        done = _run_cli("--kubeconfig", "k", "--listen", f"127.0.0.1:{port}")
    assert done.exit_code == 1
    assert done.stderr.startswith(f"localcluster: error: cannot serve DNS on 127.0.0.1:{port}: ")
    assert done.stderr.count("\n") == 1
