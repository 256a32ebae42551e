"""Long waits are visible: a heartbeat line at most every interval, at the default level."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from checkpoint_storage_bench.retry import Backoff, Deadline
from hooks.storage_profile import cli
from hooks.storage_profile.config import DEFAULT_TIMEOUT, SwitchConfig
from hooks.storage_profile.heartbeat import Heartbeat
from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import Ec2, Stepper, modify_from_class, run_hook
from tests.hooks.kube_double import KubeDouble
from tests.hooks.kube_state import KubeState, make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"
LINE = re.compile(
    r"^waiting: kubernetes: (?P<k8s>.+); provider: (?P<provider>.+); "
    r"elapsed (?P<elapsed>\S+), (?P<left>\S+) left$",
    re.MULTILINE,
)


def slow_switch(state: KubeState, seconds: float, *extra: str):
    """Switch the claim to a class whose modification takes ``seconds`` (InProgress, with
    nothing else happening)."""
    make_volume(state)
    make_class(state, "fast", iops="6000")
    state.resizer.driver_delay = seconds
    return run_hook(
        "switch", "-n", NS, "--claim", CLAIM, "--to", "fast", "--settle", "kubernetes",
        "--timeout", "60", *extra,
    )  # fmt: skip


def test_a_quiet_kubernetes_wait_prints_a_heartbeat(
    fake: FakeKube, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(cli, "HEARTBEAT", 0.4)
    result = slow_switch(fake, 3.5)
    assert result.exit_code == 0, result.output
    beats = list(LINE.finditer(result.stderr))
    # At most one per interval over the ~3.5 s wait, and the wait did speak (a watch lasts
    # at least 1 s: timeoutSeconds is whole seconds).
    assert 2 <= len(beats) <= 4 / 0.4 + 1, result.stderr
    assert beats[-1]["k8s"] == "InProgress (target fast); spec fast, applied baseline"
    assert beats[-1]["provider"] == "not asked yet"
    assert beats[-1]["left"].endswith("s")
    # The watch was cut for the heartbeat and resumed without listing the claim again.
    assert fake.count("list_claim") == 1 and fake.count("watch_claim") >= 2


def test_watches_that_end_at_once_back_off_and_show_in_the_heartbeat(
    double: KubeDouble, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
):
    double.watch_faults.extend(["close"] * 100_000)  # every watch ends without an event
    backoff = Backoff.exponential(0.2, factor=2.0, cap=0.8, tries=4)
    monkeypatch.setattr(cli, "BACKOFF", backoff)
    monkeypatch.setattr(cli, "HEARTBEAT", 0.5)
    result = slow_switch(double, 3.0, "--kubeconfig", str(kubeconfig))
    assert result.exit_code == 0, result.output
    watches = double.count("watch")
    # Reopened at once, the ~3 s wait sent thousands; backing off, one per delay at most.
    assert 2 <= watches <= 3.5 / backoff.delays[0] + 1, watches
    assert double.count("list") <= watches + 1
    beats = list(LINE.finditer(result.stderr))
    assert beats, result.stderr
    assert re.search(r"; \d+ watches ended at once without an event, backing off$",
                     beats[-1]["provider"]), beats[-1]["provider"]  # fmt: skip


def test_a_provider_wait_prints_its_state_and_progress(
    fake: FakeKube, ec2: Ec2, use_ebs, monkeypatch: pytest.MonkeyPatch
):
    make_volume(fake, handle=ec2.volume_id)
    make_class(fake, "fast", type="gp3", iops="6000", throughput="250")
    fake.resizer.on_modify = modify_from_class(ec2)
    use_ebs(
        Stepper(
            since=datetime.now(UTC) - timedelta(seconds=1),
            states=["optimizing"] * 80 + ["completed"],  # ~0.8 s at one look per 0.01 s
        )
    )
    monkeypatch.setattr(cli, "HEARTBEAT", 0.3)
    result = run_hook("switch", "-n", NS, "--claim", CLAIM, "--to", "fast", "--settle", "provider")
    assert result.exit_code == 0, result.output
    provider_beats = [b for b in LINE.finditer(result.stderr) if "EC2" in b["provider"]]
    assert provider_beats, result.stderr
    beat = provider_beats[-1]
    assert beat["k8s"] == "settled on fast"
    assert beat["provider"] == (
        f"waiting for EBS volume {ec2.volume_id} to finish optimizing (EC2: optimizing, 60%)"
    )
    assert beat["elapsed"].endswith("s") and re.fullmatch(r"(\d+h)?(\d+m)?\d+s", beat["left"])


def test_at_most_one_line_per_interval():
    now = [100.0]
    lines: list[str] = []
    deadline = Deadline(3600, clock=lambda: now[0])
    beat = Heartbeat(lines.append, interval=30, clock=lambda: now[0], deadline=deadline)
    beat.kubernetes = "InProgress"
    for _ in range(100):  # ten minutes in 6 s steps
        now[0] += 6
        beat.beat()
    assert len(lines) == 20
    assert lines[0] == (
        "waiting: kubernetes: InProgress; provider: not asked yet; elapsed 30s, 59m30s left"
    )


def test_the_default_timeout_allows_for_an_ebs_optimizing_phase():
    provider = SwitchConfig(namespace=NS, claim=CLAIM, target="fast", settle="provider")
    kubernetes = SwitchConfig(namespace=NS, claim=CLAIM, target="fast", settle="kubernetes")
    assert provider.timeout == DEFAULT_TIMEOUT["provider"] == 4 * 3600
    assert kubernetes.timeout == DEFAULT_TIMEOUT["kubernetes"] == 1800
    assert SwitchConfig(namespace=NS, claim=CLAIM, target="f", timeout=5).timeout == 5
    assert "14400 with --settle provider" in " ".join(run_hook("switch", "--help").stdout.split())
