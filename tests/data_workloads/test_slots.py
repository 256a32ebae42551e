"""The slot ring: batches read straight into shared memory and handed out as views, each
slot busy from the moment its worker takes it until the consumer asks for the next batch,
reused across batches, workers and epochs without one batch overwriting another."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import pytest
import torch

from data_workloads import dataset as ds
from data_workloads import scan
from data_workloads.slots import SlotRing

from .helpers import epoch_records, image_bytes, prepared, records_by_image


def test_a_row_is_the_memory_of_the_batch_tensor() -> None:
    ring = SlotRing(workers=2, slots=3, batch_size=4, shape=(3, 2, 2))
    assert ring.images.shape == (2, 3, 4, 3, 2, 2) and ring.labels.shape == (2, 3, 4)
    assert ring.nbytes >= ring.images.numel() + 8 * ring.labels.numel() + 6
    ring.row(1, 2, 3)[:] = bytes(range(12))
    ring.set_label(1, 2, 3, 977)
    images, labels = ring.batch(1, 2, 4)
    assert images[3].flatten().tolist() == list(range(12)) and labels[3] == 977
    assert ring.images[1, 2, :3].count_nonzero() == 0 and ring.images[0].count_nonzero() == 0
    # A view of the slot, not a copy.
    images[3, 0, 0, 0] = 99
    assert ring.row(1, 2, 3)[0] == 99
    assert ring.batch(0, 0, 2)[0].shape == (2, 3, 2, 2)


def test_acquire_goes_round_the_ring_and_skips_busy_slots() -> None:
    ring = SlotRing(workers=2, slots=3, batch_size=1, shape=(1,))
    assert [ring.acquire(0) for _ in range(3)] == [0, 1, 2]
    assert all(ring.busy(0, s) for s in range(3)) and not ring.busy(1, 0)
    ring.release(0, 1)
    assert ring.acquire(0) == 1  # the only free one
    assert ring.acquire(1) == 0  # another worker's slots are its own
    ring.reset(0)
    assert not any(ring.busy(0, s) for s in range(3)) and ring.busy(1, 0)


def test_a_worker_waits_for_a_slot_until_the_consumer_releases_one() -> None:
    ring = SlotRing(workers=1, slots=2, batch_size=1, shape=(1,))
    ring.acquire(0), ring.acquire(0)
    releaser = threading.Timer(0.2, ring.release, args=(0, 1))
    releaser.start()
    start = time.monotonic()
    assert ring.acquire(0) == 1
    assert time.monotonic() - start >= 0.15
    releaser.join()


def _fill_in_child(ring: SlotRing) -> None:
    slot = ring.acquire(0)  # slot 0; then waits for the parent to release it
    ring.row(0, slot, 0)[:] = b"\x07" * ring.record_bytes
    ring.set_label(0, slot, 0, 5)
    assert ring.acquire(0) == 1
    assert ring.acquire(0) == 0  # released by the parent meanwhile
    ring.row(0, 0, 0)[:] = b"\x09" * ring.record_bytes


def test_the_memory_and_the_flags_are_shared_with_a_forked_worker() -> None:
    ring = SlotRing(workers=1, slots=2, batch_size=1, shape=(8,))
    child = multiprocessing.get_context("fork").Process(target=_fill_in_child, args=(ring,))
    child.start()
    deadline = time.monotonic() + 30
    while not ring.busy(0, 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    images, labels = ring.batch(0, 0, 1)
    assert image_bytes(images[0]) == b"\x07" * 8 and labels.tolist() == [5]
    ring.release(0, 0)  # the child's third acquire gets slot 0 back
    child.join(30)
    assert child.exitcode == 0
    assert image_bytes(ring.images[0, 0, 0]) == b"\x09" * 8


def test_bad_rings_are_refused() -> None:
    with pytest.raises(ValueError, match="a ring of 0 x 2"):
        SlotRing(workers=0, slots=2, batch_size=1, shape=(1,))


def slot_of(ring: SlotRing, images: torch.Tensor) -> tuple[int, int]:
    """(worker, slot) of a batch handed out by the loader, from its address in the ring."""
    offset = images.data_ptr() - ring.images.data_ptr()
    index, within = divmod(offset, ring.batch_size * ring.record_bytes)
    assert within == 0
    return divmod(index, ring.slots)


@pytest.mark.parametrize("fmt", ["webdataset", "files"])
def test_slots_are_reused_across_epochs_and_workers_without_corruption(
    data_dir: Path, fmt: str
) -> None:
    data, cfg = prepared(data_dir, fmt, num_workers=2, batch_size=4)
    by_image = records_by_image(data)
    with scan.ScanLoader(data, cfg) as loader:
        ring = loader.ring
        seen: list[tuple[int, int]] = []
        for epoch in range(3):
            records: list[int] = []
            for images, labels in loader.epoch(epoch):
                worker, slot = slot_of(ring, images)
                assert ring.busy(worker, slot)  # held while the consumer has it
                seen.append((worker, slot))
                for image, label in zip(images, labels.tolist(), strict=True):
                    index = by_image[ds.crc32(image_bytes(image))]
                    assert label == ds.record(data.spec, index)[0]
                    records.append(index)
            assert sorted(records) == list(range(data.records))
    assert {w for w, _ in seen} == {0, 1}  # both workers' slots
    # About 18 batches an epoch through 2 x ring.slots slots: each slot served several.
    assert len(set(seen)) <= 2 * ring.slots < len(seen)


def test_a_held_batch_is_not_overwritten_while_the_workers_go_on(data_dir: Path) -> None:
    data, cfg = prepared(data_dir, "files", num_workers=2, batch_size=4)
    with scan.ScanLoader(data, cfg) as loader:
        batches = loader.epoch(0)
        images, labels = next(batches)
        before = (image_bytes(images), labels.tolist())
        time.sleep(0.5)  # the workers fill every other slot they have meanwhile
        assert (image_bytes(images), labels.tolist()) == before
        assert sorted([*epoch_records(loader, data, 1)]) == list(range(data.records))
