"""A cluster DNS for the local node: ``<service>.<namespace>.svc.cluster.local`` answered from
the API server, for the pods that find each other by name (a PyTorchJob's workers find their
master through its headless Service: localcluster/training_operator.py).

A real cluster runs CoreDNS; this answers only what the node's pods ask: A records of
Services (a headless Service's running pods, ready or not, else its cluster IP), an empty
answer for other types of a known name, NXDOMAIN for every other name and for a headless
Service without a pod that has an address (nothing is forwarded: the node
reaches no outside resolver anyway). UDP only, one question per query. The kubelet points the
pods at it when the node is started with ``cluster_dns=True`` (``clusterDNS`` in its config).

``python -m localcluster.cluster_dns --kubeconfig K --listen ADDRESS[:PORT]`` (its options:
:class:`localcluster.config.DnsConfig`).
"""

from __future__ import annotations

import logging
import re
import socket
import struct
from typing import Any

import click

from checkpoint_storage_bench import kube
from checkpoint_storage_bench.config_cli import config_options
from checkpoint_storage_bench.errors import exit_codes_help
from checkpoint_storage_bench.retry import Backoff
from localcluster.config import DnsConfig
from localcluster.errors import EXIT_FAILED, EXIT_USAGE, ClusterFailed

DOMAIN = "cluster.local"
TTL = 5
A, CLASS_IN = 1, 1
NOERROR, FORMERR, NXDOMAIN = 0, 1, 3
SERVICE_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9][-a-z0-9]*)\.svc\.cluster\.local$"
)

log = logging.getLogger("cluster_dns")
SERVICE = kube.Kind("v1", "Service", "services")


def parse_query(packet: bytes) -> tuple[int, int, str, int, int, int]:
    """(id, flags, name, qtype, qclass, end of the question) of a one-question query.
    Raises ValueError on anything else."""
    if len(packet) < 12:
        raise ValueError("short header")
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1:
        raise ValueError(f"{qdcount} questions")
    labels, pos = [], 12
    while True:
        if pos >= len(packet):
            raise ValueError("truncated name")
        length = packet[pos]
        pos += 1
        if length == 0:
            break
        if length > 63:
            raise ValueError("compressed or bad label")
        labels.append(packet[pos : pos + length].decode("ascii", "replace"))
        pos += length
    if pos + 4 > len(packet):
        raise ValueError("truncated question")
    qtype, qclass = struct.unpack("!HH", packet[pos : pos + 4])
    return ident, flags, ".".join(labels).lower(), qtype, qclass, pos + 4


def response(query: bytes, rcode: int, addresses: list[str] | None = None) -> bytes:
    """The answer to ``query``: its question echoed, one A record per address."""
    ident, flags, _name, _qtype, _qclass, end = parse_query(query)
    addresses = addresses or []
    rd = flags & 0x0100
    header = struct.pack("!HHHHHH", ident, 0x8000 | 0x0400 | rd | rcode, 1, len(addresses), 0, 0)
    answers = b"".join(
        struct.pack("!HHHIH", 0xC00C, A, CLASS_IN, TTL, 4) + socket.inet_aton(a) for a in addresses
    )
    return header + query[12:end] + answers


def error(query: bytes, rcode: int) -> bytes:
    ident = struct.unpack("!H", query[:2])[0] if len(query) >= 2 else 0
    return struct.pack("!HHHHHH", ident, 0x8000 | rcode, 0, 0, 0, 0)


class Resolver:
    """Names -> addresses from the API server, through the shared object layer.

    Args:
        objects: The object layer on the node's admin credentials (a query waits for no
            retry: a failed read is a SERVFAIL at once, and the client asks again).
    """

    def __init__(self, objects: kube.Client) -> None:
        self.objects = objects

    @classmethod
    def from_kubeconfig(cls, path: str) -> Resolver:
        return cls(kube.Client.from_kubeconfig(path, backoff=Backoff(delays=())))

    def lookup(self, name: str) -> list[str] | None:
        """The addresses of ``name`` (empty: a known Service without ready endpoints), or None
        when no such Service exists."""
        match = SERVICE_NAME.match(name)
        if match is None:
            return None
        service, namespace = match.group(1), match.group(3)
        svc = self.objects.get(SERVICE, service, namespace)
        if svc is None:
            return None
        spec = svc.get("spec") or {}
        if spec.get("clusterIP") and spec["clusterIP"] != "None":
            return [spec["clusterIP"]]
        # A headless Service: its pods' addresses, chosen by its selector as the endpoints
        # controller would (the node's controller manager runs no endpoint controllers).
        selector = spec.get("selector") or {}
        if not selector:
            return []
        pods, _ = self.objects.list(
            kube.POD,
            namespace,
            labelSelector=",".join(f"{k}={v}" for k, v in sorted(selector.items())),
        )
        # Every pod with an address, ready or not (as with publishNotReadyAddresses): a
        # PyTorchJob's master resolves its own name as soon as torchrun starts, before the
        # kubelet reports the pod ready.
        statuses = [pod.get("status") or {} for pod in pods]
        return sorted(
            status["podIP"]
            for status in statuses
            if status.get("podIP") and status.get("phase") in ("Pending", "Running")
        )


def answer(resolver: Resolver, query: bytes) -> bytes:
    try:
        _ident, _flags, name, qtype, qclass, _end = parse_query(query)
    except ValueError:
        return error(query, FORMERR)
    try:
        addresses = resolver.lookup(name) if qclass == CLASS_IN else None
    except Exception as exc:  # noqa: BLE001 - the API may be restarting: the client retries
        log.warning("lookup %s: %r", name, exc)
        return error(query, 2)  # SERVFAIL
    if addresses is None or (qtype == A and not addresses):
        # As CoreDNS answers a headless Service without endpoints: the name does not exist
        # yet (a client waiting for it, as the training operator's init container does,
        # retries).
        return response(query, NXDOMAIN)
    return response(query, NOERROR, addresses if qtype == A else [])


def serve(resolver: Resolver, address: str, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, port))
    log.info("serving %s on %s:%d", DOMAIN, address, port)
    while True:
        query, peer = sock.recvfrom(512)
        sock.sendto(answer(resolver, query), peer)


def query(name: str, qtype: int = A, ident: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return (
        struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, CLASS_IN)
    )


def answers(address: str, port: int = 53, timeout: float = 0.5) -> bool:
    """Whether a server on ``address`` answers a query (the start's readiness check)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(query(f"kubernetes.default.svc.{DOMAIN}"), (address, port))
            return len(sock.recv(512)) >= 12
        except OSError:
            return False


@click.command(
    epilog=exit_codes_help(
        {
            EXIT_FAILED: "the address cannot be served (taken, not this machine's)",
            EXIT_USAGE: "bad usage",
        }
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@config_options(DnsConfig)
def main(**settings: Any) -> None:
    """Answer the node's pods' DNS queries for Services from the API server, until stopped."""
    cfg = DnsConfig(**settings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    resolver = Resolver.from_kubeconfig(str(cfg.kubeconfig))
    try:
        serve(resolver, cfg.host, cfg.port)
    except OSError as exc:
        raise ClusterFailed(f"cannot serve DNS on {cfg.host}:{cfg.port}: {exc}") from exc


if __name__ == "__main__":
    main()
