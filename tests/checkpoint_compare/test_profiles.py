"""Any number of profiles, a robust verdict with intervals, repeats and drift, and a
recommendation."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkpoint_compare.cli import main
from checkpoint_compare.comparison import NO_DIFFERENCE
from checkpoint_compare.intervals import (
    hodges_lehmann,
    mann_whitney_counts,
    median_upper_bound,
)
from checkpoint_storage_bench.contract import (
    MIN_BUDGET_CHECKPOINTS,
    PROFILE_FIGURES,
    VERDICT_CONFIDENCE,
    VERDICT_OUTPUTS,
    profile_output,
)
from tests.checkpoint_compare.recorded import (
    run_cli,
    write_hook_run,
    write_repeats,
    write_training_run,
)

BASE, FAST, FASTER = "checkpoint-baseline", "checkpoint-throughput", "checkpoint-max"


def comparison(report: dict, candidate: str) -> dict:
    return next(c for c in report["comparisons"] if c["candidate"] == candidate)


# ------------------------------------------------------------------------- the statistics


def test_the_exact_rank_distribution() -> None:
    # U of Mann–Whitney for 3 and 3: the table every textbook prints.
    assert mann_whitney_counts(3, 3) == [1, 1, 2, 3, 3, 3, 3, 2, 1, 1]
    # 10 and 10 at 95 %: the critical value of U is 23, so the interval is D(24)…D(77).
    x, y = list(range(10)), [v + 100 for v in range(10)]
    shift = hodges_lehmann(x, y)
    diffs = sorted(a - b for a in x for b in y)
    assert (shift.low, shift.high) == (diffs[23], diffs[-24])
    assert 0.95 <= shift.confidence < 0.96


def test_too_few_values_have_no_interval() -> None:
    shift = hodges_lehmann([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])  # 3 and 3 cannot reach 95 %
    assert not shift.has_interval and shift.estimate == pytest.approx(-1.0)
    assert median_upper_bound([1.0, 2.0, 3.0, 4.0]) is None
    assert median_upper_bound([1.0, 2.0, 3.0, 4.0, 5.0]) == 5.0


def test_one_outlier_cannot_hide_a_difference(runs_root: Path, pricing_file) -> None:
    # Max − min would call this noise (the candidate's slow checkpoint spreads it by 4 s);
    # every other checkpoint shows the candidate a second faster.
    write_repeats(BASE, [2.0] + [2.0, 2.02, 1.98] * 3, runtime_s=100.0)
    write_repeats(FAST, [1.0] + [1.0, 1.02, 0.98] * 2 + [1.0, 1.02, 5.0], runtime_s=95.0)
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    pause = comparison(report, FAST)["pause"]
    assert pause["counts"] is True and pause["high"] < 0
    assert pause["estimate"] == pytest.approx(-1.0, abs=0.03)
    assert report["verdict"] == FAST


# ------------------------------------------------------------------------- N profiles


def test_three_profiles_against_the_first(runs_root: Path, pricing_file) -> None:
    extra = f"  {FASTER}: {{type: gp3, iops: 16000, throughput: 1000}}\n"
    for profile, pause, runtime in ((BASE, 2.0, 100.0), (FAST, 1.0, 94.0), (FASTER, 0.5, 91.0)):
        write_hook_run(profile)
        write_repeats(profile, [pause * 1.5] + [pause, pause * 1.01] * 3, runtime_s=runtime)
    code, output, report = run_cli(runs_root, pricing_file(extra_profiles=extra))
    assert code == 0, output
    assert report["baseline"] == BASE  # the first profile run
    assert [c["candidate"] for c in report["comparisons"]] == [FAST, FASTER]
    outputs = report["outputs"]
    for profile in (FAST, FASTER):
        key = profile.replace("-", "_")
        pause = comparison(report, profile)["pause"]
        assert outputs[f"{key}_pause_diff_ci_low_s"] == pytest.approx(pause["low"])
        assert outputs[f"{key}_pause_diff_ci_high_s"] == pytest.approx(pause["high"])
        assert outputs[f"{key}_warmup_pause_s_median"] > outputs[f"{key}_pause_s_median"]
        # One name per figure, the profile first.
        assert f"pause_diff_ci_low_{key}" not in outputs
    # Every output is a name of the contract: a fixed one, or a profile's figure.
    named = set(VERDICT_OUTPUTS) | {
        profile_output(p, f) for p in (BASE, FAST, FASTER) for f in PROFILE_FIGURES
    }
    assert set(outputs) <= named, sorted(set(outputs) - named)
    # Both are faster; at 4 USD/h the GPU time saved outweighs gp3's price for both, and
    # the verdict keeps the cheaper per run: the max profile (9 s shorter) wins.
    assert {c["outcome"] for c in report["comparisons"]} == {"better"}
    assert report["verdict"] == FASTER
    assert outputs["profile_count"] == 3


def test_warmup_is_reported_and_left_out(runs_root: Path, pricing_file) -> None:
    # A cold first checkpoint in the candidate only: with it, the pauses overlap.
    write_training_run(BASE, [1.0] * 7, runtime_s=100.0)
    write_training_run(FAST, [9.0] + [1.0] * 6, runtime_s=100.0)
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    prof = report["profiles"][FAST]
    assert prof["warmup_pause_s_median"] == 9.0
    assert [v for _, v in prof["training_runs"][0]["warmup_pauses"]] == [9.0]
    assert len(prof["training_runs"][0]["pauses"]) == 6
    assert prof["stages"]["pause"]["max"] == 1.0  # the warm-up is not in the compared figures
    code, _, report = run_cli(runs_root, pricing_file(), "--warmup", "0")
    assert report["profiles"][FAST]["stages"]["pause"]["max"] == 9.0
    assert report["thresholds"]["warmup"] == 0


# ----------------------------------------------------------------------- repeats, drift


def test_repeats_give_the_runtime_its_between_run_spread(runs_root: Path, pricing_file) -> None:
    pauses = [2.0] + [2.0, 2.01] * 3
    fast = [1.0] + [1.0, 1.01] * 3
    for runtime in (100.0, 104.0):  # repeats of the baseline: 4 s apart
        write_training_run(BASE, pauses, runtime_s=runtime)
    for runtime in (97.0, 101.0):  # the candidate's runs overlap the baseline's
        write_training_run(FAST, fast, runtime_s=runtime)
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    runtime = comparison(report, FAST)["runtime"]
    # Student's t between the runs (2 df): −3 s ± 4.303 · √(8 · (1/2 + 1/2)); the range of
    # the differences (−7 … 1 s) would be a 67 % interval.
    assert runtime["method"].startswith("Student's t") and runtime["confidence"] == 0.95
    assert round(runtime["low"], 2) == -15.17 and round(runtime["high"], 2) == 9.17
    assert runtime["counts"] is False and report["verdict"] == NO_DIFFERENCE
    assert report["profiles"][BASE]["runtimes_s"] == [100.0, 104.0]
    assert report["outputs"]["checkpoint_baseline_runs"] == 2


def test_repeats_that_agree_give_a_runtime_difference(runs_root: Path, pricing_file) -> None:
    for runtime in (100.0, 100.5, 99.5, 100.2):
        write_training_run(BASE, [2.0] + [2.0, 2.01] * 3, runtime_s=runtime)
    for runtime in (93.0, 93.4, 92.8, 93.1):
        write_training_run(FAST, [1.0] + [1.0, 1.01] * 3, runtime_s=runtime)
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    runtime = comparison(report, FAST)["runtime"]
    assert runtime["method"].startswith("Student's t") and runtime["confidence"] == 0.95
    assert runtime["high"] < 0 and runtime["counts"] is True
    assert report["verdict"] == FAST


def test_drift_larger_than_the_difference_is_said(runs_root: Path, pricing_file) -> None:
    # A…B…A: the baseline itself got 0.3 s faster between its first and its last runs; B's
    # runs are about 0.28 s faster than the baseline's: without the return to the baseline
    # that would count.
    write_repeats(BASE, [1.4] + [1.4, 1.41] * 4, runtime_s=100.0, runs=3)
    write_repeats(FAST, [1.0] + [0.97, 0.98] * 4, runtime_s=99.0, runs=4)
    write_repeats(BASE, [1.1] + [1.1, 1.11] * 4, runtime_s=98.0, runs=3)
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    drift = report["drift"]
    assert drift["profile"] == BASE and len(drift["first_runs"]) == len(drift["last_runs"]) == 3
    assert drift["shift"]["estimate"] == pytest.approx(-0.3, abs=0.01)
    comp = comparison(report, FAST)
    # The baseline's two blocks disagree by the drift: with a block's runs counted as two,
    # that spread keeps the interval across zero, and the drift is named.
    assert comp["pause"]["low"] < comp["pause"]["estimate"] < 0 < comp["pause"]["high"]
    assert comp["pause"]["counts"] is False
    assert any("may be drift, not the profile" in n for n in comp["notes"])
    assert report["outputs"]["baseline_drift_pause_s"] == pytest.approx(-0.3, abs=0.01)
    assert report["verdict"] == NO_DIFFERENCE
    # Without the return, the same difference counts.
    for last in report["drift"]["last_runs"]:
        shutil.rmtree(runs_root / "runs" / last)
    code, output, report = run_cli(runs_root, pricing_file())
    assert report["drift"] is None and comparison(report, FAST)["pause"]["counts"] is True


# -------------------------------------------------------------------------- recommendation


def _two_profiles() -> None:
    write_repeats(BASE, [2.5] + [2.0, 2.02, 1.98] * 3, runtime_s=100.0)
    write_repeats(FAST, [1.5] + [1.0, 1.02, 0.98] * 3, runtime_s=91.0)


def test_the_cheapest_profile_that_meets_the_budget(runs_root: Path, pricing_file) -> None:
    _two_profiles()
    code, output, report = run_cli(runs_root, pricing_file(), "--max-pause-s", "1.5")
    assert code == 0, output
    rec = report["recommendation"]
    assert rec["profile"] == FAST and report["outputs"]["recommended_profile"] == FAST
    assert "meets the budget with 95% confidence" in rec["reason"]
    fits = {f["profile"]: f for f in rec["profiles"]}
    assert fits[BASE]["meets"] is False and fits[BASE]["pause_high_s"] > 1.5
    assert fits[FAST]["meets"] is True and fits[FAST]["pause_high_s"] <= 1.5
    assert f"RECOMMENDED: {FAST}" in output
    # Both meet a generous budget: the cheaper storage wins.
    code, _, report = run_cli(runs_root, pricing_file(), "--max-pause-s", "5")
    assert report["recommendation"]["profile"] == BASE
    assert "cheapest that does (of 2 that do)" in report["recommendation"]["reason"]


def test_the_budget_is_met_in_every_run_not_by_the_pooled_checkpoints(
    runs_root: Path, pricing_file
) -> None:
    """Two runs of one profile, the second paused 1.6 s at its median: pooled, 17 of its 24
    checkpoints are at 1.0 s and the bound of the median would meet a 1.2 s budget; the run
    is the unit, and one run over the budget is one the team would have paid for."""
    write_repeats(BASE, [2.5] + [2.0, 2.02, 1.98] * 4, runtime_s=100.0)
    write_training_run(FAST, [1.5] + [1.0] * 12, 91.0)
    write_training_run(FAST, [1.5] + [1.6] * 7 + [1.0] * 5, 92.0)
    code, output, report = run_cli(runs_root, pricing_file(), "--max-pause-s", "1.2")
    assert code == 0, output
    fits = {f["profile"]: f for f in report["recommendation"]["profiles"]}
    assert fits[FAST]["meets"] is False and fits[FAST]["pause_high_s"] == pytest.approx(1.6)
    assert report["recommendation"]["profile"] == "none"
    # A budget every run meets (a third run too): met, and the reason says in each run.
    write_training_run(FAST, [1.5] + [1.0] * 12, 91.5)
    code, output, report = run_cli(runs_root, pricing_file(), "--max-pause-s", "1.7")
    assert report["recommendation"]["profile"] == FAST, output
    assert "in each of its 3 runs" in report["recommendation"]["reason"]


def test_none_meets_the_budget_is_an_answer(runs_root: Path, pricing_file) -> None:
    _two_profiles()
    code, output, report = run_cli(
        runs_root, pricing_file(), "--max-pause-s", "0.5", "--max-pause-share", "0.5"
    )
    assert code == 0, output
    assert report["outputs"]["recommended_profile"] == "none"
    reason = report["outputs"]["recommendation_reason"]
    assert reason.startswith("no profile meets the budget")
    assert BASE in reason and FAST in reason
    # the share of the runtime: 10 checkpoints of ≤ 1.02 s in 91 s is about 11 %
    code, _, report = run_cli(runs_root, pricing_file(), "--max-pause-share", "0.15")
    assert report["recommendation"]["profile"] == FAST


@pytest.mark.parametrize(("cadence", "expected"), [(100, BASE), (100_000, FAST)])
def test_the_best_net_cost_at_the_teams_cadence(
    runs_root: Path, pricing_file, cadence: int, expected: str
) -> None:
    # FAST's storage costs 20 USD a month more; each checkpoint saves 1 s of a 4 USD/h GPU.
    _two_profiles()
    code, output, report = run_cli(
        runs_root, pricing_file(), "--checkpoints-per-month", str(cadence)
    )
    assert code == 0, output
    rec = report["recommendation"]
    assert rec["profile"] == expected, rec["reason"]
    fits = {f["profile"]: f for f in rec["profiles"]}
    assert fits[FAST]["storage_month"] - fits[BASE]["storage_month"] == pytest.approx(20.0)
    saved = fits[BASE]["gpu_month"] - fits[FAST]["gpu_month"]
    assert saved == pytest.approx(cadence * 1.0 * 4 / 3600, rel=0.05)


def test_no_budget_no_cadence_recommends_the_verdict(runs_root: Path, pricing_file) -> None:
    _two_profiles()
    code, _, report = run_cli(runs_root, pricing_file())
    assert report["recommendation"]["profile"] == report["verdict"] == FAST
    assert "no pause budget" in report["recommendation"]["reason"]


# ------------------------------------------------------------- markdown, readme and HTML


def test_the_markdown_report_is_the_runs_readme(runs_root: Path, pricing_file, tmp_path) -> None:
    _two_profiles()
    md = tmp_path / "verdict.md"
    result = CliRunner().invoke(
        main,
        ["--offline-root", str(runs_root), "--pricing", str(pricing_file()),
         "--max-pause-s", "1.5", "--markdown", str(md)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = md.read_text()
    assert f"**Verdict: {FAST}**" in text and f"**Recommended: {FAST}**" in text
    assert re.search(r"\| pause vs baseline, 95% interval \| – \| -1\.00 s \[", text)
    compare_runs = [
        json.loads(p.read_text())
        for p in (runs_root / "runs").glob("*/run.plx.json")
        if json.loads(p.read_text())["name"] == "compare"
    ]
    assert len(compare_runs) == 1
    assert compare_runs[0]["readme"] == text
    assert compare_runs[0]["outputs"]["recommended_profile"] == FAST


def test_the_html_report_draws_the_intervals(runs_root: Path, pricing_file, tmp_path) -> None:
    extra = f"  {FASTER}: {{type: gp3, iops: 16000, throughput: 1000}}\n"
    for profile, pause, runtime in ((BASE, 2.0, 100.0), (FAST, 1.0, 94.0), (FASTER, 2.0, 100.0)):
        write_repeats(profile, [pause] + [pause, pause * 1.01] * 3, runtime_s=runtime)
    html = tmp_path / "report.html"
    code, output, report = run_cli(
        runs_root, pricing_file(extra_profiles=extra), "--html", str(html)
    )
    assert code == 0, output
    text = html.read_text()
    drawn = {
        m["candidate"]: m
        for m in re.finditer(
            r"<g class='interval' data-candidate='(?P<candidate>[^']+)' "
            r"data-estimate='(?P<estimate>[^']+)' data-low='(?P<low>[^']+)' "
            r"data-high='(?P<high>[^']+)' data-counts='(?P<counts>\w+)'>",
            text,
        )
        if m.start() < text.index("Whole run")
    }
    assert set(drawn) == {FAST, FASTER}
    for candidate, m in drawn.items():
        pause = comparison(report, candidate)["pause"]
        assert float(m["low"]) == pause["low"] and float(m["high"]) == pause["high"]
        assert m["counts"] == str(pause["counts"]).lower()
    assert drawn[FAST]["counts"] == "true" and drawn[FASTER]["counts"] == "false"
    assert "id='recommendation'" in text


@pytest.mark.parametrize("module", ["intervals", "cost"])
def test_doctests(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"checkpoint_compare.{module}"))
    assert result.failed == 0 and result.attempted > 0


def test_one_run_on_a_side_gives_the_runtime_no_interval(runs_root: Path, pricing_file) -> None:
    # Baseline repeated (runtimes 6 s apart), candidate once: the candidate's own run-to-run
    # variation is unmeasured, so no interval and no runtime claim.
    write_training_run(BASE, [2.0] + [2.0, 2.01] * 3, runtime_s=100.0)
    write_training_run(FAST, [1.0] + [1.0, 1.01] * 3, runtime_s=97.0)
    write_training_run(BASE, [2.0] + [2.0, 2.01] * 3, runtime_s=106.0)
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    runtime = comparison(report, FAST)["runtime"]
    assert (runtime["low"], runtime["high"]) == (None, None)
    assert "one run a side" in runtime["method"] and runtime["counts"] is False


def test_the_trainers_checkpoint_count_is_what_the_budget_bound_needs() -> None:
    # The trainer warns below MIN_BUDGET_CHECKPOINTS without importing the verdict.
    values = [1.0] * MIN_BUDGET_CHECKPOINTS
    assert median_upper_bound(values, VERDICT_CONFIDENCE) is not None
    assert median_upper_bound(values[:-1], VERDICT_CONFIDENCE) is None
