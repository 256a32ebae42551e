"""Runs the verdict refuses to rank, from the other parts' records: a claim switched during a
measurement, different GPUs or images, a resumed run; and distributed runs judged by their
slowest rank."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkpoint_compare.cli import main
from checkpoint_storage_bench.contract import LEDGER_OUTPUT, LedgerEntry, format_ledger
from tests.checkpoint_compare.recorded import (
    run_cli,
    write_hook_run,
    write_repeats,
    write_training_run,
)

BASE, FAST = "checkpoint-baseline", "checkpoint-throughput"
PAUSES = {BASE: [2.5] + [2.0, 2.02, 1.98] * 2, FAST: [1.5] + [1.0, 1.02, 0.98] * 2}


def _interval(runs_root: Path, run_uuid: str) -> tuple[datetime, datetime]:
    data = json.loads((runs_root / "runs" / run_uuid / "run.plx.json").read_text())
    return (
        datetime.fromisoformat(data["started_at"].replace("Z", "+00:00")),
        datetime.fromisoformat(data["finished_at"].replace("Z", "+00:00")),
    )


# ------------------------------------------------------------ 12.4: a switch mid-measurement


def _pipeline_with_ledger(runs_root: Path, switch_at: str) -> str:
    """Hook → train per profile, then the last op (restore to the baseline) logs the ledger
    with one extra switch: someone moved the claim to the baseline class while the fast
    profile's run was measuring (or after it)."""
    write_hook_run(BASE)
    write_training_run(BASE, PAUSES[BASE], runtime_s=100.0)
    write_hook_run(FAST)
    fast = write_training_run(FAST, PAUSES[FAST], runtime_s=92.0)
    # The ledger has whole seconds; a recorded run here lasts milliseconds: give it the
    # 92 s it reports, as a real one would have.
    start, _ = _interval(runs_root, fast)
    end = start + timedelta(seconds=92)
    run_json = runs_root / "runs" / fast / "run.plx.json"
    data = json.loads(run_json.read_text())
    data["finished_at"] = end.isoformat()
    run_json.write_text(json.dumps(data))
    at = start + timedelta(seconds=46) if switch_at == "inside" else end + timedelta(seconds=5)
    ledger = [
        LedgerEntry(start - timedelta(minutes=10), None, BASE, "pipeline-1"),
        LedgerEntry(start - timedelta(minutes=5), BASE, FAST, "pipeline-1"),
        LedgerEntry(at, FAST, BASE, "alice@laptop"),
    ]
    write_hook_run(BASE, **{LEDGER_OUTPUT: format_ledger(ledger)})
    return fast


def test_a_switch_inside_a_measured_interval_is_refused(runs_root: Path, pricing_file) -> None:
    fast = _pipeline_with_ledger(runs_root, "inside")
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 3, output
    assert f"profile {FAST}: its claim was switched from {FAST} to {BASE}" in output
    assert "by alice@laptop" in output and fast[:8] in output


def test_switches_outside_the_measured_intervals_are_fine(runs_root: Path, pricing_file) -> None:
    _pipeline_with_ledger(runs_root, "after")
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    assert not any("not checked" in n for n in report["notes"])


def test_without_a_ledger_the_check_is_skipped_with_a_note(runs_root: Path, pricing_file) -> None:
    write_hook_run(BASE)
    write_training_run(BASE, PAUSES[BASE], runtime_s=100.0)
    write_training_run(FAST, PAUSES[FAST], runtime_s=92.0)
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    assert any(
        f"recorded the claim's ledger (output '{LEDGER_OUTPUT}')" in n for n in report["notes"]
    )
    assert "== Notes" in output


def test_a_malformed_ledger_exits_2(runs_root: Path, pricing_file) -> None:
    write_hook_run(BASE, **{LEDGER_OUTPUT: '{"not": "a list"}'})
    write_training_run(BASE, PAUSES[BASE], runtime_s=100.0)
    write_training_run(FAST, PAUSES[FAST], runtime_s=92.0)
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 2 and "is not a JSON list" in output


# ---------------------------------------------------------- 13.1: the hardware and the image


def test_different_gpu_models_are_refused(runs_root: Path, pricing_file) -> None:
    write_training_run(BASE, PAUSES[BASE], 100.0, meta={"gpu_model": "NVIDIA H100 80GB HBM3"})
    write_training_run(FAST, PAUSES[FAST], 92.0, meta={"gpu_model": "NVIDIA A100-SXM4-40GB"})
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 3 and "gpu_model differs" in output and "different hardware" in output


