"""Block-I/O limits (localcluster.emulation.io_limits): how the sandbox emulates a volume
class on the local disk.

The first tests run anywhere (device resolution against a made-up mountinfo and /sys, the
v2 file format against a directory). The ones marked ``kernel`` need root and a block-I/O
controller: they skip with one line elsewhere, and never skip when ``CI`` is set (CI runs
as root on a host with the controller).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from localcluster.emulation import loop_volume
from localcluster.emulation.io_limits import (
    MIB,
    BlockDevice,
    Cgroup,
    Hierarchy,
    IoLimits,
    ThrottleUnavailable,
    block_device,
    find_hierarchy,
    in_cgroup,
    probe,
)
from sandbox.config import REPO_ROOT

from .conftest import needs_throttle, needs_volume

TOLERANCE = 0.15  # the bar: fio within 15% of the limit


# -- anywhere -------------------------------------------------------------------------


def test_the_classes_file_gives_the_limits():
    classes = {
        d["metadata"]["name"]: d["parameters"]
        for d in yaml.safe_load_all((REPO_ROOT / "connections" / "vac-ebs-gp3.yaml").read_text())
    }
    base = IoLimits.from_class_parameters(classes["checkpoint-baseline"])
    fast = IoLimits.from_class_parameters(classes["checkpoint-throughput"])
    assert (base.write_bps, base.write_iops) == (125 * MIB, 3000)
    assert (fast.read_bps, fast.read_iops) == (250 * MIB, 6000)
    gke = {
        d["metadata"]["name"]: d["parameters"]
        for d in yaml.safe_load_all(
            (REPO_ROOT / "connections" / "vac-gke-hyperdisk.yaml").read_text()
        )
    }
    assert IoLimits.from_class_parameters(gke["checkpoint-baseline"]).write_bps == 140 * MIB


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"type": "gp3"}, "neither a throughput nor an iops"),
        ({"throughput": "125Gi"}, "is not MiB/s"),
        ({"throughput": "0"}, "is not MiB/s"),
        ({"iops": "many"}, "is not a positive integer"),
    ],
)
def test_a_class_without_usable_figures_is_refused(parameters, message):
    with pytest.raises(ValueError, match=message):
        IoLimits.from_class_parameters(parameters)


def _fake_sys(tmp_path: Path, dev: str, partition_of: str | None) -> Path:
    """A /sys/dev/block with ``dev``; as a partition of ``partition_of`` when given."""
    devices = tmp_path / "devices" / "virtio0" / "vda"
    devices.mkdir(parents=True)
    (devices / "dev").write_text(f"{partition_of or dev}\n")
    target = devices
    if partition_of:
        target = devices / "vda1"
        target.mkdir()
        (target / "dev").write_text(f"{dev}\n")
        (target / "partition").write_text("1\n")
    sys_block = tmp_path / "sys-dev-block"
    sys_block.mkdir()
    (sys_block / dev).symlink_to(target)
    return sys_block


def test_a_partition_resolves_to_its_disk(tmp_path):
    st = os.stat(tmp_path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sys_block = _fake_sys(tmp_path, dev, partition_of="254:0")
    found = block_device(tmp_path, mountinfo=tmp_path / "unused", sys_block=sys_block)
    assert found == BlockDevice(254, 0, "vda")


@pytest.mark.skipif(
    not Path("/dev/shm").is_dir() or os.major(os.stat("/dev/shm").st_dev) != 0,
    reason="no tmpfs at /dev/shm",
)
def test_tmpfs_has_no_block_device_and_overlay_resolves_through_its_upper_layer(tmp_path):
    with pytest.raises(ThrottleUnavailable, match="is on tmpfs .* no block device"):
        block_device(Path("/dev/shm"))
    # /dev/shm described as an overlay whose upper layer is tmp_path: its writes land there.
    shm = os.stat("/dev/shm").st_dev
    disk = os.stat(tmp_path).st_dev
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"1 0 {os.major(shm)}:{os.minor(shm)} / /dev/shm rw - overlay overlay "
        f"rw,lowerdir=/l,upperdir={tmp_path},workdir=/w\n"
    )
    sys_block = _fake_sys(tmp_path / "sys", f"{os.major(disk)}:{os.minor(disk)}", None)
    found = block_device(Path("/dev/shm"), mountinfo=mountinfo, sys_block=sys_block)
    assert found.id == f"{os.major(disk)}:{os.minor(disk)}" and found.name == "vda"


def test_hierarchy_detection_prefers_v1_blkio_and_explains_its_absence(tmp_path):
    blkio, unified = tmp_path / "blkio", tmp_path / "unified"
    blkio.mkdir()
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("cpu io memory\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"38 31 0:35 / {blkio} rw - cgroup cgroup rw,blkio\n"
        f"41 31 0:38 / {unified} rw - cgroup2 cgroup2 rw\n"
    )
    # blkio without its throttle files (a kernel without CONFIG_BLK_DEV_THROTTLING): v2.
    assert find_hierarchy(mountinfo) == Hierarchy(2, unified)
    (blkio / "blkio.throttle.write_bps_device").write_text("")
    assert find_hierarchy(mountinfo) == Hierarchy(1, blkio)
    mountinfo.write_text(f"41 31 0:38 / {unified} rw - cgroup2 cgroup2 rw\n")
    (unified / "cgroup.controllers").write_text("cpu memory\n")
    with pytest.raises(ThrottleUnavailable, match="no block-I/O controller"):
        find_hierarchy(mountinfo)


def test_v2_limits_are_written_as_io_max_lines_and_read_back(tmp_path):
    # The v2 file format, against plain files (this host's kernel is v1): what is written
    # is one io.max line per device, "max" for no limit.
    (tmp_path / "cgroup.subtree_control").write_text("cpu io\n")
    (tmp_path / "checkpoint-storage-bench").mkdir()
    (tmp_path / "checkpoint-storage-bench" / "cgroup.subtree_control").write_text("")
    group = Cgroup("claim-x", Hierarchy(2, tmp_path))
    group.create()
    # io is enabled for the children of our parent (the root has it already).
    assert (group.path.parent / "cgroup.subtree_control").read_text() == "+io\n"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "cpu io\n"
    (group.path / "io.max").write_text("")  # the kernel makes it with the cgroup
    limits = IoLimits(read_bps=None, write_bps=125 * MIB, read_iops=3000, write_iops=3000)
    assert group.set_limits(BlockDevice(8, 0, "sda"), limits) == limits
    assert (group.path / "io.max").read_text() == (
        "8:0 rbps=max wbps=131072000 riops=3000 wiops=3000\n"
    )


def test_the_join_wrapper_passes_arguments_as_arguments(tmp_path):
    # The command's arguments never become shell code.
    group = Cgroup("x", Hierarchy(1, tmp_path))
    group.path.mkdir(parents=True)
    argv = in_cgroup(["printf", "%s|", "$(touch pwned)", "a b"], group)
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, check=True)
    assert done.stdout == "$(touch pwned)|a b|"
    assert not (tmp_path / "pwned").exists()
    assert int(group.procs_file.read_text()) > 0  # the shell wrote its pid, then exec'd


# -- the kernel (root and a block-I/O controller) ---------------------------------------


def _fio_write(directory: Path, size_mib: int, argv_wrap=lambda a: a) -> float:
    """fio's sequential O_DIRECT write bandwidth in MB/s (1e6 bytes) under ``directory``."""
    argv = ["fio", "--name=w", "--rw=write", "--bs=1M", f"--size={size_mib}M",
            "--iodepth=4", "--ioengine=libaio", "--direct=1", "--end_fsync=1",
            f"--directory={directory}", "--output-format=json"]  # fmt: skip
    done = subprocess.run(argv_wrap(argv), capture_output=True, text=True, check=True)
    return json.loads(done.stdout[done.stdout.index("{") :])["jobs"][0]["write"]["bw_bytes"] / 1e6


