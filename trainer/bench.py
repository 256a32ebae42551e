"""``python -m trainer.bench``: our checkpoint writer against fio and the libraries users
would pick (``torch.save``, ``torch.distributed.checkpoint``, safetensors).

Everything runs in one process on one directory, interleaved and repeated, so the ratios
compare like with like on a noisy machine; the table reports medians. Writes go to new
files (as checkpoints do) and are timed until fsynced; before any read the file's pages
are dropped from the page cache so reads come from the volume.

Cases (each repeat runs them all, in this order):
  fio-write        fio, sequential write, new file, direct=1, 8 MiB blocks, 4 in flight, end_fsync
  fio-write-1m     fio, the same with 1 MiB blocks and two jobs (best on our test VMs)
  fio-write-sN     fio, 4 MiB blocks, 4 in flight, N jobs (files): the streams sweep's reference
  raw-sync         our writer: stage into the reused aligned buffer with chunk k written while
                   chunk k+1 is copied, O_DIRECT, 4 MiB chunks x 4 in flight, fsync, commit
  raw-sync-strict  the same with --no-overlap: stage everything, then write
  raw-sync-sN      raw-sync over N files (--io-streams N)
  raw-async        our writer in async mode: ``pause`` is what the training loop waits for
  torch-save       ``torch.save(state, path)`` + fsync (the usual way)
  dcp-sync         trainer --format dcp: DCP ``save`` with FileSystemWriter (fsyncs its files)
  dcp-async        trainer --format dcp --async: DCP ``async_save``; ``pause`` as above
  safetensors      trainer --format safetensors: ``save_file`` + fsync
  fio-read         fio, sequential read of a written file, direct=1, 8 MiB blocks
  raw-load         read + verify checksums + build tensors (our format)
  torch-load       ``torch.load`` of the torch.save file

The library formats run through the trainer's checkpointer, so they get the same stage
timeline; their ``seconds`` leave out the read-back our manifest needs for their files
(``checksum_s``, reported apart), since a user of the library would not pay it. Then, once,
``steps/s`` of a training loop with and without an async checkpoint in flight.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import torch

from checkpoint_storage_bench.units import format_bytes, parse_size
from trainer.ckpt import checksum, store
from trainer.ckpt.checkpointer import Checkpointer
from trainer.ckpt.formats import Format, RawFormat, WriteOptions, load_verified, make_format
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer
from trainer.shape import shape_for_bytes

GB = 1e9
CPU = torch.device("cpu")
STREAMS = (1, 2, 4, 8)
TRAIN_SEQ_LEN = 64
TARGETS: dict[str, tuple[float, str]] = {
    "raw-sync whole save vs fio write": (0.9, ">="),
    "raw-sync vs dcp-sync": (2.0, ">="),
    "raw-sync vs safetensors": (1.5, ">="),
    "raw-load vs fio read": (0.9, ">="),
    "async steps/s ratio": (0.95, ">="),
    "async pause s/GB": (0.1, "<="),
    "dcp-async pause / raw-async pause": (3.0, ">="),
}
"""Issue 15's targets: name -> (threshold, how the measured value must compare)."""


def make_state(nbytes: int, seed: int = 0) -> dict[str, Any]:
    """A model-and-optimizer-shaped state of about ``nbytes``: big matrices, small vectors."""
    gen = torch.Generator().manual_seed(seed)
    per_layer = max(nbytes // 3 // 8, 4096)  # params, exp_avg, exp_avg_sq over 8 layers
    model, opt_state = {}, {}
    for layer in range(8):
        side = int((per_layer / 4) ** 0.5)
        for i, name in enumerate(("weight", "bias", "ln.weight", "ln.bias")):
            shape = (side, side) if name == "weight" else (side,)
            key = f"layer{layer}.{name}"
            model[key] = torch.randn(shape, generator=gen)
            idx = layer * 4 + i
            opt_state[idx] = {
                "step": torch.tensor(100.0),
                "exp_avg": torch.randn(shape, generator=gen),
                "exp_avg_sq": torch.rand(shape, generator=gen),
            }
    return {
        "model": model,
        "optimizer": {
            "state": opt_state,
            "param_groups": [{"lr": 3e-4, "params": list(opt_state)}],
        },
        "step": 100,
    }


def _to(state: Any, device: torch.device) -> Any:
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: _to(v, device) for k, v in state.items()}
    if isinstance(state, list):
        return [_to(v, device) for v in state]
    return state


