"""Parallel writers: ``--writers N`` (N ranks saving shards at once) and the shipped
``ckptstreams_N`` cases, with real fio on temporary directories at tiny sizes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fio_sweep.config import Config
from fio_sweep.errors import SpecError
from fio_sweep.spec import WRITERS_CASE, load_spec, writers_case

from .helpers import needs_fio, read_summary, run_cli, tree, write_spec

MiB = 1024**2


@pytest.fixture
def fio_that_lists_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The real fio behind a shim that records, after each run, the files fio left in its
    --directory (the sweep removes them right after), so a test can see one file per job."""
    real = shutil.which("fio")
    assert real is not None
    log = tmp_path / "fio-files.log"
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    shim = shim_dir / "fio"
    shim.write_text(
        "#!/bin/sh\n"
        f'"{real}" "$@"\nrc=$?\n'
        'for a in "$@"; do case "$a" in --directory=*) '
        f'ls "${{a#--directory=}}" >> "{log}";; esac; done\n'
        "exit $rc\n"
    )
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim_dir}:{Path(real).parent}")
    return log


@needs_fio
def test_writers_adds_n_parallel_writers_one_file_each(
    tmp_path: Path, mount: Path, fio_that_lists_its_files: Path
):
    spec = write_spec(tmp_path, [{"name": "seqwrite", "rw": "write"}])
    out = tmp_path / "s.json"
    result = run_cli(
        "--mount", mount, "--spec", spec, "--writers", "3", "--size-scale", "0.01",
        "--runtime", "5", "--summary-json", out, "--no-track",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    summary = read_summary(out)
    assert summary["writers"] == 3
    seq, writers = summary["cases"]
    assert seq["name"] == "seqwrite" and writers["name"] == WRITERS_CASE
    assert (writers["numjobs"], writers["bs"], writers["iodepth"]) == (3, 8 * MiB, 4)
    assert writers["rw"] == "write" and writers["end_fsync"] and writers["fallocate"] == "none"
    assert writers["direct"] or any("O_DIRECT is not supported" in n for n in writers["notes"])
    # 2 GiB × 0.01 split three ways is under one 8 MiB block: one block per writer.
    assert writers["size"] == 8 * MiB and writers["errors"] == 0
    # Every writer wrote its whole shard: fio reports all three together.
    assert writers["directions"]["write"]["io_bytes"] == 3 * 8 * MiB
    assert summary["outputs"]["fio_ckptwriters_bw_mbps"] > 0
    assert "fio_ckptwriters_iops" in summary["outputs"]
    # fio made one file per writer (its clones' default), named after the case.
    listed = fio_that_lists_its_files.read_text().split()
    assert sorted(f for f in listed if f.startswith(WRITERS_CASE)) == [
        f"{WRITERS_CASE}.{i}.0" for i in range(3)
    ]
    assert tree(mount) == []


def test_writers_case_splits_two_gib() -> None:
    for n, per_writer in [(1, 2048), (2, 1024), (4, 512), (8, 256), (3, 680), (256, 8)]:
        case = writers_case(n)
        assert (case.numjobs, case.size) == (n, per_writer * MiB), n
        assert case.size % case.bs == 0
    for bad in (0, -1, 257, True, 2.5):
        with pytest.raises(SpecError, match="--writers must be between 1 and 256"):
            writers_case(bad)  # type: ignore[arg-type]
    with pytest.raises(SpecError):
        Config(mount=Path("/x"), writers=0)


@pytest.mark.parametrize("value", ["0", "257", "two"])
def test_bad_writers_exit_2(mount: Path, value: str):
    result = run_cli("--mount", mount, "--writers", value, "--no-track")
    assert result.exit_code == 2 and "--writers" in result.stderr
    assert tree(mount) == []


def test_a_spec_with_its_own_ckptwriters_case_is_refused(tmp_path: Path, mount: Path):
    spec = write_spec(tmp_path, [{"name": WRITERS_CASE, "rw": "write"}])
    result = run_cli("--mount", mount, "--spec", spec, "--writers", "2", "--no-track")
    assert result.exit_code == 2
    assert "same output name 'ckptwriters'" in result.stderr
    assert tree(mount) == []


def test_shipped_streams_write_the_same_bytes_with_1_2_4_8_writers() -> None:
    streams = [c for c in load_spec("checkpoint-matrix").cases if c.name.startswith("ckptstreams")]
    assert [c.numjobs for c in streams] == [1, 2, 4, 8]
    assert [c.name for c in streams] == [f"ckptstreams_{n}" for n in (1, 2, 4, 8)]
    assert {c.bytes_needed for c in streams} == {2 * 1024**3}
    for case in streams:
        assert (case.rw, case.direct, case.end_fsync, case.iodepth) == ("write", True, True, 1)
        assert case.fallocate == "none" and case.bs == 8 * MiB
    # Scaled down, each stream still writes whole blocks and the totals stay equal.
    scaled = [c.scaled(0.125) for c in streams]
    assert {c.bytes_needed for c in scaled} == {256 * MiB}


@needs_fio
def test_the_checkpoint_matrix_spec_runs(tmp_path: Path, mount: Path):
    out = tmp_path / "s.json"
    result = run_cli(
        "--mount", mount, "--spec", "checkpoint-matrix", "--size-scale", "0.004",
        "--runtime", "2", "--summary-json", out, "--no-track",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    cases = {c["name"]: c for c in read_summary(out)["cases"]}
    for n in (1, 2, 4, 8):
        case = cases[f"ckptstreams_{n}"]
        assert case["numjobs"] == n and case["errors"] == 0 and case["bw_bytes"] > 0
        assert case["directions"]["write"]["io_bytes"] == case["size"] * n
    assert tree(mount) == []
