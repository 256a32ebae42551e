"""Sharded checkpoints: every rank writes its own shard, rank 0 commits them as one.

A checkpoint of step N written by W ranks is one directory, published like any other
(``store``): ``step-0000000N/`` holds ``shard-0000r-of-0000W.<ext>`` per rank and one global
``MANIFEST.json`` (``"layout": "sharded"``, ``world_size``, ``parallel``, and per shard its
file, size, chunk checksums and rank).

What each rank writes (:func:`split_state`): the leaves of the state that are DTensors (FSDP2)
as this rank's local piece; the replicated tensors under DDP split across the ranks by size
(largest first onto the least-loaded rank), so no rank writes it all; under FSDP the few
replicated tensors FSDP leaves (AdamW's step counts) in every shard, so that a rank resumes
from its own shard alone; each rank's own RNG state in its own shard.

The protocol of one checkpoint (in the training thread, or the background thread with
``--async``), on the gloo checkpoint group:

1. every rank stages its shard, writes it with :func:`trainer.ckpt.io.write_file` into the
   shared hidden ``.step-N.tmp-<rank 0's owner>/`` (:class:`trainer.ckpt.store.Owner`:
   run, pod, pid) and fsyncs it;
2. every rank reports to rank 0 (a gather): its file, size, checksums and timings, or its
   error. A rank that died breaks the gather at once; one that hangs breaks it after
   ``--checkpoint-timeout`` seconds;
3. rank 0 commits only when every rank reported its shard durable: the global manifest,
   then :func:`trainer.ckpt.store.commit`'s rename and directory fsync. Otherwise it removes
   the hidden directory: nothing is published;
4. rank 0 tells every rank the outcome (a broadcast). When nothing was committed, the rank
   that failed raises its own error (exit 4 for a full volume, …) and the others raise
   :class:`trainer.errors.RankFailedError` (exit 7).

Resuming (:func:`restore`) takes the newest checkpoint every rank can verify: rank 0 reads
the manifest and shares it, each rank verifies the shards it loads (DDP: all of them, as
every rank holds the whole replica; FSDP: its own), and all ranks agree before any loads
a byte. A checkpoint of another world size or ``--parallel`` mode is refused
(:class:`trainer.errors.WorldSizeError`, exit 2): shards are not resharded. A world of one
process resumes through the same routine, reading a single process's checkpoint.

Test seam: ``TRAINER_FAULT_SHARD_WRITE=RANK:STEP:pause=SECONDS`` makes that rank sleep inside
its write of that step's shard, ``RANK:STEP:eio`` makes the write fail with EIO.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.ckpt import store
from trainer.ckpt.checkpointer import CheckpointRecord, OneInFlight
from trainer.ckpt.formats import (
    Format,
    RawFormat,
    Staged,
    TorchFormat,
    flatten,
    load_verified,
    unflatten,
)
from trainer.ckpt.fs import LocalFS, storage_error
from trainer.ckpt.io import AlignedBuffer, write_file
from trainer.ckpt.upload import Uploader
from trainer.config import FORMATS
from trainer.distributed import Ranks, refusal
from trainer.errors import (
    CheckpointCorruptError,
    ConfigError,
    RankFailedError,
    TrainerError,
    UploadError,
    WorldSizeError,
)
from trainer.provenance import run_uuid
from trainer.restore import Restored

log = logging.getLogger(__name__)

FAULT_ENV = "TRAINER_FAULT_SHARD_WRITE"
FAILED_RANK_GRACE_S = 2.0


def shard_name(rank: int, world_size: int, filename: str) -> str:
    """The file of one rank's shard, named after the format's file.

    >>> shard_name(3, 8, "state.ckpt")
    'shard-00003-of-00008.ckpt'
    """
    return f"shard-{rank:05d}-of-{world_size:05d}{Path(filename).suffix}"


def assign(sizes: list[int], world_size: int) -> list[int]:
    """The rank that writes each tensor: largest first onto the least-loaded rank.

    Deterministic (ties go to the lower index and rank), so every rank computes the same
    split from the same state without talking.

    >>> assign([10, 1, 7, 3, 3], 2)
    [0, 1, 1, 1, 0]
    """
    owners = [0] * len(sizes)
    load = [0] * world_size
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owners[i] = rank
        load[rank] += sizes[i]
    return owners


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _placements_json(placements: Any) -> list[list[Any]]:
    out = []
    for p in placements:
        if p.is_shard():
            out.append(["shard", p.dim])
        elif p.is_replicate():
            out.append(["replicate"])
        else:
            raise TypeError(f"cannot checkpoint a DTensor placed as {p!r}")
    return out


def _placements(data: list[list[Any]]) -> tuple[Any, ...]:
    from torch.distributed.tensor import Replicate, Shard

    return tuple(Shard(int(p[1])) if p[0] == "shard" else Replicate() for p in data)


def split_state(state: dict[str, Any], ranks: Ranks, step: int) -> dict[str, Any]:
    """This rank's shard of the trainer's state (``train._state``), ready to stage.

    The shard holds the state's structure (small JSON, in every shard), the ids and
    tensors of the leaves this rank writes, how to rebuild its DTensors, and its own RNG.
    """
    rest = {k: v for k, v in state.items() if k != "rng"}
    leaves: list[torch.Tensor] = []
    skeleton = flatten(rest, leaves)
    sharded = [_is_dtensor(t) for t in leaves]
    replicated = [i for i, is_d in enumerate(sharded) if not is_d]
    if ranks.parallel == "ddp":
        owners = assign(
            [leaves[i].numel() * leaves[i].element_size() for i in replicated], ranks.world_size
        )
        kept = {i for i, owner in zip(replicated, owners, strict=True) if owner == ranks.rank}
    else:
        kept = set(replicated)  # FSDP leaves only a few small ones unsharded
    ids, tensors, dtensors = [], [], {}
    for i, t in enumerate(leaves):
        if sharded[i]:
            ids.append(i)
            tensors.append(t.to_local())
            dtensors[str(i)] = {
                "shape": list(t.shape),
                "stride": list(t.stride()),
                "placements": _placements_json(t.placements),
            }
        elif i in kept:
            ids.append(i)
            tensors.append(t)
    return {
        "shard": {
            "rank": ranks.rank,
            "world_size": ranks.world_size,
            "parallel": ranks.parallel,
            "step": step,
        },
        "skeleton": skeleton,
        "leaf_count": len(leaves),
        "ids": ids,
        "tensors": tensors,
        "dtensors": dtensors,
        "rng": state.get("rng"),
    }


def merge_shards(shards: list[dict[str, Any]], own: dict[str, Any], ranks: Ranks) -> dict[str, Any]:
    """The state to load on this rank from the shards it read (``own`` among them).

    Raises:
        CheckpointCorruptError: A leaf of the state is in none of the shards.
    """
    skeleton = own["skeleton"]
    leaves: dict[int, torch.Tensor] = {}
    for shard in shards:
        leaves.update(zip(shard["ids"], shard["tensors"], strict=True))
    for key, meta in own["dtensors"].items():
        from torch.distributed.tensor import DTensor

        i = int(key)
        leaves[i] = DTensor.from_local(
            leaves[i].to(ranks.device),
            ranks.mesh,
            _placements(meta["placements"]),
            shape=torch.Size(meta["shape"]),
            stride=tuple(meta["stride"]),
            run_check=False,
        )
    count = own["leaf_count"]
    missing = [i for i in range(count) if i not in leaves]
    if missing:
        raise CheckpointCorruptError(f"{len(missing)} tensors of the state are in no shard read")
    state = unflatten(skeleton, [leaves[i] for i in range(count)])
    state["rng"] = own["rng"]
    return state


def check_world(manifest: dict[str, Any], name: str, world_size: int, parallel: str) -> None:
    """Refuse a checkpoint written by another number of ranks or another ``--parallel`` mode.

    A manifest without these keys is a single process's (world size 1, parallel none).

    Raises:
        WorldSizeError: They differ (exit 2).
    """
    saved_world = manifest.get("world_size", 1)
    saved_mode = manifest.get("parallel", "none")
    if saved_world != world_size:
        hint = (
            "a single process"
            if saved_world == 1
            else f"torchrun --nproc-per-node {saved_world} (or the same world across nodes)"
        )
        raise WorldSizeError(
            f"--resume: {name} was written by {saved_world} rank(s), this run has {world_size}; "
            f"shards are not resharded: resume it with {hint}, or use a new checkpoint dir"
        )
    if saved_mode != parallel:
        raise WorldSizeError(
            f"--resume: {name} was written with --parallel {saved_mode}, this run uses "
            f"--parallel {parallel}"
        )


# ------------------------------------------------------------------------ writing


class _FaultFS:
    """The test seam of :data:`FAULT_ENV`: wraps the storage seam of one rank."""

    def __init__(self, fs: LocalFS, step: int, action: str) -> None:
        self._fs, self.step, self.action = fs, step, action
        self.current: int | None = None
        self._lock = threading.Lock()
        self._fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        with self._lock:
            fire = self.current == self.step and not self._fired
            self._fired |= fire
        if fire:
            if self.action == "eio":
                raise OSError(errno.EIO, f"I/O error injected by {FAULT_ENV}")
            log.warning("%s: pausing inside the write for %s", FAULT_ENV, self.action)
            time.sleep(float(self.action.removeprefix("pause=")))
        return self._fs.pwrite(fd, data, offset)


def _fault_from_env(fs: LocalFS, rank: int) -> LocalFS | _FaultFS:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return fs
    try:
        fault_rank, step, action = spec.split(":", 2)
        if action != "eio":
            float(action.removeprefix("pause="))
        if int(fault_rank) != rank:
            return fs
        return _FaultFS(fs, int(step), action)
    except ValueError:
        raise ValueError(
            f"{FAULT_ENV}={spec!r}: expected RANK:STEP:eio or RANK:STEP:pause=S"
        ) from None


def _error_for(exc: Exception, what: str) -> Exception:
    """The trainer error a failed shard write or commit stands for (exit 4, 3), or ``exc``."""
    error = storage_error(exc, what)
    if error is not None:
        error.__cause__ = exc
        return error
    return exc


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


@dataclass(kw_only=True)  # after the base's fields, whether or not they have defaults
class ShardedCheckpointRecord(CheckpointRecord):
    """One sharded checkpoint as rank 0 reports it: the whole, and every rank's stages.

    The whole's stage fields are the slowest rank's (``fsync_s`` adds rank 0's commit,
    as for one process); ``pause_s`` is ``slowest_pause_s``; ``write_gbps`` is all bytes
    over the wall span of every rank's write; ``aggregate_gbps`` all bytes over the wall
    time from the first rank's first write to the commit. Figures across ranks compare
    wall clocks (``time.time()``): exact on one node, as good as the nodes' clock sync
    across nodes.
    """

    world_size: int
    ranks: list[dict[str, Any]]
    aggregate_gbps: float
    slowest_pause_s: float
    commit_s: float


@dataclass
class _Times:
    w_request: float  # wall clock of the save request (cross-rank figures)
    t_request: float  # monotonic (this rank's durations)
    w0: float
    t0: float
    serialize_s: float
    pause_s: float | None = None  # known at save() in async mode


class ShardedCheckpointer(OneInFlight):
    """Writes this rank's shard of each checkpoint; rank 0 also commits and reports.

    The same interface as :class:`trainer.ckpt.checkpointer.Checkpointer` (``save``,
    ``poll``, ``finish``, ``in_flight``); every rank must call ``save`` at the same steps.

    Args:
        directory: The run's checkpoint directory on the claim, shared by every rank.
        fmt: The format each shard is staged in (raw or torch).
        fs: The storage seam.
        durable: fsync files and directories.
        keep: Complete checkpoints to retain (rank 0 deletes older ones).
        ranks: This process's place in the job.
        uploader: Uploads each committed checkpoint (every rank its shard), or None.
        asynchronous: Persist in the background; block only while staging.
        verified: Steps already known good (the one a resume verified): retention counts
            these and the ones this writer commits durably, nothing else.
    """

    def __init__(
        self,
        directory: Path,
        fmt: RawFormat | TorchFormat,
        fs: LocalFS,
        durable: bool,
        keep: int,
        ranks: Ranks,
        uploader: Uploader | None = None,
        asynchronous: bool = False,
        verified: Iterable[int] = (),
    ) -> None:
        self.directory = directory
        self.fmt = fmt
        self.ranks = ranks
        self.fs = _fault_from_env(fs, ranks.rank)
        self.durable = durable
        self.keep = keep
        self.uploader = uploader
        # The hidden directory carries rank 0's owner (run, pod, pid), as store names a
        # single writer's, so remove_stale_tmp tells this run's leftovers from another's.
        self.owner: store.Owner = ranks.broadcast(store.Owner.current())
        self._good = set(verified)
        super().__init__(asynchronous)

    def tmp_dir(self, step: int) -> Path:
        return self.directory / store.tmp_name(step, self.owner)

    def save(self, step: int, state_fn: Callable[[], Any]) -> None:
        """Checkpoint this rank's shard of ``state_fn()``; blocks only as long as it must."""
        w_request, t_request = time.time(), time.monotonic()
        self._drain(wait=True)  # at most one in flight; waiting for it counts as pause
        if self.ranks.device.type == "cuda":
            torch.cuda.synchronize(self.ranks.device)
        w0, t0 = time.time(), time.monotonic()
        staged = self.fmt.stage(split_state(state_fn(), self.ranks, step))
        times = _Times(w_request, t_request, w0, t0, time.monotonic() - t0)
        if self._pool is not None:
            times.pause_s = time.monotonic() - t_request
        self._start(self._persist, step, staged, times)

    # -------------------------------------------------------------- one checkpoint

    def _write_shard(self, step: int, staged: Staged, tmp: Path, name: str) -> dict[str, Any]:
        """Write and fsync this rank's shard; its report for rank 0."""
        try:
            self.fs.mkdir(tmp)
        except FileExistsError:
            pass  # another rank made it first
        if isinstance(self.fs, _FaultFS):
            self.fs.current = step
        w_write, t_write = time.time(), time.monotonic()
        written = write_file(self.fs, tmp / name, staged.data, direct=staged.direct_ok)
        w_written, t_fsync = time.time(), time.monotonic()
        try:
            if self.durable:
                self.fs.fsync(written.fd)
        finally:
            self.fs.close(written.fd)
        return {
            "ok": True,
            "entry": {
                "name": name,
                "bytes": written.nbytes,
                "chunk_bytes": written.chunk_bytes,
                written.checksum: list(written.checksums),
                "rank": self.ranks.rank,
            },
            "checksum": written.checksum,
            "io_mode": written.io_mode,
            "write_s": t_fsync - t_write,
            "fsync_s": time.monotonic() - t_fsync,
            "w_write": w_write,
            "w_written": w_written,
        }

    def _persist(self, step: int, staged: Staged, times: _Times) -> CheckpointRecord:
        ranks = self.ranks
        tmp = self.tmp_dir(step)
        final = self.directory / store.final_name(step)
        name = shard_name(ranks.rank, ranks.world_size, self.fmt.filename)
        own_error: Exception | None = None
        report: dict[str, Any] = {"ok": False}
        try:
            report = self._write_shard(step, staged, tmp, name)
        except Exception as exc:  # noqa: BLE001 - reported to rank 0 first, raised below
            own_error = _error_for(exc, f"writing rank {ranks.rank}'s shard of {final.name}")
            report = {"ok": False, "error": _describe(own_error)}
        report.update(
            rank=ranks.rank,
            bytes=staged.nbytes,
            serialize_s=times.serialize_s,
            pause_s=times.pause_s,
            w_request=times.w_request,
            w0=times.w0,
        )
        try:
            reports = ranks.gather(report)
        except RankFailedError as exc:
            if ranks.is_main:
                self.fs.rmtree(tmp)
            raise RankFailedError(f"checkpoint {final.name} was not committed: {exc}") from (
                own_error or exc
            )

        decision: dict[str, Any] = {"committed": False}
        commit_s, w_commit = 0.0, 0.0
        if ranks.is_main:
            assert reports is not None
            failed = [r for r in reports if not r["ok"]]
            if failed:
                self.fs.rmtree(tmp)
                decision["error"] = "; ".join(f"rank {r['rank']}: {r['error']}" for r in failed)
            else:
                t_commit = time.monotonic()
                try:
                    store.commit(
                        self.fs,
                        tmp,
                        final,
                        self._manifest(step, reports),
                        self.durable,
                        owner=self.owner,
                    )
                    decision = {"committed": True}
                except Exception as exc:  # noqa: BLE001 - the others are told, then it is raised
                    self.fs.rmtree(tmp)
                    own_error = _error_for(exc, f"committing {final.name}")
                    decision["error"] = f"rank 0 could not commit: {_describe(own_error)}"
                commit_s, w_commit = time.monotonic() - t_commit, time.time()
        w_released = time.time()
        decision = ranks.broadcast(decision)
        if own_error is not None:
            raise own_error
        if not decision["committed"]:
            message = f"checkpoint {final.name} was not committed: {decision['error']}"
            # torchrun stops every rank once one exits and names the first to exit as the
            # root cause: let the rank that failed exit first, and say now what we were told
            # (torchrun's SIGTERM may come before the error is printed).
            log.error("rank %d: %s", ranks.rank, message)
            time.sleep(FAILED_RANK_GRACE_S)
            raise RankFailedError(message)

        uploads = self._upload(final, name) if self.uploader is not None else None
        if uploads is not None:
            w_released = time.time()
        if self.durable:
            # Good-only retention, as for one process: without fsync nothing is known to
            # survive a crash, so nothing replaces an older checkpoint.
            self._good.add(step)
            if ranks.is_main:
                store.apply_retention(self.fs, self.directory, self.keep, self._good)
        w_end, t_end = time.time(), time.monotonic()
        if not ranks.is_main:
            return self._local_record(step, staged, times, report, final, t_end)
        assert reports is not None
        return self._record(step, reports, uploads, final, commit_s, w_commit, w_released, w_end)

    def _upload(self, final: Path, name: str) -> list[dict[str, Any]] | None:
        """Every rank uploads its shard; rank 0 the manifest last, once all shards are up."""
        assert self.uploader is not None
        ranks = self.ranks
        error: UploadError | None = None
        t0, w0 = time.monotonic(), time.time()
        try:
            self.uploader.upload(final, [name])
        except UploadError as exc:
            error = exc
        report = {"ok": error is None, "upload_s": time.monotonic() - t0, "w0": w0}
        report["w1"] = time.time()
        if error is not None:
            report["error"] = str(error)
        reports = ranks.gather(report)
        verdict: dict[str, Any] = {"ok": True}
        if ranks.is_main:
            assert reports is not None
            failed = [(r, rep) for r, rep in enumerate(reports) if not rep["ok"]]
            if not failed and error is None:
                try:
                    self.uploader.upload(final, [store.MANIFEST])
                except UploadError as exc:
                    error = exc
                reports[0]["w1"] = time.time()
            if failed or error is not None:
                shown = [f"rank {r}: {rep['error']}" for r, rep in failed]
                verdict = {"ok": False, "error": "; ".join(shown or [str(error)])}
        verdict = ranks.broadcast(verdict)
        if error is not None:
            raise error
        if not verdict["ok"]:
            raise UploadError(f"upload of {final.name} failed: {verdict['error']}")
        return reports

    def _manifest(self, step: int, reports: list[dict[str, Any]]) -> dict[str, Any]:
        algorithms = {r["checksum"] for r in reports}
        modes = sorted({r["io_mode"] for r in reports})
        return {
            "schema": store.MANIFEST_SCHEMA,
            "step": step,
            # Whose checkpoint this is: --resume auto continues only its own run's.
            "run_id": run_uuid(),
            "format": self.fmt.name,
            "created_at": time.time(),
            "layout": store.LAYOUT_SHARDED,
            "world_size": self.ranks.world_size,
            "parallel": self.ranks.parallel,
            "io_mode": modes[0] if len(modes) == 1 else ", ".join(modes),
            "checksum": algorithms.pop() if len(algorithms) == 1 else "mixed",
            "files": [r["entry"] for r in reports],
        }

    def _local_record(
        self,
        step: int,
        staged: Staged,
        times: _Times,
        report: dict[str, Any],
        final: Path,
        t_end: float,
    ) -> CheckpointRecord:
        """What a rank other than 0 measured of its own shard (it tracks nothing)."""
        return CheckpointRecord(
            step=step,
            bytes=staged.nbytes,
            serialize_s=times.serialize_s,
            write_s=report["write_s"],
            fsync_s=report["fsync_s"],
            upload_s=None,
            pause_s=times.pause_s if times.pause_s is not None else t_end - times.t_request,
            total_s=t_end - times.t_request,
            write_gbps=staged.nbytes / max(report["write_s"], 1e-9) / 1e9,
            upload_gbps=None,
            path=str(final),
            io_mode=report["io_mode"],
            checksum=report["checksum"],
        )

    def _record(
        self,
        step: int,
        reports: list[dict[str, Any]],
        uploads: list[dict[str, Any]] | None,
        final: Path,
        commit_s: float,
        w_commit: float,
        w_released: float,
        w_end: float,
    ) -> ShardedCheckpointRecord:
        per_rank = []
        for r in reports:
            # A rank's training resumes when rank 0's last word reaches it (rank 0's own
            # after its retention); asynchronous ranks were blocked only while staging.
            end = w_end if r["rank"] == 0 else w_released
            upload_s = uploads[r["rank"]]["upload_s"] if uploads else None
            per_rank.append(
                {
                    "rank": r["rank"],
                    "bytes": r["bytes"],
                    "serialize_s": r["serialize_s"],
                    "write_s": r["write_s"],
                    "fsync_s": r["fsync_s"],
                    "upload_s": upload_s,
                    "pause_s": r["pause_s"] if r["pause_s"] is not None else end - r["w_request"],
                    # From the save request, as for one process: the wait for the previous
                    # checkpoint is in the pause, so it is in the total too.
                    "total_s": end - r["w_request"],
                    "write_gbps": r["bytes"] / max(r["write_s"], 1e-9) / 1e9,
                    "io_mode": r["io_mode"],
                }
            )
        nbytes = sum(r["bytes"] for r in reports)
        first_write = min(r["w_write"] for r in reports)
        write_span = max(r["w_written"] for r in reports) - first_write
        upload_s = upload_gbps = None
        if uploads:
            upload_s = max(u["w1"] for u in uploads) - min(u["w0"] for u in uploads)
            upload_gbps = nbytes / max(upload_s, 1e-9) / 1e9
        slowest_pause = max(r["pause_s"] for r in per_rank)
        modes = sorted({r["io_mode"] for r in reports})
        return ShardedCheckpointRecord(
            step=step,
            bytes=nbytes,
            serialize_s=max(r["serialize_s"] for r in per_rank),
            write_s=max(r["write_s"] for r in per_rank),
            fsync_s=max(r["fsync_s"] for r in per_rank) + commit_s,
            upload_s=upload_s,
            pause_s=slowest_pause,
            total_s=w_end - min(r["w_request"] for r in reports),
            write_gbps=nbytes / max(write_span, 1e-9) / 1e9,
            upload_gbps=upload_gbps,
            path=str(final),
            io_mode=modes[0] if len(modes) == 1 else ", ".join(modes),
            checksum=reports[0]["checksum"],
            world_size=self.ranks.world_size,
            ranks=per_rank,
            aggregate_gbps=nbytes / max(w_commit - first_write, 1e-9) / 1e9,
            slowest_pause_s=slowest_pause,
            commit_s=commit_s,
        )


