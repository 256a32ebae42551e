"""``python -m data_workloads.bench``: the loaders beside fio, printed as a table."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from data_workloads import bench


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_one_epoch_prints_the_table_without_a_second_epoch_ratio(data_dir: Path) -> None:
    args = ["--dir", data_dir, "--dataset-size", "256KiB", "--record-size", "4KiB"]
    args += ["--format", "files", "--num-workers", "1", "--epochs", "1"]
    result = CliRunner().invoke(bench.main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if line.startswith("files ")]
    assert " - " in row  # no epoch-2/epoch-1 ratio with one epoch
    assert "scan / fio randread, worst format" in result.output
