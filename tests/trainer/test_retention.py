"""Retention keeps the newest good checkpoints: never counting a corrupt one, never
deleting for one that is not durable."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.helpers import flip_byte, quiet, steps_of, tiny_config, verifies
from trainer.ckpt import store
from trainer.ckpt.checkpointer import Checkpointer
from trainer.ckpt.formats import make_format
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer
from trainer.errors import CheckpointDirError
from trainer.preflight import check_before_training
from trainer.train import train


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


def test_durability_none_never_deletes_for_a_checkpoint_that_is_not_durable(tmp_path):
    said: list[str] = []
    train(tiny_config(tmp_path, steps=6, keep=1, durability="none"), say=said.append)
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [6, 4, 2]
    assert any("--keep" in line and "--durability none" in line for line in said), said


def _copy_as_step(source: Path, directory: Path, step: int) -> None:
    """Save the raw checkpoint at ``source`` again as a checkpoint of ``step``."""
    _, data = store.read_verified(LocalFS(), source, AlignedBuffer())
    state = make_format("raw").load(data)
    state["step"] = step
    ckpt = Checkpointer(directory, make_format("raw"), LocalFS(), durable=True, keep=10)
    ckpt.save(step, lambda: state)
    ckpt.finish()


def test_checkpoints_past_step_99999999_are_found_kept_resumed_and_refused(tmp_path):
    seed, big = tmp_path / "seed", tmp_path / "big"
    train(tiny_config(seed, steps=2), say=quiet)
    big.mkdir()
    for step in (99_999_998, 100_000_000):
        _copy_as_step(seed / store.final_name(2), big, step)
    assert [p.name for p in sorted(big.iterdir())] == ["step-100000000", "step-99999998"]
    # Found, newest first (a run that missed them would start over at step 0).
    assert steps_of(big) == [100_000_000, 99_999_998]

    cfg = tiny_config(big, steps=100_000_002, keep=1, resume="always")
    assert train(cfg, say=quiet).resumed_from == 100_000_000
    assert steps_of(big) == [100_000_002]  # --keep 1 keeps one
    with pytest.raises(CheckpointDirError, match="newest step-100000002"):
        check_before_training(tiny_config(big), warn=quiet)
