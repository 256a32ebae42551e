"""The run's figures say what they can tell: nothing to do at --steps is nulls, a diverged
run writes null for non-finite figures and exits 0, total_s starts at the save request."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from tests.trainer.helpers import (
    TINY_ARGS,
    metric_events,
    offline_runs,
    quiet,
    run_trainer,
    tiny_config,
)
from trainer.ckpt import store
from trainer.ckpt.checkpointer import Checkpointer
from trainer.ckpt.formats import RawFormat
from trainer.ckpt.fs import LocalFS
from trainer.summary import RunSummary, finite_or_null
from trainer.train import train


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
