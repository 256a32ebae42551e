"""The restore figure: seconds to load and verify the newest checkpoint, its bytes and GB/s.

A faster volume may matter more for loading a checkpoint (a restart after a failure, a
job that resumes) than for saving it; MLPerf Storage measures checkpoint load as well. A
run measures it when it resumes (the restore it does anyway) and, with ``--restore-check``,
once at the end: the newest checkpoint read back, every checksum verified, the state
loaded into the model and optimizer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from checkpoint_storage_bench.contract import RESTORE_MEASURED, RESTORE_OUTPUTS

Measured = Literal["resume", "end"]


@dataclass(frozen=True)
class RestoreFigure:
    """One restore: what it took and when it was measured."""

    seconds: float
    bytes: int
    step: int
    measured: Measured

    @property
    def gbps(self) -> float:
        return self.bytes / max(self.seconds, 1e-9) / 1e9

    def line(self) -> str:
        when = "on resume" if self.measured == "resume" else "at the end (--restore-check)"
        return (
            f"restore of step {self.step} {when}: {self.bytes / 1e6:.1f} MB loaded and "
            f"verified in {self.seconds:.3f}s ({self.gbps:.2f} GB/s)"
        )


def restore_keys(figure: RestoreFigure | None) -> dict[str, Any]:
    """The summary keys and outputs of a restore (None each when none was measured)."""
    seconds, nbytes, gbps = RESTORE_OUTPUTS
    if figure is None:
        return dict.fromkeys((*RESTORE_OUTPUTS, RESTORE_MEASURED))
    return {
        seconds: figure.seconds,
        nbytes: figure.bytes,
        gbps: figure.gbps,
        RESTORE_MEASURED: figure.measured,
    }


def _bytes(directory: Path, step: int) -> int:
    from trainer.ckpt import store  # torch: only once a restore ran

    path = directory / store.final_name(step)
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def restore_figure(
    directory: Path, step: int | None, seconds: float, measured: Measured
) -> RestoreFigure | None:
    """The figure of a restore that took ``seconds`` and gave ``step`` (None: nothing was
    restored, so nothing was measured)."""
    if step is None:
        return None
    return RestoreFigure(seconds, _bytes(Path(directory), step), step, measured)


def check_restore(
    restore: Callable[[], int | None], directory: Path, say: Callable[[str], None]
) -> RestoreFigure | None:
    """``--restore-check``: time ``restore`` (load and verify the newest checkpoint)."""
    start = time.monotonic()
    step = restore()
    figure = restore_figure(directory, step, time.monotonic() - start, "end")
    if figure is None:
        say("--restore-check: no checkpoint to load back (none was made)")
    return figure