# ------------------------------------------------------------------------ resuming


def prepare_dir(fs: LocalFS, directory: Path, ranks: Ranks) -> tuple[list[Path], list[Path]]:
    """Rank 0 removes the hidden directories this run's predecessors left while the others
    wait; returns them and the leftovers left alone (on other ranks: nothing)."""
    found: tuple[list[Path], list[Path]] = ([], [])
    if ranks.is_main:
        found = store.remove_stale_tmp(fs, directory)
    ranks.barrier()
    return found


def _head(path: Path) -> dict[str, Any]:
    try:
        return {"manifest": store.read_manifest(path)}
    except CheckpointCorruptError as exc:
        return {"error": str(exc)}


def _entries(manifest: dict[str, Any], name: str, world_size: int) -> list[dict[str, Any]]:
    """The manifest's shard entries in rank order, checked for shape."""
    files = manifest.get("files")
    if manifest.get("layout") != store.LAYOUT_SHARDED or not isinstance(files, list):
        raise CheckpointCorruptError(f"{name}: {store.MANIFEST} is not a sharded manifest")
    try:
        by_rank = sorted(files, key=lambda e: e["rank"])
    except (KeyError, TypeError):
        raise CheckpointCorruptError(f"{name}: a shard entry lacks its rank") from None
    if [e["rank"] for e in by_rank] != list(range(world_size)):
        raise CheckpointCorruptError(f"{name}: {store.MANIFEST} does not list one shard per rank")
    return by_rank


