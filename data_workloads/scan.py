"""The scan workload: read the dataset the way a training input pipeline does.

A real ``torch.utils.data.DataLoader`` with persistent worker processes, a fresh shuffle
order each epoch, every record decoded into a tensor. The main process plays the
accelerator: it takes a batch, then "computes" for ``compute_ms`` (a sleep: an accelerator
step costs the host no CPU), as MLPerf Storage emulates training. Accelerator utilization
(AU) is compute time / wall time of the epoch; MLPerf counts a storage system as enough
when AU ≥ 90 %.

The batches are made inside the dataset (an ``IterableDataset`` that yields whole batches,
``batch_size=None`` in the DataLoader): each worker reads its records straight into a batch
slot of a :class:`~data_workloads.slots.SlotRing` in shared memory and only the slot's
number goes through the DataLoader's queue, so a batch is neither collated into a fresh
segment nor pickled (what cost most of the loader's CPU before).

The page cache is kept out with ``posix_fadvise(DONTNEED)`` on every file before each
epoch, and that it worked is measured, not assumed: the bytes the epoch read from the block
device (this process's ``ru_inblock`` and each worker's ``read_bytes`` in
``/proc/<pid>/io``, read while the persistent workers live) must cover the dataset.
"""

from __future__ import annotations

import mmap
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from checkpoint_storage_bench.contract import (
    DATA_SUMMARY_EPOCH,
    DATA_SUMMARY_EPOCHS,
    SCAN_AU,
    SCAN_AU_OK,
    SCAN_CACHE_KEPT_OUT,
    SCAN_EPOCH_S,
    SCAN_FIRST_BATCH_S,
    SCAN_MBPS,
    SCAN_SAMPLES_PER_S,
    SCAN_WAIT_P50_MS,
    SCAN_WAIT_P99_MS,
    scan_epoch_field,
)
from checkpoint_storage_bench.units import format_bytes
from data_workloads import dataset as ds
from data_workloads import formats
from data_workloads.errors import ConfigError, DatasetCorruptError
from data_workloads.slots import SlotRing
from data_workloads.stats import (
    NOTHING,
    Usage,
    block_reads_counted,
    median,
    memory_available,
    own_usage,
    percentile,
    process_usage,
)

CACHE_COVERAGE = 0.9
"""An epoch whose device reads cover this share of the dataset read it from the volume."""

Descriptor = tuple[int, int, int]
"""What a worker yields for a batch: (worker, slot, records)."""


