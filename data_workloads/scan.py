"""The scan workload: read the dataset the way a training input pipeline does.

A real ``torch.utils.data.DataLoader`` with worker processes, a fresh shuffle order each
epoch, every record decoded into a tensor, batches collated. The main process plays the
accelerator: it takes a batch, then "computes" for ``compute_ms`` (a sleep: an accelerator
step costs the host no CPU), as MLPerf Storage emulates training. Accelerator utilization
(AU) is compute time / wall time of the epoch; MLPerf counts a storage system as enough
when AU ≥ 90 %.

The page cache is kept out with ``posix_fadvise(DONTNEED)`` on every file before each
epoch, and that it worked is measured, not assumed: the bytes the epoch read from the block
device (``ru_inblock`` of this process and its waited-for workers) must cover the dataset.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data import Dataset as MapDataset

from data_workloads import dataset as ds
from data_workloads.errors import DatasetCorruptError
from data_workloads.stats import (
    block_reads_counted,
    cpu_seconds,
    device_read_bytes,
    median,
    percentile,
)

CACHE_COVERAGE = 0.9
"""An epoch whose device reads cover this share of the dataset read it from the volume."""


class RecordFiles(MapDataset):
    """The ``files`` format: one record per file, read in the sampler's random order."""

    def __init__(self, files: tuple[Path, ...]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.files[index]
        try:
            return ds.decode(*ds.unpack_file_record(ds.read_file(path)))
        except ValueError as exc:
            raise DatasetCorruptError(f"record {path}: {exc}") from None


class TarShards(IterableDataset):
    """The ``webdataset`` format as WebDataset reads it: the shards shuffled and dealt to
    the workers, each shard streamed in order, samples shuffled in a per-worker buffer."""

    def __init__(self, shards: tuple[Path, ...], seed: int, buffer: int) -> None:
        self.shards = shards
        self.seed = seed
        self.buffer = buffer
        self.epoch = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        order = list(self.shards)
        random.Random(self.seed * 7919 + self.epoch).shuffle(order)
        rng = random.Random((self.seed * 7919 + self.epoch) * 131 + worker)
        pending: list[tuple[torch.Tensor, int]] = []
        for shard in order[worker::workers]:
            key = None
            with open(shard, "rb", buffering=ds.READ_CHUNK) as f:
                try:
                    for sample in ds.iter_tar_samples(f):
                        key = sample[0]  # named in the error, should the record not decode
                        pending.append(ds.decode(*sample[1:]))
                        if len(pending) >= self.buffer:
                            yield pending.pop(rng.randrange(len(pending)))
                except ValueError as exc:
                    where = f"{shard} (at record {key})" if key else str(shard)
                    raise DatasetCorruptError(f"{where}: {exc}") from None
        rng.shuffle(pending)
        yield from pending


def make_loader(data: ds.Dataset, cfg: Any, epoch: int) -> DataLoader:
    """The epoch's DataLoader (workers start afresh each epoch, as without
    ``persistent_workers``; their block reads are then counted when they are joined)."""
    extra: dict[str, Any] = {}
    if cfg.num_workers:
        extra["prefetch_factor"] = cfg.prefetch_factor
    if data.spec.format == "webdataset":
        shards = TarShards(data.files, cfg.seed, cfg.shuffle_buffer)
        shards.epoch = epoch
        return DataLoader(shards, batch_size=cfg.batch_size, num_workers=cfg.num_workers, **extra)
    generator = torch.Generator().manual_seed(cfg.seed * 7919 + epoch)
    return DataLoader(
        RecordFiles(data.files),
        batch_size=cfg.batch_size,
        shuffle=True,
        generator=generator,
        num_workers=cfg.num_workers,
        **extra,
    )


def _batches(loader: DataLoader) -> Iterator[Any]:
    """The loader's batches; a record that fails to decode in a worker is the dataset's
    error with its own message (the DataLoader wraps it in the worker's traceback)."""
    try:
        yield from loader
    except DatasetCorruptError as exc:
        last = str(exc.message).strip().splitlines()[-1]
        raise DatasetCorruptError(last.split("DatasetCorruptError: ", 1)[-1]) from None


def run_epoch(data: ds.Dataset, cfg: Any, epoch: int) -> dict[str, Any]:
    """One epoch: every record once, batch by batch, with the emulated compute."""
    if cfg.drop_cache:
        ds.drop_cache(data.files)
    compute_s = cfg.compute_ms / 1000
    reads_before = device_read_bytes()
    cpu_before = cpu_seconds()
    waits: list[float] = []
    samples = batches = 0
    computed = 0.0
    start = time.monotonic()
    first_batch_s = None
    loader = make_loader(data, cfg, epoch)
    asked = time.monotonic()
    for images, _labels in _batches(loader):
        got = time.monotonic()
        waits.append(got - asked)
        if first_batch_s is None:
            first_batch_s = got - start
        samples += images.shape[0]
        batches += 1
        if compute_s:
            time.sleep(compute_s)
            computed += time.monotonic() - got
        asked = time.monotonic()
    del loader  # joins the workers, so their block reads are counted
    wall = time.monotonic() - start
    read = device_read_bytes() - reads_before
    cpu = cpu_seconds() - cpu_before
    return {
        "epoch": epoch,
        "epoch_s": wall,
        "samples": samples,
        "batches": batches,
        "compute_s": computed,
        "au": computed / wall if compute_s else None,
        "samples_per_s": samples / wall,
        "mbps": data.bytes / wall / 1e6,
        "first_batch_s": first_batch_s,
        "wait_s": waits,
        "device_read_bytes": read,
        # Main process and workers (joined above); the emulated compute is a sleep.
        "cpu_s": cpu,
    }


def run_scan(data: ds.Dataset, cfg: Any) -> dict[str, Any]:
    """Every epoch, then the figures: the median epoch's, batch waits over all epochs, and
    the cache check.

    Raises:
        ValueError: An epoch did not see every record once (a loader defect, not a figure).
    """
    counted = block_reads_counted(data.files[0])
    epochs = []
    for epoch in range(cfg.epochs):
        result = run_epoch(data, cfg, epoch)
        if result["samples"] != data.records:
            raise ValueError(f"epoch {epoch} loaded {result['samples']} records of {data.records}")
        epochs.append(result)
    waits = [w for e in epochs for w in e["wait_s"]]
    med = sorted(epochs, key=lambda e: e["epoch_s"])[len(epochs) // 2]
    coverage = [e["device_read_bytes"] / data.bytes for e in epochs]
    kept_out = all(c >= CACHE_COVERAGE for c in coverage) if counted else None
    au = median([e["au"] for e in epochs]) if cfg.compute_ms else None
    figures = {
        "scan_epoch_s": median([e["epoch_s"] for e in epochs]),
        "scan_au": au,
        "scan_au_ok": None if au is None else au >= cfg.min_au,
        "scan_samples_per_s": med["samples_per_s"],
        "scan_mbps": med["mbps"],
        "scan_first_batch_s": median([e["first_batch_s"] for e in epochs]),
        "scan_wait_p50_ms": 1000 * (percentile(waits, 50) or 0.0),
        "scan_wait_p99_ms": 1000 * (percentile(waits, 99) or 0.0),
        "scan_cache_kept_out": kept_out,
    }
    cache = {
        "method": "posix_fadvise(DONTNEED) on every file before each epoch"
        if cfg.drop_cache
        else "none (--no-drop-cache)",
        "block_reads_counted": counted,
        "device_read_coverage": coverage,
        "second_epoch_ratio": epochs[1]["epoch_s"] / epochs[0]["epoch_s"]
        if len(epochs) > 1
        else None,
    }
    for e in epochs:
        e["wait_p99_ms"] = 1000 * (percentile(e.pop("wait_s"), 99) or 0.0)
    return {"figures": figures, "epochs": epochs, "cache": cache}
