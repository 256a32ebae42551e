"""Provider settle for EBS: moto's EC2, stepped through modifying -> optimizing -> completed,
after a switch against the in-memory fake of the client wrapper."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from checkpoint_storage_bench.retry import Deadline
from hooks.storage_profile.errors import DeadlineExceeded, PreflightRefused
from hooks.storage_profile.providers import EbsProvider, region_of
from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import Ec2, Stepper, load_summary, modify_from_class, run_hook
from tests.hooks.kube_state import make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"


@pytest.fixture
def ebs_cluster(fake: FakeKube, ec2: Ec2) -> FakeKube:
    """The claim is backed by a real (moto) EBS volume; the resizer calls EC2."""
    make_volume(fake, handle=ec2.volume_id)
    make_class(fake, "baseline", type="gp3", iops="3000", throughput="125")
    make_class(fake, "fast", type="gp3", iops="6000", throughput="250")
    fake.resizer.on_modify = modify_from_class(ec2)
    return fake


def switch(*extra: str, to: str = "fast"):
    return run_hook("switch", "-n", NS, "--claim", CLAIM, "--to", to, *extra)


def now() -> datetime:
    return datetime.now(UTC)


def test_waits_until_ec2_completed(ebs_cluster: FakeKube, ec2: Ec2, use_ebs, tmp_path: Path):
    stepper = Stepper(since=now() - timedelta(seconds=1))
    use_ebs(stepper)
    summary = tmp_path / "s.json"
    result = switch("--summary-json", str(summary))
    assert result.exit_code == 0, result.output
    # The rate-limit look saw nothing new; then the wait stepped through every state.
    assert stepper.seen == ["modifying", "optimizing", "completed"]
    volume = ec2.client.describe_volumes(VolumeIds=[ec2.volume_id])["Volumes"][0]
    assert (volume["Iops"], volume["Throughput"]) == (6000, 250)
    data = load_summary(summary)
    assert data["provider"] == "aws-ebs"
    assert data["k8s_settled_at"] <= data["provider_settled_at"]
    assert data["provider_settle_s"] >= 0
    assert data["total_settle_s"] == pytest.approx(
        data["k8s_settle_s"] + data["provider_settle_s"], abs=0.002
    )
    assert f"EC2 modification of {ec2.volume_id} completed" in result.stderr


def test_provider_failure_is_infeasible(ebs_cluster: FakeKube, use_ebs):
    use_ebs(Stepper(since=now() - timedelta(seconds=1), states=["modifying", "failed"]))
    result = switch()
    assert result.exit_code == 4, result.output
    assert "failed: Stepped failure" in result.stderr


def test_refuses_a_fifth_modification_in_24h(ebs_cluster: FakeKube, ec2: Ec2, use_ebs):
    ec2.modify(3100, 3200, 3300, 3400)
    use_ebs(Stepper(since=now()))
    result = switch()
    assert result.exit_code == 3, result.output
    assert "modified 4 times in the last 24 h; AWS allows 4 per rolling window" in result.stderr
    assert ebs_cluster.claim_writes() == []

    forced = switch("--force")
    assert forced.exit_code == 0, forced.output
    assert "warning: --force:" in forced.stderr


def test_modifications_older_than_24h_do_not_count(ebs_cluster: FakeKube, ec2: Ec2, use_ebs):
    ec2.modify(3100, 3200, 3300, 3400)
    use_ebs(Stepper(since=now()), now=lambda: now() + timedelta(hours=25))
    result = switch()
    assert result.exit_code == 0, result.output


def test_refuses_while_the_previous_modification_is_optimizing(
    ebs_cluster: FakeKube, ec2: Ec2, use_ebs
):
    since = now() - timedelta(seconds=1)
    ec2.modify(3500)
    use_ebs(Stepper(since=since, states=["optimizing"]))
    result = switch()
    assert result.exit_code == 3, result.output
    assert "still optimizing (60%)" in result.stderr
    assert ebs_cluster.claim_writes() == []


def test_already_on_class_still_waits_for_optimizing(ebs_cluster: FakeKube, ec2: Ec2, use_ebs):
    # The claim settled in Kubernetes, but EC2 is still optimizing the last change.
    since = now() - timedelta(seconds=1)
    ec2.modify(3000)
    stepper = Stepper(since=since, states=["optimizing", "optimizing", "completed"])
    use_ebs(stepper)
    result = switch(to="baseline")
    assert result.exit_code == 0, result.output
    assert stepper.seen == ["optimizing", "optimizing", "completed"]
    assert ebs_cluster.claim_writes() == []


def test_unknown_driver_falls_back_to_kubernetes_settle(fake: FakeKube, tmp_path: Path):
    from hooks.storage_profile import cli
    from hooks.storage_profile.switch import default_provider

    make_volume(fake, driver="disk.csi.example.com")
    make_class(fake, "fast", driver="disk.csi.example.com", speed="high")
    fake.resizer.driver = "disk.csi.example.com"
    summary = tmp_path / "s.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "PROVIDER_FOR", default_provider)
        result = switch("--summary-json", str(summary))
    assert result.exit_code == 0, result.output
    data = load_summary(summary)
    assert data["provider"] is None and data["provider_settled_at"] is None
    assert "no provider settle for driver disk.csi.example.com" in data["notes"][0]


def test_provider_wait_respects_the_deadline(ec2: Ec2):
    ec2.modify(3500)
    client = ec2.client
    Stepper(since=now() - timedelta(seconds=5), states=["optimizing"]).attach(client)
    provider = EbsProvider(ec2=client, poll_interval=0.05)
    with pytest.raises(DeadlineExceeded, match="finish optimizing"):
        provider.wait_settled(ec2.volume_id, Deadline(0.3))


def test_volume_without_modifications_needs_no_wait(ec2: Ec2):
    provider = EbsProvider(ec2=ec2.client, poll_interval=0.01)
    assert "no modification" in provider.wait_settled(ec2.volume_id, Deadline(1))
    assert provider.check_rate_limit(ec2.volume_id, force=False) == []


def test_rate_limit_refusal_names_the_next_slot(ec2: Ec2):
    ec2.modify(3100, 3200, 3300, 3400)
    provider = EbsProvider(ec2=ec2.client, max_per_window=4)
    with pytest.raises(PreflightRefused, match="the next from 20"):
        provider.check_rate_limit(ec2.volume_id, force=False)


def test_region_from_the_pv_zone():
    pv = {
        "spec": {
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "topology.ebs.csi.aws.com/zone",
                                    "operator": "In",
                                    "values": ["eu-west-1b"],
                                }
                            ]
                        }
                    ]
                }
            }
        }
    }
    assert region_of(pv) == "eu-west-1"
    assert region_of({"spec": {}}) is None
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    for zone, region in [
        ("us-west-2-lax-1a", "us-west-2"),  # a Local Zone
        ("us-east-1-wl1-bos-wlz-1", "us-east-1"),  # a Wavelength Zone
        ("us-gov-west-1a", "us-gov-west-1"),
        ("ap-southeast-4c", "ap-southeast-4"),
    ]:
        terms[0]["matchExpressions"][0]["values"] = [zone]
        assert region_of(pv) == region, zone


def test_unknown_ec2_volume_is_refused_before_any_write(fake: FakeKube, ec2: Ec2, use_ebs):
    make_volume(fake, handle="vol-00000000000000000")
    make_class(fake, "fast", iops="6000")
    use_ebs(Stepper(since=now()))
    result = switch()
    assert result.exit_code == 3, result.output
    assert "cannot read EC2 modifications of vol-00000000000000000" in result.stderr
    assert fake.claim_writes() == []


def age_earlier_modifications(client, before: datetime, state: str) -> None:
    """Make modifications started before ``before`` someone else's: two hours old, ``state``."""

    def rewrite(parsed: dict, **_: object) -> None:
        for mod in parsed.get("VolumesModifications", []):
            if mod["StartTime"] < before:
                mod["StartTime"] = before - timedelta(hours=2)
                mod["ModificationState"] = state
                mod["Progress"] = {"optimizing": 40, "failed": 0}.get(state, 100)

    client.meta.events.register("after-call.ec2.DescribeVolumesModifications", rewrite)