def _test_name() -> str:
    return f"test-{os.getpid()}-{time.monotonic_ns()}"


def _leftovers(name: str, mount_point: Path) -> list[str]:
    """What of volume ``name`` (at ``mount_point``) and cgroup ``name`` the kernel still has."""
    file = loop_volume.backing_file(name)
    left = [f"loop device {d.name}" for f, d in loop_volume.loop_devices().items() if f == file]
    left += [f"mount {mount_point}"] if os.path.ismount(mount_point) else []
    left += [f"backing file {file}"] if file.exists() else []
    group = Cgroup(name, find_hierarchy())
    return left + ([f"cgroup {group.path}"] if group.exists() else [])


@pytest.fixture
def throttled(tmp_path):
    """A cgroup of this test's own and a loop-device volume (a file in RAM, ext4), both
    removed at the end; the volume's unthrottled speed is measured first (MB/s)."""
    name = _test_name()
    group, _ = needs_throttle(tmp_path, name)
    volume = needs_volume(name, tmp_path / "volume", 512 * MIB)
    try:
        speed = loop_volume.write_speed(volume.mount_point)
        print(f"volume {volume.describe()}: {speed:.0f} MB/s unthrottled")
        yield group, volume.device, volume.mount_point, speed
    finally:
        group.remove()
        loop_volume.remove(volume)
        assert _leftovers(name, volume.mount_point) == []


