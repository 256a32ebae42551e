"""The training loop: a real model, real optimizer steps, stage-timed checkpoints."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from checkpoint_storage_bench.contract import WORLD_SIZE
from checkpoint_storage_bench.retry import Backoff
from trainer import distributed
from trainer.ckpt import sharded, store
from trainer.ckpt.checkpointer import Checkpointer, CheckpointRecord
from trainer.ckpt.formats import WriteOptions, make_format
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.lock import DirLock
from trainer.ckpt.upload import DEFAULT_BACKOFF, Uploader
from trainer.config import RUN_ARTIFACTS_TARGETS, TrainConfig
from trainer.errors import CheckpointDirError, ConfigError
from trainer.model import VOCAB, SyntheticTokens, TinyGPT, shape_for_bytes
from trainer.progress import PROGRESS_EVERY_S, StepProgress
from trainer.provenance import image_ref, run_uuid
from trainer.restore import Restored, RestoreFigure, check_restore, drop_cached, restore_figure
from trainer.summary import RunSummary

log = logging.getLogger(__name__)


def _state(
    model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, cfg: TrainConfig
) -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state()}
    device = next(model.parameters()).device
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return {
        "step": step,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": rng,
        "config": cfg.record(),
    }


def check_resume_mode(cfg: TrainConfig, existing: list[store.CheckpointRef]) -> None:
    """Refuse a directory whose checkpoints this run must not continue (exit 3).

    Retention would otherwise count another run's checkpoints and delete them, or this
    run's. ``never`` refuses any; ``auto`` refuses any that is not this Polyaxon run's own
    (by the run uuid each manifest records; a retried or resumed run keeps its uuid);
    ``always`` takes them as they are.
    """
    if not existing or cfg.resume == "always":
        return
    newest = existing[0].path.name
    if cfg.resume == "never":
        raise CheckpointDirError(
            f"{cfg.checkpoint_dir} already holds checkpoints (newest {newest}): pass --resume "
            "(always) to continue them, --resume auto to continue this Polyaxon run's own, "
            "or use a new directory"
        )
    me = run_uuid()
    for ref in existing:
        readable, run = store.checkpoint_run(ref)
        if readable and (me is None or run != me):
            whose = f"run {run}" if run else "a run outside Polyaxon (or an older trainer)"
            mine = f"this run is {me}" if me else "this process is not a Polyaxon run"
            raise CheckpointDirError(
                f"{cfg.checkpoint_dir} holds checkpoints of another run ({ref.path.name}: "
                f"{whose}; {mine}): --resume auto continues only its own run's; pass "
                "--resume always to continue them, or use a new directory"
            )


def _set_lr(opt: torch.optim.Optimizer, lr: float, say: Callable[[str], None]) -> None:
    """Train a resumed run at ``--lr``: the optimizer's saved state brings back the rate of
    the run that wrote it, while the new checkpoints record this run's (its config)."""
    saved = sorted({group["lr"] for group in opt.param_groups})
    if saved != [lr]:
        was = ", ".join(f"{v:g}" for v in saved)
        say(f"resume: training at --lr {lr:g}; the checkpoint's optimizer had {was}")
    for group in opt.param_groups:
        group["lr"] = lr


def _check_same_model(cfg: TrainConfig, saved: dict[str, Any], name: str) -> None:
    """A checkpoint of another model shape cannot be resumed: say so instead of a traceback."""
    for key in ("model_size", "seq_len", "seed"):
        if key in saved and saved[key] != getattr(cfg, key):
            raise ConfigError(
                f"--resume: {name} was saved with {key}={saved[key]!r}, this run has {getattr(cfg, key)!r}"
            )


