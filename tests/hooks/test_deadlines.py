"""Every call ends by the deadline: silent servers, stalled watches, a silent EC2 endpoint."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_storage_bench.retry import Deadline, DeadlineExceeded
from hooks.storage_profile.providers import EC2_READ_TIMEOUT, EbsProvider
from tests.hooks.helpers import run_hook, write_kubeconfig
from tests.hooks.kube_double import KubeDouble, make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"


@pytest.fixture
def silent() -> Iterator[str]:
    """A TCP server on loopback that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def timed(*args: str):
    started = time.monotonic()
    result = run_hook(*args)
    return result, time.monotonic() - started


@pytest.mark.timeout(60)
def test_switch_against_a_server_that_never_answers_ends_by_the_deadline(
    silent: str, tmp_path: Path
):
    config = write_kubeconfig(tmp_path / "kubeconfig", silent)
    result, elapsed = timed(
        "switch", "-n", NS, "--claim", CLAIM, "--to", "fast", "--kubeconfig", str(config),
        "--timeout", "2",
    )  # fmt: skip
    assert result.exit_code == 5, result.output
    assert elapsed < 4, elapsed  # urllib3's own 3 retries once made it 4 x the timeout
    # The deadline's message says what was failing.
    assert "deadline of 2s passed while read claim" in result.stderr
    assert "last error" in result.stderr and "timed out" in result.stderr


@pytest.mark.timeout(60)
def test_status_has_a_deadline(silent: str, tmp_path: Path):
    config = write_kubeconfig(tmp_path / "kubeconfig", silent)
    result, elapsed = timed(
        "status", "-n", NS, "--claim", CLAIM, "--kubeconfig", str(config), "--timeout", "2"
    )
    assert result.exit_code == 5, result.output
    assert elapsed < 4, elapsed


@pytest.fixture
def slow_cluster(double: KubeDouble) -> KubeDouble:
    """A claim whose modification takes far longer than the tests' deadlines."""
    make_volume(double)
    make_class(double, "baseline")
    make_class(double, "fast", iops="6000")
    double.resizer.driver_delay = 30
    return double


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", ["hang", "stall", "trickle"])
def test_a_stalled_watch_ends_by_the_deadline(slow_cluster: KubeDouble, kubeconfig: Path, fault):
    slow_cluster.watch_faults.extend([fault] * 5)
    result, elapsed = timed(
        "switch", "-n", NS, "--claim", CLAIM, "--to", "fast", "--kubeconfig", str(kubeconfig),
        "--settle", "kubernetes", "--timeout", "3",
    )  # fmt: skip
    assert result.exit_code == 5, result.output
    assert elapsed < 5, elapsed
    assert slow_cluster.count("watch") >= 1


@pytest.mark.timeout(60)
def test_ec2_calls_end_by_the_deadline(silent: str, monkeypatch: pytest.MonkeyPatch):
    # No moto here: the real botocore client talks to a loopback endpoint that never answers.
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL_EC2": silent,
    }.items():
        monkeypatch.setenv(key, value)
    provider = EbsProvider(region="us-east-1", poll_interval=0.1)
    for call in (
        lambda deadline: provider.wait_settled("vol-0123456789abcdef0", deadline),
        lambda deadline: provider.check_rate_limit("vol-0123456789abcdef0", False, deadline),
    ):
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            call(Deadline(2))
        assert time.monotonic() - started < 4


def test_ec2_client_has_no_retries_of_its_own_and_timeouts_within_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    provider = EbsProvider(region="us-east-1")
    far = provider.client(Deadline(3600)).meta.config
    assert far.retries["total_max_attempts"] == 1
    assert far.read_timeout == EC2_READ_TIMEOUT
    near = provider.client(Deadline(3)).meta.config
    assert near.connect_timeout + near.read_timeout <= 3
    assert near.retries["total_max_attempts"] == 1
