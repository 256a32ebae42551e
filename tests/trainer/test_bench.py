"""The benchmark script runs end to end and reports every case (no timing assertions)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.trainer.helpers import REPO, run_trainer  # noqa: F401 - REPO keeps cwd explicit
from trainer import bench


def test_bench_reports_every_case_and_target(tmp_path):
    out = tmp_path / "bench.json"
    result = bench.main.main(
        ["--dir", str(tmp_path / "vol"), "--size", "16MiB", "--repeats", "1", "--train-rounds", "1",
         "--train-model-size", "256KiB", "--json", str(out)],
        standalone_mode=False,
    )  # fmt: skip
    assert result is None
    data = json.loads(out.read_text())
    expected = {"raw-sync", "raw-async", "torch-save", "raw-load", "torch-load"}
    if shutil.which("fio"):
        expected |= {"fio-write", "fio-write-1m", "fio-read"}
    assert set(data["medians"]) == expected
    for case in data["medians"].values():
        assert case["gbps"] > 0 and case["seconds"] > 0
    assert set(data["targets"]) == {*bench.TARGETS, "async pause s/GB"}
    assert data["steps"]["steps_per_s_plain"] > 0
    assert list((tmp_path / "vol").iterdir()) == []  # cleaned up


def test_bench_rejects_bad_size(tmp_path):
    with pytest.raises(Exception, match="not a size"):
        bench.main.main(["--dir", str(tmp_path), "--size", "huge"], standalone_mode=False)
