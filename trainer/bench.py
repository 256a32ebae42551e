"""``python -m trainer.bench``: our checkpoint writer against fio and ``torch.save``.

Everything runs in one process on one directory, interleaved and repeated, so the ratios
compare like with like on a noisy machine; the table reports medians. Writes go to new
files (as checkpoints do) and are timed until fsynced; before any read the file's pages
are dropped from the page cache so reads come from the volume.

Cases (each repeat runs them all, in this order):
  fio-write      fio, sequential write, new file, direct=1, 8 MiB blocks, 4 in flight, end_fsync
                 (our writer uses 4 MiB chunks, 4 in flight)
  fio-write-1m   fio, the same with 1 MiB blocks and two jobs (best on our test VMs)
  raw-sync       our writer: stage into the reused aligned buffer, O_DIRECT write, fsync, commit
                 (vs fio: bytes over write+fsync time; vs torch.save: the whole save)
  raw-async      our writer in async mode: ``pause`` is what the training loop waits for
  torch-save     ``torch.save(state, path)`` + fsync (the usual way)
  fio-read       fio, sequential read of a written file, direct=1, 8 MiB blocks
  raw-load       read + verify checksums + build tensors (our format)
  torch-load     ``torch.load`` of the torch.save file

and, once, ``steps/s`` of a training loop with and without an async checkpoint in flight.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import torch

from checkpoint_storage_bench.units import format_bytes, parse_size
from trainer.ckpt import store
from trainer.ckpt.checkpointer import Checkpointer
from trainer.ckpt.formats import RawFormat
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer

GB = 1e9
TARGETS = {
    "raw-sync vs fio write": 0.9,
    "raw-sync vs torch-save": 3.0,
    "raw-load vs fio read": 0.8,
    "async steps/s ratio": 0.9,
}
PAUSE_TARGET_S_PER_GB = 0.15


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


def state_bytes(state: Any) -> int:
    tensors: list[torch.Tensor] = []
    from trainer.ckpt.formats import flatten

    flatten(state, tensors)
    return sum(t.numel() * t.element_size() for t in tensors)


def drop_cache(path: Path) -> None:
    """Evict a file's (clean, fsynced) pages so the next read comes from the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Bench:
    """Runs the cases and keeps every sample."""

    def __init__(self, directory: Path, size: int, threads: int) -> None:
        self.dir = directory
        self.samples: dict[str, list[dict[str, float]]] = defaultdict(list)
        self.state = make_state(size)
        self.nbytes = state_bytes(self.state)
        self.fio = shutil.which("fio")
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

    def repeat(self, index: int) -> None:
        work = self.dir / f"rep{index}"
        work.mkdir()
        try:
            if self.fio:
                self.fio_job("fio-write", "write", work / "fio", "8M", 4, 1)
                self.fio_job("fio-write-1m", "write", work / "fio1m", "1M", 1, 2)
            raw_dir = work / "raw"
            raw_dir.mkdir()
            ckpt = Checkpointer(raw_dir, self.raw_format, LocalFS(), durable=True, keep=8)
            self.timed("raw-sync", lambda: self._save(ckpt, 1), self.nbytes)
            async_dir = work / "async"
            async_dir.mkdir()
            ackpt = Checkpointer(
                async_dir, self.raw_format, LocalFS(), durable=True, keep=8, asynchronous=True
            )
            self.timed("raw-async", lambda: self._save(ackpt, 1), self.nbytes)
            torch_file = work / "state.pt"

            def torch_save() -> None:
                torch.save(self.state, torch_file)
                fsync_path(torch_file)
                fsync_path(work)

            self.timed("torch-save", torch_save, self.nbytes)
            if self.fio:
                drop_cache(work / "fio.0")
                self.fio_job("fio-read", "read", work / "fio", "8M", 4, 1)
            ckpt_path = store.list_checkpoints(raw_dir)[0].path
            drop_cache(ckpt_path / "state.ckpt")
            self.timed("raw-load", lambda: self._load(ckpt_path), self.nbytes)
            drop_cache(torch_file)
            self.timed(
                "torch-load",
                lambda: torch.load(torch_file, weights_only=True) and None,
                self.nbytes,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)

    @property
    def raw_format(self) -> RawFormat:
        if not hasattr(self, "_raw"):
            self._raw = RawFormat()
            self._raw.stage(self.state)  # allocate once, as a training run does
        return self._raw

    def _save(self, ckpt: Checkpointer, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        ckpt.save(step, lambda: self.state)
        pause = time.perf_counter() - t0
        (record,) = ckpt.finish()
        return {
            "seconds": record.total_s,
            "pause_s": pause,
            "stage_s": record.serialize_s,
            "write_s": record.write_s,
            "fsync_s": record.fsync_s,
            "io_direct": float(record.io_mode == "direct"),
        }

    def _load(self, path: Path) -> None:
        _, data = store.read_verified(LocalFS(), path, self.load_buffer)
        RawFormat().load(data)

    @property
    def load_buffer(self) -> AlignedBuffer:
        if not hasattr(self, "_load_buf"):
            self._load_buf = AlignedBuffer()
        return self._load_buf


def steps_per_s(ckpt_dir: Path, steps: int, model_size: str) -> dict[str, float]:
    """Training steps/s without checkpoints vs while an async checkpoint is being written."""
    from trainer.model import VOCAB, SyntheticTokens, TinyGPT, shape_for_bytes

    torch.manual_seed(0)
    seq = 64
    model = TinyGPT(shape_for_bytes(parse_size(model_size), seq), seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = SyntheticTokens(0, 8, seq)

    def step(i: int) -> None:
        tokens = data.batch(i)
        loss = torch.nn.functional.cross_entropy(
            model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()

    for i in range(3):
        step(i)  # warm up

    def timed_step(i: int) -> float:
        t0 = time.perf_counter()
        step(i)
        return time.perf_counter() - t0

    ckpt = Checkpointer(ckpt_dir, RawFormat(), LocalFS(), durable=True, keep=1, asynchronous=True)

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


def summarize(bench: Bench, extra: dict[str, float]) -> dict[str, Any]:
    med = {
        name: {k: statistics.median(s[k] for s in samples) for k in samples[0]}
        for name, samples in bench.samples.items()
    }
    fio_write = max(
        (med[n]["gbps"] for n in ("fio-write", "fio-write-1m") if n in med), default=None
    )
    # The volume comparison: our bytes over the time to write and fsync them (what fio
    # measures); staging is a memory copy, reported separately and as the async pause.
    raw_io_gbps = statistics.median(
        bench.nbytes / (s["write_s"] + s["fsync_s"]) / GB for s in bench.samples["raw-sync"]
    )
    fio_read = med.get("fio-read", {}).get("gbps")
    ratios = {
        "raw-sync vs fio write": raw_io_gbps / fio_write if fio_write else None,
        "raw-sync whole save vs fio write": med["raw-sync"]["gbps"] / fio_write
        if fio_write
        else None,
        "raw-sync vs torch-save": med["raw-sync"]["gbps"] / med["torch-save"]["gbps"],
        "raw-load vs fio read": med["raw-load"]["gbps"] / fio_read if fio_read else None,
        "torch-save vs fio write": med["torch-save"]["gbps"] / fio_write if fio_write else None,
        "async steps/s ratio": extra["steps_per_s_during_write"] / extra["steps_per_s_plain"],
    }
    pause_per_gb = med["raw-async"]["pause_s"] / (bench.nbytes / GB)
    return {
        "raw_sync_io_gbps": raw_io_gbps,
        "bytes": bench.nbytes,
        "repeats": len(bench.samples["raw-sync"]),
        "medians": med,
        "samples": bench.samples,
        "ratios": ratios,
        "async_pause_s_per_gb": pause_per_gb,
        "steps": extra,
        "targets": {
            **{
                k: {
                    "target": v,
                    "measured": ratios[k],
                    "met": ratios[k] is not None and ratios[k] >= v,
                }
                for k, v in TARGETS.items()
            },
            "async pause s/GB": {
                "target": PAUSE_TARGET_S_PER_GB,
                "measured": pause_per_gb,
                "met": pause_per_gb <= PAUSE_TARGET_S_PER_GB,
            },
        },
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"state: {format_bytes(result['bytes'])}, {result['repeats']} repeats, medians",
        f"{'case':<14} {'GB/s':>7} {'seconds':>8}  notes",
    ]
    for name, m in result["medians"].items():
        notes = []
        if "pause_s" in m:
            notes.append(
                f"pause {m['pause_s']:.3f}s stage {m['stage_s']:.3f}s write {m['write_s']:.3f}s fsync {m['fsync_s']:.3f}s"
            )
            notes.append("O_DIRECT" if m["io_direct"] >= 0.5 else "buffered")
        lines.append(f"{name:<14} {m['gbps']:7.2f} {m['seconds']:8.3f}  {' '.join(notes)}")
    lines.append(f"raw-sync write+fsync only: {result['raw_sync_io_gbps']:.2f} GB/s")
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
    lines.append("targets:")
    for name, t in result["targets"].items():
        measured = "n/a (no fio)" if t["measured"] is None else f"{t['measured']:.2f}"
        op = "<=" if name == "async pause s/GB" else ">="
        lines.append(
            f"  {name:<24} {measured:>8}  (target {op} {t['target']})  {'met' if t['met'] else 'MISSED'}"
        )
    return "\n".join(lines)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Directory on the volume to measure [default: a temp dir under /var/tmp].",
)
@click.option("--size", default="1GiB", show_default=True, help="State size to checkpoint.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option(
    "--threads", type=int, default=os.cpu_count() or 1, show_default=True, help="torch CPU threads."
)
@click.option(
    "--train-rounds",
    "train_steps",
    type=int,
    default=5,
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
    train_steps: int,
    train_model_size: str,
    ranks: int,
    json_path: Path | None,
) -> None:
    """Benchmark the checkpoint writer against fio and torch.save on one directory."""
    try:
        nbytes = parse_size(size)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--size") from None
    if repeats < 1:
        raise click.BadParameter("must be at least 1", param_hint="--repeats")
    if ranks < 1:
        raise click.BadParameter("must be at least 1", param_hint="--ranks")
    base = directory or Path("/var/tmp")
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=base))
    try:
        if shutil.disk_usage(work).free < 6 * nbytes:
            raise click.ClickException(f"{work} needs about {format_bytes(6 * nbytes)} free")
        if ranks > 1:  # many writers at once (issue 16)
            from trainer import bench_ranks

            result = bench_ranks.run_ranks(work, nbytes, ranks, repeats)
            click.echo(bench_ranks.render(result))
            if json_path:
                json_path.write_text(json.dumps(result, indent=2))
            return
        bench = Bench(work, nbytes, threads)
        if not bench.fio:
            click.echo("fio not found: ratios to fio are skipped (apt-get install fio)", err=True)
        for i in range(repeats):
            click.echo(f"repeat {i + 1}/{repeats} ...", err=True)
            bench.repeat(i)
        steps_dir = work / "steps"
        steps_dir.mkdir()
        extra = steps_per_s(steps_dir, train_steps, train_model_size)
        if threads > 1:
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
        result["machine"] = {
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "dir": str(base),
        }
        click.echo(render(result))
        if json_path:
            json_path.write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
