"""The scan: a real DataLoader with workers over real files, every record decoded once per
epoch in a new order, the page cache kept out and that checked, AU from the emulated step."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import pytest
import torch

from data_workloads import dataset as ds
from data_workloads import scan
from data_workloads.errors import DatasetCorruptError
from data_workloads.stats import block_reads_counted

from .helpers import epoch_records, prepared


@pytest.mark.parametrize("fmt", ["webdataset", "files"])
@pytest.mark.parametrize("codec", ds.CODECS)
def test_every_record_once_per_epoch_decoded_in_a_new_order_with_workers(
    data_dir: Path, fmt: str, codec: str
) -> None:
    data, cfg = prepared(data_dir, fmt, num_workers=2, codec=codec)
    with scan.ScanLoader(data, cfg) as loader:
        first, second = epoch_records(loader, data, 0), epoch_records(loader, data, 1)
        again = epoch_records(loader, data, 0)
    assert sorted(first) == sorted(second) == list(range(data.records))
    assert first != second  # shuffled each epoch
    assert again == first  # the seed fixes the order


@pytest.mark.parametrize("fmt", ["webdataset", "files"])
def test_without_workers_the_same_records_in_the_same_order(data_dir: Path, fmt: str) -> None:
    data, cfg = prepared(data_dir, fmt, num_workers=0)
    with scan.ScanLoader(data, cfg) as loader:
        alone = epoch_records(loader, data, 0)
    assert sorted(alone) == list(range(data.records))
    if fmt == "files":  # one permutation of the records, whoever reads them
        _, cfg = prepared(data_dir, fmt, num_workers=3)
        with scan.ScanLoader(data, cfg) as loader:
            assert epoch_records(loader, data, 0) == alone


def test_files_follow_the_permutation_a_shuffling_sampler_draws(data_dir: Path) -> None:
    data, cfg = prepared(data_dir, "files", num_workers=2)
    generator = torch.Generator().manual_seed(cfg.seed * 7919 + 1)
    sampler = list(torch.utils.data.RandomSampler(range(data.records), generator=generator))
    with scan.ScanLoader(data, cfg) as loader:
        got = epoch_records(loader, data, 1)
    by_name = {int(p.stem): i for i, p in enumerate(data.files)}
    assert got == [by_name[i] for i in sampler] == sampler


def test_workers_split_the_shards_without_overlap(data_dir: Path) -> None:
    data, cfg = prepared(data_dir, "webdataset", num_workers=3)
    with scan.ScanLoader(data, cfg) as loader:
        source = loader.source
        assert isinstance(source, scan.TarBatches)
        for epoch in range(2):
            dealt = [source.shards(w, 3, epoch) for w in range(3)]
            assert sorted(i for shards in dealt for i in shards) == list(range(len(data.files)))
        assert source.shards(0, 3, 0) != source.shards(0, 3, 1)  # shuffled each epoch


def test_samples_are_shuffled_within_windows() -> None:
    import random

    positions = scan.window_positions(50, 8, random.Random(1))
    assert sorted(positions) == list(range(50))
    for start in range(0, 50, 8):  # each window's samples stay in that window
        assert sorted(positions[start : start + 8]) == list(range(start, min(start + 8, 50)))
    assert positions != list(range(50))


def test_the_same_workers_serve_every_epoch_and_are_gone_after(data_dir: Path) -> None:
    data, cfg = prepared(data_dir, "webdataset", num_workers=2)
    loader = scan.ScanLoader(data, cfg)
    epoch_records(loader, data, 0)
    pids = loader.source.pids()
    assert len(pids) == 2 and os.getpid() not in pids
    epoch_records(loader, data, 1)
    assert loader.source.pids() == pids  # persistent: not forked again
    usage = loader.usage()
    assert set(usage) == {0, *pids} and all(u.cpu_s > 0 for u in usage.values())
    loader.close()
    for pid in pids:  # joined: not even a zombie left
        assert not Path(f"/proc/{pid}").exists()
    with pytest.raises(RuntimeError, match="closed"):
        loader.epoch(2)


@pytest.mark.timeout(60)  # a slot left busy would stall the workers for good
@pytest.mark.parametrize("fmt", ["webdataset", "files", "parquet", "mds"])
def test_interrupted_epochs_leave_the_next_one_whole(data_dir: Path, fmt: str) -> None:
    data, cfg = prepared(data_dir, fmt, num_workers=2)
    with scan.ScanLoader(data, cfg) as loader:
        for epoch in range(3):
            batches = loader.epoch(epoch)
            next(batches)
            next(batches)  # the workers have filled and queued more than these two
        # Abandoned three times (what the DataLoader had queued is dropped, slots and
        # all): each worker frees its slots when the next epoch starts, which is complete.
        assert sorted(epoch_records(loader, data, 3)) == list(range(data.records))


def test_a_worker_frees_its_slots_when_its_epoch_starts(data_dir: Path) -> None:
    data, cfg = prepared(data_dir, "files", num_workers=0)
    with scan.ScanLoader(data, cfg) as loader:
        ring = loader.ring
        for _ in range(ring.slots):
            ring.acquire(0)
        assert all(ring.busy(0, s) for s in range(ring.slots))
        iter(loader.source)  # in the main process: worker 0 of 1
        assert not any(ring.busy(0, s) for s in range(ring.slots))


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
    # The accelerator's time is its steps', whatever the sleep overshoots on a busy host.
    assert epoch["compute_s"] == pytest.approx(epoch["batches"] * 0.020)
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


@pytest.mark.parametrize(
    ("fmt", "damage", "message"),
    [
        ("webdataset", "flip", "CRC32"),
        ("files", "flip", "CRC32"),
        ("webdataset", "truncate", "truncated"),
        ("files", "truncate", r"read \d+ of its \d+ bytes"),
        ("files", "header", "with a header of"),
    ],
)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_record_damaged_after_verification_stops_the_scan_with_its_exit_code(
    data_dir: Path, fmt: str, damage: str, message: str, workers: int
) -> None:
    data, cfg = prepared(data_dir, fmt, num_workers=workers, epochs=1)
    victim = data.files[-1]
    blob = bytearray(victim.read_bytes())
    if damage == "flip":  # in an image: the shard's first (3 blocks in), or the file's last byte
        blob[1636 if fmt == "webdataset" else -1] ^= 0xFF
    elif damage == "truncate":
        del blob[len(blob) // 2 :]
    else:  # the header's length field: the image would start elsewhere
        blob[0] += 1
    victim.write_bytes(bytes(blob))
    with pytest.raises(DatasetCorruptError, match=message) as caught:
        scan.run_scan(data, cfg)
    assert caught.value.exit_code == 6
    assert str(victim) in caught.value.message and "Traceback" not in caught.value.message


def test_the_workers_cost_is_counted_while_they_live() -> None:
    import subprocess
    import sys

    from data_workloads.stats import NOTHING, process_usage

    burn = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
        "print(1, flush=True)\ntime.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()
        usage = process_usage(child.pid)
        assert 0.3 <= usage.cpu_s < 5 and 0 <= usage.sys_s <= usage.cpu_s
        assert usage.read_bytes is None or usage.read_bytes >= 0
        # A worker that started between two readings counts from zero.
        assert scan.spent({0: NOTHING}, {0: NOTHING, child.pid: usage}) == usage
    finally:
        child.kill()
        child.wait()
    with pytest.raises(ProcessLookupError):
        process_usage(child.pid)


@pytest.mark.parametrize(("record_size", "placed"), [("4KiB", True), ("192", False)])
def test_uncompressed_shards_are_read_into_place_unless_records_are_tiny(
    data_dir: Path, record_size: str, placed: bool
) -> None:
    # 192-byte records: a 1 MiB read would scatter into more buffers than preadv takes.
    data, cfg = prepared(data_dir, "webdataset", num_workers=2, record_size=record_size)
    with scan.ScanLoader(data, cfg) as loader:
        assert loader.source.placed is placed
        assert sorted(epoch_records(loader, data, 0)) == list(range(data.records))


@pytest.mark.parametrize("epoch_times", [[1.0, 3.0], [4.0, 1.0, 2.0, 3.0]])
def test_the_headline_figures_come_from_the_same_epoch_time(
    data_dir: Path, monkeypatch, epoch_times: list[float]
) -> None:
    # An even number of epochs has no middle one: MB/s and samples/s must still be the
    # dataset over the headline epoch time, not the figures of another epoch.
    data, cfg = prepared(data_dir, "files", num_workers=0, epochs=len(epoch_times))
    real = scan.run_epoch

    def timed(data, cfg, epoch, loader):
        result = real(data, cfg, epoch, loader)
        wall = epoch_times[epoch]
        result.update(epoch_s=wall, samples_per_s=result["samples"] / wall)
        result.update(mbps=data.bytes / wall / 1e6)
        return result

    monkeypatch.setattr(scan, "run_epoch", timed)
    figures = scan.run_scan(data, cfg)["figures"]
    epoch_s = figures["scan_epoch_s"]
    assert epoch_s == pytest.approx(statistics.median(epoch_times))
    assert figures["scan_mbps"] == pytest.approx(data.bytes / epoch_s / 1e6)
    assert figures["scan_samples_per_s"] == pytest.approx(data.records / epoch_s)


@pytest.mark.parametrize("fmt", ["webdataset", "files", "parquet", "mds"])
@pytest.mark.parametrize(
    ("workers", "drop_cache", "first"), [(0, True, False), (2, False, False), (2, False, True)]
)
def test_a_file_deleted_after_verification_stops_the_scan_with_exit_6_naming_it(
    data_dir: Path, fmt: str, workers: int, drop_cache: bool, first: bool
) -> None:
    # Found by the cache drop before the epoch, or (not dropping) by the reader in a
    # worker, or (the first file) by the probe of the block-read accounting.
    data, cfg = prepared(data_dir, fmt, num_workers=workers, epochs=1, drop_cache=drop_cache)
    victim = data.files[0 if first else len(data.files) // 2]
    victim.unlink()
    with pytest.raises(DatasetCorruptError, match="deleted after the dataset was verified") as e:
        scan.run_scan(data, cfg)
    assert e.value.exit_code == 6
    assert str(victim) in e.value.message and "Traceback" not in e.value.message


def test_a_file_deleted_after_verification_stops_materialize_with_exit_6(data_dir: Path) -> None:
    from data_workloads.config import MaterializeConfig
    from data_workloads.materialize import run_materialize

    data, _ = prepared(data_dir, "files")
    cfg = MaterializeConfig(data_dir=data_dir, dataset_format="files", track=False)
    data.files[-1].unlink()
    out = data_dir / "out"
    out.mkdir()
    with pytest.raises(DatasetCorruptError, match=str(data.files[-1])) as e:
        run_materialize(data, cfg, out)
    assert e.value.exit_code == 6


def _copied_in(paths) -> None:
    """Each file made again, a new file of the same bytes, not fsynced: its pages are
    dirty, as after a copy into the claim by another program. (Not rewritten in place:
    ext4 starts writing back a file truncated and rewritten, or renamed over another,
    when it is closed.)"""
    for path in paths:
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)


def test_dirty_pages_are_written_back_before_the_cache_is_dropped(tmp_path: Path) -> None:
    import resource

    clean = tmp_path / "clean"
    with clean.open("wb") as f:
        f.write(os.urandom(1024**2))
        f.flush()
        os.fsync(f.fileno())
    if not block_reads_counted(clean):
        pytest.skip("this file system does not count block reads (tmpfs?)")
    dirty = tmp_path / "dirty"
    dirty.write_bytes(os.urandom(1024**2))
    assert block_reads_counted(dirty)  # the probe drops a dirty file too
    _copied_in([dirty])
    ds.drop_cache([dirty])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_inblock
    dirty.read_bytes()
    read = (resource.getrusage(resource.RUSAGE_SELF).ru_inblock - before) * 512
    assert read >= 1024**2


def test_a_dataset_just_copied_in_is_scanned_from_the_volume(data_dir: Path) -> None:
    data, cfg = prepared(data_dir, "files", num_workers=1, epochs=1)
    if not block_reads_counted(data.files[0]):
        pytest.skip("this file system does not count block reads (tmpfs?)")
    _copied_in(data.files)
    result = scan.run_scan(data, cfg)
    assert result["cache"]["block_reads_counted"] is True
    assert result["figures"]["scan_cache_kept_out"] is True
    assert result["cache"]["device_read_coverage"][0] >= scan.CACHE_COVERAGE