def train(
    cfg: TrainConfig,
    fs: LocalFS | None = None,
    on_checkpoint: Callable[[CheckpointRecord], None] = lambda r: None,
    on_loss: Callable[[int, float], None] = lambda s, v: None,
    say: Callable[[str], None] = print,
    upload_backoff: Backoff = DEFAULT_BACKOFF,
    on_progress: Callable[[float], None] = lambda fraction: None,
    progress_every_s: float = PROGRESS_EVERY_S,
    upload_url: str | None = None,
) -> RunSummary:
    """Train for ``cfg.steps`` steps, checkpointing every ``cfg.checkpoint_every``.

    Args:
        cfg: The validated configuration.
        fs: The storage seam (tests inject faults here).
        on_checkpoint: Called on the main thread with each finished checkpoint's timeline.
        on_loss: Called with (step, loss) every ``cfg.log_every`` steps and at the end.
        say: Where progress lines go.
        upload_backoff: Retry schedule for uploads.
        on_progress: Called with the fraction of the steps done, with each progress line.
        progress_every_s: Least seconds between two progress lines (steps, upload bytes).
        upload_url: Where ``cfg.upload_to`` resolved to, when it names the run's artifacts
            (``run-artifacts``); default: ``cfg.upload_to`` itself.

    Returns:
        The run's summary.
    """
    fs = fs or LocalFS()
    cfg.check_checkpoint_dir()
    ranks = distributed.join(cfg)
    lock = DirLock(cfg.checkpoint_dir)
    try:
        # One trainer per directory; rank 0 holds the lock for the job's ranks.
        ranks.agree(distributed.refusal(lock.acquire) if ranks.is_main else None)
        device = ranks.device
        torch.manual_seed(cfg.seed)
        shape = shape_for_bytes(cfg.model_size, cfg.seq_len)
        model = distributed.wrap(TinyGPT(shape, cfg.seq_len).to(device), ranks)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        param_count = sum(p.numel() for p in model.parameters())
        say(
            f"model: d_model={shape.d_model} layers={shape.n_layers} params={param_count:,} "
            f"({param_count * 4 / 2**20:.1f} MiB fp32) on {device}"
            + (f", {ranks.world_size} ranks ({ranks.parallel})" if ranks.world_size > 1 else "")
        )
        inputs = {**run_inputs(cfg), "param_count": param_count, "device": str(device)}
        records: list[CheckpointRecord] = []
        curve: list[tuple[int, float]] = []
        loss_value: float | None = None

        def load_newest(tell: Callable[[str], None]) -> Restored | None:
            """Load the newest checkpoint every rank verifies into the model, read from the
            device; returns its step and the seconds it took."""
            drop_cached(cfg.checkpoint_dir, fs.drop_cached)
            return sharded.restore(
                cfg.checkpoint_dir,
                make_format(cfg.format),
                fs,
                model,
                opt,
                ranks,
                tell,
                check_config=lambda saved, name: _check_same_model(cfg, saved, name),
            )

        def summary(steps_run: int, runtime: float, restore: RestoreFigure | None) -> RunSummary:
            return RunSummary(
                storage_profile=cfg.storage_profile,
                checkpoint_dir=str(Path(cfg.checkpoint_dir)),
                inputs=inputs,
                runtime_s=runtime,
                steps_run=steps_run,
                final_loss=loss_value,
                checkpoints=records,
                loss_curve=curve,
                resumed_from=start or None,
                world_size=ranks.world_size,
                restore=restore,
            )

        ranks.agree(
            distributed.refusal(check_resume_mode, cfg, store.list_checkpoints(cfg.checkpoint_dir))
        )
        restored = load_newest(say) if cfg.resume != "never" else None
        restore = restore_figure(cfg.checkpoint_dir, restored, "resume")
        resumed = None if restored is None else restored.step
        if cfg.resume != "never" and resumed is None:
            say("resume: no complete checkpoint found; starting from step 0")
        if resumed is not None:
            _set_lr(opt, cfg.lr, say)
        start = resumed or 0
        if start >= cfg.steps:
            say(
                f"resume: the checkpoint is at step {start} and --steps is {cfg.steps}: nothing to do"
            )
            return summary(0, 0.0, restore)
        if cfg.durability == "none":
            say(
                f"--keep {cfg.keep} deletes nothing with --durability none: a checkpoint never "
                "made durable must not replace an older one"
            )
        removed, left = sharded.prepare_dir(fs, cfg.checkpoint_dir, ranks)
        for path in removed:
            say(f"removed {path.name}, left by an earlier process of this run")
        for path in left:
            say(f"left {path.name} alone: not this run's (another run, host or writer)")
        # Only rank 0 tracks, so only it can resolve run-artifacts: every rank uploads its
        # shard to where rank 0's URL points.
        upload_url = ranks.broadcast(upload_url)
        if upload_url is None and cfg.upload_to in RUN_ARTIFACTS_TARGETS:
            ranks.agree(
                ConfigError(
                    f"--upload-to {cfg.upload_to} names a Polyaxon run's artifacts: only a tracked run has them"
                )
            )
        uploader = None
        if upload_url := upload_url or cfg.upload_to:
            uploader = Uploader(
                upload_url,
                upload_backoff,
                say=say,
                progress_every_s=progress_every_s,
                checkpoint_dir=cfg.checkpoint_dir,
            )
        ckpt = _checkpointer(
            cfg, fs, ranks, uploader, verified=() if resumed is None else (resumed,)
        )
        data = distributed.RankData(SyntheticTokens(cfg.seed, cfg.batch_size, cfg.seq_len), ranks)

        def hand_over(done: list[CheckpointRecord]) -> None:
            for record in done:
                records.append(record)
                on_checkpoint(record)

        progress = StepProgress(start, cfg.steps, say, on_progress, every_s=progress_every_s)
        t_start = time.monotonic()
        try:
            for step in range(start + 1, cfg.steps + 1):
                tokens = data.batch(step).to(device, non_blocking=True)
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if step % cfg.log_every == 0 or step == cfg.steps:
                    loss_value = ranks.mean(loss)
                    curve.append((step, loss_value))
                    on_loss(step, loss_value)
                if step % cfg.checkpoint_every == 0:
                    ckpt.save(step, lambda step=step: _state(model, opt, step, cfg))
                hand_over(ckpt.poll())
                progress.update(step, loss_value)
        finally:
            # Even when training fails, wait for (and surface) the checkpoint in flight.
            hand_over(ckpt.finish())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        runtime = time.monotonic() - t_start
        if cfg.restore_check:
            restore = (
                end_of_run_restore(say, cfg.checkpoint_dir, lambda: load_newest(lambda _: None))
                or restore
            )
        return summary(cfg.steps - start, runtime, restore)
    finally:
        # Every way out, a refusal included: a rank that leaves its process group to the
        # interpreter's exit can abort there (SIGABRT) instead of exiting with its code.
        lock.release()
        ranks.close()


