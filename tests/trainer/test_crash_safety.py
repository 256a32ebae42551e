"""Nothing half-written is ever taken for a checkpoint: SIGKILL, corruption, a full disk."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.trainer.helpers import (
    REPO,
    TINY_ARGS,
    edit_manifest_and_resume,
    run_trainer,
    tiny_config,
    trainer_cmd,
)
from trainer.ckpt import store
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer
from trainer.errors import CheckpointCorruptError, CheckpointDirError, ConfigError, StorageFullError
from trainer.train import train

KILL_ARGS = [
    "--steps", "16", "--checkpoint-every", "4", "--keep", "10", "--model-size", "12MiB",
    "--batch-size", "2", "--seq-len", "16", "--device", "cpu", "--log-every", "1", "--no-track",
]  # fmt: skip


def _summary(path: Path) -> dict:
    return json.loads(path.read_text())


def _kill_during_checkpoint(ckpt_dir: Path, min_step: int) -> int:
    """Start the trainer, SIGKILL it while a checkpoint >= min_step is being written."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        trainer_cmd("--checkpoint-dir", str(ckpt_dir), *KILL_ARGS),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            for entry in os.scandir(ckpt_dir):
                if entry.name.startswith(".step-") and int(entry.name[6:14]) >= min_step:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return int(entry.name[6:14])
            time.sleep(0.0005)
        pytest.fail("never saw a checkpoint being written")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_sigkill_mid_write_then_resume_matches_uninterrupted_run(tmp_path):
    ref_dir, victim_dir = tmp_path / "ref", tmp_path / "victim"
    ref_dir.mkdir()
    victim_dir.mkdir()
    ref = run_trainer(
        "--checkpoint-dir", str(ref_dir), *KILL_ARGS, "--summary-json", str(tmp_path / "ref.json")
    )
    assert ref.returncode == 0, ref.stderr

    killed_step = _kill_during_checkpoint(victim_dir, min_step=8)
    leftovers = [p.name for p in victim_dir.iterdir() if p.name.startswith(".step-")]
    published = [r.step for r in store.list_checkpoints(victim_dir)]
    assert (
        killed_step not in published or not leftovers
    )  # the interrupted one is never published half-done

    resumed = run_trainer(
        "--checkpoint-dir",
        str(victim_dir),
        *KILL_ARGS,
        "--resume",
        "--summary-json",
        str(tmp_path / "resumed.json"),
    )
    assert resumed.returncode == 0, resumed.stderr
    start = max(published)
    assert f"continuing from step-{start:08d}" in resumed.stdout
    assert not [p for p in victim_dir.iterdir() if p.name.startswith(".step-")], (
        "stale tmp dir not cleaned"
    )

    ref_curve = {s: v for s, v in _summary(tmp_path / "ref.json")["loss_curve"]}
    resumed_data = _summary(tmp_path / "resumed.json")
    assert resumed_data["resumed_from_step"] == start
    resumed_curve = dict(resumed_data["loss_curve"])
    assert sorted(resumed_curve) == list(range(start + 1, 17))
    for step, loss in resumed_curve.items():
        assert loss == pytest.approx(ref_curve[step], rel=1e-5, abs=1e-6), step


# The library formats, each held by the fault seam inside its write of step 4 (torch in
# the trainer's writer, safetensors and DCP as the library starts writing; DCP's on its
# asynchronous thread) and killed there.
LIBRARY_KILL_CASES = [("torch", {}), ("safetensors", {}), ("dcp", {"async_checkpoint": True})]


