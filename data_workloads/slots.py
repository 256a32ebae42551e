"""A ring of batch slots in shared memory: each DataLoader worker reads records straight into
a preallocated batch, and only the slot's number travels through the DataLoader's queue.

The DataLoader's own transport costs more CPU than reading and decoding the records: a
worker collates every batch into a fresh shared-memory segment (first-touch page faults of
shared memory, 3.5 ms of CPU per 2 MiB batch on the development VM), pickles it, and the
main process receives a file descriptor and maps the segment again. Here every worker owns
``slots`` batches allocated once, before the workers are forked (anonymous ``MAP_SHARED``
memory, so not /dev/shm, whose 64 MiB a container often has), each with a busy flag:

- the worker takes a free slot (flag 0 -> 1; it waits, polling, when all of its slots are
  in use), reads its records into the slot's rows, and yields ``(worker, slot, records)``;
- the main process turns that into tensor views of the slot (no copy) and hands them to the
  consumer; the slot is released (flag -> 0) when the consumer asks for the next batch.

A batch is therefore valid until the next one is requested (as a ring buffer's), which is
how a training loop uses it: copy it to the device, step, ask for the next. Only the worker
sets a flag and only the main process clears it, so a flag needs no lock. At the start of
each epoch a worker frees all of its slots: by then the main process has consumed (or, for
an interrupted epoch, the DataLoader has discarded) everything the worker produced before.
"""

from __future__ import annotations

import math
import mmap
import time

import torch

WAIT_MAX_S = 0.005
"""Longest sleep between two looks at the busy flags while a worker waits for a slot."""


class SlotRing:
    """``workers`` x ``slots`` batches of ``batch_size`` records of ``shape`` (uint8) and
    their labels (int64), in memory shared with the processes forked after it was made.

    Attributes:
        images: (workers, slots, batch_size, *shape) uint8 tensor over the shared memory.
        labels: (workers, slots, batch_size) int64 tensor over the shared memory.
    """

    def __init__(self, workers: int, slots: int, batch_size: int, shape: tuple[int, ...]) -> None:
        if workers < 1 or slots < 1 or batch_size < 1:
            raise ValueError(f"a ring of {workers} x {slots} slots of {batch_size} records")
        self.workers, self.slots, self.batch_size = workers, slots, batch_size
        self.shape = tuple(shape)
        self.record_bytes = math.prod(self.shape)
        self._stride = batch_size * self.record_bytes
        image_bytes = workers * slots * self._stride
        label_bytes = workers * slots * batch_size * 8
        # One anonymous shared mapping (mmap(-1, n) is MAP_SHARED | MAP_ANONYMOUS): the
        # labels (8-byte aligned first), the images, the flags; inherited by forked workers
        # at the same address.
        self._map = mmap.mmap(-1, label_bytes + image_bytes + workers * slots)
        buf = memoryview(self._map)
        self._labels = buf[:label_bytes].cast("q")
        self._images = buf[label_bytes : label_bytes + image_bytes]
        self._flags = buf[label_bytes + image_bytes :]
        self.labels = torch.frombuffer(self._labels, dtype=torch.int64).view(
            workers, slots, batch_size
        )
        self.images = torch.frombuffer(self._images, dtype=torch.uint8).view(
            workers, slots, batch_size, *self.shape
        )
        self._next = [0] * workers
        self._views: list[list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    @property
    def nbytes(self) -> int:
        return len(self._map)

    # ----------------------------------------------------------------------- in a worker

    def acquire(self, worker: int) -> int:
        """A free slot of ``worker``, now marked busy (the next one round the ring; waits
        while all are in use)."""
        base = worker * self.slots
        start = self._next[worker]
        pause = 0.00005
        while True:
            for i in range(self.slots):
                slot = (start + i) % self.slots
                if not self._flags[base + slot]:
                    self._flags[base + slot] = 1
                    self._next[worker] = (slot + 1) % self.slots
                    return slot
            time.sleep(pause)
            pause = min(2 * pause, WAIT_MAX_S)

    def row(self, worker: int, slot: int, index: int) -> memoryview:
        """The writable bytes of record ``index`` of a slot (what a read goes into)."""
        at = ((worker * self.slots + slot) * self.batch_size + index) * self.record_bytes
        return self._images[at : at + self.record_bytes]

    def set_label(self, worker: int, slot: int, index: int, label: int) -> None:
        self._labels[(worker * self.slots + slot) * self.batch_size + index] = label

    def reset(self, worker: int) -> None:
        """Free every slot of ``worker`` (at the start of its epoch)."""
        base = worker * self.slots
        self._flags[base : base + self.slots] = bytes(self.slots)

    # ----------------------------------------------------------------- in the main process

    def busy(self, worker: int, slot: int) -> bool:
        return bool(self._flags[worker * self.slots + slot])

    def release(self, worker: int, slot: int) -> None:
        """The consumer is done with the slot: its worker may fill it again."""
        self._flags[worker * self.slots + slot] = 0

    def batch(self, worker: int, slot: int, records: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``records`` images and labels of a slot: views, valid until the slot
        is released."""
        if self._views is None:  # made once: indexing a tensor costs more than the rest
            self._views = [
                [(self.images[w, s], self.labels[w, s]) for s in range(self.slots)]
                for w in range(self.workers)
            ]
        images, labels = self._views[worker][slot]
        if records == self.batch_size:
            return images, labels
        return images[:records], labels[:records]