@pytest.mark.slow
def test_limits_are_read_back_from_the_kernel_and_fio_inside_lands_within_15_percent(throttled):
    group, device, work, speed = throttled
    expected = 125 * MIB / 1e6
    # The throttle decides only on a device much faster than the limit: the loop volume's
    # own speed is far above it, whatever else the machine's disk is doing.
    assert speed > 2 * expected, f"the volume writes {speed:.0f} MB/s unthrottled"
    assert block_device(work) == device  # the device the hook's probe finds under the claim
    limits = IoLimits(read_bps=250 * MIB, write_bps=125 * MIB, read_iops=6000, write_iops=3000)
    assert group.set_limits(device, limits) == limits
    # Read back from the kernel's own files, not from what we wrote.
    v1 = group.hierarchy.version == 1
    line = (group.path / ("blkio.throttle.write_bps_device" if v1 else "io.max")).read_text()
    assert f"{device.id} " in line and "131072000" in line
    assert group.limits() == {device.id: limits}

    # A busy CPU delays the throttle's dispatch and only ever makes a run slower; a throttle
    # never lets one go faster: every run stays under the band, the best one is the figure.
    runs = [_fio_write(work, 192, lambda argv: in_cgroup(argv, group)) for _ in range(3)]
    print(f"fio seqwrite in the cgroup: {runs} MB/s, limit {expected:.1f} MB/s")
    assert max(runs) <= (1 + TOLERANCE) * expected, (runs, expected)
    assert max(runs) >= (1 - TOLERANCE) * expected, (runs, expected)
    # The same write outside the cgroup is not throttled (the device is much faster here).
    outside = _fio_write(work, 192)
    print(f"fio seqwrite outside: {outside:.1f} MB/s")
    assert outside > 2 * expected, f"the device itself is too slow to tell: {outside:.0f} MB/s"

    group.clear()
    assert group.limits() == {}


@pytest.mark.slow
def test_remove_kills_what_is_left_in_the_cgroup_and_removes_it(throttled):
    group, device, _, _ = throttled
    group.set_limits(device, IoLimits(write_bps=125 * MIB))
    orphan = subprocess.Popen(in_cgroup(["sleep", "60"], group), start_new_session=True)
    deadline = time.monotonic() + 10
    while orphan.pid not in group.pids():
        assert time.monotonic() < deadline, "the process never joined the cgroup"
        time.sleep(0.05)
    assert group.remove() == [orphan.pid]
    assert orphan.wait(timeout=10) == -9
    assert not group.exists()
    assert group.remove() == []  # gone already: nothing to do


@pytest.mark.skipif(
    not Path("/dev/shm").is_dir() or os.major(os.stat("/dev/shm").st_dev) != 0,
    reason="no tmpfs at /dev/shm",
)
def test_probe_explains_why_it_cannot_throttle_tmpfs(tmp_path):
    needs_throttle(tmp_path, "probe-only")  # the controller is there: only tmpfs is the cause
    with pytest.raises(ThrottleUnavailable, match="is on tmpfs"):
        probe(Path("/dev/shm"), "probe-only")


