"""``python -m data_workloads.bench --dir DIR``: for each format, our loader and the team's
library beside fio, in one run, on one directory.

For each format (``webdataset``, ``files``, ``parquet``, ``mds``) the dataset is generated
once in ``DIR`` (reused by the next run) and scanned by our loader and by the library a team
would use on it (``LOADER_FORMATS``), each with the same DataLoader settings and no compute
step, the page cache dropped before every epoch and the drop checked; beside them fio's
random read at the same block size and queue depth: the median file for ``files`` (each is
read with one ``preadv``), 1 MiB for the shard formats (our reads of a tar or MDS shard; a
Parquet row group of the default size); the queue depth is the number of DataLoader workers
(each has one read in flight). The runs are interleaved (every format and loader, then fio,
``--repeats`` times), so the machine's load moves them alike, and each figure is the median
of its repeats.

Per row: MB/s (bytes of the dataset on the volume / epoch time) and its ratio to fio, the
loader's CPU per MB (main process and workers, user + system, from the workers' own clocks;
and of that the system share: the kernel's read path), and the cores it needs at that cost to
keep up with fio. On a shared machine the ratio says how many cores the loader got, the CPU
per MB what it costs on any. The goals: our loader at least 0.9x fio, and its CPU per MB at
most half the library's on the same bytes. ``--profile DIR`` then samples one more scan of
each with ``py-spy`` (workers included) and prints where each spends its CPU. The
materialize write (bytes / (write + fsync)) is printed beside fio's buffered sequential write
of the same size with an fsync at the end, on our rows. Nothing is asserted: the figures are
the result.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from checkpoint_storage_bench.contract import (
    DATA_FORMATS,
    DATA_SUMMARY_EPOCHS,
    LOADER_FORMATS,
    MATERIALIZE_OUTPUT_BYTES,
    MATERIALIZE_WRITE_MBPS,
    SCAN_CACHE_KEPT_OUT,
    SCAN_MBPS,
)
from checkpoint_storage_bench.fio import extract_json, parse_jobs, run_fio
from checkpoint_storage_bench.units import format_bytes
from data_workloads import dataset as ds
from data_workloads.commands import prepare_dataset
from data_workloads.config import MaterializeConfig, ScanConfig
from data_workloads.formats import check_libraries
from data_workloads.materialize import run_materialize
from data_workloads.scan import run_scan
from data_workloads.scratch import ScratchDir
from data_workloads.stats import median

BLOCK = 4096
GOAL = 0.9
CPU_GOAL = 0.5
"""Our loader's CPU per MB at most this share of the library's."""
PROFILE_TOP = 8
PROFILE_MIN_SAMPLES = 50
"""Fewer samples inside the epochs than this name nothing: a scan of a small dataset is over
in a few of py-spy's samples, and their functions would be chance."""


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


def theirs(fmt: str) -> str:
    """The library loader of a format."""
    (name,) = (n for n, fmts in LOADER_FORMATS.items() if n != "ours" and fmt in fmts)
    return name


def scan_once(directory: Path, fmt: str, loader: str, settings: dict[str, Any]) -> dict[str, Any]:
    """One scan's figures: MB/s, CPU and system ms per MB (medians over its epochs), whether
    the cache was kept out, and the second epoch's time over the first."""
    cfg = ScanConfig(data_dir=directory, dataset_format=fmt, loader=loader, track=False, **settings)
    data = prepare_dataset(cfg)
    result = run_scan(data, cfg)
    mb = data.bytes / 1e6
    return {
        "scan_mbps": result["figures"][SCAN_MBPS],
        "cpu_ms_per_mb": median([1000 * e["cpu_s"] / mb for e in result[DATA_SUMMARY_EPOCHS]]),
        "sys_ms_per_mb": median([1000 * e["sys_s"] / mb for e in result[DATA_SUMMARY_EPOCHS]]),
        "cache_kept_out": result["figures"][SCAN_CACHE_KEPT_OUT],
        "second_epoch_ratio": result["cache"]["second_epoch_ratio"],
    }


