"""Reproductions of the checkpoint defects of issue 19 (items 11-13), one test each.

Each failed on the code before its fix: retention counting a corrupt checkpoint, negative
figures after resuming at --steps, dtypes the raw format wrote but could not load, a stale
remote manifest beside a failed re-upload, a crash on a manifest with wrong field types,
exit 1 on EACCES/EPERM, total_s starting after the wait for the previous checkpoint, and
--durability none deleting older checkpoints for a newer one that was never made durable.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

from checkpoint_storage_bench.retry import Backoff
from tests.trainer.helpers import run_trainer, tiny_config
from trainer.ckpt import store
from trainer.ckpt.checkpointer import Checkpointer
from trainer.ckpt.formats import RawFormat
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer
from trainer.ckpt.upload import Uploader
from trainer.errors import EXIT_CHECKPOINT_DIR, CheckpointDirError, UploadError
from trainer.train import train


def quiet(_: str) -> None:
    pass


def flip_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def verifies(path: Path) -> bool:
    try:
        store.read_verified(LocalFS(), path, AlignedBuffer())
    except Exception:  # noqa: BLE001
        return False
    return True


# ---- 11: retention --------------------------------------------------------------------------


def test_retention_never_counts_a_corrupt_checkpoint_nor_deletes_good_ones(tmp_path):
    train(tiny_config(tmp_path, steps=20, checkpoint_every=10, keep=2), say=quiet)
    flip_byte(tmp_path / "step-00000020" / "state.ckpt")
    said: list[str] = []
    cfg = tiny_config(tmp_path, steps=30, checkpoint_every=15, keep=2, resume="always")
    assert train(cfg, say=said.append).resumed_from == 10
    assert any("skipping step-00000020" in line for line in said)
    good = [r.step for r in store.list_checkpoints(tmp_path) if verifies(r.path)]
    # The two newest good ones are kept; the corrupt 20 pushed neither out.
    assert good == [30, 15]


# ---- 12: resuming at or past --steps ------------------------------------------------------


@pytest.mark.parametrize("steps", [4, 3])
def test_resuming_at_or_past_steps_is_nothing_to_do(tmp_path, steps):
    train(tiny_config(tmp_path, steps=4, checkpoint_every=2), say=quiet)
    said: list[str] = []
    summary = train(tiny_config(tmp_path, steps=steps, resume="always"), say=said.append)
    assert any("nothing to do" in line for line in said), said
    data = summary.to_json()
    json.dumps(data, allow_nan=False)  # no NaN/Infinity anywhere
    assert data["steps_run"] == 0 and data["resumed_from_step"] == 4
    assert data["steps_per_s"] is None and data["final_loss"] is None
    assert data["checkpoint_count"] == 0
    assert all(v is None or v >= 0 for v in summary.outputs().values())
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [4, 2]


def test_cli_says_nothing_to_do_and_writes_nulls(tmp_path):
    ckpt = tmp_path / "ckpt"
    train(tiny_config(ckpt, steps=2, checkpoint_every=2), say=quiet)
    out = tmp_path / "summary.json"
    proc = run_trainer(
        "--checkpoint-dir", str(ckpt), "--steps", "2", "--resume", "--model-size", "256KiB",
        "--batch-size", "2", "--seq-len", "16", "--device", "cpu", "--no-track",
        "--summary-json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in proc.stdout
    data = json.loads(out.read_text())
    assert data["steps_run"] == 0 and data["steps_per_s"] is None and data["final_loss"] is None


# ---- 13: raw dtypes -------------------------------------------------------------------------


def all_dtypes() -> list[torch.dtype]:
    return sorted(
        {v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=lambda d: str(d)
    )


@pytest.mark.parametrize("dtype", all_dtypes(), ids=str)
def test_raw_format_loads_every_dtype_it_stages(dtype):
    try:
        tensor = torch.zeros(5, dtype=dtype)
    except (RuntimeError, TypeError):
        pytest.skip(f"torch cannot create a {dtype} tensor")
    fmt = RawFormat()
    try:
        staged = fmt.stage({"t": tensor})
    except TypeError as exc:
        assert "cannot checkpoint" in str(exc)  # refused at staging: nothing is written
        return
    loaded = RawFormat().load(memoryview(bytes(staged.data)))["t"]
    assert loaded.dtype == dtype and loaded.shape == tensor.shape
    assert bytes(loaded.view(torch.uint8).numpy()) == bytes(tensor.view(torch.uint8).numpy())


# ---- 13: re-upload --------------------------------------------------------------------------


class StateFails(MemoryFileSystem):
    """Uploads of the state file fail; the manifest would go through."""

    protocol = "statefails"

    @classmethod
    def _strip_protocol(cls, path):
        # The same paths as memory:// (whose own method knows only that prefix).
        return super()._strip_protocol(str(path).replace("statefails://", "memory://", 1))

    def put_file(self, lpath, rpath, **kwargs):
        if rpath.endswith("state.ckpt"):
            raise ConnectionError("dropped")
        return super().put_file(lpath, rpath, **kwargs)


def test_a_reuploaded_step_never_leaves_the_old_manifest_beside_a_new_state(tmp_path):
    MemoryFileSystem.store.clear()
    fsspec.register_implementation("statefails", StateFails, clobber=True)
    ckpt = tmp_path / "step-00000006"
    ckpt.mkdir()
    (ckpt / "state.ckpt").write_bytes(b"old state")
    (ckpt / store.MANIFEST).write_text('{"old": true}')
    Uploader("memory://bucket/run").upload(ckpt, ["state.ckpt", store.MANIFEST])
    remote = fsspec.filesystem("memory")
    assert remote.exists("/bucket/run/step-00000006/MANIFEST.json")

    (ckpt / "state.ckpt").write_bytes(b"new state")
    with pytest.raises(UploadError):
        Uploader("statefails://bucket/run", backoff=Backoff(delays=(0,))).upload(
            ckpt, ["state.ckpt", store.MANIFEST]
        )
    # A remote copy without a manifest is incomplete; one with the old manifest would look
    # complete and fail its checksums.
    assert not remote.exists("/bucket/run/step-00000006/MANIFEST.json")


# ---- 13: manifests with wrong field types ---------------------------------------------------


def _break(manifest: dict, how: str) -> dict:
    entry = manifest["files"][0]
    if how == "no_format":
        del manifest["format"]
    elif how == "format_null":
        manifest["format"] = None
    elif how == "name_null":
        entry["name"] = None
    elif how == "name_escapes":
        entry["name"] = "../step-00000004/state.ckpt"
    elif how == "crc32_null":
        entry["crc32"] = None
    elif how == "crc32_short":
        entry["crc32"] = entry["crc32"][:-1]
    elif how == "bytes_str":
        entry["bytes"] = str(entry["bytes"])
    elif how == "files_str":
        manifest["files"] = "state.ckpt"
    elif how == "entry_list":
        manifest["files"] = [["state.ckpt"]]
    elif how == "step_str":
        manifest["step"] = "6"
    elif how == "checksum_list":
        manifest["checksum"] = ["crc32"]
    elif how == "checksum_unknown":
        manifest["checksum"] = "md5"
    elif how == "layout_list":
        manifest["layout"] = ["striped"]
    elif how == "not_a_dict":
        return [manifest]  # type: ignore[return-value]
    return manifest


@pytest.mark.parametrize(
    "how",
    [
        "no_format", "format_null", "name_null", "name_escapes", "crc32_null", "crc32_short",
        "bytes_str", "files_str", "entry_list", "step_str", "checksum_list", "checksum_unknown",
        "layout_list", "not_a_dict",
    ],
)  # fmt: skip
def test_a_manifest_with_wrong_field_types_is_skipped(tmp_path, how):
    train(tiny_config(tmp_path, steps=6, keep=3), say=quiet)
    path = tmp_path / "step-00000006" / store.MANIFEST
    path.write_text(json.dumps(_break(json.loads(path.read_text()), how)))
    said: list[str] = []
    assert (
        train(tiny_config(tmp_path, steps=8, keep=3, resume="always"), say=said.append).resumed_from
        == 4
    )
    assert any("skipping step-00000006" in line for line in said), said


# ---- 13: EACCES / EPERM mid-run -------------------------------------------------------------


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


# ---- 13: total_s from the save request ------------------------------------------------------


class SlowFirstFsync(LocalFS):
    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls = seconds, 0

    def fsync(self, fd):
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.seconds)
        super().fsync(fd)


def test_total_starts_at_the_save_request(tmp_path):
    ckpt = Checkpointer(
        tmp_path, RawFormat(), SlowFirstFsync(0.4), durable=True, keep=5, asynchronous=True
    )
    state = {"w": torch.ones(1024)}
    ckpt.save(1, lambda: state)
    ckpt.save(2, lambda: state)  # waits for the first (slow) one: part of its pause and total
    first, second = ckpt.finish()
    assert second.pause_s >= 0.3
    assert second.total_s >= second.pause_s
    assert first.total_s >= first.pause_s


# ---- 13: --durability none with --keep ------------------------------------------------------


def test_durability_none_never_deletes_for_a_checkpoint_that_is_not_durable(tmp_path):
    said: list[str] = []
    train(tiny_config(tmp_path, steps=6, keep=1, durability="none"), say=said.append)
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [6, 4, 2]
    assert any("--keep" in line and "--durability none" in line for line in said), said
