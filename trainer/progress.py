"""Progress people can watch: a step line with an ETA every few seconds (not every step),
the run's progress bar in Polyaxon, and the bytes of an upload done so far."""

from __future__ import annotations

import time
from collections.abc import Callable

import fsspec.callbacks

PROGRESS_EVERY_S = 5.0
"""Seconds between two progress lines: a log stays readable at any step rate."""


def duration(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``42s``.

    >>> duration(3725), duration(185), duration(41.6)
    ('1h02m', '3m05s', '42s')
    """
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class StepProgress:
    """Says where training is, at most every ``every_s`` seconds, and at the last step.

    Args:
        start: The step training starts after (a resumed run's checkpoint step).
        total: The last step.
        say: Where the line goes.
        report: Called with the fraction done (0..1), e.g. the Polyaxon run's progress.
        every_s: Least seconds between two lines.
        clock: A monotonic clock (injectable for tests).
    """

    def __init__(
        self,
        start: int,
        total: int,
        say: Callable[[str], None],
        report: Callable[[float], None] = lambda fraction: None,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.start, self.total, self.say, self.report = start, total, say, report
        self.every_s, self.clock = every_s, clock
        self.t0 = self.last = clock()

    def update(self, step: int, loss: float | None) -> None:
        now = self.clock()
        if step < self.total and now - self.last < self.every_s:
            return
        self.last = now
        done, elapsed = step - self.start, now - self.t0
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = duration((self.total - step) / rate) if rate > 0 else "?"
        loss_text = f" loss {loss:.4g}" if loss is not None else ""
        self.say(
            f"step {step}/{self.total} ({100 * step / self.total:.0f}%){loss_text} "
            f"{rate:.3g} steps/s ETA {eta}"
        )
        self.report(step / self.total)


class UploadProgress(fsspec.callbacks.Callback):
    """An fsspec callback that says how many bytes of a checkpoint's upload are done, at
    most every ``every_s`` seconds and once at the end (:meth:`done`).

    fsspec reports within a file (``set_size`` then ``relative_update``; some stores, e.g.
    the local one, report nothing); the uploader adds each file once it is done
    (:meth:`file_done`), so the count runs over all of a checkpoint's files.
    """

    def __init__(
        self,
        what: str,
        total_bytes: int,
        say: Callable[[str], None],
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.what, self.total_bytes, self.say = what, total_bytes, say
        self.every_s, self.clock = every_s, clock
        self.before = 0  # bytes of the files already uploaded
        self.last = clock()

    def set_size(self, size: int) -> None:
        self.value = 0  # a file starts
        super().set_size(size)

    def file_done(self, nbytes: int) -> None:
        self.before += nbytes
        self.value = 0
        self.call()

    def call(self, *args, **kwargs) -> None:
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self._say()

    @property
    def bytes_done(self) -> int:
        return self.before + self.value

    def done(self) -> None:
        self._say()

    def _say(self) -> None:
        self.say(f"upload {self.what}: {self.bytes_done / 1e6:.1f}/{self.total_bytes / 1e6:.1f} MB")
