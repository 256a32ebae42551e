"""Checkpoint defects found by probing the trainer as a user would, one test (or a few) each.

Each failed on the code before its fix: a checkpoint renamed to another step was resumed
(training rolled back), a diverged run crashed writing its summary, a full volume under the
library formats and refused access under torchrun were exit 1, an upload into the
checkpoint directory destroyed the checkpoint, wrong-typed sharded manifests crashed every
rank, and ``--checkpoint-timeout inf`` passed validation.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.trainer.helpers import metric_events, offline_runs, run_trainer, tiny_config
from trainer.ckpt import sharded, store
from trainer.ckpt.checkpointer import Checkpointer
from trainer.ckpt.formats import make_format
from trainer.ckpt.fs import LocalFS, os_errno, storage_error
from trainer.ckpt.io import AlignedBuffer, write_file
from trainer.ckpt.upload import Uploader
from trainer.config import MAX_CHECKPOINT_TIMEOUT_S, TrainConfig
from trainer.errors import (
    EXIT_CHECKPOINT_DIR,
    EXIT_USAGE,
    CheckpointCorruptError,
    CheckpointDirError,
    ConfigError,
    StorageFullError,
)
from trainer.summary import RunSummary, finite_or_null
from trainer.train import train

TINY_ARGS = ("--model-size", "256KiB", "--batch-size", "2", "--seq-len", "16", "--device", "cpu")


def quiet(_: str) -> None:
    pass


def steps_of(directory: Path) -> list[int]:
    return [r.step for r in store.list_checkpoints(directory)]


def state_step(path: Path) -> int:
    manifest, data = store.read_verified(LocalFS(), path, AlignedBuffer())
    return make_format("raw").load(data)["step"]


# ---- 1: a checkpoint whose name and content disagree is never resumed ------------------


def test_a_copy_renamed_to_a_later_step_is_skipped_not_resumed(tmp_path):
    train(tiny_config(tmp_path, steps=6, checkpoint_every=2, keep=3), say=quiet)
    shutil.copytree(tmp_path / "step-00000004", tmp_path / "step-00000008")
    said: list[str] = []
    summary = train(tiny_config(tmp_path, steps=10, keep=3, resume="always"), say=said.append)
    assert summary.resumed_from == 6, said
    assert any("skipping step-00000008" in line for line in said), said
    # Step 8 was trained again and replaced the stale copy: its content is step 8 now.
    assert steps_of(tmp_path)[:2] == [10, 8]
    assert state_step(tmp_path / "step-00000008") == 8


def test_a_stale_copy_past_steps_does_not_roll_every_rerun_back(tmp_path):
    train(tiny_config(tmp_path, steps=6, checkpoint_every=2, keep=3), say=quiet)
    shutil.copytree(tmp_path / "step-00000004", tmp_path / "step-00000008")
    for _ in range(2):
        said: list[str] = []
        summary = train(tiny_config(tmp_path, steps=6, keep=3, resume="always"), say=said.append)
        assert summary.resumed_from == 6 and summary.steps_run == 0, said
        assert any("nothing to do" in line for line in said), said


def test_two_swapped_checkpoints_are_both_skipped(tmp_path):
    train(tiny_config(tmp_path, steps=6, checkpoint_every=2, keep=3), say=quiet)
    (tmp_path / "step-00000004").rename(tmp_path / "swap")
    (tmp_path / "step-00000006").rename(tmp_path / "step-00000004")
    (tmp_path / "swap").rename(tmp_path / "step-00000006")
    said: list[str] = []
    summary = train(tiny_config(tmp_path, steps=6, keep=3, resume="always"), say=said.append)
    assert summary.resumed_from == 2, said
    assert sum("skipping step-0000000" in line for line in said) == 2, said


def test_a_manifest_edited_to_the_name_but_a_state_of_another_step_is_skipped(tmp_path):
    train(tiny_config(tmp_path, steps=6, checkpoint_every=2, keep=3), say=quiet)
    copy = tmp_path / "step-00000008"
    shutil.copytree(tmp_path / "step-00000004", copy)
    manifest = json.loads((copy / store.MANIFEST).read_text())
    (copy / store.MANIFEST).write_text(json.dumps({**manifest, "step": 8}))
    said: list[str] = []
    summary = train(tiny_config(tmp_path, steps=10, keep=3, resume="always"), say=said.append)
    assert summary.resumed_from == 6, said
    assert any("skipping step-00000008" in line and "state" in line for line in said), said


def test_read_manifest_refuses_a_name_of_another_step(tmp_path):
    train(tiny_config(tmp_path, steps=2, checkpoint_every=2), say=quiet)
    (tmp_path / "step-00000002").rename(tmp_path / "step-00000003")
    with pytest.raises(
        CheckpointCorruptError, match="step-00000003: its MANIFEST.json is of step 2"
    ):
        store.read_manifest(tmp_path / "step-00000003")


# ---- 2: a diverged run writes its summary, with null for what is not a number ----------


def test_non_finite_figures_become_null_everywhere():
    summary = RunSummary(
        storage_profile="p",
        checkpoint_dir="/c",
        inputs={},
        runtime_s=2.0,
        steps_run=4,
        final_loss=math.nan,
        checkpoints=[],
        loss_curve=[(2, 5.0), (4, math.inf), (6, -math.inf), (8, math.nan)],
    )
    data = summary.to_json()
    json.dumps(data, allow_nan=False)
    assert data["loss_curve"] == [[2, 5.0], [4, None], [6, None], [8, None]]
    assert data["final_loss"] is None
    assert summary.outputs()["final_loss"] is None
    assert finite_or_null({"a": (1.0, [math.nan])}) == {"a": [1.0, [None]]}


def test_a_diverged_run_exits_0_with_its_summary_and_outputs(tmp_path):
    ckpt, offline, out = tmp_path / "ckpt", tmp_path / "offline", tmp_path / "summary.json"
    proc = run_trainer(
        "--checkpoint-dir", str(ckpt), "--steps", "4", "--checkpoint-every", "2",
        "--log-every", "1", "--lr", "1e30", *TINY_ARGS, "--summary-json", str(out),
        env={"POLYAXON_OFFLINE_ROOT": str(offline)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())  # strict JSON: no NaN
    assert data["steps_run"] == 4 and data["final_loss"] is None
    losses = [v for _, v in data["loss_curve"]]
    assert None in losses and len(losses) == 4
    first_bad = next(step for step, v in data["loss_curve"] if v is None)
    assert data["diverged_at_step"] == first_bad
    (run,) = offline_runs(offline)
    assert run["status"] == "succeeded"
    outputs = run["outputs"]
    assert all(not isinstance(v, float) or math.isfinite(v) for v in outputs.values()), outputs
    logged = metric_events(run["_dir"], "loss")
    assert 0 < len(logged) < 4 and all(math.isfinite(v) for _, v in logged), logged
    # Where it diverged is an output, as finite loss events alone would not tell.
    assert outputs["diverged_at_step"] == first_bad and "final_loss" not in outputs


# ---- 3: a full volume is exit 4 for every format, sync and async ------------------------


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


# ---- 4: refused access under torchrun is exit 3, as for one process --------------------


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS])
def test_the_sharded_path_maps_refused_access_like_the_single_process_path(code):
    exc = OSError(code, os.strerror(code))
    error = sharded._error_for(exc, "writing rank 1's shard of step-00000002")
    assert isinstance(error, CheckpointDirError) and error.exit_code == EXIT_CHECKPOINT_DIR
    assert error.__cause__ is exc
    single = storage_error(exc, "writing checkpoint step-00000002")
    assert type(single) is type(error)


# ---- 5: an upload target inside the checkpoint directory is refused --------------------


def test_upload_into_the_checkpoint_dir_is_refused_before_training(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (tmp_path / "link").symlink_to(ckpt)
    for target in (f"file://{ckpt}", f"file://{ckpt}/remote", str(tmp_path / "link" / "r")):
        proc = run_trainer(
            "--checkpoint-dir", str(ckpt), "--steps", "2", "--checkpoint-every", "2",
            *TINY_ARGS, "--no-track", "--upload-to", target,
        )  # fmt: skip
        assert proc.returncode == EXIT_USAGE, (target, proc.stderr)
        assert "inside the checkpoint dir" in proc.stderr and "Traceback" not in proc.stderr
        assert "step 1/" not in proc.stdout  # refused before any training step
        assert list(ckpt.iterdir()) == []


def test_upload_beside_the_checkpoint_dir_is_accepted(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with pytest.raises(ConfigError, match="inside the checkpoint dir"):
        Uploader(f"file://{ckpt}/../ckpt/x", checkpoint_dir=ckpt)
    Uploader(f"file://{tmp_path}/ckpt2", checkpoint_dir=ckpt)  # a name that merely starts alike
    Uploader(f"file://{tmp_path}", checkpoint_dir=ckpt)  # the parent: step-N lands beside ckpt
    Uploader(f"memory://{ckpt}", checkpoint_dir=ckpt)  # another file system entirely
    summary = train(
        tiny_config(ckpt, steps=2, checkpoint_every=2, upload_to=f"file://{tmp_path}/remote"),
        say=quiet,
    )
    assert summary.checkpoints and store.read_verified(
        LocalFS(), tmp_path / "remote" / "step-00000002", AlignedBuffer()
    )


# ---- 6: wrong-typed sharded manifests are corrupt checkpoints, skipped -----------------


def sharded_checkpoint(directory: Path, step: int, **changes) -> Path:
    step_dir = directory / store.final_name(step)
    step_dir.mkdir()
    data = memoryview(bytearray(os.urandom(2 * 4096)))
    written = write_file(LocalFS(), step_dir / "shard-00000-of-00001.ckpt", data, direct=False)
    os.close(written.fd)
    entry = {
        "name": "shard-00000-of-00001.ckpt",
        "bytes": written.nbytes,
        "chunk_bytes": written.chunk_bytes,
        "crc32": list(written.checksums),
        "rank": 0,
    }
    manifest = {
        "schema": store.MANIFEST_SCHEMA, "step": step, "format": "raw", "layout": "sharded",
        "world_size": 1, "parallel": "ddp", "checksum": "crc32", "files": [entry],
    }  # fmt: skip
    for key, value in changes.items():
        if key in entry:
            entry[key] = value
        else:
            manifest[key] = value
    (step_dir / store.MANIFEST).write_text(json.dumps(manifest))
    return step_dir


@pytest.mark.parametrize(
    "changes",
    [{"crc32": None}, {"crc32": ["1"]}, {"bytes": "8192"}, {"chunk_bytes": None}, {"name": 3}],
    ids=str,
)
def test_wrong_typed_shard_entries_are_corrupt(tmp_path, changes):
    step_dir = sharded_checkpoint(tmp_path, 2, **changes)
    (entry,) = store.read_manifest(step_dir)["files"]
    with pytest.raises(CheckpointCorruptError, match="step-00000002"):
        store.verify_file(LocalFS(), step_dir, entry, "crc32", AlignedBuffer())


@pytest.mark.parametrize(
    "changes", [{"world_size": "1"}, {"world_size": 0}, {"world_size": True}, {"parallel": 1}]
)
def test_wrong_typed_world_fields_are_skipped_as_corrupt(tmp_path, changes):
    sharded_checkpoint(tmp_path, 2, **changes)
    with pytest.raises(CheckpointCorruptError, match="step-00000002: MANIFEST.json field"):
        store.read_manifest(tmp_path / "step-00000002")
    said: list[str] = []
    # The single-process path skips it like any corrupt checkpoint (none left: exit 6).
    with pytest.raises(CheckpointCorruptError, match="none of the 1 checkpoints"):
        train(tiny_config(tmp_path, resume="always"), say=said.append)
    assert any("skipping step-00000002" in line for line in said), said


# ---- 7: --checkpoint-timeout has a bound -------------------------------------------------


@pytest.mark.parametrize("value", [math.inf, math.nan, MAX_CHECKPOINT_TIMEOUT_S + 1, 1e300])
def test_checkpoint_timeout_out_of_bounds_is_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="--checkpoint-timeout must be positive and at most"):
        TrainConfig(checkpoint_dir=tmp_path, checkpoint_timeout=value)
    TrainConfig(checkpoint_dir=tmp_path, checkpoint_timeout=MAX_CHECKPOINT_TIMEOUT_S)


def test_cli_refuses_an_infinite_checkpoint_timeout_and_shows_the_bound(tmp_path):
    proc = run_trainer("--checkpoint-dir", str(tmp_path), "--checkpoint-timeout", "inf")
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "--checkpoint-timeout must be positive and at most" in proc.stderr
    help_text = " ".join(run_trainer("--help").stdout.split())
    assert f"At most {MAX_CHECKPOINT_TIMEOUT_S}" in help_text