@pytest.fixture(scope="module")
def uninterrupted_loss(tmp_path_factory) -> dict[int, float]:
    """The loss curve of the tiny run, uninterrupted (the format does not change it)."""
    cfg = tiny_config(tmp_path_factory.mktemp("uninterrupted"), log_every=1, track=False)
    return dict(train(cfg, say=lambda s: None).loss_curve)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fmt", "options"), LIBRARY_KILL_CASES, ids=[c[0] for c in LIBRARY_KILL_CASES]
)
def test_library_format_killed_mid_write_is_never_taken_and_resume_takes_the_previous(
    tmp_path, uninterrupted_loss, fmt, options
):
    from trainer.ckpt.checkpointer import FAULT_ENV

    ckpt, log = tmp_path / "ckpt", tmp_path / "victim.log"
    cfg = tiny_config(ckpt, keep=10, log_every=1, track=False, format=fmt, **options)
    args = [
        "--checkpoint-dir", str(ckpt), "--steps", str(cfg.steps), "--checkpoint-every",
        str(cfg.checkpoint_every), "--keep", "10", "--format", fmt, "--log-every", "1",
        "--no-track", *TINY_ARGS, *(["--async"] if options else []),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), FAULT_ENV: "0:4:pause=120"}
    with log.open("w") as out:
        proc = subprocess.Popen(trainer_cmd(*args), env=env, stdout=out, stderr=out, cwd=REPO)
        try:
            deadline = time.monotonic() + 120
            while "pausing inside the write" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # Step 4 was being written: it is not a checkpoint, only a hidden leftover.
    assert [r.step for r in store.list_checkpoints(ckpt)] == [2]
    assert [p.name for p in ckpt.iterdir() if p.name.startswith(".step-00000004.tmp-")]

    said: list[str] = []
    summary = train(replace(cfg, resume="always"), say=said.append)
    assert summary.resumed_from == 2
    assert any("continuing from step-00000002" in line for line in said), said
    resumed = dict(summary.loss_curve)
    assert sorted(resumed) == list(range(3, cfg.steps + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted_loss[step], rel=1e-5, abs=1e-6), step
    assert [r.step for r in store.list_checkpoints(ckpt)] == [6, 4, 2]
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".step-")]  # leftover gone


def _three_checkpoints(ckpt_dir: Path, fmt: str = "raw") -> None:
    train(tiny_config(ckpt_dir, steps=6, keep=3, format=fmt), say=lambda s: None)
    assert [r.step for r in store.list_checkpoints(ckpt_dir)] == [6, 4, 2]


