"""The verdict on offline runs recorded by the real trainer (``python -m trainer``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from checkpoint_compare.cli import main
from checkpoint_compare.comparison import NO_DIFFERENCE

REPO = Path(__file__).resolve().parents[2]
PROFILES = ("checkpoint-baseline", "checkpoint-throughput")
TINY = ["--model-size", "2MiB", "--steps", "20", "--checkpoint-every", "5", "--device", "cpu"]


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "POLYAXON_TRACKING_FLUSH_DELAY": "0"}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def _compare(*args: str) -> Result:
    """The compare CLI in this process (the trainer runs are the subprocesses that matter)."""
    return CliRunner().invoke(main, list(args))


def _train(tmp_path: Path, profile: str, *extra: str) -> subprocess.CompletedProcess[str]:
    ckpt_dir = tmp_path / "volumes" / profile
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    return _run(
        "trainer",
        "--checkpoint-dir",
        str(ckpt_dir),
        "--storage-profile",
        profile,
        "--summary-json",
        str(tmp_path / f"{profile}.json"),
        *TINY,
        *extra,
    )


@pytest.mark.slow
def test_compare_real_trainer_runs(tmp_path: Path, runs_root: Path) -> None:
    for profile in PROFILES:  # one after the other, as on one claim
        result = _train(tmp_path, profile)
        assert result.returncode == 0, result.stderr[-2000:]

    out = tmp_path / "report"
    result = _compare(
        "--offline-root",
        str(runs_root),
        "--warmup",  # every checkpoint, to check the figures against the trainer's own
        "0",
        "--json",
        str(out / "offline.json"),
        "--html",
        str(out / "report.html"),
    )
    assert result.exit_code == 0, result.output[-2000:]
    report = json.loads((out / "offline.json").read_text())
    assert report["baseline"] == "checkpoint-baseline"
    assert report["verdict"] in (*PROFILES, NO_DIFFERENCE)
    assert f"VERDICT: {report['verdict']}" in result.output

    # The figures recomputed from the metric events agree with what the trainer reported, to
    # the 4 significant digits the trainer logs metrics and outputs with (the summary JSON
    # keeps full precision; a median of two rounded values is off by up to one rounding).
    rounded = 1e-3
    for profile in PROFILES:
        summary = json.loads((tmp_path / f"{profile}.json").read_text())
        figures = report["profiles"][profile]
        assert figures["checkpoint_count"] == summary["checkpoint_count"] == 4
        assert [s for s, _ in figures["pause_per_checkpoint"]] == [5, 10, 15, 20]
        for stat in ("median", "min", "max"):
            assert figures["stages"]["pause"][stat] == pytest.approx(
                summary["stages"]["pause_s"][stat], rel=rounded
            )
        assert figures["runtime_s"] == pytest.approx(summary["runtime_s"], rel=rounded)
        assert figures["final_loss"] == pytest.approx(summary["final_loss"], rel=rounded)

    # The compare op logged its verdict as outputs of a (here offline) Polyaxon run.
    compare_runs = [
        json.loads(p.read_text())
        for p in (runs_root / "runs").glob("*/run.plx.json")
        if json.loads(p.read_text())["name"] == "compare"
    ]
    assert len(compare_runs) == 1
    outputs = compare_runs[0]["outputs"]
    assert outputs["verdict"] == report["verdict"]
    assert outputs["runtime_delta_s"] == pytest.approx(report["outputs"]["runtime_delta_s"])

    # The trainer's summary JSONs give the same answer without any Polyaxon run.
    result = _compare(
        *[a for p in PROFILES for a in ("--summary", f"{p}={tmp_path / f'{p}.json'}")],
        "--baseline",  # summaries carry no start time to tell which profile ran first
        PROFILES[0],
        "--warmup",
        "0",
        "--json",
        str(out / "summaries.json"),
        "--no-track",
    )
    assert result.exit_code == 0, result.output[-2000:]
    from_summaries = json.loads((out / "summaries.json").read_text())
    assert from_summaries["verdict"] == report["verdict"]
    for profile in PROFILES:
        stages = report["profiles"][profile]["stages"]
        assert from_summaries["profiles"][profile]["stages"].keys() == stages.keys()
        for stage, stats in from_summaries["profiles"][profile]["stages"].items():
            assert stats.keys() == stages[stage].keys(), stage
            for key, value in stats.items():
                # A spread is a difference of two rounded values: its error is one rounding
                # of the larger one, not a share of the (small) spread itself.
                slack = rounded * abs(stats.get("max") or 0) if key == "spread" else 0
                assert value == pytest.approx(stages[stage][key], rel=rounded, abs=slack), (
                    stage,
                    key,
                )

    # A run that fails (resuming from corrupted checkpoints) is reported, not used.
    for state in (tmp_path / "volumes" / "checkpoint-throughput").glob("*/state.ckpt"):
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
    failed = _train(tmp_path, "checkpoint-throughput", "--resume")
    assert failed.returncode == 6, failed.stderr[-2000:]
    result = _compare("--offline-root", str(runs_root), "--no-track")
    assert result.exit_code == 3
    assert "profile checkpoint-throughput: run train-checkpoint-throughput" in result.output
    assert "failed: CheckpointCorruptError" in result.output