def _load_shards(
    fs: LocalFS,
    path: Path,
    manifest: dict[str, Any],
    fmt: RawFormat | TorchFormat,
    ranks: Ranks,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Verify and load the shards this rank needs; returns them and its own."""
    entries = _entries(manifest, path.name, ranks.world_size)
    wanted = entries if manifest["parallel"] == "ddp" else [entries[ranks.rank]]
    algorithm = store.checksum_algorithm(path, manifest)
    shards = []
    for entry in wanted:
        # Each shard gets its own buffer: loaded tensors are views into it until applied.
        data = store.verify_file(fs, path, entry, algorithm, AlignedBuffer())
        shard = fmt.load(data)
        info = shard.get("shard", {}) if isinstance(shard, dict) else {}
        if info.get("rank") != entry["rank"] or info.get("step") != manifest["step"]:
            raise CheckpointCorruptError(
                f"{path.name}: {entry['name']} holds rank {info.get('rank')}'s shard of step "
                f"{info.get('step')}, the manifest says rank {entry['rank']}, step {manifest['step']}"
            )
        skeleton = shard.get("skeleton")
        store.check_step(
            path, skeleton.get("step") if isinstance(skeleton, dict) else None, entry["name"]
        )
        shards.append(shard)
    own = next(s for s in shards if s["shard"]["rank"] == ranks.rank)
    return shards, own


def _read_state(
    fs: LocalFS, path: Path, manifest: dict[str, Any], fmt: Format, ranks: Ranks
) -> Callable[[], dict[str, Any]]:
    """Verify what this rank loads of the checkpoint at ``path``; returns what builds its
    state once every rank agrees it verified.

    A world of one reads a single process's checkpoint (any format); several ranks read
    their shards.
    """
    if ranks.world_size == 1:
        manifest, data = store.read_verified(fs, path, AlignedBuffer())
        state = load_verified(fmt, path, manifest, data)
        store.check_step(path, state.get("step"), "state")
        return lambda: state
    shards, own = _load_shards(fs, path, manifest, fmt, ranks)
    return lambda: merge_shards(shards, own, ranks)


def restore(
    directory: Path,
    fmt: Format,
    fs: LocalFS,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    ranks: Ranks,
    say: Callable[[str], None],
    check_config: Callable[[dict[str, Any], str], None],
) -> Restored | None:
    """Load the newest checkpoint every rank verifies; returns its step and the seconds it
    took from its manifest to its state loaded (None: none exist).

    Anything incomplete or corrupt is skipped with a message, never loaded. Every rank
    takes the same decision at each checkpoint: rank 0 lists them and shares each
    manifest, and the ranks' verdicts are exchanged before anything is loaded (a world of
    one exchanges nothing).

    Raises:
        WorldSizeError: The newest checkpoint was written by another world size or mode.
        CheckpointCorruptError: Checkpoints exist but none verifies (on every rank):
            starting over would silently throw the run's progress away.
    """
    many = ranks.world_size > 1
    names = ranks.broadcast(
        [ref.path.name for ref in store.list_checkpoints(directory)] if ranks.is_main else None
    )
    for name in names:
        started = time.monotonic()  # the loaded checkpoint's time, not the skipped ones'
        path = directory / name
        head = ranks.broadcast(_head(path) if ranks.is_main else None)
        if "error" in head:
            say(f"resume: skipping {head['error']}")
            continue
        manifest = head["manifest"]
        if manifest.get("format") not in FORMATS:
            say(f"resume: skipping {name}: {store.MANIFEST} names no known format")
            continue
        ranks.agree(refusal(_check_resumable, manifest, name, fmt, ranks))
        problem = None
        try:
            build = _read_state(fs, path, manifest, fmt, ranks)
        except CheckpointCorruptError as exc:
            problem = str(exc)
        problems = [(r, p) for r, p in enumerate(ranks.all_gather(problem)) if p]
        if problems:
            say(
                "resume: skipping "
                + "; ".join(f"rank {r}: {p}" if many else p for r, p in problems)
            )
            continue
        state: dict[str, Any] = {}
        try:
            state = build()
            check_config(state.get("config", {}), name)
            _load_model(model, state["model"], name)
        except TrainerError as exc:
            refused: TrainerError | None = exc
        else:
            refused = None
        ranks.agree(refused)
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"].clone())  # needs its own storage
        if "cuda" in state["rng"] and ranks.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"].clone(), ranks.device)
        seconds = time.monotonic() - started
        shards = f", {ranks.world_size} shards verified" if many else ""
        say(f"resume: continuing from {name} (step {state['step']}){shards}")
        return Restored(int(state["step"]), seconds)
    if names:
        ranks.agree(
            CheckpointCorruptError(
                f"--resume: none of the {len(names)} checkpoints in {directory} is complete and "
                "verified" + (" on every rank" if many else "")
            )
        )
    return None


def _load_model(model: torch.nn.Module, saved: dict[str, Any], name: str) -> None:
    """Load the saved weights, or refuse a checkpoint of another model shape (one the same
    settings built in another version of the trainer): exit 2, not a traceback.

    Raises:
        ConfigError: The saved tensors do not fit the model.
    """
    try:
        model.load_state_dict(saved)
    except RuntimeError as exc:
        first = " ".join(str(exc).split())[:200]
        raise ConfigError(
            f"--resume: {name} holds a model of another shape than this run builds ({first}); "
            "use a new checkpoint dir"
        ) from None


def _check_resumable(manifest: dict[str, Any], name: str, fmt: Format, ranks: Ranks) -> None:
    """Refuse the newest readable checkpoint when this run cannot continue it as it is:
    another world size or ``--parallel`` mode, or another ``--format``.

    A checkpoint in another format is healthy data, not a corrupt one to skip: skipping
    it would roll the run back to an older one, or end in "none verifies" (exit 6).

    Raises:
        WorldSizeError: Another world size or mode (exit 2).
        ConfigError: Another format (exit 2).
    """
    check_world(manifest, name, ranks.world_size, ranks.parallel)
    saved = manifest.get("format")
    if saved != fmt.name:
        raise ConfigError(
            f"--resume: {name} was written with --format {saved}, this run uses --format "
            f"{fmt.name}: resume it with --format {saved}, or use a new checkpoint dir"
        )
