"""Storage failures are the trainer's exit codes: a full volume exit 4 for every format,
refused access exit 3, for one process, sync and async, and under torchrun."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.trainer.helpers import TINY_ARGS, quiet, run_trainer, tiny_config
from trainer.ckpt import store
from trainer.ckpt.checkpointer import Checkpointer
from trainer.ckpt.formats import make_format
from trainer.ckpt.fs import LocalFS, os_errno, storage_error
from trainer.errors import (
    EXIT_CHECKPOINT_DIR,
    CheckpointDirError,
    StorageFullError,
)
from trainer.train import train


def mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)])
    return done.returncode == 0


@pytest.fixture
def small_volume(tmp_path):
    """A real 400 KiB file system, so the libraries meet ENOSPC and raise what they raise."""
    volume = tmp_path / "volume"
    if not mount_tmpfs(volume, "400k"):
        pytest.skip("mounting a small tmpfs needs root")
    yield volume
    subprocess.run(["umount", str(volume)], check=True)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("fmt", ["safetensors", "dcp", "raw", "torch"])
def test_a_full_volume_is_storage_full_for_every_format(small_volume, fmt, asynchronous):
    ckpt = Checkpointer(
        small_volume, make_format(fmt), LocalFS(), durable=True, keep=2, asynchronous=asynchronous
    )
    state = {"step": 2, "w": torch.arange(256 * 1024, dtype=torch.float32)}  # 1 MiB
    with pytest.raises(StorageFullError, match="no space left.*step-00000002"):
        ckpt.save(2, lambda: state)
        ckpt.finish()
    assert list(small_volume.iterdir()) == []


class FullFS(LocalFS):
    def __init__(self, free: int) -> None:
        self.free = free

    def free_bytes(self, path: Path) -> int:
        return self.free


def test_an_error_naming_no_errno_is_a_full_volume_only_when_the_volume_is_full(tmp_path):
    # What torch.save inside DCP raises once its writes met ENOSPC.
    lost = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    full = storage_error(lost, "writing checkpoint step-00000002", FullFS(4096), tmp_path)
    assert isinstance(full, StorageFullError)
    assert storage_error(lost, "writing", FullFS(2**30), tmp_path) is None
    assert storage_error(lost, "writing") is None


def test_the_errno_is_found_inside_library_errors():
    full = OSError(errno.ENOSPC, "No space left on device")

    class Wrapped(Exception):
        def __init__(self, exc: BaseException) -> None:
            super().__init__("wrapped")
            self.exc = exc

    class Checkpointish(Exception):
        def __init__(self, failures: dict[int, BaseException]) -> None:
            super().__init__("CheckpointException ranks:dict_keys([0])")
            self.failures = failures

    assert os_errno(Checkpointish({0: Wrapped(full)})) == errno.ENOSPC
    assert os_errno(Checkpointish({0: (full, ["a traceback"])})) == errno.ENOSPC
    rust = RuntimeError(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space" })'
    )
    assert os_errno(rust) == errno.ENOSPC
    shown = RuntimeError("Error while serializing: I/O error: No space left (os error 28)")
    assert os_errno(shown) == errno.ENOSPC
    chained = ValueError("save failed")
    chained.__cause__ = PermissionError(errno.EACCES, "Permission denied")
    assert os_errno(chained) == errno.EACCES
    assert os_errno(ValueError("no errno here")) is None


@pytest.mark.parametrize("fmt", ["safetensors", "dcp"])
def test_cli_exit_4_on_a_really_full_volume(small_volume, fmt):
    proc = run_trainer(
        "--checkpoint-dir", str(small_volume / "run"), "--steps", "2", "--checkpoint-every", "2",
        "--format", fmt, "--async", *TINY_ARGS, "--no-track",
    )  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert "no space left on the checkpoint volume" in proc.stderr


class RefusesAfter(LocalFS):
    """Refuses access (``code``) once ``ok`` checkpoint directories were created."""

    def __init__(self, code: int, where: str, ok: int = 1) -> None:
        self.code, self.where, self.ok = code, where, ok

    def mkdir(self, path):
        if self.ok == 0 and self.where == "mkdir":
            raise PermissionError(self.code, os.strerror(self.code), str(path))
        self.ok -= 1
        super().mkdir(path)

    def pwrite(self, fd, data, offset):
        if self.ok < 0 and self.where == "write":
            raise OSError(self.code, os.strerror(self.code))
        return super().pwrite(fd, data, offset)


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize(
    ("code", "where"), [(errno.EACCES, "mkdir"), (errno.EPERM, "write")], ids=["eacces", "eperm"]
)
def test_access_refused_mid_run_is_exit_3(tmp_path, code, where, asynchronous):
    cfg = tiny_config(tmp_path, steps=6, async_checkpoint=asynchronous)
    with pytest.raises(CheckpointDirError, match="refused") as info:
        train(cfg, fs=RefusesAfter(code, where), say=quiet)
    assert info.value.exit_code == EXIT_CHECKPOINT_DIR == 3
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [2]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".step-")]


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS])
def test_the_sharded_path_maps_refused_access_like_the_single_process_path(tmp_path, code):
    exc = OSError(code, os.strerror(code))
    ckpt = Checkpointer(tmp_path, make_format("raw"), LocalFS(), durable=True, keep=2)
    error = ckpt._error(exc, "writing rank 1's shard of step-00000002")
    assert isinstance(error, CheckpointDirError) and error.exit_code == EXIT_CHECKPOINT_DIR
    assert error.__cause__ is exc
    single = storage_error(exc, "writing checkpoint step-00000002")
    assert type(single) is type(error)
