"""The verdict in a data workload's terms: epoch time and accelerator utilization for a scan,
total time for materialize, p99 save latency for a workspace; the same shift statistics and
cost model; the recommendation against --min-au / --max-p99-ms."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_compare.comparison import Thresholds
from checkpoint_compare.cost import DEFAULT_PRICING, load_pricing
from checkpoint_compare.errors import NotComparable, RunsMissing
from checkpoint_compare.records import RunRecord
from checkpoint_compare.workloads import WorkloadBudget, is_data_comparison, judge_workloads

REPO = Path(__file__).resolve().parents[2]
BASE, FAST = "checkpoint-baseline", "checkpoint-throughput"
SCAN_INPUTS = {"workload": "scan", "dataset_format": "webdataset", "dataset_size": 1 << 30}


def scan_run(profile: str, epochs: list[float], au: list[float], **inputs) -> RunRecord:
    return RunRecord(
        uuid=f"{profile}-{len(epochs)}-{epochs[0]}",
        name="data",
        inputs={**SCAN_INPUTS, "storage_profile": profile, **inputs},
        outputs={"scan_epoch_s": sorted(epochs)[len(epochs) // 2], "scan_au": au[0]},
        metrics={
            "scan_epoch_s": list(enumerate(epochs)),
            "scan_au": list(enumerate(au)),
        },
    )


def judge(records: list[RunRecord], **budget) -> object:
    pricing = load_pricing(DEFAULT_PRICING, None, None)
    return judge_workloads(records, pricing, Thresholds(warmup=1), budget=WorkloadBudget(**budget))


def slow_and_fast() -> list[RunRecord]:
    return [
        scan_run(BASE, [14.0, 10.0, 10.2, 9.9, 10.1, 10.0], [0.5, 0.71, 0.7, 0.72, 0.7, 0.71]),
        scan_run(FAST, [9.0, 7.3, 7.2, 7.4, 7.3, 7.2], [0.8, 0.97, 0.97, 0.96, 0.97, 0.98]),
    ]


def test_scan_speaks_epoch_time_and_au_with_the_shift_and_its_interval() -> None:
    verdict = judge(slow_and_fast())
    assert verdict.workload == "scan" and verdict.baseline == BASE
    base, fast = verdict.profiles
    assert len(base.samples) == 5  # the warm-up epoch left out
    assert base.au == pytest.approx(0.71) and fast.au == pytest.approx(0.97)
    assert fast.shift.has_interval and fast.shift.high < 0 and fast.significant
    assert fast.relative == pytest.approx(-0.28, abs=0.01)
    text = " ".join(verdict.sentences)
    assert "epoch time 7.3 s vs 10 s" in text and "28% faster" in text
    assert "keeps the GPUs fed at 97% AU, baseline 71%" in text
    # Without a budget the faster profile is recommended; the cost model prices both.
    assert verdict.recommended == FAST
    assert fast.cost.storage_month > base.cost.storage_month > 0


def test_the_au_budget_picks_the_cheapest_profile_that_meets_it() -> None:
    assert judge(slow_and_fast(), min_au=0.9).recommended == FAST
    assert judge(slow_and_fast(), min_au=0.6).recommended == BASE  # cheaper, and enough
    none = judge(slow_and_fast(), min_au=0.99)
    assert none.recommended is None
    assert "none of the profiles meets the budget" in none.sentences[-1]
    assert "does not keep the GPUs fed" in none.sentences[0]


def test_noise_is_no_difference() -> None:
    runs = [
        scan_run(BASE, [12.0, 10.0, 10.4, 9.7, 10.2, 9.9], [0.7] * 6),
        scan_run(FAST, [12.0, 10.1, 9.8, 10.3, 9.9, 10.0], [0.7] * 6),
    ]
    verdict = judge(runs)
    assert not verdict.profiles[1].significant
    assert "no measurable difference" in verdict.sentences[0]
    assert verdict.recommended == BASE


def workspace_run(profile: str, rounds: list[float]) -> RunRecord:
    return RunRecord(
        uuid=f"ws-{profile}",
        inputs={"workload": "workspace", "storage_profile": profile, "files": 200},
        outputs={"workspace_save_p99_ms": max(rounds)},
        metrics={"workspace_save_p99_ms": list(enumerate(rounds))},
    )


def test_workspace_speaks_p99_save_latency_against_its_budget() -> None:
    runs = [
        workspace_run(BASE, [30.0, 21.0, 22.0, 20.5, 21.5, 22.5]),
        workspace_run(FAST, [15.0, 9.0, 9.5, 8.8, 9.1, 9.4]),
    ]
    verdict = judge(runs, max_p99_ms=10.0)
    assert verdict.headline == "p99 save latency" and verdict.unit == "ms"
    assert verdict.recommended == FAST
    assert "p99 save latency 9.1 ms vs 21.5 ms" in verdict.sentences[0]
    assert judge(runs, max_p99_ms=25.0).recommended == BASE


def test_refusals() -> None:
    other_dataset = [
        scan_run(BASE, [1.0, 1.0], [0.5] * 2),
        scan_run(FAST, [1.0, 1.0], [0.5] * 2, dataset_size=1),
    ]
    with pytest.raises(NotComparable, match="differ in dataset_size"):
        judge(other_dataset)
    with pytest.raises(NotComparable, match="one profile only"):
        judge([scan_run(BASE, [1.0, 1.0], [0.5] * 2)])
    mixed = [scan_run(BASE, [1.0], [0.5]), workspace_run(FAST, [1.0])]
    with pytest.raises(NotComparable, match="one data workload"):
        judge(mixed)
    pricing = load_pricing(DEFAULT_PRICING, None, None)
    with pytest.raises(RunsMissing, match="io2"):
        judge_workloads(slow_and_fast(), pricing, Thresholds(), expected=("io2",))
    assert is_data_comparison(slow_and_fast())


def test_the_cli_judges_real_scan_summaries(tmp_path: Path) -> None:
    data = tmp_path / "claim" / "data"
    data.parent.mkdir()
    env_args = ["--dataset-size", "256KiB", "--record-size", "4KiB", "--shard-size", "64KiB"]
    for profile in (BASE, FAST):
        done = subprocess.run(
            [sys.executable, "-m", "data_workloads", "scan", "--data-dir", str(data), *env_args,
             "--epochs", "3", "--num-workers", "1", "--compute-ms", "2", "--no-track",
             "--storage-profile", profile, "--summary-json", str(tmp_path / f"{profile}.json")],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    out = tmp_path / "verdict.json"
    done = subprocess.run(
        [sys.executable, "-m", "checkpoint_compare", "--no-track", "--min-au", "0.01",
         "--summary", f"{BASE}={tmp_path / f'{BASE}.json'}",
         "--summary", f"{FAST}={tmp_path / f'{FAST}.json'}", "--json", str(out),
         "--html", str(tmp_path / "verdict.html")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scan verdict, baseline checkpoint-baseline" in done.stdout
    assert "epoch time" in done.stdout and "AU" in done.stdout
    verdict = json.loads(out.read_text())
    assert verdict["workload"] == "scan" and len(verdict["profiles"]) == 2
    assert all(len(p["samples"]) == 2 for p in verdict["profiles"])  # 3 epochs, 1 warm-up
    page = (tmp_path / "verdict.html").read_text()
    assert "Storage profile comparison: scan" in page and "AU, baseline" in page
    assert page.index("id='verdict'") < page.index("id='tables'")


def test_outputs_carry_the_verdict_and_none_when_nothing_fits() -> None:
    from checkpoint_compare.workloads import outputs

    out = outputs(judge(slow_and_fast(), min_au=0.99))
    assert out["recommended_profile"] == "none" and out["workload"] == "scan"
    assert "does not keep the GPUs fed" in out["verdict"]
    assert out["recommendation_reason"].startswith("Recommendation: none")
    assert out["checkpoint_throughput_scan_au"] == pytest.approx(0.97)
    assert outputs(judge(slow_and_fast()))["recommended_profile"] == FAST
