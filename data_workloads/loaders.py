"""The scan through the library a team would use on its format, as that team writes it.

Each is a ``torch.utils.data.DataLoader`` with the scan's settings (``--num-workers``
persistent workers, ``--batch-size``, ``--prefetch-factor``, forked workers that leave
SIGTERM and SIGINT to the main process) over the library's own dataset, the batches
collated by the library or by torch's default and carried back through the DataLoader's
queue (the transport :mod:`data_workloads.slots` replaces in ours). Every record is decoded
and verified as ours does it (:func:`data_workloads.dataset.decode`: the header, the shape,
the CRC32 of the image, a uint8 tensor), so the figures differ by the loader alone:

- ``webdataset``: ``webdataset.WebDataset`` over the tar shards (shards shuffled per epoch
  and split by worker, samples shuffled in a buffer of ``--shuffle-buffer``), each sample
  decoded by a ``map``, batched by ``batched`` (its default collation: ``torch.stack``).
- ``streaming``: MosaicML's ``StreamingDataset`` over the local MDS shards (no remote),
  ``shuffle=True`` with the seed, each sample decoded in ``__getitem__`` as its docs
  subclass it, torch's default collation.
- ``arrow``: the Parquet files as Hugging Face ``datasets`` streams them
  (``IterableDataset`` of its Parquet builder): per worker its files, each opened as a
  Python file and read with ``pyarrow.parquet.ParquetFile.iter_batches`` (a batch of a
  row group's rows), the rows
  as Python values (``to_pylist``), shuffled in a buffer of ``--shuffle-buffer`` (as its
  ``shuffle(buffer_size=...)``); torch's default collation. ``datasets`` itself is not
  installed (it adds its per-row formatting on top: this is the least it costs).
- ``torch``: a map-style ``Dataset`` of the files (each read whole, as ``open().read()``),
  a shuffling sampler seeded per run, torch's default collation.
"""

from __future__ import annotations

import mmap
import random
from collections.abc import Iterator
from importlib import metadata
from typing import Any, NoReturn

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from data_workloads import dataset as ds
from data_workloads import formats
from data_workloads.errors import DatasetCorruptError
from data_workloads.scan import _order_seed, _translated, worker_options
from data_workloads.stats import Usage, own_usage, process_usage

DISTRIBUTIONS = {
    "webdataset": "webdataset",
    "streaming": "mosaicml-streaming",
    "arrow": "pyarrow",
    "torch": "torch",
}
"""The package whose version a library loader records."""


def _decoded(where: str, header: bytes, payload: Any) -> tuple[torch.Tensor, int]:
    try:
        return ds.decode(header, payload)
    except ValueError as exc:
        raise DatasetCorruptError(f"record {where}: {exc}") from None


def _shard_failed(exc: Exception) -> NoReturn:
    """webdataset's handler for a shard it cannot open or read (deleted or changed after the
    dataset was verified): the dataset's error, exit 6, naming what the library says; a
    record that does not decode is that error already."""
    if isinstance(exc, DatasetCorruptError):
        raise exc
    raise DatasetCorruptError(f"a shard failed after the dataset was verified: {exc}") from None


