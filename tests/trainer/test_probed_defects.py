"""Checkpoint defects found by probing the trainer as a user would, one test (or a few) each.

Each failed on the code before its fix: a checkpoint renamed to another step was resumed
(training rolled back), a diverged run crashed writing its summary, a full volume under the
library formats and refused access under torchrun were exit 1, an upload into the
checkpoint directory destroyed the checkpoint, wrong-typed sharded manifests crashed every
rank, and ``--checkpoint-timeout inf`` passed validation.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.trainer.helpers import tiny_config
from trainer.ckpt import sharded, store
from trainer.ckpt.formats import make_format
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer, write_file
from trainer.errors import (
    CheckpointCorruptError,
)
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
        sharded.verify_shard(LocalFS(), step_dir, entry, "crc32", AlignedBuffer())


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
