"""``python -m data_workloads.bench --dir DIR``: the loaders beside fio, in one run, on one
directory.

The scan's MB/s (bytes of the dataset on the volume / epoch time, the page cache dropped
before each epoch) is printed beside fio's random read at the same block size and queue
depth: for the ``files`` format the median file (each is read with one ``preadv``), for
``webdataset`` the loader's 1 MiB reads of a shard; the queue depth is the number of
DataLoader workers (each has one read in flight). The goal is a loader that is never the
bottleneck: at least 0.9x fio. Beside the ratio, the loader's CPU per MB (main process and
workers, user + system, and of that the system share: the kernel's read path) and the
cores it needs to keep up with fio at that cost: on a shared machine the ratio says how
many cores the loader got, the CPU per MB what it costs on any. The materialize write
(bytes / (write + fsync)) is printed beside fio's buffered sequential write of the same
size with an fsync at the end. Nothing is asserted: the figures are the result.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import click

from checkpoint_storage_bench.fio import extract_json, parse_jobs, run_fio
from checkpoint_storage_bench.units import format_bytes
from data_workloads import dataset as ds
from data_workloads.commands import prepare_dataset
from data_workloads.config import DatasetFormat, MaterializeConfig, ScanConfig
from data_workloads.materialize import run_materialize
from data_workloads.scan import run_scan
from data_workloads.scratch import ScratchDir
from data_workloads.stats import median

BLOCK = 4096
GOAL = 0.9


def fio_mbps(
    fio: str, path: Path, rw: str, bs: int, iodepth: int, size: int, direct: bool
) -> float:
    """One fio job's MB/s on a file at ``path`` (removed afterwards)."""
    size = max(bs, size // bs * bs)
    args = [
        fio, "--name=bench", f"--filename={path}", f"--rw={rw}", f"--bs={bs}", f"--size={size}",
        f"--direct={int(direct)}", "--ioengine=libaio", f"--iodepth={iodepth}",
        "--output-format=json", "--runtime=30",
    ]  # fmt: skip
    if rw == "write":
        args += ["--end_fsync=1", "--fallocate=none"]
    try:
        result = run_fio(args)
        if result.returncode != 0:
            raise click.ClickException(f"fio failed: {result.message}")
        return parse_jobs(extract_json(result.stdout)).bw_mbps
    finally:
        path.unlink(missing_ok=True)


def bench_format(
    directory: Path, fmt: DatasetFormat, settings: dict[str, Any], fio: str
) -> dict[str, Any]:
    cfg = ScanConfig(data_dir=directory, dataset_format=fmt, track=False, **settings)
    data = prepare_dataset(cfg)
    scan = run_scan(data, cfg)
    sizes = [p.stat().st_size for p in data.files]
    bs = ds.READ_CHUNK if fmt == "webdataset" else -(-int(median(sizes)) // BLOCK) * BLOCK
    with ScratchDir(directory, "bench-fio") as scratch:
        fio_read = fio_mbps(
            fio, scratch / "randread", "randread", bs, max(1, cfg.num_workers), data.bytes, True
        )
    epochs = scan["epochs"]
    cpu_ms_per_mb = median([1000 * e["cpu_s"] / (data.bytes / 1e6) for e in epochs])
    row = {
        "cpu_ms_per_mb": cpu_ms_per_mb,
        "sys_ms_per_mb": median([1000 * e["sys_s"] / (data.bytes / 1e6) for e in epochs]),
        "cores_to_keep_up": fio_read * cpu_ms_per_mb / 1000,
        "format": fmt,
        "records": data.records,
        "bytes": data.bytes,
        "bs": bs,
        "qd": max(1, cfg.num_workers),
        "scan_mbps": scan["figures"]["scan_mbps"],
        "fio_randread_mbps": fio_read,
        "cache_kept_out": scan["figures"]["scan_cache_kept_out"],
        "second_epoch_ratio": scan["cache"]["second_epoch_ratio"],
    }
    mat_cfg = MaterializeConfig(
        data_dir=directory, dataset_format=fmt, track=False, **_dataset(settings)
    )
    with ScratchDir(directory, "bench-materialize") as scratch:
        mat = run_materialize(data, mat_cfg, scratch)["figures"]
    with ScratchDir(directory, "bench-fio") as scratch:
        fio_write = fio_mbps(
            fio, scratch / "write", "write", 1024**2, 1, mat["materialize_output_bytes"], False
        )
    row.update(materialize_write_mbps=mat["materialize_write_mbps"], fio_write_mbps=fio_write)
    return row


def _dataset(settings: dict[str, Any]) -> dict[str, Any]:
    keys = ("dataset_size", "record_size", "shard_size", "seed", "codec")
    return {k: v for k, v in settings.items() if k in keys}


def _shown(value: float | None, width: int, digits: int) -> str:
    """A figure in its column; "-" where there is none (one epoch has no second)."""
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def table_row(r: dict[str, Any]) -> str:
    """One format's line of the table."""
    read_ratio = r["scan_mbps"] / r["fio_randread_mbps"]
    mat_mbps = r["materialize_write_mbps"]
    write_ratio = None if mat_mbps is None else mat_mbps / r["fio_write_mbps"]
    return (
        f"{r['format']:<11} {format_bytes(r['bytes']):>10} {format_bytes(r['bs']):>8} "
        f"{r['qd']:>3} {r['scan_mbps']:>10.1f} {r['fio_randread_mbps']:>12.1f} "
        f"{read_ratio:>6.2f} {r['cpu_ms_per_mb']:>9.2f} {r['sys_ms_per_mb']:>5.2f} "
        f"{r['cores_to_keep_up']:>5.1f} "
        f"{str(r['cache_kept_out']):>9} {_shown(r['second_epoch_ratio'], 7, 2)} "
        f"{_shown(mat_mbps, 10, 1)} {r['fio_write_mbps']:>9.1f} {_shown(write_ratio, 6, 2)}"
    )


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--dir", "directory", required=True, type=click.Path(path_type=Path),
              help="Directory on the volume to measure (its parent must exist).")  # fmt: skip
@click.option("--dataset-size", default="256MiB", show_default=True, help="Decoded dataset bytes.")
@click.option("--record-size", default="128KiB", show_default=True, help="Decoded record bytes.")
@click.option("--num-workers", default=4, show_default=True, help="DataLoader workers (= fio QD).")
@click.option("--batch-size", default=16, show_default=True, help="Records per batch.")
@click.option(
    "--format", "formats", multiple=True, type=click.Choice(["webdataset", "files"]),
    help="Formats to measure [default: both].",
)  # fmt: skip
@click.option("--codec", default="none", show_default=True, type=click.Choice(["none", "zlib"]),
              help="How the records' images are stored.")  # fmt: skip
@click.option("--epochs", default=3, show_default=True, help="Scan epochs (the median's MB/s).")
@click.option("--fio", default="fio", show_default=True, help="The fio binary.")
def main(
    directory: Path,
    dataset_size: str,
    record_size: str,
    num_workers: int,
    batch_size: int,
    formats: tuple[str, ...],
    codec: str,
    epochs: int,
    fio: str,
) -> None:
    """Scan and materialize beside fio on one directory; prints a table of ratios."""
    if shutil.which(fio) is None:
        raise click.ClickException(f"fio not found ({fio!r}): install it or give --fio")
    settings = dict(
        dataset_size=dataset_size,
        record_size=record_size,
        num_workers=num_workers,
        batch_size=batch_size,
        codec=codec,
        epochs=epochs,
        compute_ms=0.0,
    )
    ScanConfig(data_dir=directory, track=False, **settings).check_data_dir()
    load_before = os.getloadavg()[0]
    rows = [bench_format(directory, f, settings, fio) for f in formats or ("webdataset", "files")]
    click.echo(
        f"{'format':<11} {'dataset':>10} {'bs':>8} {'qd':>3} {'scan MB/s':>10} "
        f"{'fio randread':>12} {'ratio':>6} {'cpu ms/MB':>9} {'sys':>5} {'cores':>5} "
        f"{'cache out':>9} {'ep2/ep1':>7} {'mat. write':>10} {'fio write':>9} {'ratio':>6}"
    )
    for r in rows:
        click.echo(table_row(r))
    click.echo(
        f"{os.cpu_count()} CPUs, load average {load_before:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    worst = min(r["scan_mbps"] / r["fio_randread_mbps"] for r in rows)
    verdict = "the loader keeps up" if worst >= GOAL else "the loader is the bottleneck here"
    click.echo(f"scan / fio randread, worst format: {worst:.2f}x (goal >= {GOAL}x): {verdict}")


if __name__ == "__main__":
    main()