@pytest.mark.slow
def test_a_volume_is_made_once_and_its_limits_are_read_back_from_the_kernel(tmp_path):
    name = _test_name()
    group, _ = needs_throttle(tmp_path, name)
    point = tmp_path / "volume"
    longer = needs_volume(f"{name}-2", tmp_path / "longer", 64 * MIB)  # its name extends ours
    volume = needs_volume(name, point, 64 * MIB)
    try:
        assert loop_volume.find(longer.name, longer.mount_point) == longer  # left alone
        assert loop_volume.create(name, point, 64 * MIB) == volume  # the same, not a second
        assert volume.device.major == 7 and os.path.ismount(point)
        assert volume.size == 64 * MIB and volume.backing_file.parent == Path("/dev/shm")
        limits = IoLimits(read_bps=250 * MIB, write_bps=125 * MIB, write_iops=3000)
        assert loop_volume.apply_limits(volume, group, limits) == limits
        assert loop_volume.read_limits(volume, group) == limits
        with pytest.raises(loop_volume.VolumeUnavailable, match="something else is mounted"):
            loop_volume.create(f"{name}-other", point, 64 * MIB)
    finally:
        group.remove()
        removed = loop_volume.remove(volume)
        loop_volume.remove(longer)
    assert removed == [f"mount {point}", f"loop device {volume.dev_path}",
                       f"backing file {volume.backing_file}"]  # fmt: skip
    assert loop_volume.remove(volume) == []  # gone already: nothing to do
    assert _leftovers(name, point) == []


_KILLED_RUN = """
import sys, subprocess, time
from pathlib import Path
from localcluster.emulation import loop_volume
from localcluster.emulation.io_limits import MIB, Cgroup, IoLimits, in_cgroup
name, point = sys.argv[1], Path(sys.argv[2])
volume = loop_volume.create(name, point, 64 * MIB)
group = Cgroup.find(name)
loop_volume.apply_limits(volume, group, IoLimits(write_bps=125 * MIB))
subprocess.Popen(in_cgroup(["sleep", "300"], group), start_new_session=True)
while not group.pids():
    time.sleep(0.05)
(point / "held").write_text("x")
print("READY", flush=True)
time.sleep(300)
"""


@pytest.mark.slow
def test_the_sweep_removes_what_a_killed_run_left_and_nothing_else(tmp_path):
    name = _test_name()
    needs_throttle(tmp_path, name)
    point, other_point = tmp_path / "volume", tmp_path / "other"
    other = needs_volume(f"other-{name}", other_point, 64 * MIB)  # not of this prefix
    run = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, name, str(point)],
                           stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                           env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))  # fmt: skip
    try:
        assert run.stdout.readline().strip() == "READY"
        run.kill()  # the run dies with its volume mounted and a process in its cgroup
        run.wait(timeout=10)
        left = _leftovers(name, point)
        assert len(left) == 4, left  # loop device, mount, backing file, cgroup
        removed = loop_volume.sweep(name)
        assert [r.split(" ")[0] for r in removed] == ["mount", "loop", "backing", "cgroup"]
        assert "1 process(es) left in it" in removed[-1]
        assert _leftovers(name, point) == []
        assert loop_volume.find(other.name, other_point) == other  # another prefix: untouched
    finally:
        run.kill()
        loop_volume.sweep(name)
        loop_volume.remove(other)


def test_the_sweep_waits_for_a_device_a_dying_process_still_holds(tmp_path):
    # A run killed mid-write holds its file system until its throttled I/O ends: the unmount
    # is lazy and the kernel detaches the device (and frees its RAM) only then, so a stop
    # that returned at once left the device attached.
    name = _test_name()
    point = tmp_path / "volume"
    needs_volume(name, point, 64 * MIB)
    holder = subprocess.Popen(["sleep", "3"], cwd=point)
    try:
        started = time.monotonic()
        removed = loop_volume.sweep(name, cgroups=False, release_s=60)
        assert time.monotonic() - started >= 1.0  # it waited for the holder
        assert holder.poll() is not None
        assert _leftovers(name, point) == [], removed
        # A holder that outlives the wait: the device is named, not silently left behind.
        needs_volume(name, point, 64 * MIB)
        holder = subprocess.Popen(["sleep", "60"], cwd=point)
        with pytest.raises(loop_volume.VolumeUnavailable, match=r"/dev/loop\d+ still held after"):
            loop_volume.sweep(name, cgroups=False, release_s=0.5)
    finally:
        holder.kill()
        holder.wait()
        loop_volume.sweep(name, cgroups=False, release_s=30)
    assert _leftovers(name, point) == []
