"""A newcomer's first runs: summaries that know when they ran, the restore measured, every
stage of the pause in the table, an early warning, and a refusal that costs nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from checkpoint_storage_bench.contract import (
    RESTORE_MEASURED,
    RESTORE_OUTPUTS,
    RUN_FINISHED_AT,
    RUN_STARTED_AT,
)
from tests.trainer.helpers import REPO, TINY, flip_byte, offline_runs, run_trainer, tiny_config
from trainer.ckpt.fs import LocalFS
from trainer.preflight import few_checkpoints_warning
from trainer.summary import format_timeline
from trainer.train import train

ISO_SECOND = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def _tiny_args(ckpt: Path, *extra: str) -> list[str]:
    return [
        "--checkpoint-dir", str(ckpt), "--steps", "6", "--checkpoint-every", "2",
        "--device", "cpu", "--model-size", TINY["model_size"], "--batch-size", "2",
        "--seq-len", "16", *extra,
    ]  # fmt: skip


def test_summary_knows_when_it_ran_and_the_restore_at_the_end(tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    result = run_trainer(
        *_tiny_args(tmp_path / "ck", "--summary-json", str(summary), "--restore-check"),
        "--no-track",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(summary.read_text())
    started, finished = data[RUN_STARTED_AT], data[RUN_FINISHED_AT]
    assert ISO_SECOND.fullmatch(started) and ISO_SECOND.fullmatch(finished), (started, finished)
    assert datetime.fromisoformat(started) <= datetime.fromisoformat(finished)
    seconds, nbytes, gbps = (data[k] for k in RESTORE_OUTPUTS)
    assert data[RESTORE_MEASURED] == "end"
    assert seconds > 0 and nbytes >= data["checkpoint_bytes"] > 0
    assert abs(gbps - nbytes / seconds / 1e9) < 1e-9
    assert "restore of step 6 at the end (--restore-check)" in result.stdout


def test_a_resume_measures_its_restore(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck"
    first = train(tiny_config(ckpt, steps=4), say=lambda _: None)
    assert first.restore is None  # nothing restored, nothing measured
    assert first.outputs().keys().isdisjoint(RESTORE_OUTPUTS)
    lines: list[str] = []
    resumed = train(tiny_config(ckpt, steps=6, resume="always"), say=lines.append)
    assert resumed.restore is not None and resumed.restore.measured == "resume"
    assert resumed.restore.step == 4 and resumed.restore.bytes > 0 and resumed.restore.seconds > 0
    outputs = resumed.outputs()
    assert outputs[RESTORE_OUTPUTS[0]] > 0 and RESTORE_MEASURED not in outputs  # meta
    assert "restore of step 4 on resume" in format_timeline(resumed)


def test_the_table_shows_the_library_formats_read_back(tmp_path: Path) -> None:
    summary = train(tiny_config(tmp_path / "ck", format="safetensors"), say=lambda _: None)
    table = format_timeline(summary)
    header = next(line for line in table.splitlines() if line.lstrip().startswith("step"))
    assert "checksum" in header.split()
    row = next(line for line in table.splitlines() if line.split()[:1] == ["2"])
    checksum = float(row.split()[header.split().index("checksum")])
    assert checksum == round(summary.checkpoints[0].checksum_s, 3)
    # ... and the summary: a stage like the others.
    stages = summary.to_json()["stages"]
    assert stages["checksum_s"]["median"] > 0
    assert summary.outputs()["ckpt_checksum_s_median"] > 0


def test_too_few_checkpoints_are_warned_about_at_start(tmp_path: Path) -> None:
    # 6 steps every 2: 3 checkpoints, 2 after the warm-up; a pause budget's bound needs 5.
    warning = few_checkpoints_warning(tiny_config(tmp_path / "ck"))
    assert warning is not None
    assert "makes 3 checkpoint(s), 2 after the 1 warm-up" in warning
    assert "needs at least 5" in warning and "--steps 12" in warning
    assert few_checkpoints_warning(tiny_config(tmp_path / "ck", steps=12)) is None


def test_a_refused_run_imports_no_torch_and_leaves_no_tracked_run(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck"
    (ckpt / "step-00000002").mkdir(parents=True)
    root = tmp_path / "offline"
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['trainer', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_module('trainer', run_name='__main__')\n"
        "finally:\n"
        "    print('TORCH', 'torch' in sys.modules, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, *_tiny_args(ckpt)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "POLYAXON_OFFLINE_ROOT": str(root), "PATH": "/usr/bin"},
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 3, result.stderr
    assert "already holds checkpoints (newest step-00000002)" in result.stderr
    assert "TORCH False" in result.stderr
    assert not root.exists() or offline_runs(root) == []


def test_an_offline_run_warns_and_keeps_polyaxon_quiet(tmp_path: Path) -> None:
    root = tmp_path / "offline"
    result = run_trainer(*_tiny_args(tmp_path / "ck"), env={"POLYAXON_OFFLINE_ROOT": str(root)})
    assert result.returncode == 0, result.stderr
    assert len(offline_runs(root)) == 1  # tracked, offline
    assert "warning: --steps 6 with --checkpoint-every 2 makes 3 checkpoint(s)" in result.stderr
    # Polyaxon's INFO chatter does not reach the terminal.
    assert not re.search(r"\bINFO\b", result.stdout + result.stderr), result.stderr


def resident_fraction(path: Path) -> float:
    """The share of ``path``'s pages in the page cache (mincore)."""
    import ctypes
    import mmap
    import os

    size = path.stat().st_size
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        pages = -(-size // mmap.PAGESIZE)
        vec = ctypes.create_string_buffer(pages)
        try:
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw) / pages


