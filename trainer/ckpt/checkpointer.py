"""Saves checkpoints and times every stage: serialize, write, fsync, upload, pause, total.

``pause`` is how long the training loop was blocked; ``total`` runs from the save request
until the checkpoint is durable (written, fsynced, committed and uploaded). In sync mode
they are equal. In async mode the loop is blocked only while the state is staged (and
while a previous checkpoint is still in flight: at most one is), and the rest runs on a
background thread whose failure fails the run at the next step.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.ckpt import store
from trainer.ckpt.formats import RawFormat, Staged, TorchFormat
from trainer.ckpt.fs import LocalFS, raise_if_full
from trainer.ckpt.io import write_file
from trainer.ckpt.upload import Uploader
from trainer.errors import CheckpointDirError

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gbps(nbytes: int, seconds: float | None) -> float | None:
    if seconds is None:
        return None
    return nbytes / max(seconds, 1e-9) / 1e9


class Checkpointer:
    """Writes checkpoints of one run into ``directory``.

    Args:
        directory: The run's checkpoint directory on the mounted claim.
        fmt: The format (raw or torch).
        fs: The storage seam.
        durable: fsync files and directories.
        keep: Complete checkpoints to retain.
        uploader: Uploads each committed checkpoint, or None.
        asynchronous: Persist in the background.
        device: The model's device, synchronized around timed regions.
        verified: Steps already known good (the one a resume verified): retention counts
            these and the ones this writer makes durable, nothing else.
    """

    def __init__(
        self,
        directory: Path,
        fmt: RawFormat | TorchFormat,
        fs: LocalFS,
        durable: bool,
        keep: int,
        uploader: Uploader | None = None,
        asynchronous: bool = False,
        device: torch.device | None = None,
        verified: Iterable[int] = (),
    ) -> None:
        self.directory = directory
        self.fmt = fmt
        self.fs = fs
        self.durable = durable
        self.keep = keep
        self.uploader = uploader
        self.device = device or torch.device("cpu")
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt-bg") if asynchronous else None
        self._inflight: Future[CheckpointRecord] | None = None
        self._done: list[CheckpointRecord] = []
        self._good = set(verified)

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def save(self, step: int, state_fn: Callable[[], Any]) -> None:
        """Checkpoint the state ``state_fn()`` returns; blocks only as long as it must."""
        t_request = time.monotonic()
        self._drain(wait=True)  # at most one in flight; waiting for it counts as pause
        self._sync_device()
        t0 = time.monotonic()  # this checkpoint's own work starts here
        staged = self.fmt.stage(state_fn())
        serialize_s = time.monotonic() - t0
        if self._pool is None:
            self._done.append(
                self._persist(step, staged, t0, serialize_s, t_request, pause_end=None)
            )
        else:
            self._inflight = self._pool.submit(
                self._persist, step, staged, t0, serialize_s, t_request, pause_end=time.monotonic()
            )

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

    def _persist(
        self,
        step: int,
        staged: Staged,
        t0: float,
        serialize_s: float,
        t_request: float,
        pause_end: float | None,
    ) -> CheckpointRecord:
        tmp_dir = self.directory / store.tmp_name(step)
        final_dir = self.directory / store.final_name(step)
        filename = self.fmt.filename
        try:
            self.fs.mkdir(tmp_dir)
            t_write = time.monotonic()
            written = write_file(self.fs, tmp_dir / filename, staged.data, direct=staged.direct_ok)
            t_fsync = time.monotonic()
            try:
                if self.durable:
                    self.fs.fsync(written.fd)
            finally:
                self.fs.close(written.fd)
            manifest = store.manifest_for(step, self.fmt.name, filename, written)
            store.commit(self.fs, tmp_dir, final_dir, manifest, durable=self.durable)
            t_done_local = time.monotonic()
        except OSError as exc:
            self.fs.rmtree(tmp_dir)
            raise_if_full(exc, f"writing checkpoint {final_dir.name}")
            if exc.errno == errno.EROFS:
                raise CheckpointDirError(f"checkpoint volume became read-only: {exc}") from exc
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise CheckpointDirError(
                    f"access refused while writing checkpoint {final_dir.name}: {exc}"
                ) from exc
            raise
        upload_s = None
        if self.uploader is not None:
            t_up = time.monotonic()
            self.uploader.upload(final_dir, [filename, store.MANIFEST])
            upload_s = time.monotonic() - t_up
        if self.durable:
            # Without fsync no checkpoint is known to survive a crash, so none may replace
            # an older one: retention then deletes nothing (the trainer says so up front).
            self._good.add(step)
            store.apply_retention(self.fs, self.directory, self.keep, self._good)
        t_end = time.monotonic()
        write_s = t_fsync - t_write
        return CheckpointRecord(
            step=step,
            bytes=staged.nbytes,
            serialize_s=serialize_s,
            write_s=write_s,
            fsync_s=t_done_local - t_fsync,
            upload_s=upload_s,
            pause_s=(pause_end if pause_end is not None else t_end) - t_request,
            total_s=t_end - t_request,  # from the save request, waiting included
            write_gbps=staged.nbytes / max(write_s, 1e-9) / 1e9,
            upload_gbps=_gbps(staged.nbytes, upload_s),
            path=str(final_dir),
            io_mode=written.io_mode,
        )
