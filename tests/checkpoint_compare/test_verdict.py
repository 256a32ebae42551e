"""The verdict on recorded runs: win, tie, faster-but-costlier, missing, incomparable, failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkpoint_compare.cli import main
from checkpoint_compare.comparison import NO_DIFFERENCE
from tests.checkpoint_compare.recorded import (
    write_fio_run,
    write_hook_run,
    write_repeats,
    write_training_run,
)

BASE, FAST = "checkpoint-baseline", "checkpoint-throughput"


def run_cli(*args: str) -> tuple[int, str, dict | None, Path]:
    """Run the CLI; return exit code, output, the JSON report (if written) and its path."""
    out = Path(args[args.index("--offline-root") + 1]).parent / "report.json"
    result = CliRunner().invoke(main, [*args, "--json", str(out), "--no-track"])
    report = json.loads(out.read_text()) if out.exists() and result.exit_code == 0 else None
    return result.exit_code, result.output, report, out


def test_clear_win(runs_root: Path, pricing_file) -> None:
    write_hook_run(BASE)
    write_fio_run(bw_mbps=125, lat_p99_us=4000)
    # the first checkpoint of each run is warm-up: reported, left out of the comparison
    write_repeats(BASE, [3.0, 2.0, 2.1, 1.9, 2.05, 1.95], runtime_s=100.0)
    write_hook_run(FAST)
    write_fio_run(bw_mbps=250, lat_p99_us=2000)
    write_repeats(FAST, [2.5, 1.0, 1.05, 0.95, 1.02, 0.98], runtime_s=96.0)

    code, output, report, _ = run_cli(
        "--offline-root", str(runs_root), "--pricing", str(pricing_file())
    )
    assert code == 0, output
    assert report["verdict"] == FAST
    comp = report["comparisons"][0]
    assert comp["outcome"] == "better"
    assert comp["pause_delta_s"] == pytest.approx(-1.0, abs=0.01)
    # the runs' median pauses differ by 1 s, their repeats by 1 %: the between-run interval
    # is well away from zero
    pause = comp["pause"]
    assert -1.2 < pause["low"] < -1.0 < pause["high"] < -0.8 and pause["confidence"] >= 0.95
    assert pause["counts"] is True and "Student's t on the run medians" in pause["method"]
    assert comp["pause_speedup"] == pytest.approx(2.0)
    assert report["profiles"][BASE]["warmup_pause_s_median"] == pytest.approx(3.0, abs=0.02)
    assert comp["runtime_delta_s"] == pytest.approx(-4.0, abs=0.01)
    # 1 s less GPU time per checkpoint at 4 USD/h
    assert comp["cost_delta"]["gpu_per_checkpoint"] == pytest.approx(-4 / 3600, rel=0.01)
    assert comp["cost_delta"]["gpu_per_1000_checkpoints"] == pytest.approx(-4000 / 3600, rel=0.01)
    # gp3 6000 IOPS / 250 MiB/s costs 3000*0.005 + 125*0.04 = 20 USD/month more
    assert comp["cost_delta"]["storage_month"] == pytest.approx(20.0)
    assert comp["cost_delta"]["breakeven_checkpoints_month"] == pytest.approx(
        20 / (4 / 3600), rel=0.01
    )
    prof = report["profiles"]
    assert prof[BASE]["cost"]["storage_month"] == pytest.approx(16.0)
    assert prof[FAST]["fio"]["seq_write_1m"]["bw_mbps"] == 250
    assert prof[FAST]["fio"]["seq_write_1m"]["lat_p50_us"] == pytest.approx(2000 / 3)
    assert prof[FAST]["hook"]["applied_class"] == FAST
    assert prof[FAST]["hook"]["provider_settle_s"] == 60.0
    assert prof[BASE]["stages"]["write"]["median"] == pytest.approx(1.6, abs=0.01)
    assert report["outputs"]["verdict"] == FAST
    assert "VERDICT: checkpoint-throughput" in output
    assert "vol-0123456789abcdef0" in output


def test_tie_within_noise(runs_root: Path, pricing_file) -> None:
    # medians differ by 0.1 s, but the checkpoints of one run spread by 0.8 s
    # and two runs of one profile differ by 0.2 s: the runs cannot tell the profiles apart.
    spread = [2.0, 1.6, 2.4, 2.0, 1.7, 2.3, 1.8, 2.2, 2.0]
    for shift in (0.0, 0.2):
        write_training_run(BASE, [p + shift for p in spread], runtime_s=100.0)
        write_training_run(FAST, [p - 0.1 + shift for p in spread], runtime_s=99.5)
    code, output, report, _ = run_cli(
        "--offline-root", str(runs_root), "--pricing", str(pricing_file())
    )
    assert code == 0, output
    assert report["verdict"] == NO_DIFFERENCE
    pause = report["comparisons"][0]["pause"]
    assert report["comparisons"][0]["pause_measurable"] is False
    assert pause["low"] < 0 < pause["high"] and "includes zero" in pause["why_not"]
    assert report["outputs"]["verdict"] == NO_DIFFERENCE


def test_faster_checkpoints_but_not_the_whole_run(runs_root: Path, pricing_file) -> None:
    # pause clearly faster, but 4 checkpoints of 1 s in a 1000 s run: another stage dominates
    write_repeats(BASE, [2.0] * 6, runtime_s=1000.0)
    write_repeats(FAST, [1.0] * 6, runtime_s=996.0)
    code, output, report, _ = run_cli(
        "--offline-root", str(runs_root), "--pricing", str(pricing_file())
    )
    assert code == 0, output
    assert report["verdict"] == NO_DIFFERENCE
    assert report["comparisons"][0]["pause_measurable"] is True
    assert any("another stage" in n for n in report["comparisons"][0]["notes"])


def test_faster_but_costlier(runs_root: Path, pricing_file) -> None:
    # cheap GPU time (0.01 USD/h) cannot pay for 20 USD/month more storage on a long run;
    # 30 checkpoints 10 s faster explain the 300 s shorter run
    write_repeats(BASE, [20.0, 20.5, 21.0] * 10, runtime_s=10000.0)
    write_repeats(FAST, [10.0, 10.5, 10.0] * 10, runtime_s=9700.0)
    code, output, report, _ = run_cli(
        "--offline-root", str(runs_root), "--pricing", str(pricing_file()), "--gpu-hourly", "0.01"
    )
    assert code == 0, output
    comp = report["comparisons"][0]
    assert comp["outcome"] == "faster_costlier"
    assert comp["cost_delta"]["run_total"] > 0
    assert report["verdict"] == BASE
    assert "costs" in report["reason"] and "more per run" in report["reason"]
    # the same runs at the default GPU price are a win
    code, _, report, _ = run_cli("--offline-root", str(runs_root), "--pricing", str(pricing_file()))
    assert report["verdict"] == FAST


def test_one_run_a_side_is_no_evidence(runs_root: Path, pricing_file) -> None:
    # The checkpoints of one run are not independent draws: however many, one run a side
    # cannot tell the profile from the run.
    write_training_run(BASE, [2.0] * 12, runtime_s=50.0)
    write_training_run(FAST, [1.0] * 12, runtime_s=38.0)
    code, _, report, _ = run_cli("--offline-root", str(runs_root), "--pricing", str(pricing_file()))
    assert code == 0
    assert report["verdict"] == "no measurable difference"
    notes = " ".join(report["comparisons"][0]["notes"])
    assert "one run a side cannot separate the profile from run-to-run variation" in notes
    assert "more runs (repeats) are needed" in notes
    assert report["profiles"][FAST]["difference"]["claimed"] is False


def test_a_shorter_run_that_checkpoints_cannot_explain_is_not_credited(
    runs_root: Path, pricing_file
) -> None:
    write_repeats(BASE, [1.00, 1.01] * 3, runtime_s=100.0)
    write_repeats(FAST, [0.90, 0.91] * 3, runtime_s=90.0)  # 0.6 s saved, 10 s shorter
    code, _, report, _ = run_cli("--offline-root", str(runs_root), "--pricing", str(pricing_file()))
    assert code == 0
    assert report["verdict"] == "no measurable difference"
    assert "cannot explain it" in " ".join(report["comparisons"][0]["notes"])


def test_a_longer_run_with_equal_checkpoints_is_not_blamed_on_storage(
    runs_root: Path, pricing_file
) -> None:
    write_repeats(BASE, [0.07, 0.06, 0.09], runtime_s=10.0)
    write_repeats(FAST, [0.05, 0.04, 0.08], runtime_s=10.5)  # training noise, not storage
    code, _, report, _ = run_cli("--offline-root", str(runs_root), "--pricing", str(pricing_file()))
    assert code == 0
    assert report["verdict"] == "no measurable difference"
    assert "not put down to storage" in " ".join(report["comparisons"][0]["notes"])


def test_slower_candidate_keeps_baseline(runs_root: Path, pricing_file) -> None:
    write_repeats(BASE, [1.0, 1.0, 1.1] * 2, runtime_s=50.0)
    write_repeats(FAST, [3.0, 3.0, 3.1] * 2, runtime_s=56.0)
    code, _, report, _ = run_cli("--offline-root", str(runs_root), "--pricing", str(pricing_file()))
    assert code == 0
    assert report["verdict"] == BASE
    assert report["comparisons"][0]["outcome"] == "worse"


def test_missing_profile_exits_3(runs_root: Path, pricing_file) -> None:
    write_training_run(BASE, [1.0, 1.0], runtime_s=50.0)
    code, output, _, _ = run_cli("--offline-root", str(runs_root), "--pricing", str(pricing_file()))
    assert code == 3
    assert "at least two profiles, found: checkpoint-baseline" in output
    write_training_run("other", [1.0, 1.0], runtime_s=50.0)
    code, output, _, _ = run_cli(
        "--offline-root", str(runs_root), "--pricing", str(pricing_file()), "--expect", FAST
    )
    assert code == 3
    assert "profile checkpoint-throughput: no training run found" in output


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model_size_bytes", 32 * 2**20),
        ("dataset_seed", 1),
        ("checkpoint_format", "torch"),
        ("durability", "none"),
        ("batch_size", 4),
    ],
)
def test_incomparable_inputs_exit_3(runs_root: Path, pricing_file, key: str, value) -> None:
    write_training_run(BASE, [1.0, 1.0], runtime_s=50.0)
    write_training_run(FAST, [0.5, 0.5], runtime_s=40.0, **{key: value})
    code, output, report, out = run_cli(
        "--offline-root", str(runs_root), "--pricing", str(pricing_file())
    )
    assert code == 3
    assert f"not comparable: {key} differs" in output
    assert not out.exists()


def test_runs_of_different_trainer_builds_are_refused(runs_root: Path, pricing_file) -> None:
    write_training_run(BASE, [1.0, 1.0, 1.0], runtime_s=50.0, meta={"code_revision": "aaa111"})
    write_training_run(FAST, [0.5, 0.5, 0.5], runtime_s=40.0, meta={"code_revision": "bbb222"})
    code, output, _, _ = run_cli("--offline-root", str(runs_root), "--pricing", str(pricing_file()))
    assert code == 3
    assert "code_revision differs" in output and "a different trainer build" in output


def test_runs_missing_a_core_input_are_refused(runs_root: Path, pricing_file) -> None:
    write_training_run(BASE, [1.0, 1.0, 1.0], runtime_s=50.0)
    write_training_run(FAST, [0.5, 0.5, 0.5], runtime_s=40.0, durability=None)
    code, output, _, _ = run_cli("--offline-root", str(runs_root), "--pricing", str(pricing_file()))
    assert code == 3
    assert "does not record durability" in output


def test_the_hooks_class_parameters_price_the_profile(runs_root: Path, pricing_file) -> None:
    write_hook_run(BASE, class_parameters={"type": "gp3", "iops": "3000", "throughput": "125"})
    write_training_run(BASE, [1.0, 1.0, 1.0], runtime_s=50.0)
    write_hook_run(FAST, class_parameters={"type": "gp3", "iops": "16000", "throughput": "1000"})
    write_training_run(FAST, [1.0, 1.0, 1.0], runtime_s=50.0)
    code, output, report, _ = run_cli(
        "--offline-root", str(runs_root), "--pricing", str(pricing_file())
    )
    assert code == 0, output
    assert "16000 IOPS, 1000 MiB/s (from the hook's record)" in output


def test_failed_run_is_reported_not_used(runs_root: Path, pricing_file) -> None:
    write_training_run(BASE, [1.0, 1.0], runtime_s=50.0)
    failed = write_training_run(FAST, [0.5], runtime_s=40.0, fail="No space left on device")
    code, output, _, _ = run_cli("--offline-root", str(runs_root), "--pricing", str(pricing_file()))
    assert code == 3
    assert f"profile {FAST}: run train-{FAST} ({failed[:8]}) failed" in output
    assert "No space left on device" in output

    # A later successful run of the profile is used; the failed one is listed, not used.
    write_training_run(FAST, [0.5, 0.5], runtime_s=40.0)
    code, output, report, _ = run_cli(
        "--offline-root", str(runs_root), "--pricing", str(pricing_file())
    )
    assert code == 0, output
    assert [r["uuid"] for r in report["failed_runs"]] == [failed]
    assert report["profiles"][FAST]["training_run"] != failed
    assert "Failed runs (not used)" in output


def test_sandbox_profiles_priced_at_zero(runs_root: Path, pricing_file) -> None:
    write_hook_run(BASE, driver="local")
    write_training_run(BASE, [1.0, 1.0], runtime_s=50.0)
    write_hook_run(FAST, driver="local")
    write_training_run(FAST, [0.5, 0.5], runtime_s=40.0)
    code, output, report, _ = run_cli(
        "--offline-root", str(runs_root), "--pricing", str(pricing_file())
    )
    assert code == 0, output
    assert report["profiles"][FAST]["cost"]["storage_month"] == 0
    assert report["comparisons"][0]["cost_delta"]["storage_month"] == 0
    assert any("sandbox, priced at 0" in a for a in report["assumptions"])


def test_unpriced_profile_still_gets_a_timing_verdict(runs_root: Path, pricing_file) -> None:
    write_repeats(BASE, [1.0] * 6, runtime_s=50.0)
    write_repeats("nvme-local", [0.2] * 6, runtime_s=45.0)
    code, output, report, _ = run_cli(
        "--offline-root", str(runs_root), "--pricing", str(pricing_file())
    )
    assert code == 0, output
    assert report["verdict"] == "nvme-local"
    assert "cost not priced" in report["reason"]
    assert any("nvme-local: not in the pricing file" in a for a in report["assumptions"])


def test_explicit_runs_and_baseline(runs_root: Path, pricing_file) -> None:
    a = write_repeats("disk", [1.0] * 6, runtime_s=50.0)
    write_training_run("disk", [9.0] * 6, runtime_s=90.0)  # newer, but not selected
    b = write_repeats("tmpfs", [0.2] * 6, runtime_s=47.6)
    code, output, report, _ = run_cli(
        "--offline-root",
        str(runs_root),
        "--pricing",
        str(pricing_file()),
        *(arg for uuid in b for arg in ("--run", f"{FAST}={uuid}")),
        *(arg for uuid in a for arg in ("--run", uuid)),
        "--baseline",
        "disk",
    )
    assert code == 0, output
    assert report["baseline"] == "disk"
    assert report["profiles"]["disk"]["training_run"] == a[-1]
    assert report["verdict"] == FAST
    code, output, _, _ = run_cli("--offline-root", str(runs_root), "--run", "deadbeef")
    assert code == 3 and "run(s) not found" in output
