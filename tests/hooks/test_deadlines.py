"""Every call ends by the deadline: silent servers, stalled watches, a silent EC2 endpoint."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_storage_bench.retry import Deadline, DeadlineExceeded
from hooks.storage_profile.gke import GkeProvider
from hooks.storage_profile.providers import EC2_READ_TIMEOUT, EbsProvider
from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import run_hook, write_kubeconfig
from tests.hooks.kube_double import KubeDouble
from tests.hooks.kube_state import make_class, make_volume

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


@pytest.mark.timeout(60)
def test_ebs_credentials_through_irsa_end_by_the_deadline(
    silent: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # IRSA: botocore resolves the credentials with an STS call of its own (60 s timeouts,
    # 3 tries) on the first EC2 call; STS here accepts and never answers.
    token = tmp_path / "token"
    token.write_text("a-web-identity-token")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {
        "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/storage-profile-hook",
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
        "AWS_ENDPOINT_URL_STS": silent,
        "AWS_ENDPOINT_URL_EC2": silent,
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    provider = EbsProvider(region="us-east-1", poll_interval=0.1)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        provider.check_rate_limit("vol-0123456789abcdef0", False, Deadline(2))
    assert time.monotonic() - started < 4


@pytest.mark.timeout(60)
def test_a_kubeconfig_exec_plugin_ends_by_the_deadline(double: KubeDouble, tmp_path: Path):
    import yaml

    config = double.write_kubeconfig(tmp_path / "kubeconfig")
    doc = yaml.safe_load(config.read_text())
    doc["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "sh",
            "args": ["-c", "sleep 15"],
            "interactiveMode": "Never",
        }
    }
    config.write_text(yaml.safe_dump(doc))
    for command in ("status", "switch"):
        extra = ("--to", "fast") if command == "switch" else ()
        result, elapsed = timed(
            command, "-n", NS, "--claim", CLAIM, *extra, "--kubeconfig", str(config),
            "--timeout", "2",
        )  # fmt: skip
        assert result.exit_code == 5, result.output
        assert "while loading the Kubernetes configuration" in result.stderr
        assert elapsed < 4, elapsed


@pytest.mark.timeout(60)
def test_finding_google_credentials_ends_by_the_deadline(monkeypatch: pytest.MonkeyPatch):
    import google.auth

    def metadata_probe(**_: object):
        # Outside GKE, google-auth probes the metadata server (3 s timeouts, retried).
        time.sleep(12)
        raise AssertionError("the probe should have been left behind")

    monkeypatch.setattr(google.auth, "default", metadata_probe)
    provider = GkeProvider()
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="finding Google credentials"):
        provider.disk("projects/ml/zones/us-central1-a/disks/pvc-1", Deadline(2))
    assert time.monotonic() - started < 4


@pytest.mark.timeout(60)
def test_the_polyaxon_holder_lookup_is_part_of_the_deadline(
    fake: FakeKube, monkeypatch: pytest.MonkeyPatch
):
    import polyaxon.client

    class SilentRunClient:
        """A Polyaxon API that never answers."""

        def __init__(self, **_: object) -> None:
            pass

        def refresh_data(self) -> None:
            time.sleep(15)

    monkeypatch.setattr(polyaxon.client, "RunClient", SilentRunClient)
    monkeypatch.delenv("STORAGE_PROFILE_HOLDER")
    monkeypatch.setenv("POLYAXON_RUN_INSTANCE", "acme.bench.runs.run-1")
    make_volume(fake)
    make_class(fake, "fast", iops="6000")
    for command in ("switch", "release"):
        # A dry run: a real switch would also log its report to the (absent) Polyaxon run.
        extra = ("--to", "fast", "--dry-run") if command == "switch" else ()
        result, elapsed = timed(command, "-n", NS, "--claim", CLAIM, *extra, "--timeout", "2")
        assert result.exit_code == 5, result.output
        assert elapsed < 4, elapsed
    assert fake.claim_writes() == []
