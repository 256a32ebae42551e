"""The scan: a real DataLoader with workers over real files, every record decoded once per
epoch in a new order, the page cache kept out and that checked, AU from the emulated step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from data_workloads import dataset as ds
from data_workloads import scan
from data_workloads.config import ScanConfig
from data_workloads.errors import DatasetCorruptError
from data_workloads.stats import block_reads_counted


def prepared(data_dir: Path, fmt: str, **kw) -> tuple[ds.Dataset, ScanConfig]:
    cfg = ScanConfig(
        data_dir=data_dir,
        dataset_format=fmt,
        dataset_size="256KiB",
        record_size="4KiB",
        shard_size="64KiB",
        batch_size=8,
        shuffle_buffer=8,
        track=False,
        **kw,
    )
    cfg.check_data_dir()
    spec = ds.DatasetSpec(fmt, cfg.seed, cfg.dataset_size, cfg.record_size, cfg.shard_size)
    return ds.open_dataset(data_dir, spec), cfg


def labels_of_epoch(data: ds.Dataset, cfg: ScanConfig, epoch: int) -> list[int]:
    out: list[int] = []
    for images, labels in scan.make_loader(data, cfg, epoch):
        assert images.dtype == torch.uint8 and images.shape[1:] == (
            3,
            data.spec.side,
            data.spec.side,
        )
        out += labels.tolist()
    return out


@pytest.mark.parametrize("fmt", ["webdataset", "files"])
def test_every_record_once_per_epoch_in_a_new_order_with_workers(data_dir: Path, fmt) -> None:
    data, cfg = prepared(data_dir, fmt, num_workers=2)
    want = sorted(ds.record(data.spec, i)[0] for i in range(data.records))
    first, second = labels_of_epoch(data, cfg, 0), labels_of_epoch(data, cfg, 1)
    assert sorted(first) == sorted(second) == want
    assert first != second  # shuffled each epoch
    assert labels_of_epoch(data, cfg, 0) == first  # the seed fixes the order


def test_workers_split_the_shards_without_overlap(data_dir: Path) -> None:
    data, _ = prepared(data_dir, "webdataset")
    shards = scan.TarShards(data.files, seed=0, buffer=4)
    seen = []
    for worker in range(3):
        info = SimpleNamespace(id=worker, num_workers=3)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(scan, "get_worker_info", lambda info=info: info)
            seen += [label for _, label in shards]
    assert sorted(seen) == sorted(ds.record(data.spec, i)[0] for i in range(data.records))


def test_the_cache_is_kept_out_and_that_is_measured(data_dir: Path) -> None:
    data, cfg = prepared(data_dir, "files", num_workers=2, epochs=2)
    if not block_reads_counted(data.files[0]):
        pytest.skip("this file system does not count block reads (tmpfs?)")
    result = scan.run_scan(data, cfg)
    assert result["figures"]["scan_cache_kept_out"] is True
    assert all(c >= scan.CACHE_COVERAGE for c in result["cache"]["device_read_coverage"])
    # Without dropping it, the freshly read dataset comes from the cache: the check says so.
    cached, cfg = prepared(data_dir, "files", num_workers=2, epochs=2, drop_cache=False)
    warm = scan.run_scan(cached, cfg)
    assert warm["figures"]["scan_cache_kept_out"] is False
    assert warm["cache"]["device_read_coverage"][1] < scan.CACHE_COVERAGE


def test_accelerator_utilization_from_the_emulated_step(data_dir: Path) -> None:
    data, cfg = prepared(data_dir, "webdataset", num_workers=1, epochs=1, compute_ms=20.0)
    result = scan.run_scan(data, cfg)
    (epoch,) = result["epochs"]
    assert epoch["samples"] == data.records and epoch["batches"] == -(-data.records // 8)
    assert epoch["compute_s"] >= epoch["batches"] * 0.020
    figures = result["figures"]
    assert 0 < figures["scan_au"] <= 1
    assert figures["scan_au"] == pytest.approx(epoch["compute_s"] / epoch["epoch_s"])
    assert figures["scan_au_ok"] is (figures["scan_au"] >= 0.9)
    assert figures["scan_first_batch_s"] > 0
    assert figures["scan_wait_p99_ms"] >= figures["scan_wait_p50_ms"] >= 0
    assert figures["scan_mbps"] == pytest.approx(data.bytes / figures["scan_epoch_s"] / 1e6)


def test_no_compute_no_au(data_dir: Path) -> None:
    data, cfg = prepared(data_dir, "files", num_workers=0, epochs=1, compute_ms=0.0)
    figures = scan.run_scan(data, cfg)["figures"]
    assert figures["scan_au"] is None and figures["scan_au_ok"] is None
    assert figures["scan_samples_per_s"] > 0


@pytest.mark.parametrize("fmt", ["webdataset", "files"])
def test_a_record_damaged_after_verification_stops_the_scan_with_its_exit_code(
    data_dir: Path, fmt: str
) -> None:
    data, cfg = prepared(data_dir, fmt, num_workers=2, epochs=1)
    victim = data.files[-1]
    blob = bytearray(victim.read_bytes())
    # Inside a record's image: the first of the shard (three 512-byte blocks in), or the file's last.
    blob[1636 if fmt == "webdataset" else -1] ^= 0xFF
    victim.write_bytes(bytes(blob))
    with pytest.raises(DatasetCorruptError, match=r"CRC32") as caught:
        scan.run_scan(data, cfg)
    assert caught.value.exit_code == 6
    assert str(victim) in caught.value.message and "Traceback" not in caught.value.message