def _checkpointer(
    cfg: TrainConfig,
    fs: LocalFS,
    ranks: distributed.Ranks,
    uploader: Uploader | None,
    verified: tuple[int, ...],
) -> Checkpointer:
    """The writer of this run's checkpoints, one for every world size and format: one
    process writes the whole state, each rank of many its shard."""
    return Checkpointer(
        cfg.checkpoint_dir,
        make_format(cfg.format, pin=ranks.device.type == "cuda"),
        fs,
        durable=cfg.durability == "fsync",
        keep=cfg.keep,
        uploader=uploader,
        asynchronous=cfg.async_checkpoint,
        verified=verified,
        options=WriteOptions(overlap=not cfg.no_overlap, io_streams=cfg.io_streams),
        ranks=ranks,
    )


def end_of_run_restore(
    say: Callable[[str], None],
    directory: Path,
    load_newest: Callable[[], Restored | None],
) -> RestoreFigure | None:
    """``--restore-check``: time ``load_newest`` (the newest checkpoint back into the model,
    on every rank). The training is over, so replacing its state (and RNG) changes nothing
    it reports."""
    return check_restore(load_newest, directory, say)


def run_inputs(cfg: TrainConfig) -> dict[str, Any]:
    """The inputs that decide whether two runs are comparable (logged to Polyaxon)."""
    world = distributed.world_env().world_size
    return {
        "storage_profile": cfg.storage_profile,
        "checkpoint_dir": str(cfg.checkpoint_dir),
        "model_size_bytes": cfg.model_size,
        "dataset_seed": cfg.seed,
        "checkpoint_format": cfg.format,
        "durability": cfg.durability,
        "async_checkpoint": cfg.async_checkpoint,
        "io_streams": cfg.io_streams,
        "overlap": not cfg.no_overlap,
        "steps": cfg.steps,
        "checkpoint_every": cfg.checkpoint_every,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "resume": cfg.resume,
        "upload_to": cfg.upload_to,
        "image": image_ref(),
        WORLD_SIZE: world,
        "parallel": distributed.effective_parallel(cfg.parallel, world),
    }
