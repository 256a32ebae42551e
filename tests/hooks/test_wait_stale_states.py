"""States an earlier attempt (or another actor) left behind must not fool the wait (the
switch against the in-memory fake of the client wrapper)."""

from __future__ import annotations

from pathlib import Path

from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import load_summary, run_hook
from tests.hooks.kube_state import make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"


def switch(to: str, *extra: str):
    return run_hook(
        "switch", "-n", NS, "--claim", CLAIM, "--to", to, "--settle", "kubernetes", *extra
    )


def test_infeasible_left_by_a_rollback_to_no_class_is_not_judged_before_the_resizer_acts(
    fake: FakeKube,
):
    make_volume(fake, current=None)
    make_class(fake, "fast")
    fake.resizer.results["fast"] = ["InvalidArgument"]  # the first attempt only
    first = switch("fast", "--on-infeasible", "rollback")
    assert first.exit_code == 4
    left = fake.get("PersistentVolumeClaim", CLAIM, NS)["status"]["modifyVolumeStatus"]
    assert left["status"] == "Infeasible"  # a rollback to nil leaves it in place
    second = switch("fast")
    assert second.exit_code == 0, second.stderr


def test_pending_with_an_older_target_still_fails_after_the_grace(fake: FakeKube):
    make_volume(fake)
    make_class(fake, "fast")
    make_class(fake, "medium")
    fake.resizer.results["fast"] = ["InvalidArgument"]
    assert switch("fast").exit_code == 4  # leaves target=fast in the status
    # The class vanishes between preflight and the resizer: Pending, target not updated.
    fake.on_patch = lambda claim: fake.delete("VolumeAttributesClass", "medium")
    result = switch("medium", "--pending-grace", "1", "--timeout", "20")
    assert result.exit_code == 4, result.stderr  # not the deadline's 5
    assert "Pending" in result.stderr or "Pending" in result.stdout


def test_a_claim_recreated_under_the_same_name_is_not_reported_settled(
    fake: FakeKube, tmp_path: Path
):
    make_volume(fake)
    make_class(fake, "baseline")
    make_class(fake, "fast")

    def recreate(claim):
        fake.on_patch = None
        fake.delete("PersistentVolumeClaim", CLAIM, NS)
        make_volume(fake, pv="pvc-0002", handle="vol-other", current="fast")

    fake.on_patch = recreate
    summary = tmp_path / "s.json"
    result = switch("fast", "--summary-json", str(summary))
    assert result.exit_code == 1, result.stderr
    assert "re-created" in load_summary(summary)["error"]