def _cached_at_restore(monkeypatch) -> list[float]:
    """Record, each time a restore starts, the share of the checkpoints' bytes cached."""
    from trainer.ckpt import sharded, store

    seen: list[float] = []
    real = sharded.restore

    def spy(directory, *args, **kwargs):
        files = [f for r in store.list_checkpoints(directory) for f in r.path.rglob("*")]
        files = [f for f in files if f.is_file() and f.stat().st_size > 0]
        sizes = [f.stat().st_size for f in files]
        cached = sum(resident_fraction(f) * s for f, s in zip(files, sizes, strict=True))
        seen.append(cached / sum(sizes))
        return real(directory, *args, **kwargs)

    monkeypatch.setattr(sharded, "restore", spy)
    return seen


@pytest.mark.parametrize("fmt", ["raw", "torch", "safetensors", "dcp"])
def test_the_restore_reads_the_checkpoint_from_the_device(tmp_path: Path, monkeypatch, fmt):
    ckpt = tmp_path / "ck"
    seen = _cached_at_restore(monkeypatch)
    train(tiny_config(ckpt, steps=4, format=fmt, restore_check=True), say=lambda _: None)
    train(tiny_config(ckpt, steps=6, format=fmt, resume="always"), say=lambda _: None)
    assert len(seen) == 2 and seen == [0.0, 0.0], seen  # at the end, and on resume


class SlowStep4(LocalFS):
    """Reads of step 4's files take a second longer."""

    def __init__(self) -> None:
        self.slow: set[int] = set()

    def open_read(self, path: Path, direct: bool) -> int:
        fd = super().open_read(path, direct)
        if path.parent.name == "step-00000004":
            self.slow.add(fd)
        return fd

    def preadinto(self, fd: int, buf: memoryview, offset: int) -> int:
        if fd in self.slow:
            self.slow.discard(fd)
            time.sleep(1.0)
        return super().preadinto(fd, buf, offset)

    def close(self, fd: int) -> None:
        self.slow.discard(fd)
        super().close(fd)


def test_a_resume_past_a_corrupt_checkpoint_times_only_the_one_it_loaded(tmp_path: Path):
    ckpt = tmp_path / "ck"
    train(tiny_config(ckpt, steps=4, keep=3), say=lambda _: None)
    flip_byte(ckpt / "step-00000004" / "state.ckpt")
    lines: list[str] = []
    cfg = tiny_config(ckpt, steps=6, keep=3, resume="always")
    resumed = train(cfg, fs=SlowStep4(), say=lines.append)
    assert any("skipping step-00000004" in line for line in lines), lines
    restore = resumed.restore
    assert restore is not None and restore.step == 2
    # The second spent reading the skipped checkpoint is not step 2's restore.
    assert restore.seconds < 1.0, restore
    assert restore.bytes == sum(f.stat().st_size for f in (ckpt / "step-00000002").iterdir())