@pytest.mark.parametrize("fmt", ["raw", "torch"])
@pytest.mark.parametrize(
    "damage",
    ["flip_byte", "truncate", "no_manifest", "bad_manifest"],
)
def test_resume_skips_damaged_newest_checkpoint(tmp_path, fmt, damage):
    _three_checkpoints(tmp_path, fmt)
    newest = tmp_path / "step-00000006"
    state = next(p for p in newest.iterdir() if p.name.startswith("state."))
    if damage == "flip_byte":
        with open(state, "r+b") as f:
            f.seek(state.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "truncate":
        os.truncate(state, state.stat().st_size - 4096)
    elif damage == "no_manifest":
        (newest / store.MANIFEST).unlink()
    else:
        (newest / store.MANIFEST).write_text("{not json")
    said: list[str] = []
    summary = train(
        tiny_config(tmp_path, steps=8, keep=3, resume="always", format=fmt), say=said.append
    )
    assert summary.resumed_from == 4
    assert any("skipping step-00000006" in line for line in said), said
    expected = {
        "flip_byte": "checksum mismatch",
        "truncate": "bytes, manifest says",
        "no_manifest": "incomplete",
        "bad_manifest": "unreadable",
    }
    assert any(expected[damage] in line for line in said), said
    # Step 6 was saved again over the damaged copy, which is gone; nothing hidden is left.
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [8, 6, 4]
    store.read_verified(LocalFS(), newest, AlignedBuffer())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_retention_never_counts_skipped_newer_checkpoints(tmp_path):
    _three_checkpoints(tmp_path)
    (tmp_path / "step-00000006" / store.MANIFEST).unlink()
    cfg = tiny_config(tmp_path, steps=5, checkpoint_every=1, keep=1, resume="always")
    assert train(cfg, say=lambda s: None).resumed_from == 4
    # The broken step 6 must not push the fresh step 5 out of a keep-1 retention.
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [6, 5]
    assert (
        train(
            tiny_config(tmp_path, steps=6, keep=1, resume="always"), say=lambda s: None
        ).resumed_from
        == 5
    )


def test_fresh_run_refuses_a_directory_with_checkpoints(tmp_path):
    _three_checkpoints(tmp_path)
    with pytest.raises(CheckpointDirError, match="pass --resume"):
        train(tiny_config(tmp_path, steps=2), say=lambda s: None)
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [6, 4, 2]


def test_resume_with_another_model_is_refused(tmp_path):
    _three_checkpoints(tmp_path)
    with pytest.raises(ConfigError, match="model_size"):
        train(
            tiny_config(tmp_path, steps=8, resume="always", model_size="512KiB"), say=lambda s: None
        )


def test_manifest_with_invalid_chunk_size_is_skipped(tmp_path):
    _three_checkpoints(tmp_path)

    def zero_chunk(manifest: dict) -> dict:
        manifest["files"][0]["chunk_bytes"] = 0
        return manifest

    resumed_from, said = edit_manifest_and_resume(tmp_path, zero_chunk)
    assert resumed_from == 4
    assert any("invalid chunk size" in line for line in said), said


def test_resume_refuses_when_every_checkpoint_is_corrupt(tmp_path):
    _three_checkpoints(tmp_path)
    for ref in store.list_checkpoints(tmp_path):
        (ref.path / store.MANIFEST).unlink()
    with pytest.raises(CheckpointCorruptError, match="none of the 3 checkpoints"):
        train(tiny_config(tmp_path, steps=8, resume="always"), say=lambda s: None)
    proc = run_trainer(
        "--checkpoint-dir", str(tmp_path), "--resume", "--model-size", "256KiB", "--no-track"
    )
    assert proc.returncode == 6


def test_resume_with_empty_dir_starts_fresh(tmp_path):
    said: list[str] = []
    summary = train(tiny_config(tmp_path, steps=2, resume="always"), say=said.append)
    assert summary.resumed_from is None  # started at step 0: not resumed part-way
    assert any("starting from step 0" in line for line in said)


class FullAfter(LocalFS):
    """Reports ENOSPC once ``budget`` bytes have been written through it."""

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def pwrite(self, fd, data, offset):
        if self.budget < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.budget -= len(data)
        return super().pwrite(fd, data, offset)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_enospc_fails_clearly_and_keeps_earlier_checkpoints(tmp_path, asynchronous):
    _three_checkpoints(tmp_path)
    size = (tmp_path / "step-00000006" / "state.ckpt").stat().st_size
    fs = FullAfter(budget=int(size * 1.5))  # the next checkpoint fits, the one after does not
    cfg = tiny_config(tmp_path, steps=12, keep=5, resume="always", async_checkpoint=asynchronous)
    with pytest.raises(StorageFullError, match="no space left.*step-00000010"):
        train(cfg, fs=fs, say=lambda s: None)
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [8, 6, 4, 2]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".step-")]
    for ref in store.list_checkpoints(tmp_path):
        store.read_verified(LocalFS(), ref.path, AlignedBuffer())


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_full_volume_exit_code(small_tmpfs):
    proc = run_trainer(
        "--checkpoint-dir", str(small_tmpfs), "--steps", "10", "--checkpoint-every", "2", "--keep", "10",
        "--model-size", "256KiB", "--batch-size", "2", "--seq-len", "16", "--no-track",
    )  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert "no space left" in proc.stderr
    refs = store.list_checkpoints(small_tmpfs)
    assert refs, "earlier checkpoints must survive"
    for ref in refs:
        store.read_verified(LocalFS(), ref.path, AlignedBuffer())
    assert not [p for p in small_tmpfs.iterdir() if p.name.startswith(".step-")]
