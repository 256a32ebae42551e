"""One checkpointer for a world of one process and a world of many ranks.

Every checkpoint is timed per stage: serialize, write, fsync, upload, pause, total.
``pause`` is how long the training loop was blocked; ``total`` runs from the save request
until the checkpoint is durable (written, fsynced, committed and uploaded). In sync mode
they are equal. In async mode the loop is blocked only while the state is staged (and
while a previous checkpoint is still in flight: at most one is), and the rest runs on a
background thread whose failure fails the run at the next step.

The protocol of one checkpoint, the same for every world size and format (a world of one
is a :class:`trainer.distributed.Ranks` whose collectives are its own values):

1. every rank runs the format's in-flight write (:meth:`Format.begin`, then ``finish``)
   of its part of the state into the shared hidden ``.step-N.tmp-<rank 0's owner>/``
   (:class:`trainer.ckpt.store.Owner`: run, pod, pid) and fsyncs its files. One process
   writes the whole state under the format's file name; a rank of many writes its shard
   (:func:`trainer.ckpt.sharded.split_state`) under ``shard-0000r-of-0000W.<ext>``;
2. every rank reports to rank 0 (a gather): its files, sizes, checksums and timings, or
   its error. A rank that died breaks the gather at once; one that hangs breaks it after
   ``--checkpoint-timeout`` seconds;
3. rank 0 commits only when every rank reported its files durable: the manifest, then
   :func:`trainer.ckpt.store.commit`'s rename and directory fsync. Otherwise it removes the
   hidden directory: nothing is published;
4. rank 0 tells every rank the outcome (a broadcast). When nothing was committed, the rank
   that failed raises its own error (exit 4 for a full volume, …) and the others raise
   :class:`trainer.errors.RankFailedError` (exit 7).

Test seam: ``TRAINER_FAULT_SHARD_WRITE=RANK:STEP:pause=SECONDS`` makes that rank sleep inside
its write of that step, ``RANK:STEP:eio-at-start`` fails it with EIO as it starts the
checkpoint, ``RANK:STEP:eio`` makes the write fail with EIO (every format: the
bytes of raw and torch go through the trainer's writer, safetensors and dcp call the
storage seam as they start writing, DCP inside its write step).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from checkpoint_storage_bench.contract import DISTRIBUTED_CHECKPOINT_KEYS
from trainer.ckpt import checksum as checksums
from trainer.ckpt import store
from trainer.ckpt.formats import Format, InFlight, WriteOptions
from trainer.ckpt.fs import LocalFS, storage_error
from trainer.ckpt.sharded import shard_name, split_state
from trainer.ckpt.upload import Uploader
from trainer.distributed import OneProcess, Ranks
from trainer.errors import RankFailedError, UploadError
from trainer.provenance import run_uuid

log = logging.getLogger(__name__)

FAULT_ENV = "TRAINER_FAULT_SHARD_WRITE"
START_EIO = "eio-at-start"
"""The seam's action that fails a rank as it starts the checkpoint (its temporary
directory), before it writes or joins any collective of the format."""
FAILED_RANK_GRACE_S = 2.0


@dataclass
class CheckpointRecord:
    """One checkpoint's stage timeline; seconds and bytes as in the summary JSON.

    A checkpoint of several ranks, as rank 0 reports it, also has every rank's stages
    (``ranks``): the whole's stage fields are the slowest rank's (``fsync_s`` adds rank 0's
    commit, as for one process); ``pause_s`` is ``slowest_pause_s``; ``write_gbps`` is all
    bytes over the wall span of every rank's write; ``aggregate_gbps`` all bytes over the
    wall time from the first rank's first write to the commit. Figures across ranks
    compare wall clocks (``time.time()``): exact on one node, as good as the nodes' clock
    sync across nodes. A world of one has none of these (None).
    """

    step: int
    bytes: int
    serialize_s: float
    write_s: float
    fsync_s: float
    upload_s: float | None
    pause_s: float
    total_s: float
    write_gbps: float
    upload_gbps: float | None
    path: str
    io_mode: str
    overlapped: bool = False
    """Serialize and write ran at the same time (their sum can exceed the pause)."""
    checksum_s: float | None = None
    """Reading a library-written checkpoint back to checksum it (None: done while writing)."""
    io_streams: int = 1
    checksum: str = checksums.CRC32
    world_size: int = 1
    ranks: list[dict[str, Any]] | None = None
    aggregate_gbps: float | None = None
    slowest_pause_s: float | None = None
    commit_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.world_size == 1:
            # A single process's checkpoint has the contract's keys of one process only.
            for key in DISTRIBUTED_CHECKPOINT_KEYS:
                data.pop(key)
        return data


def _gbps(nbytes: int, seconds: float | None) -> float | None:
    if seconds is None:
        return None
    return nbytes / max(seconds, 1e-9) / 1e9


class OneInFlight:
    """At most one checkpoint persisting in the background (``asynchronous``), or none
    (every save persists before it returns). A subclass calls :meth:`_start` with its
    persist function and arguments.
    """

    def __init__(self, asynchronous: bool) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt-bg") if asynchronous else None
        self._inflight: Future[CheckpointRecord] | None = None
        self._done: list[CheckpointRecord] = []

    def _start(self, persist: Callable[..., CheckpointRecord], *args: Any, **kwargs: Any) -> None:
        """Persist now, or in the background when asynchronous."""
        if self._pool is None:
            self._done.append(persist(*args, **kwargs))
        else:
            self._inflight = self._pool.submit(persist, *args, **kwargs)

    @property
    def in_flight(self) -> bool:
        """Whether a background checkpoint is still being written."""
        return self._inflight is not None and not self._inflight.done()

    def poll(self) -> list[CheckpointRecord]:
        """Raise a background failure now, and hand over finished records (newest last)."""
        self._drain(wait=False)
        done, self._done = self._done, []
        return done

    def wait(self) -> list[CheckpointRecord]:
        """Wait for the checkpoint in flight (writing goes on after); returns the records
        not yet handed over."""
        self._drain(wait=True)
        done, self._done = self._done, []
        return done

    def finish(self) -> list[CheckpointRecord]:
        """Wait for the checkpoint in flight and stop; returns the records not yet handed
        over."""
        try:
            self._drain(wait=True)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
        done, self._done = self._done, []
        return done

    def _drain(self, wait: bool) -> None:
        future = self._inflight
        if future is None or (not wait and not future.done()):
            return
        self._inflight = None
        self._done.append(future.result())  # re-raises the background failure here


# ------------------------------------------------------------------ the fault seam


class _FaultFS:
    """The test seam of :data:`FAULT_ENV`: wraps the storage seam of one rank."""

    def __init__(self, fs: LocalFS, step: int, action: str) -> None:
        self._fs, self.step, self.action = fs, step, action
        self.current: int | None = None
        self._lock = threading.Lock()
        self._fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def mkdir(self, path: Path) -> None:
        if self.action == START_EIO:
            self._fire()
        self._fs.mkdir(path)

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        self._fire()
        return self._fs.pwrite(fd, data, offset)

    def library_write(self) -> None:
        self._fire()
        self._fs.library_write()

    def _fire(self) -> None:
        """Once, inside the write of the faulty step (or as it starts): fail it with EIO,
        or hold it."""
        with self._lock:
            fire = self.current == self.step and not self._fired
            self._fired |= fire
        if fire:
            if self.action == START_EIO:
                raise OSError(errno.EIO, f"I/O error injected by {FAULT_ENV} at the start")
            if self.action == "eio":
                raise OSError(errno.EIO, f"I/O error injected by {FAULT_ENV}")
            log.warning("%s: pausing inside the write for %s", FAULT_ENV, self.action)
            time.sleep(float(self.action.removeprefix("pause=")))


def _fault_from_env(fs: LocalFS, rank: int) -> LocalFS | _FaultFS:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return fs
    try:
        fault_rank, step, action = spec.split(":", 2)
        if action not in ("eio", START_EIO):
            float(action.removeprefix("pause="))
        if int(fault_rank) != rank:
            return fs
        return _FaultFS(fs, int(step), action)
    except ValueError:
        raise ValueError(
            f"{FAULT_ENV}={spec!r}: expected RANK:STEP:eio, RANK:STEP:{START_EIO} or "
            "RANK:STEP:pause=S"
        ) from None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _fatal(exc: BaseException) -> bool:
    """An interrupt or exit: not a failed write to report, but a way out to let through.
    (Not ``Exception`` for the rest: torch.distributed.checkpoint's CheckpointException is
    a BaseException.)"""
    return isinstance(exc, KeyboardInterrupt | SystemExit)


@dataclass
class _Times:
    w_request: float  # wall clock of the save request (cross-rank figures)
    t_request: float  # monotonic (this rank's durations)
    w0: float  # wall clock when staging began
    serialize_s: float = 0.0
    pause_s: float | None = None  # known at save() in async mode


# ------------------------------------------------------------------ the checkpointer


class Checkpointer(OneInFlight):
    """Writes this process's part of each checkpoint of one run into ``directory``; rank 0
    (a single process is rank 0 of one) also commits and reports.

    Every rank must call :meth:`save` at the same steps.

    Args:
        directory: The run's checkpoint directory on the mounted claim, shared by every rank.
        fmt: The format (raw, torch, dcp, safetensors).
        fs: The storage seam.
        durable: fsync files and directories.
        keep: Complete checkpoints to retain (rank 0 deletes older ones).
        uploader: Uploads each committed checkpoint (every rank its own files), or None.
        asynchronous: Persist in the background; block only while staging.
        device: The model's device, synchronized around timed regions (default: the
            device of ``ranks``, or the CPU).
        verified: Steps already known good (the one a resume verified): retention counts
            these and the ones this writer makes durable, nothing else.
        options: Overlap, streams and checksum (``durable`` and ``background`` are set
            from the arguments above).
        ranks: This process's place in the job (default: a world of one).
    """

    def __init__(
        self,
        directory: Path,
        fmt: Format,
        fs: LocalFS,
        durable: bool,
        keep: int,
        uploader: Uploader | None = None,
        asynchronous: bool = False,
        device: torch.device | None = None,
        verified: Iterable[int] = (),
        options: WriteOptions | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        device = device or (ranks.device if ranks is not None else torch.device("cpu"))
        self.ranks = ranks or OneProcess(0, 1, 0, "none", device, None, 0.0)
        self.device = device
        self.directory = directory
        self.fmt = fmt
        self.fs = _fault_from_env(fs, self.ranks.rank)
        self.durable = durable
        self.keep = keep
        self.uploader = uploader
        self.options = replace(
            options or WriteOptions(),
            durable=durable,
            background=asynchronous,
            group=self.ranks.ckpt_group if self.ranks.world_size > 1 else None,
        )
        super().__init__(asynchronous)
        self._good = set(verified)
        # One owner for every temporary name (run, pod, pid): rank 0's, so a restarted run
        # can tell its predecessors' leftovers from another run's.
        self.owner: store.Owner = self.ranks.broadcast(store.Owner.current())
        world = self.ranks.world_size
        self.filename = (
            fmt.filename if world == 1 else shard_name(self.ranks.rank, world, fmt.filename)
        )

    def tmp_dir(self, step: int) -> Path:
        return self.directory / store.tmp_name(step, self.owner)

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def save(self, step: int, state_fn: Callable[[], Any]) -> None:
        """Checkpoint this process's part of ``state_fn()``; blocks only as long as it must."""
        w_request, t_request = time.time(), time.monotonic()
        self._drain(wait=True)  # at most one in flight; waiting for it counts as pause
        self._sync_device()
        tmp, final = self.tmp_dir(step), self.directory / store.final_name(step)
        times = _Times(w_request, t_request, time.time())
        t0 = time.monotonic()
        inflight: InFlight | None = None
        error: BaseException | None = None
        try:
            if isinstance(self.fs, _FaultFS):
                self.fs.current = step
            try:
                self.fs.mkdir(tmp)
            except FileExistsError:
                if self.ranks.world_size == 1:
                    raise
                # another rank made it first
            state = state_fn()
            if self.ranks.world_size > 1 and not self.fmt.collective:
                state = split_state(state, self.ranks, step)
            # The format copies what must be copied before training may go on; with
            # overlap its first chunks are already being written meanwhile.
            inflight = self.fmt.begin(state, tmp, self.fs, self.options, name=self.filename)
        except BaseException as exc:
            if _fatal(exc) or self.ranks.world_size == 1:
                # Nothing to agree on with other ranks: fail the save where it was asked.
                self._failed(exc, tmp, final, self._what(final))
                raise
            # Another rank is writing its part: it hears of this failure in the gather,
            # and of a format's own collective save (DCP's) in it, which this rank joins
            # to fail it, so that no rank waits there for this one.
            error = exc
            if self.fmt.collective:
                self.fmt.join_failed(exc, tmp, self.options)
        times.serialize_s = inflight.serialize_s if inflight else time.monotonic() - t0
        if self._pool is not None:
            times.pause_s = time.monotonic() - t_request
        self._start(self._persist, step, inflight, error, times)

    def _what(self, final: Path) -> str:
        if self.ranks.world_size == 1:
            return f"writing checkpoint {final.name}"
        return f"writing rank {self.ranks.rank}'s shard of {final.name}"

    def _error(self, exc: BaseException, what: str) -> BaseException:
        """The trainer error a failed write or commit stands for (exit 4, 3), or ``exc``.
        Before the half-written checkpoint is removed: a volume it filled is a full one."""
        error = storage_error(exc, what, self.fs, self.directory)
        if error is None:
            return exc
        error.__cause__ = exc
        return error

    def _failed(self, exc: BaseException, tmp: Path, final: Path, what: str) -> None:
        """Delete the half-written checkpoint; raise the trainer's error for a known cause."""
        error = None if _fatal(exc) else self._error(exc, what)
        self.fs.rmtree(tmp)
        if error is not None and error is not exc:
            raise error from exc

    def _write(self, inflight: InFlight, times: _Times) -> dict[str, Any]:
        """Finish and fsync this rank's files; its report for rank 0."""
        w_write = times.w0 if inflight.overlapped else time.time()
        written = inflight.finish()
        w_written, t_fsync = time.time(), time.monotonic()
        try:
            if self.durable:
                for f in written.files:
                    self.fs.fsync(f.fd)
        finally:
            for f in written.files:
                self.fs.close(f.fd)
        many = self.ranks.world_size > 1
        return {
            "ok": True,
            "files": written.files,
            "bytes": written.nbytes,
            "overlapped": inflight.overlapped,
            "entries": [
                {
                    "name": f.name or self.filename,
                    "bytes": f.nbytes,
                    "chunk_bytes": f.chunk_bytes,
                    f.checksum: list(f.checksums),
                    **({"rank": self.ranks.rank} if many else {}),
                }
                for f in written.files
            ],
            "layout": written.layout,
            "checksum": written.checksum,
            "io_mode": written.io_mode,
            "write_s": written.write_s,
            "checksum_s": written.checksum_s,
            "fsync_s": time.monotonic() - t_fsync,
            "w_write": w_write,
            "w_written": w_written,
        }

    def _persist(
        self, step: int, inflight: InFlight | None, error: BaseException | None, times: _Times
    ) -> CheckpointRecord:
        ranks = self.ranks
        tmp, final = self.tmp_dir(step), self.directory / store.final_name(step)
        report: dict[str, Any] = {"ok": False}
        if inflight is not None and error is None:
            try:
                report = self._write(inflight, times)
            except BaseException as exc:
                inflight.abort()
                if _fatal(exc):
                    self.fs.rmtree(tmp)
                    raise
                error = exc
        if isinstance(error, RankFailedError):
            # Another rank's failure, told by the format's own collective (DCP's): this
            # rank's part was fine; the rank that failed reports why and exits first.
            report = {"ok": False, "error": _describe(error), "told": True}
            error = None
        elif error is not None:
            error = self._error(error, self._what(final))
            report = {"ok": False, "error": _describe(error)}
        files = report.pop("files", [])  # this rank's own: open descriptors are not sent
        report.setdefault("bytes", 0)
        report.update(
            rank=ranks.rank,
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
                error or exc
            )

        decision: dict[str, Any] = {"committed": False}
        commit_s, w_commit = 0.0, 0.0
        if ranks.is_main:
            assert reports is not None
            failed = [r for r in reports if not r["ok"]]
            if failed:
                self.fs.rmtree(tmp)
                shown = [r for r in failed if not r.get("told")] or failed
                decision["error"] = "; ".join(f"rank {r['rank']}: {r['error']}" for r in shown)
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
                except BaseException as exc:
                    if _fatal(exc):
                        raise
                    error = self._error(exc, f"committing {final.name}")
                    self.fs.rmtree(tmp)
                    decision["error"] = f"rank 0 could not commit: {_describe(error)}"
                commit_s, w_commit = time.monotonic() - t_commit, time.time()
        w_released = time.time()
        decision = ranks.broadcast(decision)
        if error is not None:
            raise error
        if not decision["committed"]:
            message = f"checkpoint {final.name} was not committed: {decision['error']}"
            # torchrun stops every rank once one exits and names the first to exit as the
            # root cause: let the rank that failed exit first, and say now what we were told
            # (torchrun's SIGTERM may come before the error is printed).
            log.error("rank %d: %s", ranks.rank, message)
            time.sleep(FAILED_RANK_GRACE_S)
            raise RankFailedError(message)

        uploads = None
        if self.uploader is not None:
            uploads = self._upload(final, [f.name or self.filename for f in files])
            w_released = time.time()
        if self.durable:
            # Without fsync no checkpoint is known to survive a crash, so none may replace
            # an older one: retention then deletes nothing (the trainer says so up front).
            self._good.add(step)
            if ranks.is_main:
                store.apply_retention(self.fs, self.directory, self.keep, self._good)
        w_end, t_end = time.time(), time.monotonic()
        if not ranks.is_main:
            return self._local_record(step, report, times, final, t_end)
        assert reports is not None
        if ranks.world_size == 1:
            return self._local_record(step, report, times, final, t_end, uploads, commit_s)
        return self._record(step, reports, uploads, final, commit_s, w_commit, w_released, w_end)

    def _upload(self, final: Path, names: list[str]) -> list[dict[str, Any]]:
        """Every rank uploads its own files; rank 0 the manifest last, once all are up."""
        assert self.uploader is not None
        ranks = self.ranks
        if ranks.world_size == 1:
            # One upload: the manifest last, the remote one of an earlier try dropped first.
            t0, w0 = time.monotonic(), time.time()
            self.uploader.upload(final, [*names, store.MANIFEST])
            return [{"ok": True, "upload_s": time.monotonic() - t0, "w0": w0, "w1": time.time()}]
        error: UploadError | None = None
        t0, w0 = time.monotonic(), time.time()
        try:
            self.uploader.upload(final, names)
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
        return reports if reports is not None else [report]

    def _manifest(self, step: int, reports: list[dict[str, Any]]) -> dict[str, Any]:
        """The manifest of one process's files (its format's layout), or of every rank's
        (``sharded``: each file names its rank; ``shard_layout`` is the format's)."""
        algorithms = {r["checksum"] for r in reports}
        modes = sorted({r["io_mode"] for r in reports})
        manifest = {
            "schema": store.MANIFEST_SCHEMA,
            "step": step,
            # Whose checkpoint this is: --resume auto continues only its own run's.
            "run_id": run_uuid(),
            "format": self.fmt.name,
            "created_at": time.time(),
            "io_mode": modes[0] if len(modes) == 1 else ", ".join(modes),
            "checksum": algorithms.pop() if len(algorithms) == 1 else "mixed",
            "layout": reports[0]["layout"],
            "files": [e for r in reports for e in r["entries"]],
        }
        if self.ranks.world_size > 1:
            manifest |= {
                "layout": store.LAYOUT_SHARDED,
                "shard_layout": reports[0]["layout"],
                "world_size": self.ranks.world_size,
                "parallel": self.ranks.parallel,
            }
        return manifest

    def _local_record(
        self,
        step: int,
        report: dict[str, Any],
        times: _Times,
        final: Path,
        t_end: float,
        uploads: list[dict[str, Any]] | None = None,
        commit_s: float = 0.0,
    ) -> CheckpointRecord:
        """What this process measured of its own files (a rank other than 0 tracks
        nothing; a single process reports exactly this)."""
        nbytes = report["bytes"]
        upload_s = uploads[0]["upload_s"] if uploads else None
        return CheckpointRecord(
            step=step,
            bytes=nbytes,
            serialize_s=times.serialize_s,
            write_s=report["write_s"],
            fsync_s=report["fsync_s"] + commit_s,
            upload_s=upload_s,
            pause_s=times.pause_s if times.pause_s is not None else t_end - times.t_request,
            total_s=t_end - times.t_request,  # from the save request, waiting included
            write_gbps=nbytes / max(report["write_s"], 1e-9) / 1e9,
            upload_gbps=_gbps(nbytes, upload_s),
            path=str(final),
            io_mode=report["io_mode"],
            overlapped=report["overlapped"],
            checksum_s=report["checksum_s"],
            io_streams=self.options.io_streams,
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
    ) -> CheckpointRecord:
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
        checks = [r["checksum_s"] for r in reports if r["checksum_s"] is not None]
        modes = sorted({r["io_mode"] for r in reports})
        return CheckpointRecord(
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
            overlapped=reports[0]["overlapped"],
            checksum_s=max(checks) if checks else None,
            io_streams=self.options.io_streams,
            checksum=reports[0]["checksum"],
            world_size=self.ranks.world_size,
            ranks=per_rank,
            aggregate_gbps=nbytes / max(w_commit - first_write, 1e-9) / 1e9,
            slowest_pause_s=slowest_pause,
            commit_s=commit_s,
        )