def read_block(fmt: str, data: ds.Dataset) -> int:
    """fio's block size for a format: what its loader reads at once."""
    if fmt == "files":
        return -(-int(median(list(data.sizes)) or BLOCK) // BLOCK) * BLOCK
    return ds.READ_CHUNK


def bench(
    directory: Path, formats: list[str], settings: dict[str, Any], fio: str, repeats: int
) -> list[dict[str, Any]]:
    """Every format through our loader and its library, and fio, interleaved ``repeats``
    times; one row per format and loader with the medians."""
    datasets = {}
    for fmt in formats:
        cfg = ScanConfig(data_dir=directory, dataset_format=fmt, track=False, **settings)
        datasets[fmt] = prepare_dataset(cfg)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    fio_runs: dict[str, list[float]] = collections.defaultdict(list)
    qd = max(1, settings["num_workers"])
    for _ in range(repeats):
        for fmt in formats:
            data = datasets[fmt]
            for loader in ("ours", theirs(fmt)):
                runs[fmt, loader].append(scan_once(directory, fmt, loader, settings))
            with ScratchDir(directory, "bench-fio") as scratch:
                bs = read_block(fmt, data)
                fio_runs[fmt].append(
                    fio_mbps(fio, scratch / "randread", "randread", bs, qd, data.bytes, True)
                )
    rows = []
    for fmt in formats:
        data, fio_read = datasets[fmt], median(fio_runs[fmt])
        library_cpu = median([r["cpu_ms_per_mb"] for r in runs[fmt, theirs(fmt)]])
        for loader in ("ours", theirs(fmt)):
            got = runs[fmt, loader]
            cpu = median([r["cpu_ms_per_mb"] for r in got])
            ratios = [r["second_epoch_ratio"] for r in got if r["second_epoch_ratio"] is not None]
            kept = [r["cache_kept_out"] for r in got]
            rows.append(
                {
                    "format": fmt,
                    "loader": loader,
                    "runs": len(got),
                    "records": data.records,
                    "bytes": data.bytes,
                    "bs": read_block(fmt, data),
                    "qd": qd,
                    "scan_mbps": median([r["scan_mbps"] for r in got]),
                    "fio_randread_mbps": fio_read,
                    "cpu_ms_per_mb": cpu,
                    "sys_ms_per_mb": median([r["sys_ms_per_mb"] for r in got]),
                    "cpu_vs_library": cpu / library_cpu if loader == "ours" else None,
                    "cores_to_keep_up": fio_read * cpu / 1000,
                    "cache_kept_out": None if None in kept else all(kept),
                    "second_epoch_ratio": median(ratios) if ratios else None,
                    "materialize_write_mbps": None,
                    "fio_write_mbps": None,
                }
            )
    return rows


def add_materialize(
    directory: Path, rows: list[dict[str, Any]], settings: dict[str, Any], fio: str
) -> None:
    """The materialize write and fio's buffered write of the same size, on our rows."""
    for row in rows:
        if row["loader"] != "ours":
            continue
        cfg = MaterializeConfig(
            data_dir=directory, dataset_format=row["format"], track=False, **_dataset(settings)
        )
        data = prepare_dataset(cfg)
        with ScratchDir(directory, "bench-materialize") as scratch:
            mat = run_materialize(data, cfg, scratch)["figures"]
        with ScratchDir(directory, "bench-fio") as scratch:
            size = mat[MATERIALIZE_OUTPUT_BYTES]
            fio_write = fio_mbps(fio, scratch / "write", "write", 1024**2, 1, size, False)
        row.update(materialize_write_mbps=mat[MATERIALIZE_WRITE_MBPS], fio_write_mbps=fio_write)


def _dataset(settings: dict[str, Any]) -> dict[str, Any]:
    keys = ("dataset_size", "record_size", "shard_size", "row_group_size", "seed", "codec")
    return {k: v for k, v in settings.items() if k in keys}


def _shown(value: float | None, width: int, digits: int) -> str:
    """A figure in its column; "-" where there is none (one epoch has no second)."""
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


HEADER = (
    f"{'format':<10} {'loader':<10} {'dataset':>10} {'bs':>8} {'qd':>3} {'scan MB/s':>10} "
    f"{'fio randread':>12} {'ratio':>6} {'cpu ms/MB':>9} {'sys':>5} {'vs lib':>6} {'cores':>5} "
    f"{'cache out':>9} {'ep2/ep1':>7} {'mat. write':>10} {'fio write':>9} {'ratio':>6}"
)


def table_row(r: dict[str, Any]) -> str:
    """One format and loader's line of the table."""
    read_ratio = r["scan_mbps"] / r["fio_randread_mbps"]
    mat_mbps, fio_write = r["materialize_write_mbps"], r["fio_write_mbps"]
    write_ratio = None if mat_mbps is None or not fio_write else mat_mbps / fio_write
    return (
        f"{r['format']:<10} {r['loader']:<10} {format_bytes(r['bytes']):>10} "
        f"{format_bytes(r['bs']):>8} {r['qd']:>3} {r['scan_mbps']:>10.1f} "
        f"{r['fio_randread_mbps']:>12.1f} {read_ratio:>6.2f} {r['cpu_ms_per_mb']:>9.2f} "
        f"{r['sys_ms_per_mb']:>5.2f} {_shown(r['cpu_vs_library'], 6, 2)} "
        f"{r['cores_to_keep_up']:>5.1f} {str(r['cache_kept_out']):>9} "
        f"{_shown(r['second_epoch_ratio'], 7, 2)} {_shown(mat_mbps, 10, 1)} "
        f"{_shown(fio_write, 9, 1)} {_shown(write_ratio, 6, 2)}"
    )


_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def where_cpu_goes(collapsed: str, top: int = PROFILE_TOP) -> list[tuple[str, float]]:
    """The functions that used the most CPU in a ``py-spy record --format raw`` profile
    (collapsed stacks, a line per stack and its samples; with ``--subprocesses`` each stack
    starts with its process, a worker's with the main process and then its own): the
    innermost frame of each sample, by function and file, with its share of the samples.
    The main process counts only inside the epochs (``run_epoch``), not while it generates
    or verifies the dataset; the workers whole.

    >>> where_cpu_goes("process 1:x;run_epoch (scan.py:5);sleep (time.py:1) 3\\n"
    ...     "process 1:x;process 2:y;crc32 (dataset.py:9) 1\\nprocess 1:x;verify (d.py:2) 9")
    [('sleep (time.py)', 0.75), ('crc32 (dataset.py)', 0.25)]
    """
    return _shares(_epoch_samples(collapsed), top)


def _shares(counts: collections.Counter[str], top: int) -> list[tuple[str, float]]:
    total = sum(counts.values())
    return [(name, n / total) for name, n in counts.most_common(top)] if total else []


def _epoch_samples(collapsed: str) -> collections.Counter[str]:
    """Samples by innermost frame, the main process's only inside ``run_epoch``."""
    counts: collections.Counter[str] = collections.Counter()
    for line in collapsed.splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        frames = stack.split(";")
        in_main = sum(1 for f in frames if f.startswith("process ")) <= 1
        if in_main and not any(f.startswith("run_epoch ") for f in frames):
            continue
        match = _FRAME.match(frames[-1])
        leaf = f"{match['function']} ({os.path.basename(match['file'])})" if match else frames[-1]
        counts[leaf] += int(samples)
    return counts


def profile_line(fmt: str, loader: str, collapsed: str) -> str:
    """The report's line for one profile: its top functions, or that it has too few samples
    to name any.

    >>> profile_line("files", "ours", "process 1:x;run_epoch (scan.py:5);sleep (t.py:1) 3")
    'where ours spends its CPU on files: too few samples (3 of 50) to say; scan more data (--dataset-size, --epochs)'
    """
    counts = _epoch_samples(collapsed)
    samples = sum(counts.values())
    head = f"where {loader} spends its CPU on {fmt}"
    if samples < PROFILE_MIN_SAMPLES:
        return (
            f"{head}: too few samples ({samples} of {PROFILE_MIN_SAMPLES}) to say; "
            "scan more data (--dataset-size, --epochs)"
        )
    shares = ", ".join(f"{name} {share:.0%}" for name, share in _shares(counts, PROFILE_TOP))
    return f"{head} ({samples} samples): {shares}"


def profile(directory: Path, out: Path, formats: list[str], settings: dict[str, Any]) -> list[str]:
    """One more scan of each format and loader under ``py-spy record --subprocesses``; the
    raw profiles are written to ``out``, the report's lines about them returned."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise click.ClickException("--profile needs py-spy (pip install py-spy)")
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for fmt in formats:
        for loader in ("ours", theirs(fmt)):
            raw = out / f"{fmt}-{loader}.txt"
            args = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
            command = [
                spy, "record", "--subprocesses", "--nonblocking", "--rate", "200",
                "--format", "raw", "-o", str(raw), "--",
                sys.executable, "-m", "data_workloads", "scan", "--data-dir", str(directory),
                f"--dataset-format={fmt}", f"--loader={loader}", "--no-track", *args,
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise click.ClickException(f"py-spy failed: {done.stderr.strip()[-300:]}")
            lines.append(profile_line(fmt, loader, raw.read_text()))
    return lines


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--dir", "directory", required=True, type=click.Path(path_type=Path),
              help="Directory on the volume to measure (its parent must exist).")  # fmt: skip
@click.option("--dataset-size", default="256MiB", show_default=True, help="Decoded dataset bytes.")
@click.option("--record-size", default="128KiB", show_default=True, help="Decoded record bytes.")
@click.option("--num-workers", default=4, show_default=True, help="DataLoader workers (= fio QD).")
@click.option("--batch-size", default=16, show_default=True, help="Records per batch.")
@click.option(
    "--format", "formats", multiple=True, type=click.Choice(list(DATA_FORMATS)),
    help="Formats to measure [default: all].",
)  # fmt: skip
@click.option("--codec", default="none", show_default=True, type=click.Choice(["none", "zlib"]),
              help="How the records' images are stored.")  # fmt: skip
@click.option("--epochs", default=3, show_default=True, help="Scan epochs (the median's MB/s).")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1),
              help="Interleaved rounds of every scan and fio (the table has their medians).")  # fmt: skip
@click.option("--materialize/--no-materialize", default=True, show_default=True,
              help="Also the materialize write beside fio's buffered write.")  # fmt: skip
@click.option("--profile", "profile_dir", type=click.Path(path_type=Path),
              help="Sample one more scan of each with py-spy; raw profiles into this directory.")  # fmt: skip
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
    repeats: int,
    materialize: bool,
    profile_dir: Path | None,
    fio: str,
) -> None:
    """Every format through our loader and the team's library beside fio on one directory;
    prints a table of medians and ratios."""
    if shutil.which(fio) is None:
        raise click.ClickException(f"fio not found ({fio!r}): install it or give --fio")
    chosen = list(formats or DATA_FORMATS)
    for fmt in chosen:
        check_libraries(fmt, theirs(fmt))
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
    rows = bench(directory, chosen, settings, fio, repeats)
    if materialize:
        add_materialize(directory, rows, settings, fio)
    click.echo(HEADER)
    for r in rows:
        click.echo(table_row(r))
    click.echo(
        f"{os.cpu_count()} CPUs, load average {load_before:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end; medians of {repeats} interleaved runs"
    )
    ours = [r for r in rows if r["loader"] == "ours"]
    worst = min(r["scan_mbps"] / r["fio_randread_mbps"] for r in ours)
    verdict = "the loader keeps up" if worst >= GOAL else "the loader is the bottleneck here"
    click.echo(f"scan / fio randread, worst format: {worst:.2f}x (goal >= {GOAL}x): {verdict}")
    cpu = max(r["cpu_vs_library"] for r in ours)
    met = "met" if cpu <= CPU_GOAL else "not met"
    click.echo(
        f"our CPU per MB / the library's, worst format: {cpu:.2f} (goal <= {CPU_GOAL}): {met}"
    )
    if profile_dir is not None:
        for line in profile(directory, profile_dir, chosen, settings):
            click.echo(line)


if __name__ == "__main__":
    main()
