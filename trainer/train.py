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
            whose = f"run {run}" if run else "a run outside Polyaxon"
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


class TrainingRun:
    """One run's training on this rank: the model, optimizer, data and checkpointer, and
    the figures it reports. :func:`train` drives it: :meth:`resume`, then :meth:`prepare`,
    then :meth:`step` and :meth:`save_if_due` for every step, then :meth:`finish`.

    Args:
        cfg: The validated configuration.
        ranks: This process's place in the job (a world of one for a single process).
        fs: The storage seam.
        say: Where progress lines go.
        on_checkpoint: Called on the main thread with each finished checkpoint's timeline.
        on_loss: Called with (step, loss) every ``cfg.log_every`` steps and at the end.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        ranks: distributed.Ranks,
        fs: LocalFS,
        say: Callable[[str], None],
        on_checkpoint: Callable[[CheckpointRecord], None],
        on_loss: Callable[[int, float], None],
    ) -> None:
        self.cfg, self.ranks, self.fs, self.say = cfg, ranks, fs, say
        self.on_checkpoint, self.on_loss = on_checkpoint, on_loss
        device = self.device = ranks.device
        torch.manual_seed(cfg.seed)
        shape = shape_for_bytes(cfg.model_size, cfg.seq_len)
        self.model = distributed.wrap(TinyGPT(shape, cfg.seq_len).to(device), ranks)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        param_count = sum(p.numel() for p in self.model.parameters())
        say(
            f"model: d_model={shape.d_model} layers={shape.n_layers} params={param_count:,} "
            f"({param_count * 4 / 2**20:.1f} MiB fp32) on {device}"
            + (f", {ranks.world_size} ranks ({ranks.parallel})" if ranks.world_size > 1 else "")
        )
        self.inputs = {**run_inputs(cfg), "param_count": param_count, "device": str(device)}
        self.records: list[CheckpointRecord] = []
        self.curve: list[tuple[int, float]] = []
        self.loss_value: float | None = None
        self.start = 0
        self.restore: RestoreFigure | None = None
        self.ckpt: Checkpointer | None = None
        self.data: distributed.RankData | None = None

    def load_newest(self, tell: Callable[[str], None]) -> Restored | None:
        """Load the newest checkpoint every rank verifies into the model, read from the
        device; returns its step and the seconds it took."""
        cfg = self.cfg
        drop_cached(cfg.checkpoint_dir, self.fs.drop_cached)
        return sharded.restore(
            cfg.checkpoint_dir,
            make_format(cfg.format),
            self.fs,
            self.model,
            self.opt,
            self.ranks,
            tell,
            check_config=lambda saved, name: _check_same_model(cfg, saved, name),
        )

    def resume(self) -> int:
        """Continue from the newest verified checkpoint when ``--resume`` allows it, timing
        the restore; returns the step training starts after (0: from the beginning)."""
        cfg, ranks = self.cfg, self.ranks
        ranks.agree(
            distributed.refusal(check_resume_mode, cfg, store.list_checkpoints(cfg.checkpoint_dir))
        )
        restored = self.load_newest(self.say) if cfg.resume != "never" else None
        self.restore = restore_figure(cfg.checkpoint_dir, restored, "resume")
        if cfg.resume != "never" and restored is None:
            self.say("resume: no complete checkpoint found; starting from step 0")
        if restored is not None:
            _set_lr(self.opt, cfg.lr, self.say)
        self.start = 0 if restored is None else restored.step
        return self.start

    def prepare(
        self,
        upload_url: str | None,
        upload_backoff: Backoff,
        progress_every_s: float,
    ) -> None:
        """Clear what this run's predecessors left, then make the checkpointer (with its
        uploader) and the data."""
        cfg, ranks, say = self.cfg, self.ranks, self.say
        if cfg.durability == "none":
            say(
                f"--keep {cfg.keep} deletes nothing with --durability none: a checkpoint never "
                "made durable must not replace an older one"
            )
        removed, left = sharded.prepare_dir(self.fs, cfg.checkpoint_dir, ranks)
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
        verified = () if not self.start else (self.start,)
        self.ckpt = _checkpointer(cfg, self.fs, ranks, uploader, verified=verified)
        self.data = distributed.RankData(
            SyntheticTokens(cfg.seed, cfg.batch_size, cfg.seq_len), ranks
        )

    def step(self, step: int) -> None:
        """One optimizer step on this rank's batch; the job's loss every ``--log-every``."""
        assert self.data is not None
        cfg = self.cfg
        tokens = self.data.batch(step).to(self.device, non_blocking=True)
        logits = self.model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if step % cfg.log_every == 0 or step == cfg.steps:
            self.loss_value = self.ranks.mean(loss)
            self.curve.append((step, self.loss_value))
            self.on_loss(step, self.loss_value)

    def save_if_due(self, step: int) -> None:
        """Checkpoint at every ``--checkpoint-every`` step; hand over the checkpoints that
        finished (a background one's failure is raised here)."""
        assert self.ckpt is not None
        if step % self.cfg.checkpoint_every == 0:
            self.ckpt.save(step, lambda: _state(self.model, self.opt, step, self.cfg))
        self._hand_over(self.ckpt.poll())

    def finish(self) -> None:
        """Wait for (and surface) the checkpoint in flight."""
        if self.ckpt is not None:
            self._hand_over(self.ckpt.finish())

    def restore_check(self) -> None:
        """``--restore-check``: time loading the newest checkpoint back, on every rank. The
        training is over, so replacing its state (and RNG) changes nothing it reports."""
        figure = check_restore(
            lambda: self.load_newest(lambda _: None), self.cfg.checkpoint_dir, self.say
        )
        self.restore = figure or self.restore

    def _hand_over(self, done: list[CheckpointRecord]) -> None:
        for record in done:
            self.records.append(record)
            self.on_checkpoint(record)

    def summary(self, steps_run: int, runtime: float) -> RunSummary:
        cfg = self.cfg
        return RunSummary(
            storage_profile=cfg.storage_profile,
            checkpoint_dir=str(Path(cfg.checkpoint_dir)),
            inputs=self.inputs,
            runtime_s=runtime,
            steps_run=steps_run,
            final_loss=self.loss_value,
            checkpoints=self.records,
            loss_curve=self.curve,
            resumed_from=self.start or None,
            world_size=self.ranks.world_size,
            restore=self.restore,
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
        run = TrainingRun(cfg, ranks, fs, say, on_checkpoint, on_loss)
        start = run.resume()
        if start >= cfg.steps:
            say(
                f"resume: the checkpoint is at step {start} and --steps is {cfg.steps}: nothing to do"
            )
            return run.summary(0, 0.0)
        run.prepare(upload_url, upload_backoff, progress_every_s)
        progress = StepProgress(start, cfg.steps, say, on_progress, every_s=progress_every_s)
        t_start = time.monotonic()
        try:
            for step in range(start + 1, cfg.steps + 1):
                run.step(step)
                run.save_if_due(step)
                progress.update(step, run.loss_value)
        finally:
            # Even when training fails, wait for (and surface) the checkpoint in flight.
            run.finish()
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        runtime = time.monotonic() - t_start
        if cfg.restore_check:
            run.restore_check()
        return run.summary(cfg.steps - start, runtime)
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
