"""Helpers of the data-workload tests: tiny dataset options, the CLI in-process, a tiny
dataset for the scan and its epochs checked record by record."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from click.testing import CliRunner, Result

from data_workloads import dataset as ds
from data_workloads import scan
from data_workloads.cli import main
from data_workloads.config import ScanConfig

# A few hundred KiB: a handful of shards or files, generated in well under a second.
TINY = ["--dataset-size", "256KiB", "--record-size", "4KiB", "--shard-size", "64KiB"]


def run_cli(*args: str | Path) -> Result:
    """``python -m data_workloads ARGS`` in-process; the exit code is click's, as in a shell."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def prepared(data_dir: Path, fmt: str, **kw) -> tuple[ds.Dataset, ScanConfig]:
    """A tiny dataset (67 records of 3888 bytes, 5 shards or 67 files) and a scan's
    settings for it (batches of 8 unless ``kw`` says otherwise)."""
    settings = dict(
        dataset_size="256KiB",
        record_size="4KiB",
        shard_size="64KiB",
        batch_size=8,
        shuffle_buffer=8,
    )
    cfg = ScanConfig(data_dir=data_dir, dataset_format=fmt, track=False, **{**settings, **kw})
    cfg.check_data_dir()
    spec = ds.DatasetSpec(
        fmt, cfg.seed, cfg.dataset_size, cfg.record_size, cfg.shard_size, cfg.codec,
        cfg.row_group_size,
    )  # fmt: skip
    return ds.open_dataset(data_dir, spec), cfg


def image_bytes(image: torch.Tensor) -> bytes:
    assert image.is_contiguous()
    return ctypes.string_at(image.data_ptr(), image.numel())


def records_by_image(data: ds.Dataset) -> dict[int, int]:
    """Record index by the CRC32 of its image (the generated images are all different)."""
    index = {ds.crc32(ds.record(data.spec, i)[1]): i for i in range(data.records)}
    assert len(index) == data.records
    return index


def epoch_records(loader: scan.ScanLoader, data: ds.Dataset, epoch: int) -> list[int]:
    """The records of an epoch in the order the loader handed them out, each batch's
    images and labels checked against the generated records while the batch is valid."""
    by_image = records_by_image(data)
    out: list[int] = []
    for images, labels in loader.epoch(epoch):
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert images.shape[1:] == (3, data.spec.side, data.spec.side)
        assert images.shape[0] == labels.shape[0] <= loader.ring.batch_size
        for image, label in zip(images, labels.tolist(), strict=True):
            index = by_image.get(ds.crc32(image_bytes(image)))
            assert index is not None, "a row of the batch is no record's image (overwritten?)"
            assert label == ds.record(data.spec, index)[0]
            out.append(index)
    return out
