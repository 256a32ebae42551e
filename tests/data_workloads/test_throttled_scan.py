"""The scan's figures follow the volume's class: the real scan (a subprocess, DataLoader
workers, the cache dropped) on a loop-device volume under two real block-I/O throttles, as
the sandbox emulates two classes. Needs root and loop devices; skipped without them (failed
under CI, which has them)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from data_workloads import dataset as ds
from localcluster.emulation import loop_volume
from localcluster.emulation.io_limits import MIB, Cgroup, IoLimits, ThrottleUnavailable, in_cgroup

REPO = Path(__file__).resolve().parents[2]
DATASET = ["--dataset-size", "32MiB", "--record-size", "128KiB", "--shard-size", "4MiB"]
SLOW, FAST = 8 * MIB, 32 * MIB  # read throughput of the two emulated classes


@pytest.fixture
def throttled(tmp_path: Path):
    """A fresh loop volume and a cgroup that may throttle reads on it."""
    name = f"dwscan-{secrets.token_hex(3)}"
    try:
        volume = loop_volume.create(name, tmp_path / "volume", 128 * MIB)
    except ThrottleUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to make a loop-device volume: {exc}")
        pytest.skip(f"needs root and loop devices: {exc}")
    try:
        cgroup = Cgroup.find(name)
        cgroup.create()
        yield volume, cgroup
    except ThrottleUnavailable as exc:
        pytest.skip(f"needs a block-I/O controller: {exc}")
    finally:
        try:
            Cgroup.find(name).remove()
        except ThrottleUnavailable:
            pass
        loop_volume.remove(volume)


def scan_under(volume, cgroup: Cgroup, limit: int, fmt: str, out: Path) -> dict:
    """The scan's outputs with reads capped at ``limit`` bytes/s for the scan's processes."""
    in_force = loop_volume.apply_limits(volume, cgroup, IoLimits(read_bps=limit))
    assert in_force.read_bps == limit  # read back from the kernel
    argv = [sys.executable, "-m", "data_workloads", "scan", "--data-dir",
            str(volume.mount_point / "data"), "--dataset-format", fmt, *DATASET, "--no-generate",
            "--epochs", "2", "--num-workers", "2", "--compute-ms", "0", "--no-track",
            "--summary-json", str(out)]  # fmt: skip
    done = subprocess.run(
        in_cgroup(argv, cgroup), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())["outputs"]


@pytest.mark.parametrize("fmt", ["webdataset", "files"])
def test_scan_mbps_follows_the_class_throughput(throttled, tmp_path: Path, fmt: str) -> None:
    volume, cgroup = throttled
    data_dir = volume.mount_point / "data"
    data_dir.mkdir()
    # Generated unthrottled, as the first stage of a pipeline would (and then reused).
    spec = ds.DatasetSpec(fmt, 0, 32 * MIB, 128 * 1024, 4 * MIB)
    ds.open_dataset(data_dir, spec)
    slow = scan_under(volume, cgroup, SLOW, fmt, tmp_path / "slow.json")
    fast = scan_under(volume, cgroup, FAST, fmt, tmp_path / "fast.json")
    print(f"{fmt}: {slow['scan_mbps']:.1f} MB/s at {SLOW / 1e6:.1f}, "
          f"{fast['scan_mbps']:.1f} MB/s at {FAST / 1e6:.1f}")  # fmt: skip
    for outputs in (slow, fast):
        assert outputs["scan_cache_kept_out"] is True  # every epoch read from the device
    # The slow class is the bottleneck: the scan gets its throughput, never more (worker
    # start-up is in the epoch, so somewhat less).
    assert 0.5 * SLOW / 1e6 <= slow["scan_mbps"] <= 1.1 * SLOW / 1e6
    # Four times the throughput: clearly faster (start-up and the loader's CPU take a share).
    assert fast["scan_mbps"] >= 1.8 * slow["scan_mbps"]
    assert fast["scan_epoch_s"] < slow["scan_epoch_s"] / 1.8