def _ignore_stop_signals(_worker_id: int) -> None:
    """A worker's init: SIGTERM and SIGINT are the main process's to act on. It stops the
    workers through the DataLoader when it is stopped; a worker that died of the signal
    itself (torch's worker handler re-raises a SIGTERM not sent by its parent) would be
    reported by torch as a failed worker in the middle of that cleanup. A module-level
    function, as the DataLoader's hooks must be."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def worker_options(num_workers: int, prefetch: int) -> dict[str, Any]:
    """The DataLoader's worker settings every scan loader uses (none without workers): fork,
    so the workers inherit what the loader mapped (ours: the ring's anonymous shared
    mapping, nothing of it pickled); persistent, so they are set up once; the stop signals
    left to the main process."""
    if not num_workers:
        return {}
    return dict(
        prefetch_factor=prefetch,
        persistent_workers=True,
        multiprocessing_context="fork",
        worker_init_fn=_ignore_stop_signals,
    )


def _as_is(batch: Descriptor) -> Descriptor:
    """The DataLoader's collate_fn: a descriptor travels as it is (a module-level function,
    so that it pickles)."""
    return batch


def _order_seed(seed: int, epoch: int) -> int:
    return seed * 7919 + epoch


class BatchSource(IterableDataset):
    """Batches made inside the dataset, into the slots of ``ring``: each worker yields
    ``(worker, slot, records)`` for every batch it has filled, in its order.

    The epoch and the workers' pids live in shared memory (``mmap(-1, n)``: shared with the
    workers forked after it was made), so that persistent workers see the main process set
    the epoch, and the main process can read their CPU and I/O counters while they live.
    """

    def __init__(self, ring: SlotRing, seed: int) -> None:
        self.ring = ring
        self.seed = seed
        self._control = mmap.mmap(-1, 8 * (1 + ring.workers))
        self._shared = memoryview(self._control).cast("q")  # [epoch, pid of each worker]

    @property
    def epoch(self) -> int:
        return self._shared[0]

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._shared[0] = value

    def pids(self) -> list[int]:
        """The workers that have started an epoch (their pids; none without workers)."""
        return [pid for pid in self._shared[1:] if pid]

    def __iter__(self) -> Iterator[Descriptor]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        if info is not None:
            self._shared[1 + worker] = os.getpid()
        # Whatever this worker produced before has been consumed, or discarded by the
        # DataLoader (an interrupted epoch): every slot of the worker is free again.
        self.ring.reset(worker)
        return self.batches(worker, workers, self.epoch)

    def batches(self, worker: int, workers: int, epoch: int) -> Iterator[Descriptor]:
        raise NotImplementedError


class FileBatches(BatchSource):
    """The ``files`` format: one record per file, in a random order fixed by the seed and
    the epoch (the permutation a shuffling sampler draws), cut into batches; batch ``k``
    is read by worker ``k mod workers``, so that the DataLoader, taking the workers' batches
    in turn, hands them out in that order."""

    def __init__(self, data: ds.Dataset, ring: SlotRing, seed: int) -> None:
        super().__init__(ring, seed)
        self.paths = tuple(str(p) for p in data.files)
        self.sizes = data.sizes
        self.codec = data.spec.codec

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(_order_seed(self.seed, epoch))
        return torch.randperm(len(self.paths), generator=generator).tolist()

    def batches(self, worker: int, workers: int, epoch: int) -> Iterator[Descriptor]:
        ring, size = self.ring, self.ring.batch_size
        order = self.order(epoch)
        scratch = bytearray(64 * 1024)
        for first in range(worker * size, len(order), workers * size):
            slot = ring.acquire(worker)
            chosen = order[first : first + size]
            for row, index in enumerate(chosen):
                path = self.paths[index]
                try:
                    label = ds.read_file_record_into(
                        path,
                        self.sizes[index],
                        ring.row(worker, slot, row),
                        ring.shape,
                        self.codec,
                        scratch,
                    )
                except ValueError as exc:
                    raise DatasetCorruptError(f"record {path}: {exc}") from None
                ring.set_label(worker, slot, row, label)
            yield worker, slot, len(chosen)


def window_positions(samples: int, window: int, rng: random.Random) -> list[int]:
    """Where each of ``samples`` arriving samples goes in the output: a random permutation
    within each window of ``window`` consecutive samples (so each sample's place is known
    when it arrives, and it is read straight into its batch).

    >>> sorted(window_positions(10, 4, random.Random(0)))
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    positions: list[int] = []
    for start in range(0, samples, window):
        block = list(range(start, min(start + window, samples)))
        rng.shuffle(block)
        positions += block
    return positions


