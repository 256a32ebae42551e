"""A newcomer's first runs: summaries that know when they ran, the restore measured, every
stage of the pause in the table, an early warning, and a refusal that costs nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from checkpoint_storage_bench.contract import (
    RESTORE_MEASURED,
    RESTORE_OUTPUTS,
    RUN_FINISHED_AT,
    RUN_STARTED_AT,
)
from tests.trainer.helpers import REPO, TINY, offline_runs, run_trainer, tiny_config
from trainer.preflight import few_checkpoints_warning
from trainer.summary import format_timeline
from trainer.train import train

ISO_SECOND = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def _tiny_args(ckpt: Path, *extra: str) -> list[str]:
    return [
        "--checkpoint-dir", str(ckpt), "--steps", "6", "--checkpoint-every", "2",
        "--device", "cpu", "--model-size", TINY["model_size"], "--batch-size", "2",
        "--seq-len", "16", *extra,
    ]  # fmt: skip


def test_summary_knows_when_it_ran_and_the_restore_at_the_end(tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    result = run_trainer(
        *_tiny_args(tmp_path / "ck", "--summary-json", str(summary), "--restore-check"),
        "--no-track",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(summary.read_text())
    started, finished = data[RUN_STARTED_AT], data[RUN_FINISHED_AT]
    assert ISO_SECOND.fullmatch(started) and ISO_SECOND.fullmatch(finished), (started, finished)
    assert datetime.fromisoformat(started) <= datetime.fromisoformat(finished)
    seconds, nbytes, gbps = (data[k] for k in RESTORE_OUTPUTS)
    assert data[RESTORE_MEASURED] == "end"
    assert seconds > 0 and nbytes >= data["checkpoint_bytes"] > 0
    assert abs(gbps - nbytes / seconds / 1e9) < 1e-9
    assert "restore of step 6 at the end (--restore-check)" in result.stdout


def test_a_resume_measures_its_restore(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck"
    first = train(tiny_config(ckpt, steps=4), say=lambda _: None)
    assert first.restore is None  # nothing restored, nothing measured
    assert first.outputs().keys().isdisjoint(RESTORE_OUTPUTS)
    lines: list[str] = []
    resumed = train(tiny_config(ckpt, steps=6, resume="always"), say=lines.append)
    assert resumed.restore is not None and resumed.restore.measured == "resume"
    assert resumed.restore.step == 4 and resumed.restore.bytes > 0 and resumed.restore.seconds > 0
    outputs = resumed.outputs()
    assert outputs[RESTORE_OUTPUTS[0]] > 0 and RESTORE_MEASURED not in outputs  # meta
    assert "restore of step 4 on resume" in format_timeline(resumed)


def test_the_table_shows_the_library_formats_read_back(tmp_path: Path) -> None:
    summary = train(tiny_config(tmp_path / "ck", format="safetensors"), say=lambda _: None)
    table = format_timeline(summary)
    header = next(line for line in table.splitlines() if line.lstrip().startswith("step"))
    assert "checksum" in header.split()
    row = next(line for line in table.splitlines() if line.split()[:1] == ["2"])
    checksum = float(row.split()[header.split().index("checksum")])
    assert checksum == round(summary.checkpoints[0].checksum_s, 3)
    # ... and the summary: a stage like the others.
    stages = summary.to_json()["stages"]
    assert stages["checksum_s"]["median"] > 0
    assert summary.outputs()["ckpt_checksum_s_median"] > 0


def test_too_few_checkpoints_are_warned_about_at_start(tmp_path: Path) -> None:
    # 6 steps every 2: 3 checkpoints, 2 after the warm-up; 4 are needed.
    warning = few_checkpoints_warning(tiny_config(tmp_path / "ck"))
    assert warning is not None
    assert "makes 3 checkpoint(s), 2 after the 1 warm-up" in warning
    assert "needs at least 4 per profile" in warning and "--steps 10" in warning
    assert few_checkpoints_warning(tiny_config(tmp_path / "ck", steps=10)) is None


def test_a_refused_run_imports_no_torch_and_leaves_no_tracked_run(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck"
    (ckpt / "step-00000002").mkdir(parents=True)
    root = tmp_path / "offline"
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['trainer', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_module('trainer', run_name='__main__')\n"
        "finally:\n"
        "    print('TORCH', 'torch' in sys.modules, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, *_tiny_args(ckpt)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "POLYAXON_OFFLINE_ROOT": str(root), "PATH": "/usr/bin"},
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 3, result.stderr
    assert "already holds checkpoints (newest step-00000002)" in result.stderr
    assert "TORCH False" in result.stderr
    assert not root.exists() or offline_runs(root) == []


def test_an_offline_run_warns_and_keeps_polyaxon_quiet(tmp_path: Path) -> None:
    root = tmp_path / "offline"
    result = run_trainer(*_tiny_args(tmp_path / "ck"), env={"POLYAXON_OFFLINE_ROOT": str(root)})
    assert result.returncode == 0, result.stderr
    assert len(offline_runs(root)) == 1  # tracked, offline
    assert "warning: --steps 6 with --checkpoint-every 2 makes 3 checkpoint(s)" in result.stderr
    # Polyaxon's INFO chatter does not reach the terminal.
    assert not re.search(r"\bINFO\b", result.stdout + result.stderr), result.stderr
