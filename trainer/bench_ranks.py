"""``python -m trainer.bench --ranks N``: N processes write shards of one state at once.

What a torchrun job's checkpoint does to a volume: N writers at the same moment. Each of N
worker processes (gloo over 127.0.0.1) holds the same model-and-optimizer-shaped state and
saves it through the trainer's own :class:`trainer.ckpt.checkpointer.Checkpointer` (DDP
rule: the replicated state split across the ranks by size; each rank stages its part,
writes it with O_DIRECT and fsyncs it; rank 0 commits the global manifest once every rank
reported). The reference is fio with ``numjobs=N``: N jobs writing new files at once,
``direct=1``, 8 MiB blocks, 4 in flight each, ``end_fsync``, the same bytes in all.

After one untimed save (it allocates the staging buffers), each repeat runs fio, then one
sharded save, on one directory; the table reports medians:
fio's aggregate GB/s; the save's aggregate GB/s (all bytes over the wall time from the
first rank's first write to the commit), its write-stage GB/s, the slowest rank's pause
and the slowest rank's write.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import shutil
import socket
import statistics
from pathlib import Path
from typing import Any

import click

GB = 1e9
RESULT_TIMEOUT_S = 900.0  # one save of the whole state by N ranks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int, world: int, port: int, directory: str, nbytes: int, steps: Any, results: Any
) -> None:
    """One rank: join the group, build the state, save it whenever told (step numbers)."""
    import torch

    from trainer import distributed
    from trainer.bench import make_state
    from trainer.ckpt.checkpointer import Checkpointer
    from trainer.ckpt.formats import RawFormat
    from trainer.ckpt.fs import LocalFS

    torch.set_num_threads(1)
    try:
        ranks = distributed.init(
            rank, world, rank, "ddp", "cpu", RESULT_TIMEOUT_S, f"tcp://127.0.0.1:{port}"
        )
        state = make_state(nbytes)  # the same on every rank: a seeded replica
        ckpt = Checkpointer(
            Path(directory), RawFormat(), LocalFS(), durable=True, keep=10**6, ranks=ranks
        )
        results.put(("ready", rank, None))
        while (step := steps.get()) is not None:
            # Training ranks reach a checkpoint together (every step synchronizes them);
            # the barrier removes the skew of this pool's own dispatch.
            ranks.barrier()
            ckpt.save(step, lambda: state)
            (record,) = ckpt.poll()
            if ranks.is_main:
                results.put(("saved", rank, record.as_dict()))
        ranks.close()
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        results.put(("failed", rank, f"{type(exc).__name__}: {exc}"))
        raise


class RankPool:
    """N long-lived worker processes (torch is imported and the state built once)."""

    def __init__(self, ranks: int, directory: Path, nbytes: int) -> None:
        ctx = mp.get_context("spawn")  # fresh interpreters: no torch state forked
        self.results = ctx.Queue()
        self.steps = [ctx.Queue() for _ in range(ranks)]
        port = _free_port()
        self.procs = [
            ctx.Process(
                target=_worker,
                args=(r, ranks, port, str(directory), nbytes, self.steps[r], self.results),
                daemon=True,
            )
            for r in range(ranks)
        ]
        for proc in self.procs:
            proc.start()
        for _ in range(ranks):
            self._expect("ready")

    def _expect(self, kind: str) -> Any:
        try:
            got, rank, payload = self.results.get(timeout=RESULT_TIMEOUT_S)
        except queue.Empty:
            raise click.ClickException(f"no rank answered within {RESULT_TIMEOUT_S:g}s") from None
        if got != kind:
            raise click.ClickException(f"rank {rank} failed: {payload}")
        return payload

    def save(self, step: int) -> dict[str, Any]:
        for q in self.steps:
            q.put(step)
        return self._expect("saved")

    def close(self) -> None:
        for q in self.steps:
            q.put(None)
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()


def fio_numjobs(path: Path, nbytes: int, jobs: int) -> dict[str, float]:
    """fio: ``jobs`` writers of new files at once, as many bytes in all as the state."""
    from checkpoint_storage_bench.fio import extract_json, parse_jobs, run_fio
    from checkpoint_storage_bench.units import parse_size

    block = parse_size("8M")
    size = max(block, nbytes // jobs // block * block)
    args = [
        "fio", "--name=ranks", "--rw=write", "--bs=8M", f"--size={size}", "--direct=1",
        "--ioengine=libaio", "--iodepth=4", f"--numjobs={jobs}", "--group_reporting=1",
        f"--filename_format={path}.$jobnum", "--output-format=json", "--end_fsync=1",
        "--fallocate=none",
    ]  # fmt: skip
    result = run_fio(args)
    if result.returncode != 0:
        raise click.ClickException(f"fio failed: {result.message}")
    bw = parse_jobs(extract_json(result.stdout)).bw_bytes
    return {"gbps": bw / GB, "seconds": size * jobs / bw}


def run_ranks(work: Path, nbytes: int, ranks: int, repeats: int) -> dict[str, Any]:
    """Interleave fio numjobs=N and N-rank sharded saves ``repeats`` times in ``work``."""
    fio = shutil.which("fio")
    if not fio:
        click.echo("fio not found: the ratio to fio is skipped (apt-get install fio)", err=True)
    ckpt_dir = work / "sharded"
    ckpt_dir.mkdir()
    samples: dict[str, list[Any]] = {"fio": [], "save": []}
    pool = RankPool(ranks, ckpt_dir, nbytes)
    try:
        # Untimed: the first save allocates the staging buffers, as a job's first
        # checkpoint does (the verdict leaves that one out, too).
        shutil.rmtree(pool.save(10**6)["path"])
        for i in range(repeats):
            click.echo(f"repeat {i + 1}/{repeats} ...", err=True)
            if fio:
                target = work / f"fio{i}"
                samples["fio"].append(fio_numjobs(target, nbytes, ranks))
                for leftover in work.glob(f"fio{i}.*"):
                    leftover.unlink()
            record = pool.save(i + 1)
            samples["save"].append(record)
            shutil.rmtree(record["path"])  # untimed; keeps the disk use to one checkpoint
    finally:
        pool.close()
    return summarize(samples, ranks, nbytes)


def summarize(samples: dict[str, list[Any]], ranks: int, nbytes: int) -> dict[str, Any]:
    saves = samples["save"]

    def med(values: list[float]) -> float:
        return statistics.median(values)

    result: dict[str, Any] = {
        "ranks": ranks,
        "state_bytes": nbytes,
        "checkpoint_bytes": saves[0]["bytes"],
        "repeats": len(saves),
        "aggregate_gbps": med([s["aggregate_gbps"] for s in saves]),
        "write_gbps": med([s["write_gbps"] for s in saves]),
        "slowest_pause_s": med([s["slowest_pause_s"] for s in saves]),
        "slowest_write_s": med([s["write_s"] for s in saves]),
        "commit_s": med([s["commit_s"] for s in saves]),
        "rank_write_gbps": med([r["write_gbps"] for s in saves for r in s["ranks"]]),
        "samples": samples,
    }
    if samples["fio"]:
        result["fio_gbps"] = med([f["gbps"] for f in samples["fio"]])
        result["aggregate_vs_fio"] = result["aggregate_gbps"] / result["fio_gbps"]
    return result


def render(result: dict[str, Any]) -> str:
    n = result["ranks"]
    lines = [
        f"{n} ranks, {result['checkpoint_bytes'] / GB:.2f} GB per checkpoint, "
        f"medians of {result['repeats']}",
        f"  {'case':<46} {'GB/s':>6} {'seconds':>8}",
    ]
    if "fio_gbps" in result:
        lines.append(
            f"  {f'fio numjobs={n}, direct=1, 8 MiB x 4 in flight':<46} {result['fio_gbps']:>6.2f}"
        )
    lines += [
        f"  {'sharded save, aggregate (first write → commit)':<46} {result['aggregate_gbps']:>6.2f}",
        f"  {'sharded save, write stage (all ranks)':<46} {result['write_gbps']:>6.2f}",
        f"  {'one rank writing (median over ranks)':<46} {result['rank_write_gbps']:>6.2f}",
        f"  {'slowest rank: write':<46} {'':>6} {result['slowest_write_s']:>8.3f}",
        f"  {'slowest rank: pause (sync save)':<46} {'':>6} {result['slowest_pause_s']:>8.3f}",
        f"  {'rank 0: commit (manifest, rename, fsyncs)':<46} {'':>6} {result['commit_s']:>8.3f}",
    ]
    if "aggregate_vs_fio" in result:
        lines.append(f"aggregate / fio numjobs={n}: {result['aggregate_vs_fio']:.2f}x")
    return "\n".join(lines)
