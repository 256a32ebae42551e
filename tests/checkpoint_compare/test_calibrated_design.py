"""The verdict says when its comparison is smaller than the design the calibration showed to
mean its 95 % (docs/compare.md, "Calibration"): runs a side counted below ``met`` are not a
calibrated answer, and no more than ``missed`` may not see a difference at all."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from checkpoint_compare.cli import main
from checkpoint_storage_bench.contract import CALIBRATED_RUNS, VERDICT_RUNS_PER_BLOCK
from tests.checkpoint_compare.recorded import write_repeats
from tests.checkpoint_compare.workload_runs import BASE, FAST, judge, workspace_run

PAUSES = {BASE: [3.0, 2.0, 2.1, 1.9, 2.05, 1.95], FAST: [2.5, 1.0, 1.05, 0.95, 1.02, 0.98]}
RUNTIME = {BASE: 100.0, FAST: 96.0}
NOT_CALIBRATED = "not a calibrated answer"


def checkpoint_report(root: Path, order: list[str]) -> tuple[dict, str]:
    for profile in order:  # each a block of two runs back to back
        write_repeats(profile, PAUSES[profile], runtime_s=RUNTIME[profile])
    out = root.parent / "report.json"
    result = CliRunner().invoke(
        main, ["--offline-root", str(root), "--json", str(out), "--no-track"]
    )
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output


def test_a_checkpoint_comparison_back_to_back_says_it_is_not_a_calibrated_answer(runs_root):
    report, output = checkpoint_report(runs_root, [BASE, FAST])
    (comp,) = report["comparisons"]
    assert comp["outcome"] == "better"  # still an answer: the design met the goals
    (note,) = [n for n in comp["notes"] if NOT_CALIBRATED in n]
    per_block = VERDICT_RUNS_PER_BLOCK["checkpoint"]
    assert f"count {per_block} runs a side" in note, note
    assert f"only with {CALIBRATED_RUNS['checkpoint'].met} counted a side" in note, note
    assert NOT_CALIBRATED in output


def test_a_checkpoint_comparison_alternating_is_a_calibrated_answer(runs_root):
    report, _ = checkpoint_report(runs_root, [BASE, FAST, BASE, FAST])
    (comp,) = report["comparisons"]
    assert comp["outcome"] == "better"
    assert not [n for n in comp["notes"] if NOT_CALIBRATED in n], comp["notes"]


def _workspace(passes: int) -> list:
    base, fast = [30.0, 21.0, 22.0, 21.5], [15.0, 9.0, 9.5, 9.2]
    return [workspace_run(p, r) for _ in range(passes) for p, r in ((BASE, base), (FAST, fast))]


def test_a_design_the_calibration_missed_with_says_a_difference_may_go_unseen():
    missed = CALIBRATED_RUNS["workspace"].missed
    verdict = judge(_workspace(missed))
    (note,) = [n for n in verdict.candidates[0].notes if NOT_CALIBRATED in n]
    assert f"count {missed} runs a side" in note and "may go unseen" in note, note


def test_the_workspace_at_its_calibrated_passes_has_nothing_to_say():
    verdict = judge(_workspace(CALIBRATED_RUNS["workspace"].met))
    assert verdict.profiles[1].significant
    assert not [n for n in verdict.candidates[0].notes if NOT_CALIBRATED in n]


def test_one_run_counted_a_side_leaves_the_why_to_the_interval():
    verdict = judge(_workspace(1))
    assert not verdict.profiles[1].shift.has_interval
    assert not [n for n in verdict.candidates[0].notes if NOT_CALIBRATED in n]
