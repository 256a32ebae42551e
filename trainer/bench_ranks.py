"""``python -m trainer.bench --ranks N``: N processes checkpoint one state at once.

What a torchrun job's checkpoint does to a volume: N writers at the same moment. Each of N
worker processes (gloo over 127.0.0.1) holds the same model-and-optimizer-shaped state, a
DDP replica, and checkpoints it four ways, one after another in every repeat:

- ``ours``: the trainer's own :class:`trainer.ckpt.checkpointer.Checkpointer` (DDP rule: the
  replicated state split across the ranks by size; each rank stages its part into its
  aligned buffer, writes it with O_DIRECT overlapping the copy, fsyncs it; rank 0 commits
  the global manifest once every rank reported);
- ``ours-async``: the same with ``--async``: each rank is blocked only while it copies its
  part, the write runs on its background thread;
- ``dcp``: ``torch.distributed.checkpoint.save`` on the same process group, DCP's own
  multi-rank save (it writes each replicated tensor once, spread over the ranks), its
  FileSystemWriter fsyncing each file;
- ``dcp-async``: ``dcp.async_save``: each rank blocked while DCP stages, then written on
  DCP's thread.

The reference is fio with ``numjobs=N``: N jobs writing new files at once, ``direct=1``,
8 MiB blocks, 4 in flight each, ``end_fsync``, the same bytes in all. And the limit of an
asynchronous pause: each rank copying its share of the state into a reused buffer
(``copy``), what any snapshot must at least do.

Every figure is a median over the repeats, all cases interleaved so a noisy neighbour hits
them alike. Throughput is all bytes over the wall time from the first rank's start to the
last rank's end (ours: to the commit); CPU is the processes' user + system seconds (all
ranks, fio's too) per MB written, so a writer that buys its rate with cores shows it.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import resource
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import click

from checkpoint_storage_bench.ports import free_port

GB = 1e9
MB = 1e6
RESULT_TIMEOUT_S = 900.0  # one save of the whole state by N ranks
CASES = ("ours", "ours-async", "dcp", "dcp-async")


def _cpu_s(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _worker(
    rank: int, world: int, port: int, directory: str, nbytes: int, steps: Any, results: Any
) -> None:
    """One rank: join the group, build the state, run each case whenever told."""
    import torch
    import torch.distributed.checkpoint as dcp

    from trainer import distributed
    from trainer.bench import make_state
    from trainer.ckpt.checkpointer import Checkpointer
    from trainer.ckpt.formats import RawFormat, flatten
    from trainer.ckpt.fs import LocalFS
    from trainer.ckpt.sharded import assign

    torch.set_num_threads(1)
    try:
        ranks = distributed.init(
            rank, world, rank, "ddp", "cpu", RESULT_TIMEOUT_S, f"tcp://127.0.0.1:{port}"
        )
        state = make_state(nbytes)  # the same on every rank: a seeded replica
        root = Path(directory)
        for sub in ("sync", "async"):
            (root / sub).mkdir(exist_ok=True)
        ours = {
            asynchronous: Checkpointer(
                root / ("async" if asynchronous else "sync"),
                RawFormat(),
                LocalFS(),
                durable=True,
                keep=10**6,
                ranks=ranks,
                asynchronous=asynchronous,
            )
            for asynchronous in (False, True)
        }
        tensors: list[torch.Tensor] = []
        flatten(state, tensors)
        flat = {f"t{i}": t for i, t in enumerate(tensors)}
        # The copy limit: the bytes this rank's shard holds (the checkpointer's own split)
        # into a reused buffer.
        owners = assign([t.numel() * t.element_size() for t in tensors], world)
        share = [
            t.reshape(-1).view(torch.uint8)
            for t, owner in zip(tensors, owners, strict=True)
            if owner == rank
        ]
        copies = [torch.empty_like(t) for t in share]
        results.put(("ready", rank, None))
        while (command := steps.get()) is not None:
            case, step = command
            # Training ranks reach a checkpoint together (every step synchronizes them);
            # the barrier removes the skew of this pool's own dispatch.
            ranks.barrier()
            cpu0, w0 = _cpu_s(), time.time()
            out: dict[str, Any] = {}
            if case in ("ours", "ours-async"):
                ckpt = ours[case == "ours-async"]
                ckpt.save(step, lambda: state)
                w_pause = time.time()
                (record,) = ckpt.wait()
                if ranks.is_main:
                    out["record"] = record.as_dict()
            elif case in ("dcp", "dcp-async"):
                target = root / f"dcp-{step}"
                writer = dcp.FileSystemWriter(target, sync_files=True)
                if case == "dcp":
                    dcp.save(flat, storage_writer=writer, process_group=ranks.ckpt_group)
                    w_pause = time.time()
                else:
                    response = dcp.async_save(
                        flat, storage_writer=writer, process_group=ranks.ckpt_group
                    )
                    w_pause = time.time()
                    getattr(response, "upload_completion", response).result()
                out["path"] = str(target)
            else:  # copy
                for dst, src in zip(copies, share, strict=True):
                    dst.copy_(src)
                w_pause = time.time()
                out["bytes"] = sum(t.numel() for t in share)
            out |= {"w0": w0, "w_pause": w_pause, "w_end": time.time(), "cpu_s": _cpu_s() - cpu0}
            results.put(("done", rank, out))
        for ckpt in ours.values():
            ckpt.finish()
        ranks.close()
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        results.put(("failed", rank, f"{type(exc).__name__}: {exc}"))
        raise


class RankPool:
    """N long-lived worker processes (torch is imported and the state built once)."""

    def __init__(self, ranks: int, directory: Path, nbytes: int) -> None:
        ctx = mp.get_context("spawn")  # fresh interpreters: no torch state forked
        self.ranks = ranks
        self.results = ctx.Queue()
        self.steps = [ctx.Queue() for _ in range(ranks)]
        port = free_port()
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
        self._collect("ready")

    def _collect(self, kind: str) -> list[Any]:
        """Every rank's answer, in rank order."""
        got: dict[int, Any] = {}
        while len(got) < self.ranks:
            try:
                answer, rank, payload = self.results.get(timeout=RESULT_TIMEOUT_S)
            except queue.Empty:
                raise click.ClickException(
                    f"no rank answered within {RESULT_TIMEOUT_S:g}s"
                ) from None
            if answer != kind:
                raise click.ClickException(f"rank {rank} failed: {payload}")
            got[rank] = payload
        return [got[r] for r in range(self.ranks)]

    def run(self, case: str, step: int) -> list[dict[str, Any]]:
        for q in self.steps:
            q.put((case, step))
        return self._collect("done")

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
    cpu0 = _cpu_s(resource.RUSAGE_CHILDREN)
    result = run_fio(args)
    if result.returncode != 0:
        raise click.ClickException(f"fio failed: {result.message}")
    bw = parse_jobs(extract_json(result.stdout)).bw_bytes
    written = size * jobs
    cpu = _cpu_s(resource.RUSAGE_CHILDREN) - cpu0
    return {
        "gbps": bw / GB,
        "seconds": written / bw,
        "bytes": written,
        "cpu_s_per_mb": cpu / (written / MB),
    }


