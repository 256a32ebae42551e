"""A chosen port stays free for the process that binds it later: it is not in the range the
kernel draws outgoing connections' local ports from, and one process never gets it twice."""

from __future__ import annotations

import socket

from checkpoint_storage_bench import ports


def test_a_chosen_port_is_outside_the_range_outgoing_connections_draw_from():
    low, high = ports.ephemeral_range()
    chosen = {ports.free_port() for _ in range(50)}
    assert all(ports.FIRST_PORT <= p < min(low, ports.END_PORT) for p in chosen), sorted(chosen)
    # What etcd lost its port to: a connection's local port, from the kernel's range.
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        try:
            assert low <= client.getsockname()[1] <= high
        finally:
            client.close()


def test_one_process_never_gets_the_same_port_twice():
    chosen = [ports.free_port() for _ in range(500)]
    assert len(set(chosen)) == len(chosen)


def test_a_port_a_listener_holds_is_not_chosen(monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as held:
        taken = held.getsockname()[1]
        assert not ports.port_free("127.0.0.1", taken)
        # Only that port to choose from below the range: nothing free there, so the kernel's.
        monkeypatch.setattr(ports, "FIRST_PORT", taken)
        monkeypatch.setattr(ports, "END_PORT", taken + 1_000)
        monkeypatch.setattr(ports.random, "randrange", lambda a, b: taken)
        assert ports.free_port() != taken


def test_a_machine_whose_ephemeral_range_starts_low_gets_the_kernels_choice(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.FIRST_PORT + 10, 65_000))
    port = ports.free_port()
    assert ports.port_free("127.0.0.1", port)
