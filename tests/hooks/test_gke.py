"""Provider settle for GKE (``pd.csi.storage.gke.io``) against a Compute Engine double on
loopback: the disk's fields change over calls, faults are injected, and credentials are
static, anonymous, or Application Default Credentials from a metadata-server double."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.oauth2.credentials import Credentials

from checkpoint_storage_bench.retry import Backoff, Deadline
from hooks.storage_profile import cli
from hooks.storage_profile.errors import (
    EXIT_DEADLINE,
    EXIT_INFEASIBLE,
    DeadlineExceeded,
    Infeasible,
    PreflightRefused,
)
from hooks.storage_profile.gke import (
    DRIVER,
    ENDPOINT_ENV,
    ComputeApiError,
    DiskTarget,
    GkeProvider,
    disk_path,
)
from hooks.storage_profile.providers import PROVIDERS
from hooks.storage_profile.switch import default_provider
from tests.hooks.compute_double import ComputeDouble
from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import hook_command, load_summary, run_hook
from tests.hooks.kube_double import KubeDouble
from tests.hooks.kube_state import KubeState, make_class, make_volume

ROOT = Path(__file__).resolve().parents[2]
NS, CLAIM = "ml-team", "training-checkpoints"
HANDLE = "projects/ml-project/zones/us-central1-a/disks/pvc-0001"
REGIONAL = "projects/ml-project/regions/us-central1/disks/pvc-0002"
TOKEN = "static-test-token"
FAST = Backoff(delays=(0.01, 0.01, 0.01))


def shipped_classes() -> dict[str, dict]:
    """The GKE classes the bundle ships (connections/vac-gke-hyperdisk.yaml)."""
    docs = yaml.safe_load_all((ROOT / "connections" / "vac-gke-hyperdisk.yaml").read_text())
    return {d["metadata"]["name"]: d for d in docs if d}


@pytest.fixture
def compute() -> Iterator[ComputeDouble]:
    server = ComputeDouble(require_token=TOKEN).start()
    server.add_disk(HANDLE)
    yield server
    server.stop()


def provider(compute: ComputeDouble, slept: list[float] | None = None, **kw) -> GkeProvider:
    def sleep(seconds: float) -> None:
        if slept is not None:
            slept.append(seconds)

    kw.setdefault("credentials", Credentials(token=TOKEN))
    return GkeProvider(
        endpoint=compute.endpoint, poll_interval=0.01, backoff=FAST, sleep=sleep, **kw
    )


# ----------------------------------------------------------------- what a class asks for


def test_targets_of_the_shipped_classes() -> None:
    classes = shipped_classes()
    assert DiskTarget.from_parameters(classes["checkpoint-baseline"]["parameters"]) == DiskTarget(
        3000, 140
    )
    assert DiskTarget.from_parameters(classes["checkpoint-throughput"]["parameters"]) == DiskTarget(
        6000, 290
    )


def test_targets_are_converted_as_the_driver_does() -> None:
    # iops: a quantity rounded up; throughput: rounded up to whole MiB/s; keys any case.
    assert DiskTarget.from_parameters({"IOPS": "3k", "Throughput": "1Gi"}) == DiskTarget(3000, 1024)
    assert DiskTarget.from_parameters({"iops": "2500.5", "throughput": "1.5Mi"}) == DiskTarget(
        2501, 2
    )
    # A bare number is bytes/s to the driver: "290" asks for 1 MiB/s, not 290.
    assert DiskTarget.from_parameters({"throughput": "290"}).throughput_mibps == 1
    assert DiskTarget.from_parameters({}) == DiskTarget(None, None)
    with pytest.raises(ValueError, match="290 Mi"):
        DiskTarget.from_parameters({"throughput": "290 Mi"})


def test_volume_handles() -> None:
    assert disk_path(HANDLE) == HANDLE and disk_path(REGIONAL) == REGIONAL
    for bad in (
        "vol-0123",
        "projects/p/zones/z/instances/i",
        "projects/p/zones/z/disks/",
        f"{HANDLE}\n",
    ):
        with pytest.raises(ComputeApiError, match="not a Compute Engine disk"):
            disk_path(bad)


def test_registered_for_the_gke_driver_only() -> None:
    pv = {"spec": {"csi": {"driver": DRIVER, "volumeHandle": HANDLE}}}
    assert isinstance(PROVIDERS[DRIVER](pv), GkeProvider)
    assert isinstance(default_provider(DRIVER, pv), GkeProvider)
    assert default_provider("example.csi.vendor.io", pv) is None


def test_endpoint_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENDPOINT_ENV, "http://127.0.0.1:9/compute/v1")
    assert GkeProvider().endpoint == "http://127.0.0.1:9/compute/v1/"
    monkeypatch.delenv(ENDPOINT_ENV)
    assert GkeProvider().endpoint == "https://compute.googleapis.com/compute/v1/"


# ---------------------------------------------------------------------------- the wait


def test_waits_until_the_disk_reports_the_class(compute: ComputeDouble) -> None:
    # The update lands in two steps: the IOPS on the 2nd look, the throughput on the 4th.
    compute.modify(HANDLE, after_looks=2, provisionedIops=6000)
    compute.modify(HANDLE, after_looks=4, provisionedThroughput=290)
    states: list[tuple[str, float | None]] = []
    note = provider(compute).wait_settled(
        HANDLE,
        Deadline(10),
        target_class=shipped_classes()["checkpoint-throughput"],
        progress=lambda state, pct: states.append((state, pct)),
    )
    assert note == f"Compute Engine disk {HANDLE} is READY with 6000 IOPS and 290 MiB/s"
    assert states == [
        ("READY, 3000 IOPS, 140 MiB/s", None),
        ("READY, 6000 IOPS, 140 MiB/s", None),
        ("READY, 6000 IOPS, 140 MiB/s", None),
    ]
    reads = compute.disk_reads()
    assert len(reads) == 4
    assert {r.path for r in reads} == {f"/compute/v1/{HANDLE}"}
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in reads)


def test_not_ready_is_not_settled_even_with_the_values(compute: ComputeDouble) -> None:
    compute.modify(HANDLE, status="CREATING", provisionedIops=6000, provisionedThroughput=290)
    compute.modify(HANDLE, after_looks=2, status="READY")
    note = provider(compute).wait_settled(
        HANDLE, Deadline(10), target_class=shipped_classes()["checkpoint-throughput"]
    )
    assert "READY" in note and len(compute.disk_reads()) == 2


def test_regional_disk_and_anonymous_credentials() -> None:
    server = ComputeDouble().start()  # no token required
    try:
        server.add_disk(REGIONAL, iops=6000, throughput=290)
        gke = provider(server, credentials=AnonymousCredentials())
        note = gke.wait_settled(
            REGIONAL, Deadline(5), target_class=shipped_classes()["checkpoint-throughput"]
        )
        assert "READY with 6000 IOPS and 290 MiB/s" in note
        (read,) = server.disk_reads()
        assert read.path == f"/compute/v1/{REGIONAL}" and "authorization" not in read.headers
    finally:
        server.stop()


def test_without_the_class_only_ready_is_awaited(compute: ComputeDouble) -> None:
    note = provider(compute).wait_settled(HANDLE, Deadline(5))
    assert note.endswith("is READY (the class's values were not checked)")


def test_a_disk_that_never_reaches_the_target_hits_the_deadline(compute: ComputeDouble) -> None:
    gke = GkeProvider(
        credentials=Credentials(token=TOKEN), endpoint=compute.endpoint, poll_interval=0.05
    )
    with pytest.raises(DeadlineExceeded) as info:
        gke.wait_settled(
            HANDLE, Deadline(0.4), target_class=shipped_classes()["checkpoint-throughput"]
        )
    assert info.value.exit_code == EXIT_DEADLINE
    message = str(info.value)
    assert "READY with 6000 IOPS and 290 MiB/s" in message
    assert "last seen: READY, 3000 IOPS, 140 MiB/s" in message
    assert len(compute.disk_reads()) >= 3  # it kept looking until the deadline


def test_a_failed_disk_is_infeasible(compute: ComputeDouble) -> None:
    compute.modify(HANDLE, after_looks=2, status="FAILED")
    with pytest.raises(Infeasible, match="is FAILED") as info:
        provider(compute).wait_settled(
            HANDLE, Deadline(5), target_class=shipped_classes()["checkpoint-throughput"]
        )
    assert info.value.exit_code == EXIT_INFEASIBLE


# ----------------------------------------------------------------- errors and retries


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (403, "needs compute.disks.get"),
        # A 401 makes google-auth refresh; a static token cannot be refreshed.
        (401, "credentials could not be refreshed"),
        (404, "not found"),
        (400, "failed: injected 400"),
    ],
)
def test_a_4xx_is_not_retried(compute: ComputeDouble, status: int, message: str) -> None:
    compute.fail(status)
    with pytest.raises(ComputeApiError, match=message):
        provider(compute).wait_settled(HANDLE, Deadline(5))
    assert len(compute.disk_reads()) == 1


def test_an_unknown_disk_is_reported(compute: ComputeDouble) -> None:
    with pytest.raises(ComputeApiError, match="was not found"):
        provider(compute).disk("projects/ml-project/zones/us-central1-a/disks/gone")


def test_wrong_credentials_are_refused(compute: ComputeDouble) -> None:
    gke = provider(compute, credentials=Credentials(token="someone-else"))
    with pytest.raises(ComputeApiError, match="credentials could not be refreshed"):
        gke.disk(HANDLE)
    assert len(compute.disk_reads()) == 1


def test_429_and_5xx_are_retried_with_retry_after(compute: ComputeDouble) -> None:
    compute.fail(429, retry_after="3")
    compute.fail(503)
    slept: list[float] = []
    disk = provider(compute, slept).disk(HANDLE, Deadline(60))
    assert disk["status"] == "READY"
    assert len(compute.disk_reads()) == 3
    # Retry-After (3 s) beat our own 0.01 s; the 503 waited our delay.
    assert slept == [3.0, 0.01]


def test_5xx_until_the_tries_run_out(compute: ComputeDouble) -> None:
    compute.fail(500, times=10)
    with pytest.raises(ComputeApiError, match="failed after 4 tries: Compute Engine answered 500"):
        provider(compute, []).disk(HANDLE)
    assert len(compute.disk_reads()) == 4


def test_a_dead_endpoint_is_retried_then_reported() -> None:
    server = ComputeDouble().start()
    endpoint = server.endpoint
    server.stop()  # nothing listens there any more
    gke = GkeProvider(
        credentials=AnonymousCredentials(), endpoint=endpoint, backoff=FAST, sleep=lambda s: None
    )
    with pytest.raises(ComputeApiError, match="connection to .* failed"):
        gke.disk(HANDLE)


# ---------------------------------------------------------------------------- preflight


def test_preflight_on_a_ready_disk(compute: ComputeDouble) -> None:
    assert provider(compute).check_rate_limit(HANDLE, force=False) == []


def test_preflight_refuses_a_disk_that_is_not_ready(compute: ComputeDouble) -> None:
    compute.modify(HANDLE, status="CREATING")
    with pytest.raises(PreflightRefused, match="is CREATING, not READY"):
        provider(compute).check_rate_limit(HANDLE, force=False)
    assert provider(compute).check_rate_limit(HANDLE, force=True) == [
        f"--force: Compute Engine disk {HANDLE} is CREATING, not READY"
    ]


def test_preflight_refuses_when_the_api_refuses(compute: ComputeDouble) -> None:
    compute.fail(403)
    with pytest.raises(PreflightRefused, match="--settle kubernetes skips the provider"):
        provider(compute).check_rate_limit(HANDLE, force=False)


# ------------------------------------------------------------------- through the real CLI


def seed_gke(state: KubeState, compute: ComputeDouble) -> None:
    """The claim is a GKE Hyperdisk; the resizer's driver call starts an update that the
    disk reports two looks later (the driver does not wait for the operation)."""
    # On the shipped baseline class already, as the bundle's claim starts: a switch to
    # it is then no modification, and GKE's one per 4 h (counted from the claim's ledger)
    # is left for the one switch to checkpoint-throughput.
    make_volume(state, driver=DRIVER, handle=HANDLE, current="checkpoint-baseline")
    for name, doc in shipped_classes().items():
        make_class(state, name, driver=DRIVER, **doc["parameters"])
    state.resizer.driver = DRIVER

    def on_modify(pv: dict, vac: dict) -> None:
        target = DiskTarget.from_parameters(vac["parameters"])
        compute.modify(
            pv["spec"]["csi"]["volumeHandle"],
            after_looks=2,
            provisionedIops=target.iops,
            provisionedThroughput=target.throughput_mibps,
        )

    state.resizer.on_modify = on_modify


@pytest.fixture
def gke_cluster(fake: FakeKube, compute: ComputeDouble) -> FakeKube:
    """:func:`seed_gke` on the in-memory fake."""
    seed_gke(fake, compute)
    return fake


def switch(*extra: str, to: str = "checkpoint-throughput"):
    return run_hook("switch", "-n", NS, "--claim", CLAIM, "--to", to, *extra)


def test_switch_waits_for_compute_engine(
    gke_cluster: FakeKube, compute: ComputeDouble, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    gke = provider(compute)
    monkeypatch.setattr(cli, "PROVIDER_FOR", lambda d, pv: gke if d == DRIVER else None)
    summary = tmp_path / "s.json"
    result = switch("--summary-json", str(summary), to="checkpoint-baseline")
    assert result.exit_code == 0, result.output  # already on the baseline: nothing to wait for
    result = switch("--summary-json", str(summary))
    assert result.exit_code == 0, result.output
    data = load_summary(summary)
    assert data["provider"] == "gcp-pd" and data["driver"] == DRIVER
    assert data["applied_class"] == "checkpoint-throughput"
    assert data["k8s_settled_at"] <= data["provider_settled_at"]
    assert f"Compute Engine disk {HANDLE} is READY with 6000 IOPS and 290 MiB/s" in data["notes"]
    disk = compute.disks[HANDLE].fields
    assert (disk["provisionedIops"], disk["provisionedThroughput"]) == ("6000", "290")
    # preflight looked once; after Kubernetes settled, the wait looked until the update landed
    assert len(compute.disk_reads()) >= 3


def test_unknown_driver_falls_back_to_kubernetes_settle(
    fake: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    driver = "example.csi.vendor.io"
    make_volume(fake, driver=driver, handle="vendor-volume-1")
    make_class(fake, "baseline", driver=driver, speed="1")
    make_class(fake, "fast", driver=driver, speed="2")
    fake.resizer.driver = driver
    monkeypatch.setattr(cli, "PROVIDER_FOR", default_provider)  # the real registry
    summary = tmp_path / "s.json"
    result = switch("--summary-json", str(summary), to="fast")
    assert result.exit_code == 0, result.output
    data = load_summary(summary)
    assert data["provider"] is None and data["applied_class"] == "fast"
    assert (
        f"no provider settle for driver {driver}: settled means settled in Kubernetes"
        in data["notes"]
    )


def test_switch_with_workload_identity_credentials(
    double: KubeDouble, compute: ComputeDouble, kubeconfig: Path, tmp_path: Path
):
    """``python -m hooks.storage_profile`` as the pod runs it: the real provider registry,
    Application Default Credentials from the (double) metadata server, as Workload
    Identity serves them, and the API endpoint from the environment."""
    seed_gke(double, compute)
    metadata = ComputeDouble(token="wi-token", require_token="wi-token").start()
    try:
        metadata.add_disk(HANDLE)
        double.resizer.on_modify = lambda pv, vac: metadata.modify(
            HANDLE, after_looks=0, provisionedIops=6000, provisionedThroughput=290
        )
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GOOGLE_", "GCE_", "CLOUDSDK_", "POLYAXON_"))
        }
        env.update(
            HOME=str(tmp_path),
            CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),  # no gcloud credentials to find
            GCE_METADATA_HOST=metadata.host,
            GCE_METADATA_IP=metadata.host,
            **{ENDPOINT_ENV: metadata.endpoint},
        )
        summary = tmp_path / "s.json"
        command = hook_command(
            "switch", "-n", NS, "--claim", CLAIM, "--to", "checkpoint-throughput",
            "--kubeconfig", str(kubeconfig), "--summary-json", str(summary),
        )  # fmt: skip
        done = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        data = load_summary(summary)
        assert data["provider"] == "gcp-pd"
        assert (
            f"Compute Engine disk {HANDLE} is READY with 6000 IOPS and 290 MiB/s" in (data["notes"])
        )
        paths = [r.path.split("?")[0] for r in metadata.requests]
        assert any(p.endswith("/service-accounts/default/token") for p in paths), paths
        reads = metadata.disk_reads()
        assert len(reads) >= 2
        assert all(r.headers["authorization"] == "Bearer wi-token" for r in reads)
    finally:
        metadata.stop()


# ------------------------------------------------------- the hook's provider interface


def test_the_heartbeat_shows_the_disk_while_the_provider_is_waited_for(
    gke_cluster: FakeKube, compute: ComputeDouble, monkeypatch: pytest.MonkeyPatch
):
    # The update lands ~0.8 s after Kubernetes settled: a few heartbeats of 0.2 s meanwhile.
    gke = GkeProvider(
        credentials=Credentials(token=TOKEN), endpoint=compute.endpoint, poll_interval=0.05
    )
    gke_cluster.resizer.on_modify = lambda pv, vac: compute.modify(
        HANDLE, after_looks=17, provisionedIops=6000, provisionedThroughput=290
    )
    monkeypatch.setattr(cli, "PROVIDER_FOR", lambda d, pv: gke if d == DRIVER else None)
    monkeypatch.setattr(cli, "HEARTBEAT", 0.2)
    result = switch()
    assert result.exit_code == 0, result.output
    beats = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("waiting: kubernetes: settled on checkpoint-throughput; provider: ")
    ]
    assert beats, result.stderr
    assert (
        f"provider: waiting for Compute Engine disk {HANDLE} to be READY with 6000 IOPS and "
        "290 MiB/s (last seen: READY, 3000 IOPS, 140 MiB/s); elapsed "
    ) in beats[-1]


@pytest.mark.timeout(60)
def test_every_call_ends_by_the_deadline() -> None:
    """A Compute Engine endpoint that accepts connections and never answers."""
    import socket
    import time

    from checkpoint_storage_bench.retry import DeadlineExceeded

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        gke = GkeProvider(
            credentials=AnonymousCredentials(),
            endpoint=f"http://127.0.0.1:{silent.getsockname()[1]}/compute/v1/",
            poll_interval=0.1,
        )
        for call in (
            lambda deadline: gke.wait_settled(HANDLE, deadline, None),
            lambda deadline: gke.check_rate_limit(HANDLE, False, deadline),
        ):
            started = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                call(Deadline(1.5))
            assert time.monotonic() - started < 2.5