def _sample(case: str, answers: list[dict[str, Any]]) -> dict[str, Any]:
    """One run of a case on every rank: its bytes, wall time, pauses and CPU."""
    start = min(a["w0"] for a in answers)
    pauses = [a["w_pause"] - a["w0"] for a in answers]
    cpu = sum(a["cpu_s"] for a in answers)
    if case.startswith("ours"):
        record = answers[0]["record"]
        nbytes = record["bytes"]
        # To the commit: when the checkpoint is published (rank 0 after its gather).
        end = max(a["w_end"] for a in answers)
        out = {"record": record, "commit_s": record["commit_s"]}
    elif case.startswith("dcp"):
        path = Path(answers[0]["path"])
        nbytes = _dir_bytes(path)
        shutil.rmtree(path)  # untimed; keeps the disk use to one checkpoint
        end = max(a["w_end"] for a in answers)
        out = {}
    else:
        nbytes = sum(a["bytes"] for a in answers)
        end = max(a["w_pause"] for a in answers)
        out = {}
    return out | {
        "bytes": nbytes,
        "seconds": end - start,
        "gbps": nbytes / max(end - start, 1e-9) / GB,
        "slowest_pause_s": max(pauses),
        "cpu_s_per_mb": cpu / (nbytes / MB),
    }


