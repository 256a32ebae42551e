"""Parquet and MDS, and the scan through the libraries teams use: real files written by the
real libraries, read by ours and by theirs, every record decoded once per epoch, the same
verification and refusals, the loader recorded in the summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoint_storage_bench.contract import DATA_FORMATS, DATA_LOADERS, LOADER_FORMATS
from data_workloads import dataset as ds
from data_workloads import formats, scan
from data_workloads.errors import DatasetCorruptError
from data_workloads.stats import block_reads_counted

from .helpers import TINY, prepared, records_by_image, run_cli

PAIRS = [(fmt, loader) for loader, fmts in LOADER_FORMATS.items() for fmt in fmts]
ROW_GROUP = "16KiB"  # 4 records of 3888 bytes a row group, 16 a file


def tiny(data_dir: Path, fmt: str, **kw) -> tuple[ds.Dataset, object]:
    return prepared(data_dir, fmt, row_group_size=ROW_GROUP, **kw)


def epoch_labels(loader, data: ds.Dataset, epoch: int) -> list[int]:
    """The records of an epoch as the loader handed them out, each image and label checked
    against the generated record while its batch is valid."""
    by_image = records_by_image(data)
    out = []
    for images, labels in loader.epoch(epoch):
        assert images.dtype == torch.uint8
        assert images.shape[1:] == (3, data.spec.side, data.spec.side)
        labels = torch.as_tensor(labels).tolist()
        assert len(labels) == images.shape[0]
        for image, label in zip(images, labels, strict=True):
            index = by_image.get(ds.crc32(image.contiguous().numpy().tobytes()))
            assert index is not None, "a row of the batch is no record's image"
            assert label == ds.record(data.spec, index)[0]
            out.append(index)
    return out


def test_every_loader_reads_a_format_and_ours_reads_them_all() -> None:
    assert set(LOADER_FORMATS) == set(DATA_LOADERS)
    assert LOADER_FORMATS["ours"] == DATA_FORMATS
    assert {f for fmts in LOADER_FORMATS.values() for f in fmts} == set(DATA_FORMATS)
    assert all(len(LOADER_FORMATS[n]) == 1 for n in DATA_LOADERS if n != "ours")


@pytest.mark.parametrize(("fmt", "loader"), PAIRS)
def test_each_format_through_each_loader_gives_every_record_once_per_epoch(
    data_dir: Path, fmt: str, loader: str
) -> None:
    data, cfg = tiny(data_dir, fmt, num_workers=2, loader=loader)
    with scan.open_loader(data, cfg) as reader:
        first, second = epoch_labels(reader, data, 0), epoch_labels(reader, data, 1)
        workers = reader.usage().keys() - {0}
    assert sorted(first) == sorted(second) == list(range(data.records))
    assert first != second  # shuffled each epoch
    assert len(workers) == 2  # the workers' own clocks are read


@pytest.mark.parametrize("fmt", ["parquet", "mds"])
@pytest.mark.parametrize("codec", ds.CODECS)
def test_ours_reads_the_columnar_formats_without_workers_and_compressed(
    data_dir: Path, fmt: str, codec: str
) -> None:
    data, cfg = tiny(data_dir, fmt, num_workers=0, codec=codec)
    with scan.open_loader(data, cfg) as reader:
        assert sorted(epoch_labels(reader, data, 0)) == list(range(data.records))


def test_parquet_files_have_row_groups_of_the_size_asked(data_dir: Path) -> None:
    import pyarrow.parquet as pq

    data, _ = tiny(data_dir, "parquet")
    assert data.spec.records_per_group == 16 * 1024 // data.spec.record_bytes == 4
    first = pq.ParquetFile(data.files[0])
    assert first.schema_arrow.names == list(formats.COLUMNS)
    assert [first.metadata.row_group(g).num_rows for g in range(first.num_row_groups)] == [4] * 4
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in data.files) == data.records
    row = pq.read_table(data.files[0]).slice(1, 1).to_pylist()[0]
    key, header, payload, label = ds.encode_row(data.spec, 1)
    assert row == {"image": payload, "key": key, "label": label, "meta": header}


def test_mds_shards_are_read_by_the_streaming_librarys_own_reader(data_dir: Path) -> None:
    data, _ = tiny(data_dir, "mds")
    lib = formats.streaming_modules("test")
    local = lib.StreamingDataset(local=str(data.root), remote=None, shuffle=False, batch_size=8)
    assert local.num_samples == data.records
    for i in (0, data.records - 1):
        key, header, payload, label = ds.encode_row(data.spec, i)
        assert local[i] == {"image": payload, "key": key, "label": label, "meta": header.decode()}
    assert [p.name for p in data.files][-1] == formats.MDS_INDEX
    assert sum(formats.mds_counts(data.root)) == data.records


@pytest.mark.parametrize("fmt", ["parquet", "mds"])
def test_a_columnar_dataset_is_generated_once_then_reused_and_verified(
    data_dir: Path, fmt: str
) -> None:
    data, _ = tiny(data_dir, fmt)
    again, _ = tiny(data_dir, fmt)
    assert data.generated and not again.generated
    assert [p.read_bytes() for p in data.files] == [p.read_bytes() for p in again.files]


@pytest.mark.parametrize("fmt", ["parquet", "mds"])
@pytest.mark.parametrize(
    ("damage", "code", "message"),
    [
        ("truncate", 6, "truncated"),
        ("flip", 6, "fails its CRC32 check"),
        ("foreign", 3, "not a dataset generated here"),
        ("other", 5, "another one"),
    ],
)
def test_a_damaged_foreign_or_other_columnar_dataset_is_refused_before_the_scan(
    data_dir: Path, fmt: str, damage: str, code: int, message: str
) -> None:
    args = ["--data-dir", data_dir, "--dataset-format", fmt, *TINY, "--row-group-size", ROW_GROUP]
    if damage == "foreign":
        (data_dir / fmt).mkdir(parents=True)
        (data_dir / fmt / "train-00000.parquet").write_bytes(b"PAR1 theirs")
    else:
        data, _ = tiny(data_dir, fmt)
        victim = data.files[0]
        blob = bytearray(victim.read_bytes())
        if damage == "truncate":
            del blob[-100:]
        elif damage == "flip":
            blob[len(blob) // 2] ^= 0xFF
        victim.write_bytes(bytes(blob))
        if damage == "other":  # click takes an option's last value
            args += ["--row-group-size", "32KiB"] if fmt == "parquet" else ["--seed", "1"]
    result = run_cli("scan", *args, "--epochs", "1", "--no-track")
    assert result.exit_code == code, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("fmt", "loader", "workers"),
    [("parquet", "ours", 0), ("mds", "ours", 0), *((f, n, 2) for f, n in PAIRS)],
)
def test_a_record_damaged_after_verification_stops_the_scan_with_exit_6_whatever_the_loader(
    data_dir: Path, fmt: str, loader: str, workers: int
) -> None:
    data, cfg = tiny(data_dir, fmt, num_workers=workers, epochs=1, loader=loader)
    victim = data.files[0]
    blob = bytearray(victim.read_bytes())
    # An image's byte: the first record's, in the first row group or shard.
    key, header, payload, _ = ds.encode_row(data.spec, 0)
    blob[blob.index(payload[:64]) + 100] ^= 0xFF
    victim.write_bytes(bytes(blob))
    with pytest.raises(DatasetCorruptError, match="CRC32") as caught:
        scan.run_scan(data, cfg)
    assert caught.value.exit_code == 6 and "Traceback" not in caught.value.message
    # Ours names the file; a library names the record as it knows it (its key, its URL).
    assert str(victim) in caught.value.message or loader == "streaming"


@pytest.mark.parametrize(("fmt", "loader"), [("webdataset", "streaming"), ("files", "arrow")])
def test_a_loader_that_does_not_read_the_format_is_refused(
    data_dir: Path, fmt: str, loader: str
) -> None:
    result = run_cli(
        "scan", "--data-dir", data_dir, "--dataset-format", fmt, "--loader", loader, "--no-track"
    )
    assert result.exit_code == 2
    assert f"--loader {loader} does not read --dataset-format {fmt}" in result.output
    assert not data_dir.exists() or not any(data_dir.iterdir())  # nothing generated


@pytest.mark.parametrize(
    ("fmt", "loader", "library"),
    [
        ("parquet", "ours", "pyarrow"),
        ("mds", "ours", "streaming"),
        ("webdataset", "webdataset", "webdataset"),
    ],
)
def test_a_missing_library_is_exit_2_before_anything_is_generated(
    data_dir: Path, fmt: str, loader: str, library: str
) -> None:
    # A module that is None in sys.modules is one Python does not have.
    hide = (
        f"import sys\nsys.modules[{library!r}] = None\n"
        "from data_workloads.cli import main\nmain()\n"
    )
    args = ["scan", "--data-dir", str(data_dir), "--dataset-format", fmt, "--loader", loader]
    result = subprocess.run(
        [sys.executable, "-c", hide, *args, "--no-track"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "formats]" in result.stderr and "Traceback" not in result.stderr
    assert not (data_dir / fmt).exists()


@pytest.mark.parametrize(("fmt", "loader"), [("mds", "streaming"), ("parquet", "ours")])
def test_the_summary_records_format_loader_library_and_the_figures(
    data_dir: Path, tmp_path: Path, fmt: str, loader: str
) -> None:
    out = tmp_path / "scan.json"
    result = run_cli(
        "scan", "--data-dir", data_dir, "--dataset-format", fmt, "--loader", loader, *TINY,
        "--epochs", "2", "--num-workers", "2", "--compute-ms", "1", "--summary-json", out,
        "--no-track",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    assert summary["config"]["dataset_format"] == fmt
    assert summary["config"]["loader"] == loader
    details = summary["details"]["loader"]
    assert details["library"] == loader
    assert (details["version"] is None) == (loader == "ours")
    figures = summary["outputs"]
    for name in ("scan_epoch_s", "scan_au", "scan_mbps", "scan_samples_per_s"):
        assert figures[name] > 0, name
    assert figures["scan_first_batch_s"] > 0 and figures["scan_wait_p99_ms"] >= 0
    assert figures["scan_cache_kept_out"] in (True, None)
    assert all(e["cpu_s"] > 0 for e in summary["details"]["epochs"])


@pytest.mark.parametrize(("fmt", "loader"), [p for p in PAIRS if p[1] != "ours"])
def test_the_cache_is_kept_out_for_the_libraries_and_that_is_measured(
    data_dir: Path, fmt: str, loader: str
) -> None:
    data, cfg = tiny(data_dir, fmt, num_workers=2, epochs=2, loader=loader)
    if not block_reads_counted(data.files[0]):
        pytest.skip("this file system does not count block reads (tmpfs?)")
    result = scan.run_scan(data, cfg)
    assert result["figures"]["scan_cache_kept_out"] is True
    assert all(c >= scan.CACHE_COVERAGE for c in result["cache"]["device_read_coverage"])
    # Without the drop the library's reads come from the cache, and the check says so:
    # the workers' reads are counted, not assumed.
    _, cfg = tiny(data_dir, fmt, num_workers=2, epochs=2, loader=loader, drop_cache=False)
    assert scan.run_scan(data, cfg)["figures"]["scan_cache_kept_out"] is False


@pytest.mark.parametrize(("fmt", "loader"), [("webdataset", "webdataset"), ("files", "torch")])
def test_a_file_deleted_after_verification_is_exit_6_through_the_library(
    data_dir: Path, fmt: str, loader: str
) -> None:
    data, cfg = tiny(data_dir, fmt, num_workers=2, epochs=1, loader=loader, drop_cache=False)
    victim = data.files[len(data.files) // 2]
    victim.unlink()
    with pytest.raises(DatasetCorruptError) as caught:
        scan.run_scan(data, cfg)
    assert caught.value.exit_code == 6 and str(victim) in caught.value.message
    assert "Traceback" not in caught.value.message


@pytest.mark.parametrize("fmt", ["parquet", "mds"])
def test_materialize_reads_every_record_of_a_columnar_dataset(data_dir: Path, fmt: str) -> None:
    from data_workloads.config import MaterializeConfig
    from data_workloads.materialize import run_materialize
    from data_workloads.scratch import ScratchDir

    data, _ = tiny(data_dir, fmt)
    cfg = MaterializeConfig(data_dir=data_dir, dataset_format=fmt, track=False)
    with ScratchDir(data_dir, "materialize") as scratch:
        result = run_materialize(data, cfg, scratch)
    assert result["records"] == data.records
    # float16 of every pixel, and each record's JSON header, in the output shards
    assert result["figures"]["materialize_output_bytes"] > 2 * data.records * data.spec.record_bytes


@pytest.mark.timeout(60)  # too few slots for what one read places would stall the workers
def test_tiny_mds_records_take_more_buffers_than_one_read_and_all_arrive(data_dir: Path) -> None:
    data, cfg = prepared(
        data_dir, "mds", dataset_size="256KiB", record_size="192", shard_size="128KiB",
        batch_size=64, shuffle_buffer=200, num_workers=2,
    )  # fmt: skip
    # Three buffers a sample: a shard of more than IOV_MAX / 3 samples needs several reads.
    assert min(formats.mds_counts(data.root)) > scan.IOV_MAX // 3
    with scan.open_loader(data, cfg) as reader:
        assert sorted(epoch_labels(reader, data, 0)) == list(range(data.records))


def test_an_mds_shard_beyond_its_32_bit_offsets_is_refused(data_dir: Path) -> None:
    result = run_cli(
        "scan", "--data-dir", data_dir, "--dataset-format", "mds", "--shard-size", "4GiB",
        "--no-track",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--shard-size must be at most" in result.output and "32-bit" in result.output
