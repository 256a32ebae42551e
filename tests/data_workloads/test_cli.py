"""The CLI: options from the config dataclasses, one exit-code table, bad input refused
before anything is measured, nothing written outside the data dir, figures recorded."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
from dataclasses import fields
from pathlib import Path

import pytest

from checkpoint_storage_bench.config_cli import field_docs
from checkpoint_storage_bench.contract import DATA_SUMMARY_SCHEMA, DATA_WORKLOAD_OUTPUTS
from checkpoint_storage_bench.errors import BenchError
from data_workloads import errors
from data_workloads.config import MaterializeConfig, ScanConfig, WorkspaceConfig
from data_workloads.errors import EXIT_CODES, WorkloadError

from .helpers import TINY, run_cli

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {"scan": ScanConfig, "materialize": MaterializeConfig, "workspace": WorkspaceConfig}


def test_every_error_carries_a_listed_code_and_every_code_has_an_error() -> None:
    classes = [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, WorkloadError) and c.__module__ == errors.__name__
    ]
    for cls in classes:
        assert issubclass(cls, BenchError) and cls.exit_code in EXIT_CODES, cls
    # 1 is the base class's (unexpected), 0 success; 128+N an interruption's.
    assert {c.exit_code for c in classes} | {0} == {c for c in EXIT_CODES if isinstance(c, int)}
    assert errors.Interrupted(signal.SIGTERM).exit_code == 143 and "128+N" in EXIT_CODES


@pytest.mark.parametrize("workload", sorted(CONFIGS))
def test_help_lists_every_documented_option_and_the_exit_codes(workload: str) -> None:
    out = run_cli(workload, "--help").output
    docs = field_docs(CONFIGS[workload])
    for f in fields(CONFIGS[workload]):
        assert docs.get(f.name), f"{f.name} has no docstring"
        assert "--" + f.name.replace("_", "-") in out
    for code in EXIT_CODES:
        assert f"  {code}  " in out or f"  {code} " in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "0"], "--epochs must be positive"),
        (["--record-size", "10"], "--record-size must be at least"),
        (["--dataset-size", "lots"], "--dataset-size: not a size"),
        (["--min-au", "1.5"], "--min-au must be in (0, 1]"),
        (["--num-workers", "-1"], "--num-workers must be 0 to 64"),
        (["--compute-ms", "nan"], "--compute-ms must be 0 or more"),
    ],
)
def test_bad_options_exit_2(data_dir: Path, args: list[str], message: str) -> None:
    result = run_cli("scan", "--data-dir", data_dir, "--no-track", *TINY, *args)
    assert result.exit_code == 2 and message in result.output
    assert not data_dir.exists()  # refused before the data dir is touched


def test_unmounted_claim_exit_3(tmp_path: Path) -> None:
    result = run_cli("workspace", "--data-dir", tmp_path / "nowhere" / "data", "--no-track")
    assert result.exit_code == 3 and "is the claim mounted?" in result.output


def test_missing_dataset_exit_4_other_dataset_exit_5_truncated_exit_6(data_dir: Path) -> None:
    args = ["scan", "--data-dir", data_dir, "--no-track", *TINY]
    missing = run_cli(*args, "--no-generate")
    assert missing.exit_code == 4 and "no webdataset dataset" in missing.output
    assert run_cli(*args, "--epochs", "1").exit_code == 0
    other = run_cli(*args, "--seed", "3")
    assert other.exit_code == 5 and "seed=0 (asked 3)" in other.output
    shard = sorted((data_dir / "webdataset").glob("*.tar"))[0]
    shard.write_bytes(shard.read_bytes()[:1000])
    truncated = run_cli(*args)
    assert truncated.exit_code == 6 and "truncated" in truncated.output
    assert "scan_epoch_s" not in truncated.output  # nothing measured


@pytest.mark.parametrize("workload", sorted(CONFIGS))
def test_each_workload_writes_only_inside_the_data_dir(data_dir: Path, workload: str) -> None:
    claim = data_dir.parent
    extra = TINY if workload != "workspace" else ["--files", "10", "--rounds", "1"]
    if workload == "scan":
        extra = [*extra, "--epochs", "1", "--num-workers", "1"]
    summary = data_dir / "summary.json"
    result = run_cli(
        workload, "--data-dir", data_dir, "--no-track", "--summary-json", summary, *extra
    )
    assert result.exit_code == 0, result.output
    assert [p.name for p in claim.iterdir()] == ["data"]
    # The dataset stays for the next profile; scratch files are gone.
    left = sorted(p.name for p in data_dir.iterdir())
    assert left == (["summary.json"] if workload == "workspace" else ["summary.json", "webdataset"])
    doc = json.loads(summary.read_text())
    assert doc["schema"] == DATA_SUMMARY_SCHEMA and doc["workload"] == workload
    assert set(doc["outputs"]) == set(DATA_WORKLOAD_OUTPUTS[workload])


def test_the_run_is_tracked_with_its_outputs(data_dir: Path, tmp_path: Path) -> None:
    result = run_cli(
        "workspace",
        "--data-dir",
        data_dir,
        "--files",
        "5",
        "--rounds",
        "1",
        "--storage-profile",
        "fast",
    )
    assert result.exit_code == 0, result.output
    (run_file,) = (tmp_path / "plx-offline").rglob("run.plx.json")
    outputs = json.loads(run_file.read_text())["outputs"]
    assert set(DATA_WORKLOAD_OUTPUTS["workspace"]) <= set(outputs)
    inputs = json.loads(run_file.read_text())["inputs"]
    assert inputs["workload"] == "workspace" and inputs["storage_profile"] == "fast"


def test_the_measurement_runs_before_the_tracked_run_opens(data_dir: Path, monkeypatch) -> None:
    # DataLoader workers forked from a process where an online Polyaxon run has started its
    # threads can inherit a held lock and hang: nothing is measured inside the tracked run.
    from contextlib import contextmanager

    from checkpoint_storage_bench.tracking import Tracker
    from data_workloads import commands

    events: list[str] = []

    @contextmanager
    def tracked(*_a, **_k):
        events.append("tracking opened")
        yield Tracker(None)

    monkeypatch.setattr(commands, "tracked_run", tracked)
    cfg = WorkspaceConfig(data_dir=data_dir, track=True)

    def measure() -> dict:
        events.append("measured")
        return {"figures": {"x": 1.0}, "metrics": [(0, {"x": 1.0})]}

    commands.run_workload("workspace", cfg, measure)
    assert events == ["measured", "tracking opened"]


def test_the_summary_records_when_the_measurement_started_and_finished(data_dir: Path) -> None:
    from datetime import UTC, datetime

    from checkpoint_storage_bench.contract import RUN_FINISHED_AT, RUN_STARTED_AT

    summary = data_dir / "summary.json"
    before = datetime.now(UTC).replace(microsecond=0)
    result = run_cli("workspace", "--data-dir", data_dir, "--no-track", "--summary-json",
                     summary, "--files", "5", "--rounds", "1")  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(summary.read_text())
    # The trainer's format: ISO 8601 in UTC to the second, with a Z.
    pattern = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"
    started, finished = doc[RUN_STARTED_AT], doc[RUN_FINISHED_AT]
    assert re.match(pattern, started) and re.match(pattern, finished)
    started_at = datetime.fromisoformat(started.replace("Z", "+00:00"))
    finished_at = datetime.fromisoformat(finished.replace("Z", "+00:00"))
    assert before <= started_at <= finished_at <= datetime.now(UTC)


@pytest.fixture
def full_volume(tmp_path: Path):
    """A tiny tmpfs, filled up (root only: skipped where it cannot be mounted)."""
    import subprocess

    mount = tmp_path / "full"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                      capture_output=True).returncode:  # fmt: skip
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        (mount / "previous.json").write_text('{"kept": true}\n')
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, bytes(4096)):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_volume_when_the_summary_is_written_is_exit_7_and_nothing_is_broken(
    data_dir: Path, full_volume: Path
) -> None:
    import subprocess
    import sys

    summary = full_volume / "previous.json"
    # A fresh process: the exit code and stderr as a shell sees them.
    result = subprocess.run(
        [sys.executable, "-m", "data_workloads", "workspace", "--data-dir", str(data_dir),
         "--no-track", "--summary-json", str(summary), "--files", "5", "--rounds", "1"],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 7, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"data-workloads: error: no space left on the volume while writing the summary {summary}"
    ]
    assert json.loads(summary.read_text()) == {"kept": True}  # what was there stays whole
    assert sorted(p.name for p in full_volume.iterdir()) == ["filler", "previous.json"]


@pytest.mark.parametrize("target", ["empty", "missing"])
def test_a_symlinked_dataset_dir_is_refused_and_nothing_is_written_into_its_target(
    data_dir: Path, tmp_path: Path, target: str
) -> None:
    elsewhere = tmp_path / "elsewhere"
    if target == "empty":
        elsewhere.mkdir()
    data_dir.mkdir()
    (data_dir / "files").symlink_to(elsewhere)
    result = run_cli("scan", "--data-dir", data_dir, "--no-track", *TINY,
                     "--dataset-format", "files", "--epochs", "1")  # fmt: skip
    assert result.exit_code == 3, result.output
    assert "is a symbolic link" in result.output and "Traceback" not in result.output
    assert (list(elsewhere.iterdir()) == []) if target == "empty" else not elsewhere.exists()
    assert sorted(p.name for p in data_dir.iterdir()) == ["files"]


@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_a_summary_path_that_cannot_be_written_is_refused_before_measuring(
    data_dir: Path, tmp_path: Path, where: str
) -> None:
    summary = tmp_path / "out"
    if where == "a directory":
        summary.mkdir()
    else:
        summary.write_text("not a directory")
        summary = summary / "sub" / "summary.json"
    result = run_cli("workspace", "--data-dir", data_dir, "--no-track", "--files", "5",
                     "--rounds", "1", "--summary-json", summary)  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--summary-json" in result.output and "workspace_save_p99_ms" not in result.output
    out = tmp_path / "out"
    assert list(out.iterdir()) == [] if out.is_dir() else out.read_text() == "not a directory"
