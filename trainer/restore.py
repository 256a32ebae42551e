"""The restore figure: seconds to load and verify the newest checkpoint, its bytes and GB/s.

A faster volume may matter more for loading a checkpoint (a restart after a failure, a
job that resumes) than for saving it; MLPerf Storage measures checkpoint load as well. A
run measures it when it resumes (the restore it does anyway) and, with ``--restore-check``,
once at the end: the newest checkpoint read back, every checksum verified, the state
loaded into the model and optimizer.
"""

from __future__ import annotations

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
    directory: Path, restored: Restored | None, measured: Measured
) -> RestoreFigure | None:
    """The figure of a restore (None: nothing was restored, so nothing was measured)."""
    if restored is None:
        return None
    step = restored.step
    return RestoreFigure(restored.seconds, _bytes(Path(directory), step), step, measured)


@dataclass(frozen=True)
class Restored:
    """The checkpoint a restore loaded, and the seconds its own read, verification and
    load took (not those of newer ones it skipped as incomplete or corrupt)."""

    step: int
    seconds: float


def drop_cached(directory: Path, drop: Callable[[Path], None]) -> None:
    """Evict every published checkpoint's files from the page cache (``drop`` one file).

    A restore after a failure reads from the volume, usually on another node; pages left
    cached by the writes would make a library format's load (torch, safetensors, dcp)
    a memory copy, and the figure the volume's profile is judged by would not be the
    volume's.
    """
    from trainer.ckpt import store  # torch: only once a restore runs

    for ref in store.list_checkpoints(Path(directory)):
        for path in sorted(ref.path.rglob("*")):
            if path.is_file():
                drop(path)


def check_restore(
    restore: Callable[[], Restored | None], directory: Path, say: Callable[[str], None]
) -> RestoreFigure | None:
    """``--restore-check``: time ``restore`` (load and verify the newest checkpoint)."""
    restored = restore()
    figure = restore_figure(directory, restored, "end")
    if figure is None:
        say("--restore-check: no checkpoint to load back (none was made)")
    return figure
