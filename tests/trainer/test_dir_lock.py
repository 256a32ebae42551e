"""One trainer per checkpoint directory: a second is refused naming the holder, and a
killed trainer leaves nothing held."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.trainer.helpers import REPO, TINY_ARGS, run_trainer, steps_of, trainer_cmd
from trainer.ckpt.lock import LOCK_NAME, DirLock
from trainer.errors import CheckpointDirError


def _wait_for_holder(lock_file: Path, pid: int, proc: subprocess.Popen, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        if lock_file.exists() and f"pid {pid}," in lock_file.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"trainer {pid} never took {lock_file}")


@pytest.mark.slow
def test_a_second_trainer_is_refused_and_a_killed_one_holds_nothing(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    first = subprocess.Popen(
        trainer_cmd(
            "--checkpoint-dir", str(ckpt), *TINY_ARGS, "--steps", "1000000",
            "--checkpoint-every", "20", "--no-track",
        ),
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )  # fmt: skip
    try:
        _wait_for_holder(ckpt / LOCK_NAME, first.pid, first)
        second = run_trainer(
            "--checkpoint-dir", str(ckpt), *TINY_ARGS, "--steps", "40", "--resume", "--no-track"
        )
        assert second.returncode == 3, second.stderr
        [line] = [s for s in second.stderr.splitlines() if "error" in s]
        assert f"{ckpt} is in use by another trainer (run local, host " in line
        assert f", pid {first.pid}, since " in line
        assert first.poll() is None  # the first trains on, untouched
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # Killed: the kernel released its lock; the next trainer takes over its directory.
    made = steps_of(ckpt)
    target = str((made[0] if made else 0) + 4)
    third = run_trainer(
        "--checkpoint-dir", str(ckpt), *TINY_ARGS, "--steps", target, "--checkpoint-every", "2",
        "--resume", "--no-track",
    )  # fmt: skip
    assert third.returncode == 0, third.stderr
    assert steps_of(ckpt)[0] == int(target)
    assert not (ckpt / LOCK_NAME).exists()  # released and removed


def test_the_lock_refuses_a_second_holder_until_released(tmp_path):
    first, second = DirLock(tmp_path), DirLock(tmp_path)
    first.acquire()
    with pytest.raises(CheckpointDirError, match=rf"pid {os.getpid()}, since ") as refused:
        second.acquire()
    assert refused.value.exit_code == 3
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    second.acquire()
    assert second.held
    second.release()


def test_a_lock_file_left_by_a_dead_holder_is_taken_over(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / LOCK_NAME).write_text("run local, host gone, pid 1, since 2026-01-01T00:00:00Z\n")
    lock = DirLock(ckpt)
    lock.acquire()  # nobody holds the file's lock: its writer is gone
    assert f"pid {os.getpid()}," in (ckpt / LOCK_NAME).read_text()
    lock.release()
    assert list(ckpt.iterdir()) == []


def test_a_waiter_that_locked_a_removed_file_locks_the_new_one(tmp_path):
    holder = DirLock(tmp_path)
    holder.acquire()
    stale = os.open(tmp_path / LOCK_NAME, os.O_RDWR)  # opened before the holder removes it
    holder.release()
    waiter = DirLock(tmp_path)
    assert not waiter._still_the_file(stale)
    os.close(stale)
    waiter.acquire()
    assert (tmp_path / LOCK_NAME).exists() and waiter.held
    waiter.release()
