"""What a run is refused or warned about before torch is imported, the model built or a
tracked run opened: a refusal costs a second and leaves no failed run behind in the
offline root (or the project) that a later comparison would have to step over.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from checkpoint_storage_bench.contract import (
    CHECKPOINT_DIR_PATTERN,
    MIN_BUDGET_CHECKPOINTS,
    VERDICT_CONFIDENCE,
    VERDICT_WARMUP,
)
from trainer.config import TrainConfig
from trainer.errors import CheckpointDirError, ConfigError


def check_before_training(cfg: TrainConfig, warn: Callable[[str], None]) -> None:
    """Refuse an unusable directory, or one whose checkpoints ``--resume never`` must not
    touch; warn when the run makes too few checkpoints for the verdict's interval.

    Raises:
        CheckpointDirError: The directory is unusable or already holds checkpoints.
        ConfigError: ``--summary-json`` cannot be written.
    """
    cfg.check_checkpoint_dir()
    if cfg.summary_json is not None:
        check_summary_path(cfg.summary_json)
    if cfg.resume == "never":
        refuse_existing(cfg)
    if (warning := few_checkpoints_warning(cfg)) is not None:
        warn(warning)


def check_summary_path(path: Path) -> None:
    """Refuse a ``--summary-json`` that cannot be written, before the run it would report
    on: an existing directory, a path under a file, a directory not writable. Its parent
    directories are made now (the summary would make them anyway).

    Raises:
        ConfigError: It cannot be written (exit 2).
    """
    if path.is_dir():
        raise ConfigError(f"--summary-json {path} is a directory: name the file to write")
    probe = path.with_name(f".{path.name}.probe-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"--summary-json {path} cannot be written: {exc.strerror or exc} ({exc.filename})"
        ) from None


def refuse_existing(cfg: TrainConfig) -> None:
    """``--resume never`` and the directory holds published checkpoints: refused as the
    training loop would refuse them, only sooner (the ``auto`` and ``always`` modes read
    the checkpoints' manifests, which the loop does)."""
    pattern = re.compile(CHECKPOINT_DIR_PATTERN)
    found = sorted(
        (p.name for p in cfg.checkpoint_dir.iterdir() if p.is_dir() and pattern.fullmatch(p.name)),
        key=lambda name: int(name.removeprefix("step-")),  # step-100000000 after step-99999999
    )
    if found:
        raise CheckpointDirError(
            f"{cfg.checkpoint_dir} already holds checkpoints (newest {found[-1]}): pass "
            "--resume (always) to continue them, --resume auto to continue this Polyaxon "
            "run's own, or use a new directory"
        )


def few_checkpoints_warning(cfg: TrainConfig) -> str | None:
    """A warning when ``--steps`` / ``--checkpoint-every`` give fewer measured checkpoints
    (the verdict leaves the first out as warm-up) than the verdict's bound of a run's median
    pause needs at its default confidence: below it no pause budget can be met."""
    made = cfg.steps // cfg.checkpoint_every
    need = MIN_BUDGET_CHECKPOINTS
    measured = max(0, made - VERDICT_WARMUP)
    if measured >= need:
        return None
    steps = (need + VERDICT_WARMUP) * cfg.checkpoint_every
    return (
        f"warning: --steps {cfg.steps} with --checkpoint-every {cfg.checkpoint_every} makes "
        f"{made} checkpoint(s), {measured} after the {VERDICT_WARMUP} warm-up one(s) the "
        f"verdict leaves out; a {VERDICT_CONFIDENCE:.0%} bound of the run's median pause, which "
        f"a pause budget is judged on, needs at least {need}: e.g. --steps {steps}"
    )
