"""The benchmark script runs end to end and reports every case (no timing assertions)."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from trainer import bench


def test_bench_reports_every_case_and_target(tmp_path):
    out = tmp_path / "bench.json"
    result = bench.main.main(
        ["--dir", str(tmp_path / "vol"), "--size", "16MiB", "--repeats", "1", "--train-rounds", "1",
         "--train-model-size", "256KiB", "--streams", "1,2", "--json", str(out)],
        standalone_mode=False,
    )  # fmt: skip
    assert result is None
    data = json.loads(out.read_text())
    expected = {
        "raw-sync", "raw-sync-strict", "raw-sync-s2", "raw-async", "torch-save", "dcp-sync",
        "dcp-async", "safetensors", "raw-load", "torch-load",
    }  # fmt: skip
    if shutil.which("fio"):
        expected |= {"fio-write", "fio-write-1m", "fio-write-s1", "fio-write-s2", "fio-read"}
    assert set(data["medians"]) == expected
    for case in data["medians"].values():
        assert case["gbps"] > 0 and case["seconds"] > 0
    assert data["medians"]["raw-sync"]["overlapped"] == 1.0
    assert data["medians"]["raw-sync-strict"]["overlapped"] == 0.0
    # the library formats' read-back is reported apart, ours happens while writing
    assert data["medians"]["dcp-sync"]["checksum_s"] > 0
    assert data["medians"]["raw-sync"]["checksum_s"] == 0
    assert set(data["targets"]) == set(bench.TARGETS)
    for target in data["targets"].values():
        assert target["met"] in (True, False)
    assert set(data["streams"]) == {"1", "2"}
    assert data["steps"]["steps_per_s_plain"] > 0
    assert data["machine"]["crc32"] in ("isal", "zlib")
    assert list((tmp_path / "vol").iterdir()) == []  # cleaned up


def test_bench_rejects_bad_size(tmp_path):
    with pytest.raises(Exception, match="not a size"):
        bench.main.main(["--dir", str(tmp_path), "--size", "huge"], standalone_mode=False)


def test_bench_rejects_a_sweep_without_one_stream(tmp_path):
    with pytest.raises(Exception, match="must include 1"):
        bench.main.main(["--dir", str(tmp_path), "--streams", "2,4"], standalone_mode=False)


@pytest.mark.parametrize(
    "args",
    [
        ["--threads", "0"],
        ["--train-rounds", "0"],
        ["--train-model-size", "huge"],
        ["--train-model-size", "64KiB"],
    ],
)
def test_bench_refuses_bad_settings_before_it_runs(tmp_path, args):
    result = CliRunner().invoke(bench.main, ["--dir", str(tmp_path / "vol"), *args])
    assert result.exit_code == 2, result.output
    assert "Error: Invalid value for" in result.output
    assert not (tmp_path / "vol").exists()  # nothing measured, nothing written