class _Epoch:
    """The epoch, in memory shared with the workers forked after it was made (persistent
    workers see the main process set it)."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 8)
        self._value = memoryview(self._map).cast("q")

    def get(self) -> int:
        return self._value[0]

    def set(self, value: int) -> None:
        self._value[0] = value


def _webdataset(data: ds.Dataset, cfg: Any, epoch: _Epoch) -> tuple[Any, dict[str, Any]]:
    import webdataset as wds

    payload_ext = ds.PAYLOAD_EXT[data.spec.codec]

    def decode(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        where = f"{sample['__key__']} of {sample['__url__']}"
        return _decoded(where, sample[ds.HEADER_EXT], sample[payload_ext])

    urls = [str(p) for p in data.files]
    dataset = (
        wds.WebDataset(
            urls,
            shardshuffle=len(urls),
            detshuffle=True,
            seed=cfg.seed,
            empty_check=False,
            handler=_shard_failed,
        )  # fmt: skip
        .shuffle(cfg.shuffle_buffer, initial=cfg.shuffle_buffer)
        .map(decode)
        .batched(min(cfg.batch_size, data.records), partial=True)
    )
    return dataset, {"batch_size": None}


def _streaming(data: ds.Dataset, cfg: Any, epoch: _Epoch) -> tuple[Any, dict[str, Any]]:
    lib = formats.streaming_modules("--loader streaming")

    class DecodedMDS(lib.StreamingDataset):  # type: ignore[misc, name-defined]
        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            sample = super().__getitem__(index)
            return _decoded(sample["key"], sample["meta"].encode(), sample["image"])

    batch = min(cfg.batch_size, data.records)
    dataset = DecodedMDS(
        local=str(data.root), remote=None, shuffle=True, shuffle_seed=cfg.seed, batch_size=batch
    )
    return dataset, {"batch_size": batch}


class ArrowParquetStream(IterableDataset):
    """Parquet rows as Hugging Face ``datasets`` streams them (see the module's text)."""

    def __init__(self, data: ds.Dataset, seed: int, buffer: int, epoch: _Epoch) -> None:
        self.paths = [str(p) for p in data.files]
        self.rows_per_batch = data.spec.records_per_group
        self.seed, self.buffer, self.epoch = seed, buffer, epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        _pa, pq = formats.pyarrow_modules("--loader arrow")
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        seed = _order_seed(self.seed, self.epoch.get())
        paths = list(self.paths)
        random.Random(seed).shuffle(paths)
        rng = random.Random(seed * 131 + worker)
        held: list[tuple[torch.Tensor, int]] = []
        for path in paths[worker::workers]:
            # A Python file object, as its Parquet builder opens each file.
            with open(ds.open_data_file(path), "rb") as f:
                reader = pq.ParquetFile(f)
                for batch in reader.iter_batches(
                    batch_size=self.rows_per_batch, columns=["image", "key", "meta"]
                ):
                    for row in batch.to_pylist():
                        sample = _decoded(f"{row['key']} of {path}", row["meta"], row["image"])
                        if len(held) < self.buffer:
                            held.append(sample)
                            continue
                        i = rng.randrange(len(held))
                        held[i], sample = sample, held[i]
                        yield sample
        rng.shuffle(held)
        yield from held


class FileRecords(Dataset):
    """The ``files`` format as a map-style dataset: record ``i`` is file ``i``."""

    def __init__(self, data: ds.Dataset) -> None:
        self.paths = data.files

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.paths[index]
        try:
            header, payload = ds.unpack_file_record(ds.read_file(path))
        except ValueError as exc:
            raise DatasetCorruptError(f"record {path}: {exc}") from None
        return _decoded(str(path), header, payload)


def _arrow(data: ds.Dataset, cfg: Any, epoch: _Epoch) -> tuple[Any, dict[str, Any]]:
    dataset = ArrowParquetStream(data, cfg.seed, cfg.shuffle_buffer, epoch)
    return dataset, {"batch_size": min(cfg.batch_size, data.records)}


def _torch(data: ds.Dataset, cfg: Any, epoch: _Epoch) -> tuple[Any, dict[str, Any]]:
    return FileRecords(data), {
        "batch_size": min(cfg.batch_size, data.records),
        "shuffle": True,
        "generator": torch.Generator().manual_seed(cfg.seed),
    }


BUILDERS = {"webdataset": _webdataset, "streaming": _streaming, "arrow": _arrow, "torch": _torch}


class LibraryLoader:
    """A library's dataset in a DataLoader with the scan's settings; the same interface as
    :class:`~data_workloads.scan.ScanLoader` (``epoch``, ``usage``, ``details``, ``close``)."""

    def __init__(self, name: str, data: ds.Dataset, cfg: Any) -> None:
        self.name, self.records = name, data.records
        self._epoch = _Epoch()
        dataset, settings = BUILDERS[name](data, cfg, self._epoch)
        extra = worker_options(cfg.num_workers, cfg.prefetch_factor)
        self.settings = settings
        self.loader: DataLoader | None = DataLoader(
            dataset, num_workers=cfg.num_workers, **settings, **extra
        )
        self._active: Iterator[Any] | None = None

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, Any]]:
        if self.loader is None:
            raise RuntimeError("the loader is closed")
        self._epoch.set(epoch)
        self._active = _translated(iter(self.loader))
        return self._active

    def pids(self) -> list[int]:
        iterator = getattr(self.loader, "_iterator", None)
        workers = getattr(iterator, "_workers", None) or []
        return [w.pid for w in workers if w.pid]

    def usage(self) -> dict[int, Usage]:
        """CPU and block reads so far, per process: 0 for this one, each worker by pid."""
        return {0: own_usage(), **{pid: process_usage(pid) for pid in self.pids()}}

    def details(self, cfg: Any) -> dict[str, Any]:
        return {
            "library": self.name,
            "version": metadata.version(DISTRIBUTIONS[self.name]),
            "batches_in_dataset": self.settings.get("batch_size") is None,
            "persistent_workers": bool(cfg.num_workers),
            "slot_ring_bytes": None,
            "batch_size": min(cfg.batch_size, self.records),
            "shuffle_window": cfg.shuffle_buffer if self.name in ("webdataset", "arrow") else None,
            "prefetch_factor": cfg.prefetch_factor if cfg.num_workers else None,
        }

    def close(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None
        loader, self.loader = self.loader, None
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

    def __enter__(self) -> LibraryLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def library_loader(name: str, data: ds.Dataset, cfg: Any) -> LibraryLoader:
    """The scan's DataLoader through the library ``name`` (one of the contract's
    ``DATA_LOADERS`` but ours)."""
    return LibraryLoader(name, data, cfg)
