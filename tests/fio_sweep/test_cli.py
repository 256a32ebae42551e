"""``python -m fio_sweep`` with real fio on temporary directories, tiny sizes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from checkpoint_storage_bench.tracking import offline_root
from fio_sweep import commands

from .helpers import needs_fio, read_summary, run_cli, tree, write_spec

pytestmark = needs_fio

CASE_FIELDS = {
    "name", "rw", "bs", "size", "iodepth", "numjobs", "direct", "ioengine", "runtime",
    "bw_bytes", "bw_mbps", "iops", "lat_p50_us", "lat_p99_us", "lat_p999_us", "runtime_s",
    "errors", "notes",
}  # fmt: skip


def offline_run() -> Path:
    (run,) = (offline_root() / "runs").iterdir()
    return run


def test_shipped_sweep_shrunk_with_reference_dir_and_tracking(
    tmp_path: Path, mount: Path, monkeypatch
):
    monkeypatch.setenv("STORAGE_PROFILE", "checkpoint-throughput")
    reference = tmp_path / "local-disk"
    reference.mkdir()
    out = tmp_path / "out" / "fio.json"
    result = run_cli(
        "--mount", mount, "--size-scale", "0.002", "--runtime", "1",
        "--reference-dir", reference, "--summary-json", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    summary = read_summary(out)
    assert summary["schema"] == "fio-sweep/1"
    assert summary["fio_version"].startswith("fio-3.")
    assert summary["mount"] == str(mount) and summary["target"] == str(mount / "fio-sweep")
    assert [c["name"] for c in summary["cases"]] == ["randread_4k", "seqread_1m", "seqwrite_1m"]
    for case in summary["cases"]:
        assert CASE_FIELDS <= set(case)
        assert case["errors"] == 0 and case["bw_bytes"] > 0 and case["iops"] > 0
        assert case["bw_mbps"] == pytest.approx(case["bw_bytes"] / 1e6)
        assert 0 < case["lat_p50_us"] <= case["lat_p99_us"] <= case["lat_p999_us"]
        assert case["runtime"] == 1 and case["runtime_s"] <= 5
    randread = summary["cases"][0]
    # 1G × 0.002, rounded down to whole 4k blocks.
    assert randread["numjobs"] == 4 and randread["size"] == int(1024**3 * 0.002) // 4096 * 4096
    overhead = summary["overhead"]
    assert overhead["case"] == "seqwrite_1m" and overhead["reference_dir"] == str(reference)
    assert overhead["reference"]["bw_bytes"] > 0
    expected_pct = (
        (overhead["reference_bw_mbps"] - overhead["target_bw_mbps"])
        / overhead["reference_bw_mbps"]
        * 100
    )
    assert overhead["overhead_pct"] == pytest.approx(expected_pct)
    assert overhead["flagged"] == (overhead["overhead_pct"] > 10)

    outputs = summary["outputs"]
    for name in ("randread_4k", "seqread_1m", "seqwrite_1m"):
        assert outputs[f"fio_{name}_bw_mbps"] > 0
        assert outputs[f"fio_{name}_iops"] > 0
        assert outputs[f"fio_{name}_lat_p99_us"] > 0
    assert outputs["fio_overhead_pct"] == overhead["overhead_pct"]

    # Progress went to stderr, a short table to stdout.
    assert "[fio 1/4] randread_4k" in result.stderr
    assert "[fio 4/4] seqwrite_1m@reference" in result.stderr
    assert "seqwrite_1m:" in result.stdout and "overhead vs" in result.stdout

    # No fio file left anywhere.
    assert tree(mount) == [] and tree(reference) == []

    # The Polyaxon run: outputs and one metric series per case and measure. Polyaxon stores
    # a metric named fio.<case>.<measure> under the file name fio-<case>-<measure>.plx.
    run = offline_run()
    record = json.loads((run / "run.plx.json").read_text())
    assert record["name"] == "fio-sweep" and record["status"] == "succeeded"
    assert "fio-sweep" in record["tags"]
    assert record["inputs"]["mount"] == str(mount)
    assert record["inputs"]["storage_profile"] == "checkpoint-throughput"
    for key, value in outputs.items():
        assert record["outputs"][key] == pytest.approx(value)
    metrics = {p.stem for p in (run / "events" / "metric").iterdir()}
    for name in ("randread_4k", "seqread_1m", "seqwrite_1m"):
        for measure in ("bw_mbps", "iops", "lat_p50_us", "lat_p99_us", "lat_p999_us"):
            assert f"fio-{name}-{measure}" in metrics
    bw = (run / "events" / "metric" / "fio-seqwrite_1m-bw_mbps.plx").read_text().splitlines()
    assert float(bw[1].split("|")[2]) == pytest.approx(summary["cases"][2]["bw_mbps"])


def test_user_spec_with_matrix_mix_and_numjobs(tmp_path: Path, mount: Path):
    spec = write_spec(
        tmp_path,
        [
            {"name": "w_{bs}_qd{iodepth}", "rw": "write", "end_fsync": True,
             "matrix": {"bs": ["64k", "1M"], "iodepth": [1, 4]}},
            {"name": "mix.70-30", "rw": "randrw", "rwmixread": 70, "bs": "4k", "numjobs": 2,
             "time_based": True},
        ],
    )  # fmt: skip
    out = tmp_path / "s.json"
    target = mount / "deep" / "fio"
    result = run_cli(
        "--mount", mount, "--target", target, "--spec", spec, "--summary-json", out, "--no-track"
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    summary = read_summary(out)
    names = [c["name"] for c in summary["cases"]]
    assert names == ["w_64k_qd1", "w_64k_qd4", "w_1m_qd1", "w_1m_qd4", "mix.70-30"]
    mix = summary["cases"][-1]
    assert set(mix["directions"]) == {"read", "write"}
    assert mix["bw_bytes"] == pytest.approx(
        mix["directions"]["read"]["bw_bytes"] + mix["directions"]["write"]["bw_bytes"]
    )
    assert "fio_mix_70_30_bw_mbps" in summary["outputs"]
    assert summary["overhead"] is None and "fio_overhead_pct" not in summary["outputs"]
    assert tree(mount) == []  # the target and its parent were created by the sweep
    assert not offline_root().exists()  # --no-track


def test_direct_io_unsupported_falls_back_to_buffered(tmp_path: Path, mount: Path, monkeypatch):
    # As on tmpfs without O_DIRECT (older kernels): the probe says no, fio runs buffered.
    monkeypatch.setattr(commands, "supports_direct_io", lambda _path: False)
    spec = write_spec(tmp_path, [{"name": "w", "rw": "write"}])
    out = tmp_path / "s.json"
    result = run_cli("--mount", mount, "--spec", spec, "--summary-json", out, "--no-track")
    assert result.exit_code == 0, result.stderr
    (case,) = read_summary(out)["cases"]
    assert case["direct"] is False and case["bw_bytes"] > 0
    assert any("O_DIRECT is not supported" in note for note in case["notes"])


@pytest.mark.parametrize(
    ("echo", "reason"),
    [
        # dlopen failure: fio's messages on stderr.
        (
            'echo "fio: engine libaio not loadable" >&2; echo "fio: failed to load engine" >&2',
            "fio: engine libaio not loadable",
        ),
        # io_queue_init failure (aio-max-nr exhausted): fio's td_verror line on stdout.
        (
            'echo "fio: pid=9, err=11/file:engines/libaio.c:420, func=io_queue_init, '
            'error=Resource temporarily unavailable"; echo "{\\"jobs\\": []}"',
            "func=io_queue_init",
        ),
    ],
)
def test_unavailable_engine_falls_back_to_psync(
    tmp_path: Path, mount: Path, monkeypatch, echo: str, reason: str
):
    # A fio on PATH that cannot use libaio, as fio reports it, and is real fio otherwise.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "fio"
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do\n'
        f'  if [ "$a" = "--ioengine=libaio" ]; then {echo}; exit 1; fi\n'
        "done\n"
        'exec /usr/bin/fio "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    spec = write_spec(
        tmp_path, [{"name": "r", "rw": "randread", "iodepth": 8}, {"name": "w", "rw": "write"}]
    )
    out = tmp_path / "s.json"
    result = run_cli("--mount", mount, "--spec", spec, "--summary-json", out, "--no-track")
    assert result.exit_code == 0, result.stderr
    read, write = read_summary(out)["cases"]
    for case in (read, write):
        assert case["ioengine"] == "psync" and case["errors"] == 0 and case["bw_bytes"] > 0
        (note,) = [n for n in case["notes"] if n.startswith("ioengine libaio unavailable (")]
        assert reason in note and "ran with psync" in note
    assert any("iodepth 8 not reached" in n for n in read["notes"])
    assert tree(mount) == []


def test_failed_job_exits_5_with_the_error_in_the_summary(tmp_path: Path):
    # /dev/full answers every write with ENOSPC: a real fio job failure, on a raw device.
    spec = write_spec(tmp_path, [{"name": "full", "rw": "write", "ioengine": "psync"}])
    out = tmp_path / "s.json"
    result = run_cli(
        "--mount", "/dev/full", "--allow-raw-device", "--spec", spec, "--summary-json", out
    )  # fmt: skip
    assert result.exit_code == 5
    assert result.stderr.strip().splitlines()[-1] == (
        "fio-sweep: error: fio failed for full (details in the summary notes)"
    )
    summary = read_summary(out)
    (case,) = summary["cases"]
    assert summary["raw_device"] is True and case["errors"] == 1
    assert "errno 28 (No space left on device)" in case["notes"]
    assert any(n.startswith("fio exited with 1: fio: pid=") for n in case["notes"])
    assert "fio_full_bw_mbps" not in summary["outputs"]
    record = json.loads((offline_run() / "run.plx.json").read_text())
    assert record["status"] == "failed"


def test_raw_character_device_with_the_flag(tmp_path: Path):
    spec = write_spec(tmp_path, [{"name": "w", "rw": "write"}, {"name": "r", "rw": "read"}])
    out = tmp_path / "s.json"
    result = run_cli(
        "--mount", "/dev/zero", "--allow-raw-device", "--spec", spec, "--summary-json", out,
        "--no-track",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    for case in read_summary(out)["cases"]:
        assert case["bw_bytes"] > 0 and case["direct"] is False  # no O_DIRECT on /dev/zero


@pytest.mark.parametrize(
    ("spec_cases", "args", "code", "message"),
    [
        ([{"name": "a", "rw": "read", "colour": "red"}], [], 2, "unknown key 'colour'"),
        ([{"name": "a", "rw": "read", "size": "-4M"}], [], 2, "size must not be negative"),
        ([{"name": "a", "rw": "read"}], ["--size-scale", "0"], 2, "--size-scale must be"),
        ([{"name": "a", "rw": "read"}], ["--runtime", "0"], 2, "--runtime must be"),
        ([{"name": "a", "rw": "read"}], ["--target", "{tmp}/x"], 3, "not strictly inside"),
        ([{"name": "a", "rw": "read"}], ["--target", "{mount}/../y"], 3, "not strictly inside"),
        ([{"name": "a", "rw": "read"}], ["--target", "{mount}"], 3, "not strictly inside"),
        ([{"name": "a", "rw": "read"}], ["--size-scale", "1e9"], 3, "free, the sweep needs"),
        ([{"name": "a", "rw": "read"}], ["--reference-dir", "{tmp}/no"], 3, "reference dir"),
    ],
)
def test_bad_input_is_a_one_line_error_and_leaves_nothing(
    tmp_path: Path, mount: Path, spec_cases, args, code, message
):
    spec = write_spec(tmp_path, spec_cases)
    args = [a.format(tmp=tmp_path, mount=mount) for a in args]
    out = tmp_path / "s.json"
    result = run_cli("--mount", mount, "--spec", spec, "--summary-json", out, *args)
    assert result.exit_code == code
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("fio-sweep: error: ") and message in line
    assert tree(mount) == [] and not out.exists()
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    assert not offline_root().exists()  # refused before a Polyaxon run was opened


def test_raw_device_without_the_flag_is_refused(tmp_path: Path):
    result = run_cli("--mount", "/dev/zero", "--no-track")
    assert result.exit_code == 3
    assert "raw device; fio would overwrite its data" in result.stderr


def test_missing_fio_binary_exits_4(tmp_path: Path, mount: Path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    result = run_cli("--mount", mount, "--size-scale", "0.001")
    assert result.exit_code == 4
    assert result.stderr.strip() == (
        "fio-sweep: error: fio not found on PATH (install it: apt-get install fio)"
    )
    assert tree(mount) == [] and not offline_root().exists()


def test_fio_that_does_not_run_exits_4(tmp_path: Path, mount: Path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fio").write_text("#!/bin/sh\nexit 127\n")
    (bin_dir / "fio").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    result = run_cli("--mount", mount, "--size-scale", "0.001")
    assert result.exit_code == 4 and "does not run" in result.stderr
    assert tree(mount) == []


def test_click_usage_errors_exit_2(mount: Path):
    assert run_cli().exit_code == 2
    assert run_cli("--mount", mount, "--runtime", "soon").exit_code == 2


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"overhead_case": ["a"]}, "'overhead_case' must be a case name"),
        ({"description": {"x": 1}}, "'description' must be a string"),
    ],
)
def test_a_spec_key_of_the_wrong_type_is_exit_2_in_one_line(
    tmp_path: Path, mount: Path, top, message
):
    spec = write_spec(tmp_path, [{"name": "a", "rw": "read"}], **top)
    result = run_cli("--mount", mount, "--spec", spec, "--no-track")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("fio-sweep: error: ") and message in line
    assert tree(mount) == []
