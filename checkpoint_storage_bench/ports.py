"""Ports for the processes we start (the control plane's, the node's, the sandbox's server,
moto, the training operator's webhook, torchrun's rendezvous).

A port is chosen here and bound later by another process, so something else may take it in
between. The kernel's own choice (binding port 0) comes from its ephemeral range, the range
every outgoing connection on the machine draws its local port from: on a busy machine one of
them takes the port just released (etcd then fails with "bind: address already in use").
So a port comes from below that range, where only a listener binds, and below Kubernetes'
NodePort range too (a node's kube-proxy sends those to Services), and never twice from one
process.

>>> port = free_port()
>>> FIRST_PORT <= port < min(ephemeral_range()[0], END_PORT) and port_free("127.0.0.1", port)
True
>>> port != free_port()
True
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Where a chosen port comes from: at or above FIRST_PORT, below END_PORT (where Kubernetes'
# NodePort range starts) and below the ephemeral range.
FIRST_PORT = 10_000
END_PORT = 30_000
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_RANGE = (32_768, 60_999)
ATTEMPTS = 200

_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default where the
    file cannot be read)."""
    try:
        low, high = EPHEMERAL_RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_RANGE


def port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port no process listens on at ``host`` now, outside the ephemeral range, that this
    process has not handed out before."""
    end = min(ephemeral_range()[0], END_PORT)
    if end - FIRST_PORT < 1_000:  # a machine whose ephemeral range starts low: the kernel's
        return _kernel_port(host)
    for _ in range(ATTEMPTS):
        port = random.randrange(FIRST_PORT, end)
        if port not in _handed_out and port_free(host, port):
            _handed_out.add(port)
            return port
    return _kernel_port(host)


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    _handed_out.add(port)
    return port
