"""A checkpoint whose manifest has wrong field types, or whose name and content disagree
on its step, is corrupt: skipped on resume, never loaded (one process and sharded)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.trainer.helpers import edit_manifest_and_resume, quiet, state_step, steps_of, tiny_config
from trainer.ckpt import store
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer, write_file
from trainer.errors import (
    CheckpointCorruptError,
)
from trainer.train import train


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
    elif how == "no_checksum":
        del manifest["checksum"]
    elif how == "checksum_list":
        manifest["checksum"] = ["crc32"]
    elif how == "checksum_unknown":
        manifest["checksum"] = "md5"
    elif how == "no_layout":
        del manifest["layout"]
    elif how == "layout_list":
        manifest["layout"] = ["striped"]
    elif how == "no_run_id":
        del manifest["run_id"]
    elif how == "run_id_number":
        manifest["run_id"] = 7
    elif how == "not_a_dict":
        return [manifest]  # type: ignore[return-value]
    return manifest


@pytest.mark.parametrize(
    "how",
    [
        "no_format", "format_null", "name_null", "name_escapes", "crc32_null", "crc32_short",
        "bytes_str", "files_str", "entry_list", "step_str", "no_checksum", "checksum_list",
        "checksum_unknown",
        "no_layout", "layout_list", "no_run_id", "run_id_number", "not_a_dict",
    ],
)  # fmt: skip
def test_a_manifest_with_wrong_field_types_is_skipped(tmp_path, how):
    train(tiny_config(tmp_path, steps=6, keep=3), say=quiet)
    resumed_from, said = edit_manifest_and_resume(tmp_path, lambda m: _break(m, how))
    assert resumed_from == 4
    assert any("skipping step-00000006" in line for line in said), said


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
        "schema": store.MANIFEST_SCHEMA, "step": step, "run_id": None, "format": "raw",
        "layout": "sharded", "shard_layout": "striped", "world_size": 1, "parallel": "ddp",
        "checksum": "crc32", "files": [entry],
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
