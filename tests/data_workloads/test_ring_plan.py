"""The slot ring's size: enough that a worker never waits on itself, no more than the
shuffle itself holds, the loader settings clamped to what the dataset can use, and a ring
that does not fit in memory refused before anything is generated."""

from __future__ import annotations

import itertools
import json
import random
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from data_workloads import dataset as ds
from data_workloads import scan
from data_workloads.errors import ConfigError
from data_workloads.slots import SlotRing

from .helpers import TINY, run_cli

KIB, MIB, GIB = 1024, 1024**2, 1024**3


def _settings(**kw) -> SimpleNamespace:
    base = dict(num_workers=2, batch_size=16, prefetch_factor=2, shuffle_buffer=64)
    return SimpleNamespace(**{**base, **kw})


def _worker_epoch(window: int, batch: int, ahead: int, prefetch: int, samples: int, seed: int):
    """One worker's epoch in a ring of the planned slots, the worst case for them: a read
    places ``ahead`` samples before the first of them is complete, and the queue and the
    consumer hold as many handed-out batches as they can. Fails where the worker would
    wait for a slot (for ever: only its own batches could free one)."""
    slots = scan.batches_being_filled(window, batch, ahead) + prefetch + 1
    ring = SlotRing(1, slots, batch, (8,))
    real_acquire = ring.acquire

    def acquire(worker: int) -> int:
        assert any(not ring.busy(worker, s) for s in range(slots)), "out of slots"
        return real_acquire(worker)

    ring.acquire = acquire  # type: ignore[method-assign]
    assembly = scan.Assembly(ring, 0, scan.window_positions(samples, window, random.Random(seed)))
    handed_out: deque[int] = deque()
    placed: deque[tuple[int, int]] = deque()
    for _ in range(samples):
        while len(placed) < ahead and assembly.arrived < samples:
            batch_, row, _view = assembly.place()
            placed.append((batch_, row))
        for _w, slot, _n in assembly.done(*placed.popleft(), 0):
            handed_out.append(slot)
            if len(handed_out) > prefetch + 1:
                ring.release(0, handed_out.popleft())
    assert assembly.next_out == assembly.batches


@pytest.mark.parametrize(
    ("window", "batch", "ahead"),
    [*itertools.product([1, 5, 13, 64, 200], [1, 4, 16], [1, 2, 9, 30]), (5000, 16, 9)],
)
def test_a_worker_never_runs_out_of_slots(window: int, batch: int, ahead: int) -> None:
    for samples, seed in ((3 * window + 7, 0), (window, 1), (batch * 5 + 1, 2), (40, 3)):
        for prefetch in (1, 2):
            _worker_epoch(window, batch, ahead, prefetch, samples, seed)


def test_the_ring_holds_one_shuffle_window_not_two() -> None:
    # 8 workers, 128 KiB records, a shuffle buffer of 5000: two windows' worth of slots
    # was 10 GB; what the shuffle itself holds is 8 x 5000 x 128 KiB = 5.2 GB.
    spec = ds.DatasetSpec("webdataset", 0, 64 * GIB, 128 * KIB, 16 * MIB)
    plan = scan.ring_plan(spec, _settings(num_workers=8, shuffle_buffer=5000))
    window_bytes = 8 * 5000 * spec.record_bytes
    two_windows = 8 * (-(-(9 + 2 * 5000) // 16) + 1 + 3) * 16 * spec.record_bytes
    assert plan.nbytes < 1.05 * window_bytes < 0.55 * two_windows


@pytest.mark.parametrize(
    "huge",
    [{"batch_size": 10**8}, {"shuffle_buffer": 10**9}, {"prefetch_factor": 10**9}],
)
def test_huge_loader_settings_are_clamped_to_the_dataset(data_dir: Path, huge: dict) -> None:
    # Beyond the dataset each behaves as one its size: the scan runs, its ring that size.
    summary = data_dir / "summary.json"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in huge.items()]
    result = run_cli("scan", "--data-dir", data_dir, "--no-track", *TINY, "--epochs", "1",
                     "--num-workers", "1", "--summary-json", summary, *flags)  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(summary.read_text())
    loader, records = doc["details"]["loader"], doc["outputs"]["dataset_records"]
    assert loader["batch_size"] <= records and loader["shuffle_window"] <= records
    assert loader["prefetch_factor"] <= records
    assert loader["slot_ring_bytes"] < 64 * MIB
    assert doc["config"] == {**doc["config"], **huge}  # the settings asked for are recorded


def test_a_ring_beyond_the_memory_is_refused_before_anything_is_generated(
    data_dir: Path, monkeypatch
) -> None:
    monkeypatch.setattr(scan, "memory_available", lambda: 4 * GIB)
    args = ["--dataset-size", "64GiB", "--record-size", "128KiB", "--num-workers", "8"]
    result = run_cli("scan", "--data-dir", data_dir, "--no-track", *args,
                     "--shuffle-buffer", "5000")  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--shuffle-buffer 5000" in result.output and "of the 4.00 GiB" in result.output
    assert "Traceback" not in result.output
    assert not (data_dir / "webdataset").exists()
    with pytest.raises(ConfigError):
        spec = ds.DatasetSpec("webdataset", 0, 64 * GIB, 128 * KIB, 16 * MIB)
        scan.check_ring_memory(spec, _settings(num_workers=8, shuffle_buffer=5000))
    assert scan.check_ring_memory(spec, _settings(num_workers=8)).nbytes < GIB


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["workspace", "--file-size", "100TiB"], "--file-size must be at most 1073741824"),
        (["workspace", "--files", "10000000000"], "--files must be at most"),
        (["scan", "--record-size", "100TiB", "--dataset-size", "200TiB"],
         "--record-size must be at most"),
    ],
)  # fmt: skip
def test_huge_sizes_are_refused_up_front(data_dir: Path, args: list[str], message: str) -> None:
    result = run_cli(*args, "--data-dir", data_dir, "--no-track")
    assert result.exit_code == 2 and message in result.output, result.output
    assert not data_dir.exists()
