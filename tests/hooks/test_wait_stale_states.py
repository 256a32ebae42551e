"""States an earlier attempt (or another actor) left behind must not fool the wait."""

from __future__ import annotations

from pathlib import Path

from tests.hooks.helpers import load_summary, run_hook
from tests.hooks.kube_double import KubeDouble
from tests.hooks.kube_state import make_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"


def switch(kubeconfig: Path, to: str, *extra: str):
    return run_hook(
        "switch", "-n", NS, "--claim", CLAIM, "--to", to, "--kubeconfig", str(kubeconfig),
        "--settle", "kubernetes", *extra,
    )  # fmt: skip


def test_infeasible_left_by_a_rollback_to_no_class_is_not_judged_before_the_resizer_acts(
    double: KubeDouble, kubeconfig: Path
):
    make_volume(double, current=None)
    make_class(double, "fast")
    double.resizer.results["fast"] = ["InvalidArgument"]  # the first attempt only
    first = switch(kubeconfig, "fast", "--on-infeasible", "rollback")
    assert first.exit_code == 4
    left = double.get("PersistentVolumeClaim", CLAIM, NS)["status"]["modifyVolumeStatus"]
    assert left["status"] == "Infeasible"  # a rollback to nil leaves it in place
    second = switch(kubeconfig, "fast")
    assert second.exit_code == 0, second.stderr


def test_pending_with_an_older_target_still_fails_after_the_grace(
    double: KubeDouble, kubeconfig: Path
):
    make_volume(double)
    make_class(double, "fast")
    make_class(double, "medium")
    double.resizer.results["fast"] = ["InvalidArgument"]
    assert switch(kubeconfig, "fast").exit_code == 4  # leaves target=fast in the status
    # The class vanishes between preflight and the resizer: Pending, target not updated.
    double.on_patch = lambda claim: double.delete("VolumeAttributesClass", "medium")
    result = switch(kubeconfig, "medium", "--pending-grace", "1", "--timeout", "20")
    assert result.exit_code == 4, result.stderr  # not the deadline's 5
    assert "Pending" in result.stderr or "Pending" in result.stdout


def test_a_claim_recreated_under_the_same_name_is_not_reported_settled(
    double: KubeDouble, kubeconfig: Path, tmp_path: Path
):
    make_volume(double)
    make_class(double, "baseline")
    make_class(double, "fast")

    def recreate(claim):
        double.on_patch = None
        double.delete("PersistentVolumeClaim", CLAIM, NS)
        make_volume(double, pv="pvc-0002", handle="vol-other", current="fast")

    double.on_patch = recreate
    summary = tmp_path / "s.json"
    result = switch(kubeconfig, "fast", "--summary-json", str(summary))
    assert result.exit_code == 1, result.stderr
    assert "re-created" in load_summary(summary)["error"]