def state_bytes(state: Any) -> int:
    tensors: list[torch.Tensor] = []
    from trainer.ckpt.formats import flatten

    flatten(state, tensors)
    return sum(t.numel() * t.element_size() for t in tensors)


def drop_cache(path: Path) -> None:
    """Evict a file's pages so the next read comes from the device (as a restore does)."""
    LocalFS().drop_cached(path)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Bench:
    """Runs the cases and keeps every sample."""

    def __init__(
        self,
        directory: Path,
        size: int,
        threads: int,
        streams: tuple[int, ...],
        device: torch.device = CPU,
    ) -> None:
        self.dir = directory
        self.samples: dict[str, list[dict[str, float]]] = defaultdict(list)
        self.device = device
        self.state = _to(make_state(size), device)
        self.nbytes = state_bytes(self.state)
        self.fio = shutil.which("fio")
        self.streams = streams
        self._formats: dict[str, Format] = {}
        self._load_buf = AlignedBuffer()
        torch.set_num_threads(threads)

    def timed(self, name: str, fn: Callable[[], dict[str, float] | None], nbytes: int) -> None:
        t0 = time.perf_counter()
        extra = fn() or {}
        seconds = extra.pop("seconds", time.perf_counter() - t0)
        self.samples[name].append({"seconds": seconds, "gbps": nbytes / seconds / GB, **extra})

    def fio_job(self, name: str, rw: str, path: Path, bs: str, iodepth: int, numjobs: int) -> None:
        from checkpoint_storage_bench.fio import extract_json, parse_jobs, run_fio

        block = parse_size(bs)
        size = max(block, self.nbytes // numjobs // block * block)
        args = [
            self.fio, "--name=bench", f"--rw={rw}", f"--bs={bs}", f"--size={size}", "--direct=1",
            "--ioengine=libaio", f"--iodepth={iodepth}", f"--numjobs={numjobs}", "--group_reporting=1",
            f"--filename_format={path}.$jobnum", "--output-format=json",
        ]  # fmt: skip
        if rw == "write":
            args += ["--end_fsync=1", "--fallocate=none"]
        result = run_fio(args)
        if result.returncode != 0:
            raise click.ClickException(f"fio failed: {result.message}")
        measures = parse_jobs(extract_json(result.stdout))
        moved = size * numjobs
        self.samples[name].append(
            {"seconds": moved / measures.bw_bytes, "gbps": measures.bw_bytes / GB}
        )

    def fmt(self, name: str) -> Format:
        """One format object per name, reused as a training run reuses its buffers."""
        if name not in self._formats:
            self._formats[name] = make_format(name, pin=self.device.type == "cuda")
            if name == "raw":
                self._formats[name].stage(self.state)  # allocate once, as a training run does
        return self._formats[name]

    def save_case(self, name: str, directory: Path, fmt: str, **options: Any) -> Path:
        """Time one checkpoint through the trainer's checkpointer; returns its directory."""
        asynchronous = options.pop("asynchronous", False)
        directory.mkdir()
        ckpt = Checkpointer(
            directory,
            self.fmt(fmt),
            LocalFS(),
            durable=True,
            keep=8,
            asynchronous=asynchronous,
            device=self.device,
            options=WriteOptions(**options),
        )
        self.timed(name, lambda: self._save(ckpt), self.nbytes)
        return store.list_checkpoints(directory)[0].path

    def repeat(self, index: int) -> None:
        work = self.dir / f"rep{index}"
        work.mkdir()
        try:
            if self.fio:
                self.fio_job("fio-write", "write", work / "fio", "8M", 4, 1)
                self.fio_job("fio-write-1m", "write", work / "fio1m", "1M", 1, 2)
                for n in self.streams:
                    self.fio_job(f"fio-write-s{n}", "write", work / f"fios{n}", "4M", 4, n)
                    _remove_glob(work, f"fios{n}.*")
                _remove_glob(work, "fio1m.*")
            raw_path = self.save_case("raw-sync", work / "raw", "raw")
            shutil.rmtree(self.save_case("raw-sync-strict", work / "strict", "raw", overlap=False))
            for n in self.streams:
                if n > 1:
                    path = self.save_case(f"raw-sync-s{n}", work / f"s{n}", "raw", io_streams=n)
                    shutil.rmtree(path)
            shutil.rmtree(self.save_case("raw-async", work / "async", "raw", asynchronous=True))
            torch_file = work / "state.pt"

            def torch_save() -> None:
                torch.save(self.state, torch_file)
                fsync_path(torch_file)
                fsync_path(work)

            self.timed("torch-save", torch_save, self.nbytes)
            shutil.rmtree(self.save_case("dcp-sync", work / "dcp", "dcp"))
            shutil.rmtree(self.save_case("dcp-async", work / "dcpa", "dcp", asynchronous=True))
            shutil.rmtree(self.save_case("safetensors", work / "st", "safetensors"))
            if self.fio:
                drop_cache(work / "fio.0")
                self.fio_job("fio-read", "read", work / "fio", "8M", 4, 1)
                _remove_glob(work, "fio.*")
            drop_cache(raw_path / "state.ckpt")
            self.timed("raw-load", lambda: self._load(raw_path), self.nbytes)
            drop_cache(torch_file)
            self.timed(
                "torch-load",
                lambda: torch.load(torch_file, weights_only=True) and None,
                self.nbytes,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _save(self, ckpt: Checkpointer) -> dict[str, float]:
        t0 = time.perf_counter()
        ckpt.save(1, lambda: self.state)
        pause = time.perf_counter() - t0
        (record,) = ckpt.finish()
        checksum_s = record.checksum_s or 0.0
        return {
            # What a user of the format waits for: our read-back of a library's files, done
            # only so our manifest can checksum them, is reported apart.
            "seconds": record.total_s - checksum_s,
            "pause_s": pause,
            "stage_s": record.serialize_s,
            "write_s": record.write_s,
            "fsync_s": record.fsync_s,
            "checksum_s": checksum_s,
            "overlapped": float(record.overlapped),
            "io_direct": float(record.io_mode == "direct"),
        }

    def _load(self, path: Path) -> None:
        manifest, data = store.read_verified(LocalFS(), path, self._load_buf)
        load_verified(RawFormat(), path, manifest, data)


def _remove_glob(directory: Path, pattern: str) -> None:
    for path in directory.glob(pattern):
        path.unlink()


def steps_per_s(
    ckpt_dir: Path, steps: int, model_size: str, device: torch.device = CPU
) -> dict[str, float]:
    """Training steps/s without checkpoints vs while an async checkpoint is being written."""
    from trainer.model import VOCAB, SyntheticTokens, TinyGPT, shape_for_bytes

    torch.manual_seed(0)
    seq = TRAIN_SEQ_LEN
    model = TinyGPT(shape_for_bytes(parse_size(model_size), seq), seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = SyntheticTokens(0, 8, seq)

    def step(i: int) -> None:
        tokens = data.batch(i).to(device)
        loss = torch.nn.functional.cross_entropy(
            model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a step ends when the device is done with it

    for i in range(3):
        step(i)  # warm up

    def timed_step(i: int) -> float:
        t0 = time.perf_counter()
        step(i)
        return time.perf_counter() - t0

    ckpt = Checkpointer(
        ckpt_dir,
        RawFormat(pin=device.type == "cuda"),
        LocalFS(),
        durable=True,
        keep=1,
        asynchronous=True,
        device=device,
    )

    def state() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": opt.state_dict()}

    # Alternate: a few plain steps, then steps while an async checkpoint is in flight.
    # Per-step medians, so one slow step (or the machine's noise) does not decide.
    plain: list[float] = []
    during: list[float] = []
    for round_ in range(steps):
        plain += [timed_step(i) for i in range(2)]
        ckpt.save(round_ + 1, state)
        while ckpt.in_flight:
            during.append(timed_step(round_))
        ckpt.poll()
    ckpt.finish()
    result = {"steps_per_s_plain": 1 / statistics.median(plain)}
    result["steps_per_s_during_write"] = 1 / statistics.median(during) if during else float("nan")
    result["steps_overlapped"] = len(during)
    return result


def instrumentation_cost(work: Path) -> dict[str, float]:
    """What timing and recording one checkpoint costs: the clock reads of its spans, and
    logging its nine metrics to an (offline) Polyaxon run."""
    import os as _os

    from checkpoint_storage_bench.tracking import tracked_run

    n = 100_000
    t0 = time.perf_counter()
    for _ in range(n):
        time.monotonic()
    clock_s = (time.perf_counter() - t0) / n
    spans_per_checkpoint = 8  # request, stage start/end, write, fsync, local done, upload, end
    saved = _os.environ.get("POLYAXON_OFFLINE_ROOT")
    _os.environ["POLYAXON_OFFLINE_ROOT"] = str(work / "plx")
    try:
        with tracked_run("bench-instrumentation", tags=["bench"]) as tracker:
            costs = []
            for step in range(50):
                metrics = {f"ckpt_m{i}": float(step + i) for i in range(9)}
                t0 = time.perf_counter()
                tracker.log_metrics(step, metrics)
                costs.append(time.perf_counter() - t0)
    finally:
        if saved is None:
            _os.environ.pop("POLYAXON_OFFLINE_ROOT", None)
        else:
            _os.environ["POLYAXON_OFFLINE_ROOT"] = saved
    return {
        "clock_s_per_checkpoint": clock_s * spans_per_checkpoint,
        "tracking_s_per_checkpoint": statistics.median(costs),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(bench: Bench, extra: dict[str, float]) -> dict[str, Any]:
    med = {
        name: {k: statistics.median(s[k] for s in samples) for k in samples[0]}
        for name, samples in bench.samples.items()
    }

    def gbps(name: str) -> float | None:
        return med[name]["gbps"] if name in med else None

    fio_write = max(
        (med[n]["gbps"] for n in ("fio-write", "fio-write-1m") if n in med), default=None
    )
    # Our bytes over the time to write and fsync them (what fio measures); with overlap
    # part of the staging copy runs inside this window too.
    raw_io_gbps = statistics.median(
        bench.nbytes / (s["write_s"] + s["fsync_s"]) / GB for s in bench.samples["raw-sync"]
    )
    gb = bench.nbytes / GB
    ratios: dict[str, float | None] = {
        "raw-sync whole save vs fio write": _ratio(gbps("raw-sync"), fio_write),
        "raw-sync-strict whole save vs fio write": _ratio(gbps("raw-sync-strict"), fio_write),
        "raw-sync write+fsync vs fio write": _ratio(raw_io_gbps, fio_write),
        "raw-sync vs torch-save": _ratio(gbps("raw-sync"), gbps("torch-save")),
        "raw-sync vs dcp-sync": _ratio(gbps("raw-sync"), gbps("dcp-sync")),
        "raw-sync vs safetensors": _ratio(gbps("raw-sync"), gbps("safetensors")),
        "raw-load vs fio read": _ratio(gbps("raw-load"), gbps("fio-read")),
        "torch-save vs fio write": _ratio(gbps("torch-save"), fio_write),
        "dcp-sync vs fio write": _ratio(gbps("dcp-sync"), fio_write),
        "safetensors vs fio write": _ratio(gbps("safetensors"), fio_write),
        "async steps/s ratio": extra["steps_per_s_during_write"] / extra["steps_per_s_plain"],
        "async pause s/GB": med["raw-async"]["pause_s"] / gb,
        "dcp-async pause / raw-async pause": med["dcp-async"]["pause_s"]
        / med["raw-async"]["pause_s"],
    }
    sweep = {}
    for n in bench.streams:
        ours = "raw-sync" if n == 1 else f"raw-sync-s{n}"
        sweep[str(n)] = {
            "raw_gbps": gbps(ours),
            "fio_gbps": gbps(f"fio-write-s{n}"),
            "ratio": _ratio(gbps(ours), gbps(f"fio-write-s{n}")),
        }
    targets = {}
    for name, (threshold, op) in TARGETS.items():
        value = ratios[name]
        met = value is not None and (value >= threshold if op == ">=" else value <= threshold)
        targets[name] = {"target": threshold, "op": op, "measured": value, "met": met}
    return {
        "raw_sync_io_gbps": raw_io_gbps,
        "bytes": bench.nbytes,
        "repeats": len(bench.samples["raw-sync"]),
        "medians": med,
        "samples": bench.samples,
        "ratios": ratios,
        "streams": sweep,
        "async_pause_s_per_gb": ratios["async pause s/GB"],
        "steps": extra,
        "targets": targets,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"state: {format_bytes(result['bytes'])}, {result['repeats']} repeats, medians",
        f"{'case':<16} {'GB/s':>7} {'seconds':>8}  notes",
    ]
    for name, m in result["medians"].items():
        notes = []
        if "pause_s" in m:
            notes.append(
                f"pause {m['pause_s']:.3f}s stage {m['stage_s']:.3f}s write {m['write_s']:.3f}s "
                f"fsync {m['fsync_s']:.3f}s"
            )
            if m["checksum_s"]:
                notes.append(f"(+ checksum read-back {m['checksum_s']:.3f}s)")
            if m["overlapped"] >= 0.5:
                notes.append("overlapped")
            notes.append("O_DIRECT" if m["io_direct"] >= 0.5 else "buffered")
        lines.append(f"{name:<16} {m['gbps']:7.2f} {m['seconds']:8.3f}  {' '.join(notes)}")
    lines.append(f"raw-sync write+fsync only: {result['raw_sync_io_gbps']:.2f} GB/s")
    lines.append("streams: " + ", ".join(
        f"{n}: {_fmt(s['raw_gbps'])} GB/s ours / {_fmt(s['fio_gbps'])} fio ({_fmt(s['ratio'])}x)"
        for n, s in result["streams"].items()
    ))  # fmt: skip
    s = result["steps"]
    lines.append(
        f"training: {s['steps_per_s_plain']:.2f} steps/s plain, {s['steps_per_s_during_write']:.2f} steps/s during an async write"
    )
    if "spare_core_ratio" in s:
        lines.append(
            f"  with one CPU core left to the writer: during/plain = {s['spare_core_ratio']:.2f}"
        )
    cost = result.get("instrumentation")
    if cost:
        per = cost["clock_s_per_checkpoint"] + cost["tracking_s_per_checkpoint"]
        share = per / result["medians"]["raw-sync"]["seconds"]
        lines.append(
            f"instrumentation per checkpoint: {cost['clock_s_per_checkpoint'] * 1e6:.1f} us of clock reads + "
            f"{cost['tracking_s_per_checkpoint'] * 1e6:.0f} us of Polyaxon logging = {100 * share:.3f}% of a sync save"
        )
    lines.append("ratios:")
    for name, value in result["ratios"].items():
        lines.append(f"  {name:<40} {_fmt(value):>8}")
    lines.append("targets:")
    for name, t in result["targets"].items():
        measured = "n/a (no fio)" if t["measured"] is None else f"{t['measured']:.2f}"
        lines.append(
            f"  {name:<40} {measured:>8}  (target {t['op']} {t['target']})  {'met' if t['met'] else 'MISSED'}"
        )
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def machine(directory: Path) -> dict[str, Any]:
    """What the numbers were measured on, and how busy the machine was."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fio = shutil.which("fio")
    fio_version = (
        subprocess.run([fio, "--version"], capture_output=True, text=True).stdout.strip()
        if fio
        else None
    )
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "fio": fio_version,
        "crc32": checksum.implementation(checksum.DEFAULT),
        "dir": str(directory),
        "loadavg_start": os.getloadavg(),
    }


def _parse_streams(value: str) -> tuple[int, ...]:
    try:
        streams = tuple(sorted({int(v) for v in value.split(",") if v.strip()}))
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a list of integers", param_hint="--streams"
        ) from None
    if not streams or streams[0] != 1 or streams[-1] > 64:
        raise click.BadParameter("must include 1 and stay within 1..64", param_hint="--streams")
    return streams


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Directory on the volume to measure [default: a temp dir under /var/tmp].",
)
@click.option("--size", default="1GiB", show_default=True, help="State size to checkpoint.")
@click.option("--repeats", type=int, default=5, show_default=True)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=os.cpu_count() or 1,
    show_default=True,
    help="torch CPU threads.",
)
@click.option(
    "--streams",
    default=",".join(map(str, STREAMS)),
    show_default=True,
    help="The --io-streams sweep (comma-separated, must include 1).",
)
@click.option(
    "--train-rounds",
    "train_steps",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Rounds of (plain steps, async checkpoint + overlapped steps).",
)
@click.option("--train-model-size", default="32MiB", show_default=True)
@click.option(
    "--ranks",
    type=int,
    default=1,
    show_default=True,
    help="N > 1: N processes write shards of one state at once (the trainer's sharded "
    "checkpoint), against fio numjobs=N (trainer.bench_ranks); the other cases are not run.",
)
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    show_default=True,
    help="Where the state lives: cuda stages through the pinned buffer (device-to-host "
    "copies overlapping the writes) and trains on the GPU.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write all results here.",
)
def main(
    directory: Path | None,
    size: str,
    repeats: int,
    threads: int,
    streams: str,
    train_steps: int,
    train_model_size: str,
    ranks: int,
    device: str,
    json_path: Path | None,
) -> None:
    """Benchmark the checkpoint writer against fio, torch.save, DCP and safetensors."""
    try:
        nbytes = parse_size(size)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--size") from None
    try:  # checked now, not after the whole benchmark ran
        shape_for_bytes(parse_size(train_model_size), TRAIN_SEQ_LEN)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--train-model-size") from None
    if repeats < 1:
        raise click.BadParameter("must be at least 1", param_hint="--repeats")
    if ranks < 1:
        raise click.BadParameter("must be at least 1", param_hint="--ranks")
    if ranks > 1 and device == "cuda":
        # The ranks' shards are staged from CPU state over gloo (trainer.bench_ranks).
        raise click.BadParameter("--ranks above 1 runs on the CPU only", param_hint="--device")
    sweep = _parse_streams(streams)
    if device == "cuda" and not torch.cuda.is_available():
        raise click.ClickException("--device cuda: torch sees no CUDA device here")
    dev = torch.device(device)
    base = directory or Path("/var/tmp")
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=base))
    try:
        if shutil.disk_usage(work).free < 6 * nbytes:
            raise click.ClickException(f"{work} needs about {format_bytes(6 * nbytes)} free")
        if ranks > 1:  # many writers at once, as the ranks of a torchrun job write
            from trainer import bench_ranks

            result = bench_ranks.run_ranks(work, nbytes, ranks, repeats)
            click.echo(bench_ranks.render(result))
            if json_path:
                json_path.write_text(json.dumps(result, indent=2))
            return
        info = machine(base)
        info["device"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        bench = Bench(work, nbytes, threads, sweep, dev)
        if not bench.fio:
            click.echo("fio not found: ratios to fio are skipped (apt-get install fio)", err=True)
        for i in range(repeats):
            click.echo(f"repeat {i + 1}/{repeats} ...", err=True)
            bench.repeat(i)
        steps_dir = work / "steps"
        steps_dir.mkdir()
        extra = steps_per_s(steps_dir, train_steps, train_model_size, dev)
        if threads > 1 and dev.type == "cpu":
            # The same with one core left to the background write, as on a GPU node where
            # the training loop does not use every CPU core.
            torch.set_num_threads(threads - 1)
            spare = steps_per_s(steps_dir, train_steps, train_model_size)
            torch.set_num_threads(threads)
            extra["spare_core_ratio"] = (
                spare["steps_per_s_during_write"] / spare["steps_per_s_plain"]
            )
        result = summarize(bench, extra)
        result["instrumentation"] = instrumentation_cost(work)
        info["loadavg_end"] = os.getloadavg()
        result["machine"] = info
        click.echo(render(result))
        click.echo(
            f"machine: {info['cpus']} x {info['cpu_model']}, load average "
            f"{info['loadavg_start'][0]:.1f} at the start, {info['loadavg_end'][0]:.1f} at the end"
        )
        if json_path:
            json_path.write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