@pytest.mark.parametrize(
    ("base_image", "fast_image", "refused"),
    [
        ("reg.example.com/bench:0.2@sha256:aaa", "reg.example.com/bench:0.3@sha256:aaa", False),
        ("reg.example.com/bench@sha256:aaa", "reg.example.com/bench@sha256:bbb", True),
        ("reg.example.com/bench:0.2", "reg.example.com/bench:0.3", True),
        ("reg.example.com/bench:0.2", "reg.example.com/bench:0.2", False),
    ],
)
def test_images_are_compared_by_digest_when_pinned(
    runs_root: Path, pricing_file, base_image: str, fast_image: str, refused: bool
) -> None:
    write_training_run(BASE, PAUSES[BASE], 100.0, image=base_image, meta={"node_name": "gpu-a"})
    write_training_run(FAST, PAUSES[FAST], 92.0, image=fast_image, meta={"node_name": "gpu-b"})
    code, output, report = run_cli(runs_root, pricing_file())
    if refused:
        assert code == 3 and "image differs" in output and "a different image" in output
    else:
        assert code == 0, output
        # each run's node is shown
        assert "node (per run)" in output and "gpu-a" in output and "gpu-b" in output
        assert report["profiles"][FAST]["training_runs"][0]["node_name"] == "gpu-b"


# --------------------------------------------------------------------- 13.2: resumed runs


def test_a_resumed_run_is_not_ranked_against_an_uninterrupted_one(
    runs_root: Path, pricing_file
) -> None:
    write_training_run(BASE, PAUSES[BASE], runtime_s=100.0)
    write_training_run(FAST, PAUSES[FAST], runtime_s=60.0, outputs={"resumed_from_step": 100})
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 3, output
    assert f"{FAST} (train-{FAST}" in output and "from step 100" in output
    assert "--allow-resumed" in output
    code, output, report = run_cli(runs_root, pricing_file(), "--allow-resumed")
    assert code == 0, output
    assert any("compared anyway (--allow-resumed)" in n for n in report["notes"])
    assert report["profiles"][FAST]["training_runs"][0]["resumed_from_step"] == 100


# ------------------------------------------------------------ 16: many ranks, one checkpoint


def test_distributed_runs_are_judged_by_their_slowest_rank(runs_root: Path, pricing_file) -> None:
    # Rank 0's pause looks the same on both profiles; the slowest rank's does not, and
    # training waits for the slowest rank.
    same = [1.0] * 7
    write_repeats(
        BASE, same, runtime_s=100.0, outputs={"world_size": 8},
        per_checkpoint={"ckpt_slowest_pause_s": [3.0, 3.0, 3.02, 2.98, 3.0, 3.01, 2.99],
                        "ckpt_aggregate_gbps": [1.0] * 7},
    )  # fmt: skip
    write_repeats(
        FAST, same, runtime_s=88.0, outputs={"world_size": 8},
        per_checkpoint={"ckpt_slowest_pause_s": [1.2, 1.2, 1.22, 1.18, 1.2, 1.21, 1.19],
                        "ckpt_aggregate_gbps": [2.5] * 7},
    )  # fmt: skip
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    assert report["profiles"][BASE]["stages"]["pause"]["median"] == pytest.approx(3.0, abs=0.02)
    pause = next(c for c in report["comparisons"] if c["candidate"] == FAST)["pause"]
    assert pause["estimate"] == pytest.approx(-1.8, abs=0.02) and pause["counts"] is True
    assert report["profiles"][FAST]["training_runs"][0]["pause_is_slowest_rank"] is True
    assert "aggregate GB/s, all ranks (median)" in output
    assert report["verdict"] == FAST


def test_single_and_multi_process_runs_are_not_mixed(runs_root: Path, pricing_file) -> None:
    write_training_run(BASE, PAUSES[BASE], runtime_s=100.0, outputs={"world_size": 1})
    write_training_run(FAST, PAUSES[FAST], runtime_s=92.0, outputs={"world_size": 8})
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 3 and "world_size differs" in output


def test_a_distributed_summary_uses_the_slowest_rank(tmp_path: Path) -> None:
    from tests.checkpoint_compare.recorded import summary_json

    args = []
    for profile, slowest in ((BASE, 3.0), (FAST, 1.2)):
        data = summary_json(profile, [1.0] * 7, 100.0 if profile == BASE else 88.0)
        data["world_size"] = 2
        data["provenance"] = {"node_name": f"node-{profile}", "gpu_model": "cpu"}
        for i, ckpt in enumerate(data["checkpoints"]):
            ckpt["slowest_pause_s"] = slowest + 0.01 * (i % 3)
            ckpt["aggregate_gbps"] = 1.0
        path = tmp_path / f"{profile}.json"
        path.write_text(json.dumps(data))
        args += ["--summary", f"{profile}={path}"]
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, [*args, "--baseline", BASE, "--json", str(out), "--no-track"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["profiles"][BASE]["stages"]["pause"]["median"] == pytest.approx(3.01)
    assert report["profiles"][FAST]["training_runs"][0]["node_name"] == f"node-{FAST}"
    assert report["profiles"][FAST]["training_runs"][0]["world_size"] == 2
