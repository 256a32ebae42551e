"""``python -m data_workloads.bench``: every format through our loader and its library
beside fio, printed as a table of medians (its structure checked, not its timings)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkpoint_storage_bench.contract import LOADER_FORMATS
from data_workloads import bench

needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
TINY = ["--dataset-size", "256KiB", "--record-size", "4KiB", "--num-workers", "1"]


def run_bench(data_dir: Path, *args: str) -> list[str]:
    argv = ["--dir", str(data_dir), *TINY, *args]
    result = CliRunner().invoke(bench.main, argv, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


@needs_fio
def test_each_format_has_a_row_for_ours_and_its_library_with_medians_of_the_repeats(
    data_dir: Path,
) -> None:
    lines = run_bench(
        data_dir, "--format", "files", "--format", "mds", "--epochs", "1", "--repeats", "2"
    )
    header = lines[0].split()
    assert header[:3] == ["format", "loader", "dataset"] and "vs" in header and "lib" in header
    rows = [line.split() for line in lines[1:5]]
    assert [(r[0], r[1]) for r in rows] == [
        ("files", "ours"), ("files", "torch"), ("mds", "ours"), ("mds", "streaming")
    ]  # fmt: skip
    for fields in rows:
        assert all(f == "-" or float(f) >= 0 for f in fields[7:13]), fields  # MB/s to cores
        assert fields[-4] == "-"  # one epoch: no epoch-2/epoch-1 ratio
    # Ours is compared with the library on CPU per MB; the library's row has no such ratio.
    ours, library = rows[0], rows[1]
    assert float(ours[12]) == pytest.approx(float(ours[10]) / float(library[10]), abs=0.02)
    assert library[12] == "-"
    # Materialize is our workload: only our rows have its write beside fio's.
    assert ours[-3] != "-" and library[-3] == "-"
    text = "\n".join(lines)
    assert "medians of 2 interleaved runs" in text
    assert "scan / fio randread, worst format" in text
    assert "our CPU per MB / the library's, worst format" in text


def test_every_format_has_one_library_loader() -> None:
    for fmt in LOADER_FORMATS["ours"]:
        assert fmt in LOADER_FORMATS[bench.theirs(fmt)]


def test_the_profile_counts_the_workers_and_the_main_process_only_in_its_epochs() -> None:
    raw = "\n".join(
        [
            'process 7:"python -m data_workloads scan";main (cli.py:1);verify (dataset.py:3) 50',
            'process 7:"python";run_epoch (scan.py:9);sleep (time.py:2) 10',
            'process 7:"python";process 8:"python";_worker_loop (worker.py:5);crc32 (d.py:3) 25',
            'process 7:"python";process 9:"python";_worker_loop (worker.py:5);crc32 (d.py:7) 5',
            'process 7:"python";process 9:"python";preadv (scan.py:4) 10',
            "not a stack line",
        ]
    )
    assert bench.where_cpu_goes(raw) == [
        ("crc32 (d.py)", 0.6), ("sleep (time.py)", 0.2), ("preadv (scan.py)", 0.2)
    ]  # fmt: skip
    assert bench.where_cpu_goes(raw, top=1) == [("crc32 (d.py)", 0.6)]
    assert bench.where_cpu_goes("") == []


def test_a_profile_names_functions_only_with_enough_samples_inside_the_epochs() -> None:
    enough = bench.PROFILE_MIN_SAMPLES
    raw = "\n".join(
        [
            f'process 7:"python";run_epoch (scan.py:9);preadv (scan.py:4) {enough - 10}',
            'process 7:"python";process 8:"python";crc32 (d.py:3) 10',
            'process 7:"python";verify (dataset.py:3) 500',
        ]
    )
    assert bench.profile_line("parquet", "ours", raw) == (
        f"where ours spends its CPU on parquet ({enough} samples): "
        "preadv (scan.py) 80%, crc32 (d.py) 20%"
    )
    fewer = raw.replace(" 10", " 9")
    assert bench.profile_line("parquet", "ours", fewer) == (
        f"where ours spends its CPU on parquet: too few samples ({enough - 1} of {enough}) "
        "to say; scan more data (--dataset-size, --epochs)"
    )


@needs_fio
@pytest.mark.skipif(
    shutil.which("py-spy") is None and not Path(sys.executable).with_name("py-spy").exists(),
    reason="py-spy is not installed",
)
def test_the_profile_names_where_each_loader_spends_its_cpu(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "profiles"
    lines = run_bench(
        data_dir, "--format", "parquet", "--epochs", "1", "--repeats", "1", "--no-materialize",
        "--profile", str(out),
    )  # fmt: skip
    named = [line for line in lines if line.startswith("where ")]
    assert [line.split(" spends")[0] for line in named] == ["where ours", "where arrow"]
    # A tiny scan may be over in fewer samples than it takes to name a function.
    assert all(re.search(r"\(\d+ samples\): .+ \d+%|too few samples", line) for line in named)
    assert sorted(p.name for p in out.iterdir()) == ["parquet-arrow.txt", "parquet-ours.txt"]