class Assembly:
    """A worker's epoch of samples put together into batches: where each arriving sample
    goes (its window's place: a batch, taking the batch's slot when its first sample comes,
    and a row), and each batch handed out once all of its samples are in, in order."""

    def __init__(self, ring: SlotRing, worker: int, positions: list[int]) -> None:
        self.ring, self.worker, self.positions = ring, worker, positions
        size = ring.batch_size
        self.batches = -(-len(positions) // size)
        self.wanted = [min(size, len(positions) - b * size) for b in range(self.batches)]
        self.filled = [0] * self.batches
        self.slots: dict[int, int] = {}  # batch -> its slot, until handed out
        self.arrived = self.next_out = 0

    def place(self) -> tuple[int, int, memoryview]:
        """(batch, row, the row's bytes) of the next sample to arrive.

        Raises:
            ValueError: More samples arrive than the shards should hold.
        """
        if self.arrived == len(self.positions):
            raise ValueError(f"more samples than the {len(self.positions)} expected")
        batch, row = divmod(self.positions[self.arrived], self.ring.batch_size)
        self.arrived += 1
        if batch not in self.slots:
            self.slots[batch] = self.ring.acquire(self.worker)
        return batch, row, self.ring.row(self.worker, self.slots[batch], row)

    def done(self, batch: int, row: int, label: int) -> Iterator[Descriptor]:
        """A sample is in: its label recorded, and every batch now complete handed out."""
        self.ring.set_label(self.worker, self.slots[batch], row, label)
        self.filled[batch] += 1
        while self.next_out < self.batches and (
            self.filled[self.next_out] == self.wanted[self.next_out]
        ):
            yield self.worker, self.slots.pop(self.next_out), self.wanted[self.next_out]
            self.next_out += 1


class ShardBatches(BatchSource):
    """A format of shards read as WebDataset reads its own: the shards shuffled and dealt
    to the workers, each shard read front to back, its samples shuffled within windows of
    ``window`` samples, each sample's image read into its batch's slot (a batch is handed
    out once all of its samples are in)."""

    def __init__(
        self, data: ds.Dataset, ring: SlotRing, seed: int, window: int,
        paths: list[Path], counts: list[int],
    ) -> None:  # fmt: skip
        super().__init__(ring, seed)
        self.paths = tuple(str(p) for p in paths)
        size_of = dict(zip(data.files, data.sizes, strict=True))
        self.sizes = tuple(size_of[p] for p in paths)
        self.counts = tuple(counts)
        self.window = window
        self.codec = data.spec.codec

    def shards(self, worker: int, workers: int, epoch: int) -> list[int]:
        order = list(range(len(self.paths)))
        random.Random(_order_seed(self.seed, epoch)).shuffle(order)
        return order[worker::workers]

    def batches(self, worker: int, workers: int, epoch: int) -> Iterator[Descriptor]:
        mine = self.shards(worker, workers, epoch)
        samples = sum(self.counts[i] for i in mine)
        rng = random.Random(_order_seed(self.seed, epoch) * 131 + worker)
        batches = Assembly(self.ring, worker, window_positions(samples, self.window, rng))
        for shard in mine:
            path = self.paths[shard]
            at: list[str | None] = [None]  # the sample being read, named in an error
            try:
                yield from self.read_shard(shard, batches, at)
            except ValueError as exc:
                where = f"{path} (at record {at[0]})" if at[0] else path
                raise DatasetCorruptError(f"{where}: {exc}") from None
        if batches.arrived != samples:
            raise DatasetCorruptError(
                f"the shards {', '.join(self.paths[i] for i in mine)} hold {batches.arrived} "
                f"samples, the manifest {samples}"
            )

    def read_shard(
        self, shard: int, batches: Assembly, at: list[str | None]
    ) -> Iterator[Descriptor]:
        raise NotImplementedError


class TarBatches(ShardBatches):
    """The ``webdataset`` format as WebDataset reads it: each shard streamed in order in
    1 MiB reads.

    Uncompressed records (codec ``none``) are read where they belong
    (:class:`~data_workloads.dataset.PlacedShard`: each 1 MiB read scatters into the batch
    rows); compressed ones (and records too small for that: more than ``IOV_MAX`` pieces a
    read) through :class:`~data_workloads.dataset.TarStream`, copied from its read buffer
    or inflated into their rows."""

    def __init__(self, data: ds.Dataset, ring: SlotRing, seed: int, window: int) -> None:
        per_shard = data.spec.records_per_shard
        counts = [min(per_shard, data.records - i * per_shard) for i in range(len(data.files))]
        super().__init__(data, ring, seed, window, list(data.files), counts)
        self.payload_ext = ds.PAYLOAD_EXT[self.codec]
        self.placed = self.codec == "none" and pieces_per_read(ring.record_bytes) <= IOV_MAX
        self._staging: memoryview | None = None

    def read_shard(
        self, shard: int, batches: Assembly, at: list[str | None]
    ) -> Iterator[Descriptor]:
        if self.placed:
            return self._placed(shard, batches, at)
        if self._staging is None:
            self._staging = memoryview(bytearray(2 * ds.READ_CHUNK))
        return self._streamed(shard, batches, self._staging, at)

    def _placed(self, shard: int, batches: Assembly, at: list[str | None]) -> Iterator[Descriptor]:
        shape, rows = self.ring.shape, {}

        def place(j: int) -> memoryview:
            rows[j] = batches.place()
            return rows[j][2]

        reader = ds.PlacedShard(
            self.paths[shard], self.sizes[shard], self.counts[shard], self.ring.record_bytes
        )
        for j, key, header in reader.read(place):
            at[0] = key
            batch, row, image = rows.pop(j)
            yield from batches.done(batch, row, ds.decode_into(header, image, shape, "none"))

    def _streamed(
        self, shard: int, batches: Assembly, staging: memoryview, at: list[str | None]
    ) -> Iterator[Descriptor]:
        shape = self.ring.shape
        pending: dict[str, list[Any]] = {}  # key -> [batch, row, image, header, payload]
        with open(ds.open_data_file(self.paths[shard]), "rb", buffering=0) as f:
            stream = ds.TarStream(f.readinto, staging)
            for name, member_size in stream.members():
                key, _, ext = name.partition(".")
                at[0] = key
                sample = pending.get(key)
                if sample is None:
                    sample = pending[key] = [*batches.place(), None, None]
                if ext == ds.HEADER_EXT:
                    sample[3] = bytes(stream.read())
                elif ext == self.payload_ext and self.codec == "none":
                    if member_size != len(sample[2]):
                        raise ValueError(f"payload of {member_size} bytes for shape {shape}")
                    stream.take(sample[2])
                    sample[4] = True
                elif ext == self.payload_ext:
                    sample[4] = stream.read()
                else:
                    continue  # another member of the sample: not read
                if sample[3] is None or sample[4] is None:
                    continue
                del pending[key]
                batch, row, image, header, payload = sample
                compressed = None if payload is True else payload
                label = ds.decode_into(header, image, shape, self.codec, compressed)
                yield from batches.done(batch, row, label)
        if pending:
            raise ValueError(f"incomplete samples: {', '.join(sorted(pending))}")


IOV_MAX = 1024
"""Buffers one ``preadv`` may take (Linux)."""


def scattered_read(fd: int, buffers: Iterator[memoryview], size: int) -> Iterator[int]:
    """Read a file of ``size`` bytes front to back into ``buffers`` (consecutive: each
    takes the bytes after the previous one's, all of the file between them), in ``preadv``
    calls of at most :data:`~data_workloads.dataset.READ_CHUNK` bytes and ``IOV_MAX``
    buffers; yields the offset reached after each call. A buffer is asked for only when
    the call its first byte is in is built, so a caller that places a record in a batch
    when its buffer is asked for places no more records than one read reaches.

    Raises:
        ValueError: The file ends before its ``size`` bytes.
    """
    current: memoryview | None = None
    within = pos = 0
    while pos < size:
        pieces: list[memoryview] = []
        n = 0
        while n < ds.READ_CHUNK and len(pieces) < IOV_MAX and pos + n < size:
            if current is None:
                current = next(buffers, None)
                within = 0
                if current is None:
                    raise ValueError(f"the buffers cover {pos + n} of the file's {size} bytes")
            take = min(len(current) - within, ds.READ_CHUNK - n)
            pieces.append(current[within : within + take])
            n += take
            within += take
            if within == len(current):
                current = None
        got = os.preadv(fd, pieces, pos)
        if got != n:
            raise ValueError(f"the file is truncated: {pos + got} of {size} bytes")
        pos += n
        yield pos


class MdsBatches(ShardBatches):
    """The ``mds`` format read by us: a shard's offsets from its first bytes, then the
    shard front to back in 1 MiB ``preadv`` calls that put each uncompressed sample's
    image straight into its row of a batch (its column sizes and the other columns into
    small buffers, verified afterwards); a compressed sample is read whole and inflated
    into its row."""

    def __init__(self, data: ds.Dataset, ring: SlotRing, seed: int, window: int) -> None:
        shards = [p for p in data.files if p.suffix == formats.MDS_SHARD_SUFFIX]
        counts = formats.mds_counts(data.root)
        if len(counts) != len(shards):
            raise DatasetCorruptError(
                f"{data.root}: {len(shards)} shards, its {formats.MDS_INDEX} {len(counts)}"
            )
        super().__init__(data, ring, seed, window, shards, counts)
        self.placed = self.codec == "none"

    def read_shard(
        self, shard: int, batches: Assembly, at: list[str | None]
    ) -> Iterator[Descriptor]:
        size, samples = self.sizes[shard], self.counts[shard]
        shape, record_bytes = self.ring.shape, self.ring.record_bytes
        prefix = formats.MDS_PREFIX.size
        fd = ds.open_data_file(self.paths[shard])
        try:
            head = bytearray(min(size, 4 * (samples + 2)))
            os.preadv(fd, [head], 0)
            offsets = formats.mds_offsets(head, samples, size)
            rows: dict[int, tuple[int, int, memoryview]] = {}
            parts: dict[int, list[memoryview]] = {}

            def buffers() -> Iterator[memoryview]:
                yield memoryview(bytearray(offsets[0]))  # the count, offsets and config
                for j in range(samples):
                    length = offsets[j + 1] - offsets[j]
                    if not self.placed:
                        parts[j] = [memoryview(bytearray(length))]
                        yield parts[j][0]
                        continue
                    rest = length - prefix - record_bytes
                    if rest < 0:
                        raise ValueError(f"a sample of {length} bytes holds no image")
                    rows[j] = batches.place()
                    parts[j] = [memoryview(bytearray(prefix)), memoryview(bytearray(rest))]
                    yield parts[j][0]
                    yield rows[j][2]
                    yield parts[j][1]

            done = 0
            for reached in scattered_read(fd, buffers(), size):
                while done < samples and offsets[done + 1] <= reached:
                    yield from self._sample(done, rows, parts, batches, shape, at)
                    done += 1
        finally:
            os.close(fd)

    def _sample(
        self, j: int, rows: dict[int, tuple[int, int, memoryview]],
        parts: dict[int, list[memoryview]], batches: Assembly, shape: tuple[int, ...],
        at: list[str | None],
    ) -> Iterator[Descriptor]:  # fmt: skip
        pieces = parts.pop(j)
        if not self.placed:
            key, header, payload, _label = formats.mds_sample(pieces[0])
            at[0] = key
            batch, row, image = batches.place()
            label = ds.decode_into(header, image, shape, self.codec, payload)
            yield from batches.done(batch, row, label)
            return
        image_bytes, key_bytes, meta_bytes = formats.MDS_PREFIX.unpack(pieces[0])
        tail = pieces[1]
        if image_bytes != len(rows[j][2]) or (
            key_bytes + formats.MDS_LABEL_BYTES + meta_bytes != len(tail)
        ):
            raise ValueError(
                f"sample {j} has columns of {image_bytes}, {key_bytes} and {meta_bytes} bytes "
                f"in {len(rows[j][2]) + len(tail)}"
            )
        at[0] = bytes(tail[:key_bytes]).decode()
        batch, row, image = rows.pop(j)
        header = bytes(tail[key_bytes + formats.MDS_LABEL_BYTES :])
        yield from batches.done(batch, row, ds.decode_into(header, image, shape, "none"))


class ParquetBatches(ShardBatches):
    """The ``parquet`` format read by us: each file's row groups read by pyarrow (one
    thread: the workers are the parallelism), every image copied from the column's buffer
    straight into its row of a batch (inflated into it for ``zlib``), not made into Python
    objects nor collated."""

    def __init__(self, data: ds.Dataset, ring: SlotRing, seed: int, window: int) -> None:
        per_file = data.spec.records_per_shard
        counts = [min(per_file, data.records - i * per_file) for i in range(len(data.files))]
        super().__init__(data, ring, seed, window, list(data.files), counts)
        self._pq = formats.pyarrow_modules("--dataset-format parquet")[1]

    def read_shard(
        self, shard: int, batches: Assembly, at: list[str | None]
    ) -> Iterator[Descriptor]:
        path, shape = self.paths[shard], self.ring.shape
        try:
            reader = self._pq.ParquetFile(path, memory_map=False)
        except FileNotFoundError:
            raise ds.gone(path) from None
        if reader.metadata.num_rows != self.counts[shard]:
            raise ValueError(f"{reader.metadata.num_rows} rows, the manifest {self.counts[shard]}")
        for group in range(reader.num_row_groups):
            table = reader.read_row_group(group, columns=["image", "meta"], use_threads=False)
            metas = table.column("meta").to_pylist()
            k = 0
            for chunk in table.column("image").chunks:
                _validity, offsets_buf, data_buf = chunk.buffers()
                offsets = memoryview(offsets_buf).cast("i")[chunk.offset :]
                data = memoryview(data_buf).cast("B")
                for i in range(len(chunk)):
                    payload = data[offsets[i] : offsets[i + 1]]
                    batch, row, image = batches.place()
                    if self.codec == "none":
                        if len(payload) != len(image):
                            raise ValueError(f"an image of {len(payload)} bytes for {shape}")
                        image[:] = payload
                        label = ds.decode_into(metas[k], image, shape, "none")
                    else:
                        label = ds.decode_into(metas[k], image, shape, self.codec, payload)
                    k += 1
                    yield from batches.done(batch, row, label)


def pieces_per_read(record_bytes: int) -> int:
    """At most how many buffers a 1 MiB read of a shard scatters into (three per sample:
    its headers, its image, its padding)."""
    return 3 * (ds.READ_CHUNK // ds.sample_span(record_bytes) + 2) + 1


def samples_ahead(record_bytes: int, placed: bool) -> int:
    """At most how many samples have their place taken before they are complete: those a
    1 MiB read reaches into (placed), or the one being read (streamed); never more than a
    shard holds (a shard is complete before the next is read)."""
    return ds.READ_CHUNK // ds.sample_span(record_bytes) + 2 if placed else 1


def mds_samples_ahead(record_bytes: int) -> int:
    """At most how many uncompressed MDS samples one :func:`scattered_read` call places
    (each takes its image and at least the column sizes; three buffers a sample)."""
    per_read = ds.READ_CHUNK // (record_bytes + formats.MDS_PREFIX.size) + 2
    return min(per_read, IOV_MAX // 3 + 2)


MEMORY_SHARE = 0.5
"""The most of the memory available to the run that the slot ring may take (the rest is the
workers', torch's and the page cache's)."""


@dataclass(frozen=True)
class RingPlan:
    """The slot ring a scan needs, and the loader settings as they take effect: a batch, a
    shuffle window or a prefetch larger than the dataset behaves as one its size, so each
    is clamped to it (the settings asked for are the run's config).

    Attributes:
        workers: Workers the ring has slots for (one without worker processes).
        slots: Slots per worker.
        batch_size: Records per batch (at most the dataset's records).
        window: ``webdataset``: the shuffle window (at most the samples a worker reads).
        prefetch: Batches each worker loads ahead (at most the batches of an epoch).
        record_bytes: Bytes of one record's image.
        placed: ``webdataset``: the records are read into place (else streamed).
    """

    workers: int
    slots: int
    batch_size: int
    window: int
    prefetch: int
    record_bytes: int
    placed: bool

    @property
    def nbytes(self) -> int:
        """What :class:`~data_workloads.slots.SlotRing` maps for it."""
        per_slot = self.batch_size * (self.record_bytes + 8) + 1
        return self.workers * self.slots * per_slot


def batches_being_filled(window: int, batch: int, ahead: int) -> int:
    """At most how many of a worker's batches have a slot before they are complete, with
    its samples shuffled in windows of ``window`` and placed up to ``ahead`` samples past
    the last complete one: the batches of the window the first incomplete sample is in
    (every earlier window is complete, and its batches handed out in order), and at most
    one more for each sample placed beyond that window; never more than the batches of the
    windows those samples can be in. About the window itself (what a shuffle buffer of
    that many samples holds), not two windows.

    >>> batches_being_filled(5000, 16, 9)
    323
    """
    within = -(-window // batch) + 1
    return min(within + ahead, -(-(ahead + 2 * window) // batch) + 1)


def ring_plan(spec: ds.DatasetSpec, cfg: Any) -> RingPlan:
    """The ring of a scan of ``spec`` with ``cfg``'s loader settings (nothing allocated)."""
    records, record_bytes = spec.records, spec.record_bytes
    batch = min(cfg.batch_size, records)
    prefetch = min(cfg.prefetch_factor, -(-records // batch))
    placed = False
    window = 0
    if spec.format in ds.SHARDED:
        shards = -(-records // spec.records_per_shard)
        per_worker = min(records, -(-shards // max(1, cfg.num_workers)) * spec.records_per_shard)
        if spec.format == "webdataset":
            placed = spec.codec == "none" and pieces_per_read(record_bytes) <= IOV_MAX
            ahead = min(samples_ahead(record_bytes, placed), spec.records_per_shard)
        elif spec.format == "mds":
            # The writer fills shards by bytes on the volume: how many records a worker gets
            # is the index's, so the window is bounded by the whole dataset instead.
            per_worker = records
            placed = spec.codec == "none"
            ahead = mds_samples_ahead(record_bytes) if placed else 1
        else:  # parquet: each record placed, copied and done before the next
            ahead = 1
        window = min(cfg.shuffle_buffer, per_worker)
        being_filled = batches_being_filled(window, batch, ahead)
    else:
        being_filled = 1
    # Being filled, waiting in the queue (prefetch per worker), and held by the consumer:
    # a worker then never waits for a slot while the queue has room.
    queued = prefetch if cfg.num_workers else 0
    return RingPlan(
        workers=max(1, cfg.num_workers),
        slots=being_filled + queued + 1,
        batch_size=batch,
        window=window,
        prefetch=prefetch,
        record_bytes=record_bytes,
        placed=placed,
    )


def check_ring_memory(spec: ds.DatasetSpec, cfg: Any) -> RingPlan:
    """The scan's ring, refused before anything is generated or read when it would take
    more than :data:`MEMORY_SHARE` of the memory available to the run.

    Raises:
        ConfigError: It does not fit (exit 2), naming the settings that size it.
    """
    plan = ring_plan(spec, cfg)
    available = memory_available()
    if available is not None and plan.nbytes > MEMORY_SHARE * available:
        shuffle = (
            f"; --shuffle-buffer {cfg.shuffle_buffer} keeps that many records of each worker in it"
            if spec.format in ds.SHARDED
            else ""
        )
        raise ConfigError(
            f"the scan's batch slots would take {format_bytes(plan.nbytes)} ({plan.workers} "
            f"workers x {plan.slots} slots x {plan.batch_size} records of "
            f"{format_bytes(plan.record_bytes)}{shuffle}), more than "
            f"{MEMORY_SHARE:.0%} of the {format_bytes(available)} of memory available; lower "
            "--shuffle-buffer, --batch-size, --prefetch-factor or --num-workers"
        )
    return plan


class ScanLoader:
    """The scan's DataLoader: batches made in the dataset into a slot ring, persistent
    workers (started by the first epoch, kept for the others), one epoch per
    :meth:`epoch`; :meth:`usage` is what the main process and the workers have cost so far.
    Close it (or use it as a context manager) to stop the workers."""

    def __init__(self, data: ds.Dataset, cfg: Any) -> None:
        side = data.spec.side
        self.plan = plan = ring_plan(data.spec, cfg)
        self.ring = SlotRing(plan.workers, plan.slots, plan.batch_size, (3, side, side))
        self.source: BatchSource
        sources = {"webdataset": TarBatches, "mds": MdsBatches, "parquet": ParquetBatches}
        if data.spec.format in sources:
            self.source = sources[data.spec.format](data, self.ring, cfg.seed, plan.window)
        else:
            self.source = FileBatches(data, self.ring, cfg.seed)
        extra = worker_options(cfg.num_workers, plan.prefetch)
        self.loader: DataLoader | None = DataLoader(
            self.source, batch_size=None, collate_fn=_as_is, num_workers=cfg.num_workers, **extra
        )
        self._active: Iterator[Any] | None = None

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's batches, ``(images, labels)``: views of a slot, valid until the next
        batch is asked for (a consumer that keeps one copies it)."""
        if self.loader is None:
            raise RuntimeError("the loader is closed")
        if self._active is not None:
            self._active.close()  # releases the slot the consumer held
        self.source.epoch = epoch
        self._active = self._batches(self.loader)
        return self._active

    def _batches(self, loader: DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        ring = self.ring
        held: tuple[int, int] | None = None
        descriptors = _translated(iter(loader))
        try:
            while True:
                if held is not None:  # the consumer asks for the next: done with this one
                    ring.release(*held)
                    held = None
                descriptor = next(descriptors, None)
                if descriptor is None:
                    return
                worker, slot, records = descriptor
                held = worker, slot
                yield ring.batch(worker, slot, records)
        finally:
            if held is not None:
                ring.release(*held)

    def usage(self) -> dict[int, Usage]:
        """CPU and block reads so far, per process: 0 for this one, each worker by pid."""
        return {0: own_usage(), **{pid: process_usage(pid) for pid in self.source.pids()}}

    def details(self, cfg: Any) -> dict[str, Any]:
        """The summary's ``details.loader``: how the batches were made, and the settings
        as they took effect (each at most what the dataset can use)."""
        plan = self.plan
        return {
            "library": "ours",
            "version": None,
            "batches_in_dataset": True,
            "persistent_workers": bool(cfg.num_workers),
            "slot_ring_bytes": self.ring.nbytes,
            "batch_size": plan.batch_size,
            "shuffle_window": plan.window or None,
            "prefetch_factor": plan.prefetch,
        }

    def close(self) -> None:
        """Stop the workers (joined: nothing is left running)."""
        if self._active is not None:
            self._active.close()
            self._active = None
        loader, self.loader = self.loader, None
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:
            # Persistent workers stop when their iterator is shut down; torch has no
            # public call for it (its __del__ does the same).
            iterator._shutdown_workers()

    def __enter__(self) -> ScanLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _translated(batches: Iterator[Descriptor]) -> Iterator[Descriptor]:
    """The loader's descriptors; a record that fails to decode in a worker is the dataset's
    error with its own message (the DataLoader wraps it in the worker's traceback)."""
    try:
        yield from batches
    except DatasetCorruptError as exc:
        last = str(exc.message).strip().splitlines()[-1]
        raise DatasetCorruptError(last.split("DatasetCorruptError: ", 1)[-1]) from None


def spent(before: dict[int, Usage], after: dict[int, Usage]) -> Usage:
    """What the processes cost between two :meth:`ScanLoader.usage` readings (a worker
    started in between counts from zero: its counters start at its fork)."""
    total = NOTHING
    for pid, usage in after.items():
        total = total + (usage - before.get(pid, NOTHING))
    return total


def open_loader(data: ds.Dataset, cfg: Any) -> Any:
    """The scan's loader: ours, or the team's library (:mod:`data_workloads.loaders`); both
    have ``epoch``, ``usage``, ``details`` and ``close``."""
    name = getattr(cfg, "loader", "ours")
    if name == "ours":
        return ScanLoader(data, cfg)
    from data_workloads.loaders import library_loader

    return library_loader(name, data, cfg)


# An epoch's fields in the summary that the run's figures are made of.
EPOCH_S, FIRST_BATCH_S = scan_epoch_field(SCAN_EPOCH_S), scan_epoch_field(SCAN_FIRST_BATCH_S)


def run_epoch(data: ds.Dataset, cfg: Any, epoch: int, loader: Any) -> dict[str, Any]:
    """One epoch: every record once, batch by batch, with the emulated compute."""
    if cfg.drop_cache:
        ds.drop_cache(data.files)
    compute_s = cfg.compute_ms / 1000
    before = loader.usage()
    waits: list[float] = []
    samples = batches = 0
    computed = 0.0
    start = time.monotonic()
    first_batch_s = None
    asked = time.monotonic()
    for images, _labels in loader.epoch(epoch):
        got = time.monotonic()
        waits.append(got - asked)
        if first_batch_s is None:
            first_batch_s = got - start
        samples += images.shape[0]
        batches += 1
        if compute_s:
            time.sleep(compute_s)
            # The accelerator's step is compute_s: what the sleep overshoots on a busy host
            # is the scheduler's delay, not accelerator work, and counting it would let the
            # machine's load, not the storage, move AU between runs.
            computed += compute_s
        asked = time.monotonic()
    wall = time.monotonic() - start
    cost = spent(before, loader.usage())
    return {
        DATA_SUMMARY_EPOCH: epoch,
        EPOCH_S: wall,
        "samples": samples,
        "batches": batches,
        "compute_s": computed,
        scan_epoch_field(SCAN_AU): computed / wall if compute_s else None,
        scan_epoch_field(SCAN_SAMPLES_PER_S): samples / wall,
        scan_epoch_field(SCAN_MBPS): data.bytes / wall / 1e6,
        FIRST_BATCH_S: first_batch_s,
        "wait_s": waits,
        "device_read_bytes": cost.read_bytes,
        # Main process and workers (the emulated compute is a sleep), and of that the
        # kernel's share (system time).
        "cpu_s": cost.cpu_s,
        "sys_s": cost.sys_s,
    }


def run_scan(data: ds.Dataset, cfg: Any) -> dict[str, Any]:
    """Every epoch, then the figures: the median epoch time and the rates over it (AU: the
    median compute time over it), batch waits over all epochs, and the cache check. The
    workers start in the first epoch (its time to the first batch includes their start)
    and serve every epoch.

    Raises:
        ValueError: An epoch did not see every record once (a loader defect, not a figure).
    """
    try:
        counted = block_reads_counted(data.files[0])
    except FileNotFoundError:
        raise ds.gone(data.files[0]) from None
    epochs = []
    with open_loader(data, cfg) as loader:
        for epoch in range(cfg.epochs):
            result = run_epoch(data, cfg, epoch, loader)
            if result["samples"] != data.records:
                raise ValueError(
                    f"epoch {epoch} loaded {result['samples']} records of {data.records}"
                )
            epochs.append(result)
        loader_details = loader.details(cfg)
    waits = [w for e in epochs for w in e["wait_s"]]
    # One epoch time, and every rate from it: with an even number of epochs the median is
    # between two epochs, and no single epoch's rates would match it.
    epoch_s = median([e[EPOCH_S] for e in epochs])
    # A worker's reads are not counted where /proc/<pid>/io is missing: then unknown, too.
    reads = [e["device_read_bytes"] for e in epochs]
    counted = counted and None not in reads
    coverage = [r / data.bytes if r is not None else None for r in reads]
    kept_out = all(r / data.bytes >= CACHE_COVERAGE for r in reads) if counted else None
    au = median([e["compute_s"] for e in epochs]) / epoch_s if cfg.compute_ms else None
    figures = {
        SCAN_EPOCH_S: epoch_s,
        SCAN_AU: au,
        SCAN_AU_OK: None if au is None else au >= cfg.min_au,
        SCAN_SAMPLES_PER_S: data.records / epoch_s,
        SCAN_MBPS: data.bytes / epoch_s / 1e6,
        SCAN_FIRST_BATCH_S: median([e[FIRST_BATCH_S] for e in epochs]),
        SCAN_WAIT_P50_MS: 1000 * (percentile(waits, 50) or 0.0),
        SCAN_WAIT_P99_MS: 1000 * (percentile(waits, 99) or 0.0),
        SCAN_CACHE_KEPT_OUT: kept_out,
    }
    cache = {
        "method": "posix_fadvise(DONTNEED) on every file before each epoch"
        if cfg.drop_cache
        else "none (--no-drop-cache)",
        "block_reads_counted": counted,
        "device_read_coverage": coverage,
        "second_epoch_ratio": epochs[1][EPOCH_S] / epochs[0][EPOCH_S] if len(epochs) > 1 else None,
    }
    for e in epochs:
        e["wait_p99_ms"] = 1000 * (percentile(e.pop("wait_s"), 99) or 0.0)
    return {
        "figures": figures,
        DATA_SUMMARY_EPOCHS: epochs,
        "cache": cache,
        "loader": loader_details,
    }