def run_ranks(work: Path, nbytes: int, ranks: int, repeats: int) -> dict[str, Any]:
    """Interleave fio numjobs=N, the four N-rank saves and the copy ``repeats`` times."""
    fio = shutil.which("fio")
    if not fio:
        click.echo("fio not found: the ratio to fio is skipped (apt-get install fio)", err=True)
    ckpt_dir = work / "sharded"
    ckpt_dir.mkdir()
    samples: dict[str, list[Any]] = {"fio": [], "save": [], "copy": []}
    samples |= {case: [] for case in CASES if case != "ours"}
    pool = RankPool(ranks, ckpt_dir, nbytes)
    try:
        # Untimed: the first save of each allocates the staging buffers, as a job's first
        # checkpoint does (the verdict leaves that one out, too).
        for case in CASES:
            sample = _sample(case, pool.run(case, 10**6))
            if "record" in sample:
                shutil.rmtree(sample["record"]["path"])
        pool.run("copy", 0)  # first touch of the copy buffers' pages
        for i in range(repeats):
            click.echo(f"repeat {i + 1}/{repeats} ...", err=True)
            if fio:
                target = work / f"fio{i}"
                samples["fio"].append(fio_numjobs(target, nbytes, ranks))
                for leftover in work.glob(f"fio{i}.*"):
                    leftover.unlink()
            for case in CASES:
                sample = _sample(case, pool.run(case, i + 1))
                if case.startswith("ours"):
                    record = sample.pop("record")
                    shutil.rmtree(record["path"])  # untimed, as above
                    if case == "ours":
                        samples["save"].append(record | {"cpu_s_per_mb": sample["cpu_s_per_mb"]})
                        continue
                    sample["rank_pause_s"] = [r["pause_s"] for r in record["ranks"]]
                samples[case].append(sample)
            samples["copy"].append(_sample("copy", pool.run("copy", 0)))
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
        "cpu_s_per_mb": med([s["cpu_s_per_mb"] for s in saves]),
        "samples": samples,
    }
    for case in ("ours-async", "dcp", "dcp-async", "copy"):
        if samples.get(case):
            key = case.replace("-", "_")
            result[f"{key}_gbps"] = med([s["gbps"] for s in samples[case]])
            result[f"{key}_pause_s"] = med([s["slowest_pause_s"] for s in samples[case]])
            result[f"{key}_cpu_s_per_mb"] = med([s["cpu_s_per_mb"] for s in samples[case]])
    if "dcp_gbps" in result:
        result["aggregate_vs_dcp"] = result["aggregate_gbps"] / result["dcp_gbps"]
    if "copy_pause_s" in result and "ours_async_pause_s" in result:
        result["async_pause_vs_copy"] = result["ours_async_pause_s"] / result["copy_pause_s"]
    if samples["fio"]:
        result["fio_gbps"] = med([f["gbps"] for f in samples["fio"]])
        result["fio_cpu_s_per_mb"] = med([f["cpu_s_per_mb"] for f in samples["fio"]])
        result["aggregate_vs_fio"] = result["aggregate_gbps"] / result["fio_gbps"]
    return result


def render(result: dict[str, Any]) -> str:
    n = result["ranks"]
    lines = [
        f"{n} ranks, {result['checkpoint_bytes'] / GB:.3f} GB per checkpoint, "
        f"medians of {result['repeats']}",
        f"  {'case':<48} {'MB/s':>7} {'CPU ms/MB':>9} {'pause s':>8}",
    ]

    def row(name: str, gbps: float | None, cpu: float | None, pause: float | None = None) -> str:
        rate = f"{gbps * 1e3:7.0f}" if gbps is not None else f"{'':>7}"
        ms = f"{cpu * 1e3:9.2f}" if cpu is not None else f"{'':>9}"
        held = f"{pause:8.3f}" if pause is not None else f"{'':>8}"
        return f"  {name:<48} {rate} {ms} {held}"

    if "fio_gbps" in result:
        lines.append(
            row(f"fio numjobs={n}, direct=1, 8 MiB x 4 in flight", result["fio_gbps"],
                result["fio_cpu_s_per_mb"])
        )  # fmt: skip
    lines.append(
        row("ours, sync (first write → commit)", result["aggregate_gbps"],
            result["cpu_s_per_mb"], result["slowest_pause_s"])
    )  # fmt: skip
    if "ours_async_gbps" in result:
        lines.append(
            row("ours, --async (request → commit)", result["ours_async_gbps"],
                result["ours_async_cpu_s_per_mb"], result["ours_async_pause_s"])
        )  # fmt: skip
    if "dcp_gbps" in result:
        lines.append(
            row(f"dcp.save, {n} ranks", result["dcp_gbps"], result["dcp_cpu_s_per_mb"],
                result["dcp_pause_s"])
        )  # fmt: skip
        lines.append(
            row(f"dcp.async_save, {n} ranks", result["dcp_async_gbps"],
                result["dcp_async_cpu_s_per_mb"], result["dcp_async_pause_s"])
        )  # fmt: skip
    if "copy_gbps" in result:
        lines.append(
            row("copy of each rank's share (the async limit)", result["copy_gbps"],
                result["copy_cpu_s_per_mb"], result["copy_pause_s"])
        )  # fmt: skip
    lines += [
        f"  slowest rank's write {result['slowest_write_s']:.3f}s, one rank writing "
        f"{result['rank_write_gbps'] * 1e3:.0f} MB/s, rank 0's commit {result['commit_s']:.3f}s",
    ]
    ratios = []
    if "aggregate_vs_fio" in result:
        ratios.append(f"sync / fio numjobs={n}: {result['aggregate_vs_fio']:.2f}x")
    if "aggregate_vs_dcp" in result:
        ratios.append(f"sync / dcp.save: {result['aggregate_vs_dcp']:.2f}x")
    if "async_pause_vs_copy" in result:
        ratios.append(f"async pause / copy: {result['async_pause_vs_copy']:.2f}x")
    if ratios:
        lines.append("; ".join(ratios))
    return "\n".join(lines)
