"""The materialize workload: build a preprocessed cache from the dataset, stage by stage.

The records are read from the volume (the cache dropped first), decoded and transformed
on the CPU (to normalized float16, the way a preprocessing job writes model-ready
tensors), and written into tar shards that are fsynced when full, each stage timed like a
checkpoint's: ``read`` (bytes off the volume), ``transform`` (decode and transform),
``write`` (into the shard file: the page cache), ``fsync`` (until the shard is durable).
The cache is built in a scratch directory inside the data dir, removed afterwards.
"""

from __future__ import annotations

import ctypes
import io
import os
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from checkpoint_storage_bench.contract import (
    MATERIALIZE_OUTPUT_BYTES,
    MATERIALIZE_STAGES,
    MATERIALIZE_TOTAL_S,
    MATERIALIZE_WRITE_MBPS,
    materialize_stage_output,
)
from data_workloads import dataset as ds
from data_workloads import formats

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def transform(image: torch.Tensor) -> bytes:
    """A record's model-ready bytes: per-channel normalized, float16."""
    out = ((image.float() / 255.0 - MEAN) / STD).to(torch.float16).contiguous()
    # numpy is not a dependency: copy the tensor's memory straight into bytes.
    return ctypes.string_at(out.data_ptr(), out.nbytes)


class Stages:
    """Seconds spent in each stage."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(MATERIALIZE_STAGES, 0.0)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.seconds[stage] += time.monotonic() - start


def _raw_records(data: ds.Dataset, stages: Stages) -> Iterator[tuple[str, bytes, bytes]]:
    """(key, header, payload) of every record; reading the volume is the read stage."""
    counts: dict[str, int] = {}
    if data.spec.format == "mds":
        shards = [p.name for p in data.files if p.suffix == formats.MDS_SHARD_SUFFIX]
        counts = dict(zip(shards, formats.mds_counts(data.root), strict=True))
    for path in data.files:
        with stages.timed("read"):
            blob = ds.read_file(path)
        if data.spec.format == "webdataset":
            with stages.timed("transform"):
                samples = list(ds.iter_tar_samples(io.BytesIO(blob)))
            yield from samples
        elif data.spec.format in ("parquet", "mds"):
            if path.name == formats.MDS_INDEX:
                continue
            with stages.timed("transform"):
                if data.spec.format == "parquet":
                    rows = list(formats.iter_parquet_file(blob))
                else:
                    rows = list(formats.iter_mds_shard(blob, counts[path.name]))
            for key, header, payload, _label in rows:
                yield key, header, payload
        else:
            yield (path.stem, *ds.unpack_file_record(blob))


class ShardWriter:
    """Tar shards of transformed records, each fsynced once it holds ``shard_bytes``."""

    def __init__(self, out: Path, shard_bytes: int, stages: Stages) -> None:
        self.out, self.shard_bytes, self.stages = out, shard_bytes, stages
        self.shards: list[Path] = []
        self.bytes = 0
        self._file: Any = None
        self._tar: tarfile.TarFile | None = None
        self._in_shard = 0

    def add(self, key: str, header: bytes, tensor_bytes: bytes) -> None:
        with self.stages.timed("write"):
            if self._tar is None:
                path = self.out / f"shard-{len(self.shards):06d}.tar"
                self._file = path.open("wb")
                self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.USTAR_FORMAT)
                self.shards.append(path)
            ds.add_tar_member(self._tar, f"{key}.json", header)
            ds.add_tar_member(self._tar, f"{key}.f16", tensor_bytes)
            self._in_shard += len(header) + len(tensor_bytes)
        if self._in_shard >= self.shard_bytes:
            self.close_shard()

    def close_shard(self) -> None:
        if self._tar is None:
            return
        with self.stages.timed("write"):
            self._tar.close()
            self._file.flush()
        with self.stages.timed("fsync"):
            os.fsync(self._file.fileno())
        self.bytes += self._file.tell()
        self._file.close()
        self._tar = self._file = None
        self._in_shard = 0

    def abandon(self) -> None:
        """Close a shard left open by a failure (its directory is removed anyway)."""
        if self._file is not None:
            self._file.close()
            self._tar = self._file = None

    def finish(self) -> None:
        self.close_shard()
        with self.stages.timed("fsync"):
            ds.fsync_dir(self.out)


def run_materialize(data: ds.Dataset, cfg: Any, scratch: Path) -> dict[str, Any]:
    """Build the cache into ``scratch`` (an empty directory) and time every stage."""
    ds.drop_cache(data.files)
    stages = Stages()
    writer = ShardWriter(scratch, cfg.output_shard_size, stages)
    records = 0
    start = time.monotonic()
    try:
        for key, header, payload in _raw_records(data, stages):
            with stages.timed("transform"):
                image, _label = ds.decode(header, payload)
                tensor_bytes = transform(image)
            writer.add(key, header, tensor_bytes)
            records += 1
        writer.finish()
    except OSError as exc:
        raise ds.storage_error(exc, f"the cache in {scratch}") from exc
    finally:
        writer.abandon()
    total = time.monotonic() - start
    durable_s = stages.seconds["write"] + stages.seconds["fsync"]
    figures = {
        MATERIALIZE_TOTAL_S: total,
        **{materialize_stage_output(s): v for s, v in stages.seconds.items()},
        MATERIALIZE_WRITE_MBPS: writer.bytes / durable_s / 1e6 if durable_s else None,
        MATERIALIZE_OUTPUT_BYTES: writer.bytes,
    }
    return {"figures": figures, "records": records, "shards": len(writer.shards)}
