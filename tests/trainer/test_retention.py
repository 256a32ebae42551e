"""Retention keeps the newest good checkpoints: never counting a corrupt one, never
deleting for one that is not durable."""

from __future__ import annotations

from tests.trainer.helpers import flip_byte, quiet, tiny_config, verifies
from trainer.ckpt import store
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