@pytest.fixture
def tags_only(fake: FakeKube, ec2: Ec2) -> FakeKube:
    """A class that only changes tags: the driver makes no EC2 volume modification."""
    make_volume(fake, handle=ec2.volume_id)
    make_class(fake, "baseline", type="gp3", iops="3000", throughput="125")
    make_class(fake, "tagged", tagSpecification_1="team=ml")
    return fake


def test_an_older_failed_modification_is_not_this_switchs(tags_only: FakeKube, ec2: Ec2, use_ebs):
    ec2.modify(3500)  # someone's, long ago
    provider = use_ebs(Stepper(since=now() + timedelta(seconds=1)))
    age_earlier_modifications(provider.client(), now(), "failed")
    result = switch(to="tagged")
    assert result.exit_code == 0, result.output
    assert "no modification of" in result.stderr and "since the switch" in result.stderr


def test_an_older_running_modification_is_not_waited_for(tags_only: FakeKube, ec2: Ec2, use_ebs):
    ec2.modify(3500)  # someone's, still optimizing
    provider = use_ebs(Stepper(since=now() + timedelta(seconds=1)))
    age_earlier_modifications(provider.client(), now(), "optimizing")
    result = switch("--force", "--timeout", "5", to="tagged")
    assert result.exit_code == 0, result.output
    assert "warning: --force: the previous modification" in result.stderr
