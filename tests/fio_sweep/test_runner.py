"""Where fio may write: the mount rules, free space, scratch directories, O_DIRECT probe."""

from __future__ import annotations

import io
import os
import signal
import time
from pathlib import Path

import pytest

from checkpoint_storage_bench.interrupts import deferred_signals, signals_raise
from fio_sweep.commands import Progress
from fio_sweep.errors import Interrupted, NoSpaceError, UnsafeTargetError
from fio_sweep.runner import (
    SPACE_RESERVE,
    Target,
    check_directory,
    check_space,
    free_bytes,
    resolve_target,
    scratch_dir,
    supports_direct_io,
)
from fio_sweep.spec import Case

from .conftest import OWN_FS_SIZE
from .helpers import tree


def test_default_target_is_inside_the_mount(mount: Path):
    target = resolve_target(mount, None)
    assert target == Target(mount.resolve() / "fio-sweep")


def test_mount_given_through_a_symlink_is_resolved(tmp_path: Path, mount: Path):
    link = tmp_path / "claim-link"
    link.symlink_to(mount)
    assert resolve_target(link, link / "x").path == mount.resolve() / "x"


@pytest.mark.parametrize("target", ["..", "../elsewhere", ".", "/tmp"])
def test_target_must_be_strictly_inside_the_mount(mount: Path, target: str):
    with pytest.raises(UnsafeTargetError, match="not strictly inside mount"):
        resolve_target(mount, mount / target if not target.startswith("/") else Path(target))


def test_symlink_inside_the_mount_pointing_out_is_refused(tmp_path: Path, mount: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (mount / "escape").symlink_to(outside)
    with pytest.raises(UnsafeTargetError, match="not strictly inside"):
        resolve_target(mount, mount / "escape" / "fio")


def test_missing_mount_and_file_target_are_refused(tmp_path: Path, mount: Path):
    with pytest.raises(UnsafeTargetError, match="not an existing directory"):
        resolve_target(tmp_path / "nope", None)
    (mount / "file").write_text("x")
    with pytest.raises(UnsafeTargetError, match="exists and is not a directory"):
        resolve_target(mount, mount / "file")


def test_colon_in_target_is_refused(mount: Path):
    with pytest.raises(UnsafeTargetError, match="contains ':'"):
        resolve_target(mount, mount / "a:b")


def test_raw_devices_need_the_explicit_flag(mount: Path):
    with pytest.raises(UnsafeTargetError, match="raw device.*--allow-raw-device"):
        resolve_target(Path("/dev/zero"), None)
    with pytest.raises(UnsafeTargetError, match="raw device"):
        resolve_target(mount, Path("/dev/zero"))
    assert resolve_target(Path("/dev/zero"), None, allow_raw_device=True).raw_device
    with pytest.raises(UnsafeTargetError, match="as --mount, without --target"):
        resolve_target(mount, Path("/dev/zero"), allow_raw_device=True)


def test_reference_dir_checks(tmp_path: Path):
    with pytest.raises(UnsafeTargetError, match="reference dir .* not an existing directory"):
        check_directory(tmp_path / "nope")
    with pytest.raises(UnsafeTargetError, match="is a device"):
        check_directory(Path("/dev/null"))
    assert check_directory(tmp_path).path == tmp_path.resolve()


def test_free_space_check(own_filesystem: Path):
    # On a file system of its own: nothing else can free or fill it between the read and
    # the check.
    target = resolve_target(own_filesystem, None)
    free = free_bytes(target)
    assert 0 < free <= OWN_FS_SIZE
    check_space(target, 1024**2)
    check_space(target, free - SPACE_RESERVE)  # exactly enough
    with pytest.raises(NoSpaceError, match="free, the sweep needs"):
        check_space(target, free - SPACE_RESERVE + 1)
    assert tree(own_filesystem) == []


def test_scratch_dir_is_removed_with_the_target_it_created(mount: Path):
    target = Target(mount / "a" / "b")
    with scratch_dir(target) as scratch:
        assert scratch.parent == target.path and scratch.name.startswith(".fio-sweep-")
        (scratch / "case").mkdir()
        (scratch / "case" / "job.0.0").write_bytes(b"x" * 4096)
    assert tree(mount) == []


def test_scratch_dir_keeps_an_existing_target_and_its_files(mount: Path):
    target = Target(mount / "mine")
    target.path.mkdir()
    (target.path / "keep.txt").write_text("user data")
    with pytest.raises(RuntimeError), scratch_dir(target) as scratch:
        (scratch / "job.0.0").write_bytes(b"x")
        raise RuntimeError("boom")
    assert tree(mount) == ["mine", "mine/keep.txt"]


def test_direct_io_probe_leaves_nothing(mount: Path):
    assert isinstance(supports_direct_io(mount), bool)
    assert os.listdir(mount) == []


def test_progress_counts_cases_and_estimates_the_rest():
    stream = io.StringIO()
    progress = Progress([10.0, 20.0, 30.0], stream)
    case = Case(name="w", rw="write", bs=1024**2, size=4 * 1024**2, runtime=10)
    progress.start(1, "w", case)
    assert 49.0 < progress.eta_s() <= 50.0
    progress.log_every_s = 0
    progress.tick()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[fio 2/3] w: rw=write bs=1.00 MiB size=4.00 MiB")
    assert lines[1].startswith("[fio 2/3] w: 0s, sweep") and "ETA ~50s" in lines[1]


def test_a_signal_during_cleanup_is_raised_after_it():
    seen: list[str] = []
    with pytest.raises(Interrupted, match="SIGTERM"), signals_raise(Interrupted):
        with deferred_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)  # a repeat is ignored: SIGTERM is reported
            time.sleep(0.05)
            seen.append("cleanup done")
        seen.append("not reached")
    assert seen == ["cleanup done"]


def test_a_signal_outside_cleanup_interrupts_at_once():
    with pytest.raises(Interrupted) as caught, signals_raise(Interrupted):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    assert caught.value.exit_code == 130
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
