"""What the checkpoint verdict refuses or claims, held for every workload: no cost claim
about an unpriced profile, runs of another claim or volume refused, profile names whose
output names would collide refused."""

from __future__ import annotations

from pathlib import Path

from checkpoint_storage_bench.contract import SANDBOX_DRIVER, SANDBOX_EMULATED_DRIVER
from checkpoint_storage_bench.tracking import tracked_run
from tests.checkpoint_compare.recorded import run_cli, write_hook_run, write_training_run

BASE, FAST = "checkpoint-baseline", "checkpoint-throughput"


def test_an_unpriced_profile_is_never_called_the_cheapest(runs_root: Path, pricing_file) -> None:
    write_training_run(BASE, [1.0] * 6, runtime_s=50.0)
    write_training_run("nvme-local", [0.2] * 6, runtime_s=45.0)
    code, output, report = run_cli(runs_root, pricing_file(), "--max-pause-s", "0.5")
    assert code == 0, output
    reason = report["recommendation"]["reason"]
    assert report["recommendation"]["profile"] == "nvme-local"
    assert "cheapest" not in reason and "nothing is said of what it costs" in reason


def test_no_saving_is_claimed_against_an_unpriced_baseline(runs_root: Path, pricing_file) -> None:
    write_training_run("nvme-local", [1.0] * 6, runtime_s=50.0)
    write_training_run(BASE, [1.0] * 6, runtime_s=50.0)
    code, output, report = run_cli(
        runs_root, pricing_file(), "--checkpoints-per-month", "1000", "--baseline", "nvme-local"
    )
    assert code == 0, output
    reason = report["recommendation"]["reason"]
    assert report["recommendation"]["profile"] == BASE
    assert "less than nvme-local" not in reason and "-" not in reason.split("USD")[0][-8:]
    assert "nvme-local not priced, so no saving against it is claimed" in reason


def _hook(target: str, claim: str, handle: str, driver: str = "ebs.csi.aws.com") -> None:
    with tracked_run(f"hook-{target}", tags=["hook"]) as t:
        t.log_inputs(claim=claim, namespace="ml-team", target_class=target,
                     previous_class=BASE, driver=driver, volume_handle=handle)  # fmt: skip
        t.log_outputs(applied_class=target)


def test_runs_of_another_claim_or_volume_are_refused_naming_both(
    runs_root: Path, pricing_file
) -> None:
    _hook(BASE, "training-checkpoints", "vol-1")
    write_training_run(BASE, [1.0] * 6, runtime_s=50.0)
    _hook(FAST, "other-team-claim", "vol-2")
    write_training_run(FAST, [0.5] * 6, runtime_s=47.0)
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 3, output
    assert "the claim differs" in output
    assert "ml-team/training-checkpoints" in output and "ml-team/other-team-claim" in output
    assert "the volume differs" in output and "vol-1" in output and "vol-2" in output


def test_the_sandbox_profiles_are_directories_behind_one_claim(
    runs_root: Path, pricing_file
) -> None:
    # The sandbox's hook records each profile's directory as its volume handle: by design.
    for profile, driver in ((BASE, SANDBOX_DRIVER), (FAST, SANDBOX_EMULATED_DRIVER)):
        _hook(profile, "training-checkpoints", f"/sandbox/profiles/{profile}", driver)
        write_training_run(profile, [1.0] * 6, runtime_s=50.0)
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 0, output


def test_one_claim_one_volume_is_compared(runs_root: Path, pricing_file) -> None:
    write_hook_run(BASE)
    write_training_run(BASE, [1.0] * 6, runtime_s=50.0)
    write_hook_run(FAST)
    write_training_run(FAST, [0.5] * 6, runtime_s=47.0)
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 0, output


def test_profile_names_whose_output_names_collide_are_refused(
    runs_root: Path, pricing_file
) -> None:
    write_training_run("gp3-fast", [1.0] * 6, runtime_s=50.0)
    write_training_run("gp3.fast", [0.5] * 6, runtime_s=47.0)
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 2, output
    assert "overwrite each other" in output
    assert "gp3-fast and gp3.fast" in output or "gp3.fast and gp3-fast" in output


def test_every_workload_gets_one_document_with_the_same_fields(
    runs_root: Path, pricing_file
) -> None:
    """One engine, one schema: a checkpoint verdict and a scan verdict have the same fields
    at the top, per profile and per comparison; the checkpoint's only add to them."""
    from checkpoint_compare.report_json import SCHEMA, document
    from tests.checkpoint_compare.recorded import write_repeats
    from tests.checkpoint_compare.workload_runs import judge, slow_and_fast

    write_repeats(BASE, [1.0] * 6, runtime_s=50.0)
    write_repeats(FAST, [0.5] * 6, runtime_s=47.0)
    code, output, checkpoint = run_cli(runs_root, pricing_file())
    assert code == 0, output
    scan = document(judge(slow_and_fast(), min_au=0.9))
    assert checkpoint["schema"] == scan["schema"] == SCHEMA
    assert set(checkpoint) == set(scan)
    assert set(scan["profiles"][FAST]) <= set(checkpoint["profiles"][FAST])
    assert set(scan["comparisons"][0]) <= set(checkpoint["comparisons"][0])
    assert set(scan["profiles"][FAST]["difference"]) == set(
        checkpoint["profiles"][FAST]["difference"]
    )
    assert checkpoint["workload"] == "checkpoint" and scan["workload"] == "scan"
    assert checkpoint["outputs"]["workload"] == "checkpoint"


def test_a_budget_of_another_workload_is_named_and_not_tested(
    runs_root: Path, pricing_file
) -> None:
    write_training_run(BASE, [1.0] * 6, runtime_s=50.0)
    write_training_run(FAST, [0.5] * 6, runtime_s=47.0)
    asked = ("--max-pause-s", "0.8", "--min-au", "0.9", "--max-p99-ms", "5")
    code, output, report = run_cli(runs_root, pricing_file(), *asked)
    assert code == 0, output
    assert (
        "--min-au, --max-p99-ms: not a budget of the checkpoint workload, not tested"
        in (report["notes"])
    )
    budget = report["recommendation"]["budget"]
    assert budget["min_au"] is None and budget["max_p99_ms"] is None
    assert budget["max_pause_s"] == 0.8  # its own budget is tested
    assert report["recommendation"]["profile"] == FAST


def test_a_scan_verdict_does_not_take_a_pause_budget_or_a_cadence_for_its_own() -> None:
    from tests.checkpoint_compare.workload_runs import judge, slow_and_fast

    plain = judge(slow_and_fast())
    asked = judge(slow_and_fast(), max_pause_s=0.1, checkpoints_per_month=1000.0)
    note = "--max-pause-s, --checkpoints-per-month: not a budget of the scan workload, not tested"
    assert note in asked.notes and note not in plain.notes
    assert asked.budget.max_pause_s is None and asked.budget.checkpoints_per_month is None
    assert asked.recommendation.reason == plain.recommendation.reason
    assert not any(s.startswith("Budget:") for s in asked.sentences)
