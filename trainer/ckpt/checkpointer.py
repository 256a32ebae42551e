"""Saves checkpoints and times every stage: serialize, write, fsync, upload, pause, total.

``pause`` is how long the training loop was blocked; ``total`` runs from the save request
until the checkpoint is durable (written, fsynced, committed and uploaded). In sync mode
they are equal. In async mode the loop is blocked only while the state is staged (and
while a previous checkpoint is still in flight: at most one is), and the rest runs on a
background thread whose failure fails the run at the next step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from trainer.ckpt import checksum as checksums
from trainer.ckpt import store
from trainer.ckpt.formats import Format, InFlight, WriteOptions
from trainer.ckpt.fs import LocalFS, storage_error
from trainer.ckpt.upload import Uploader

log = logging.getLogger(__name__)


@dataclass
class CheckpointRecord:
    """One checkpoint's stage timeline; seconds and bytes as in the summary JSON."""

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gbps(nbytes: int, seconds: float | None) -> float | None:
    if seconds is None:
        return None
    return nbytes / max(seconds, 1e-9) / 1e9


class OneInFlight:
    """At most one checkpoint persisting in the background (``asynchronous``), or none
    (every save persists before it returns): what both writers, one process or many ranks,
    share. A subclass calls :meth:`_start` with its persist function and arguments.
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

    def finish(self) -> list[CheckpointRecord]:
        """Wait for the checkpoint in flight; returns the records not yet handed over."""
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


class Checkpointer(OneInFlight):
    """Writes checkpoints of one run into ``directory``.

    Args:
        directory: The run's checkpoint directory on the mounted claim.
        fmt: The format (raw, torch, dcp, safetensors).
        fs: The storage seam.
        durable: fsync files and directories.
        keep: Complete checkpoints to retain.
        uploader: Uploads each committed checkpoint, or None.
        asynchronous: Persist in the background.
        device: The model's device, synchronized around timed regions.
        verified: Steps already known good (the one a resume verified): retention counts
            these and the ones this writer makes durable, nothing else.
        options: Overlap, streams and checksum (``durable`` and ``background`` are set
            from the arguments above).
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
    ) -> None:
        self.directory = directory
        self.fmt = fmt
        self.fs = fs
        self.durable = durable
        self.keep = keep
        self.uploader = uploader
        self.device = device or torch.device("cpu")
        self.options = replace(options or WriteOptions(), durable=durable, background=asynchronous)
        super().__init__(asynchronous)
        self._good = set(verified)
        # One owner for every temporary name this writer makes (run, pod, pid), so a
        # restarted run can tell its predecessors' leftovers from another run's.
        self.owner = store.Owner.current()

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def save(self, step: int, state_fn: Callable[[], Any]) -> None:
        """Checkpoint the state ``state_fn()`` returns; blocks only as long as it must."""
        t_request = time.monotonic()
        self._drain(wait=True)  # at most one in flight; waiting for it counts as pause
        self._sync_device()
        tmp_dir = self.directory / store.tmp_name(step, self.owner)
        final_dir = self.directory / store.final_name(step)
        try:
            self.fs.mkdir(tmp_dir)
            # The format copies what must be copied before training may go on; with
            # overlap its first chunks are already being written meanwhile.
            inflight = self.fmt.begin(state_fn(), tmp_dir, self.fs, self.options)
        except BaseException as exc:
            self._failed(exc, tmp_dir, final_dir)
            raise
        pause_end = None if self._pool is None else time.monotonic()
        self._start(self._persist, step, inflight, tmp_dir, t_request, pause_end=pause_end)

    def _failed(self, exc: BaseException, tmp_dir: Path, final_dir: Path) -> None:
        """Delete the half-written checkpoint; raise the trainer's error for a known cause."""
        error = None
        # Not `Exception`: torch.distributed.checkpoint's CheckpointException is a
        # BaseException. Before the rmtree: a volume the half-written checkpoint filled up
        # is a full one.
        if not isinstance(exc, KeyboardInterrupt | SystemExit):
            error = storage_error(
                exc, f"writing checkpoint {final_dir.name}", self.fs, self.directory
            )
        self.fs.rmtree(tmp_dir)
        if error is not None:
            raise error from exc

    def _persist(
        self,
        step: int,
        inflight: InFlight,
        tmp_dir: Path,
        t_request: float,
        pause_end: float | None,
    ) -> CheckpointRecord:
        final_dir = self.directory / store.final_name(step)
        try:
            written = inflight.finish()
            t_fsync = time.monotonic()
            try:
                if self.durable:
                    for f in written.files:
                        self.fs.fsync(f.fd)
            finally:
                for f in written.files:
                    self.fs.close(f.fd)
            manifest = store.manifest_for(
                step, self.fmt.name, self.fmt.filename, written.files, layout=written.layout
            )
            store.commit(
                self.fs, tmp_dir, final_dir, manifest, durable=self.durable, owner=self.owner
            )
            t_done_local = time.monotonic()
        except BaseException as exc:
            inflight.abort()
            self._failed(exc, tmp_dir, final_dir)
            raise
        upload_s = None
        if self.uploader is not None:
            t_up = time.monotonic()
            self.uploader.upload(final_dir, [f.name for f in written.files] + [store.MANIFEST])
            upload_s = time.monotonic() - t_up
        if self.durable:
            # Without fsync no checkpoint is known to survive a crash, so none may replace
            # an older one: retention then deletes nothing (the trainer says so up front).
            self._good.add(step)
            store.apply_retention(self.fs, self.directory, self.keep, self._good)
        t_end = time.monotonic()
        return CheckpointRecord(
            step=step,
            bytes=written.nbytes,
            serialize_s=inflight.serialize_s,
            write_s=written.write_s,
            fsync_s=t_done_local - t_fsync,
            upload_s=upload_s,
            pause_s=(pause_end if pause_end is not None else t_end) - t_request,
            total_s=t_end - t_request,  # from the save request, waiting included
            write_gbps=written.nbytes / max(written.write_s, 1e-9) / 1e9,
            upload_gbps=_gbps(written.nbytes, upload_s),
            path=str(final_dir),
            io_mode=written.io_mode,
            overlapped=inflight.overlapped,
            checksum_s=written.checksum_s,
            io_streams=self.options.io_streams,
            checksum=written.checksum,
        )
