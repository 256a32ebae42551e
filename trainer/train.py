"""The training loop: a real model, real optimizer steps, stage-timed checkpoints."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainer import distributed
from trainer.ckpt import sharded, store
from trainer.ckpt.checkpointer import Checkpointer, CheckpointRecord
from trainer.ckpt.formats import make_format
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer
from trainer.ckpt.upload import DEFAULT_BACKOFF, Backoff, Uploader
from trainer.config import TrainConfig
from trainer.errors import CheckpointCorruptError, CheckpointDirError, ConfigError
from trainer.model import VOCAB, SyntheticTokens, TinyGPT, shape_for_bytes
from trainer.summary import RunSummary

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for but no CUDA device is available")
    return torch.device(name)


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


def restore_latest(
    cfg: TrainConfig,
    fs: LocalFS,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    say: Callable[[str], None],
) -> int | None:
    """Load the newest checkpoint that is complete and verifies; returns its step.

    Anything incomplete or corrupt is skipped with a message, never loaded.

    Returns:
        The restored step, or None when the directory holds no published checkpoint.

    Raises:
        CheckpointCorruptError: Checkpoints exist but none verifies: starting over would
            silently throw the run's progress away.
    """
    fmt = make_format(cfg.format)
    buffer = AlignedBuffer()
    refs = store.list_checkpoints(cfg.checkpoint_dir)
    for ref in refs:
        try:
            # Shards of several ranks are refused (exit 2), never misread as one file.
            sharded.check_world(store.read_manifest(ref.path), ref.path.name, 1, "none")
            manifest, data = store.read_verified(fs, ref.path, buffer)
            if manifest["format"] != cfg.format:
                raise CheckpointCorruptError(
                    f"{ref.path.name} is format {manifest['format']!r}, this run uses {cfg.format!r}"
                )
            state = fmt.load(data)
        except CheckpointCorruptError as exc:
            say(f"resume: skipping {exc}")
            continue
        _check_same_model(cfg, state.get("config", {}), ref.path.name)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"].clone())  # needs its own storage
        device = next(model.parameters()).device
        if "cuda" in state["rng"] and device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"].clone(), device)
        say(f"resume: continuing from {ref.path.name} (step {state['step']})")
        return int(state["step"])
    if refs:
        raise CheckpointCorruptError(
            f"--resume: none of the {len(refs)} checkpoints in {cfg.checkpoint_dir} is complete and verified"
        )
    return None


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
) -> RunSummary:
    """Train for ``cfg.steps`` steps, checkpointing every ``cfg.checkpoint_every``.

    Args:
        cfg: The validated configuration.
        fs: The storage seam (tests inject faults here).
        on_checkpoint: Called on the main thread with each finished checkpoint's timeline.
        on_loss: Called with (step, loss) every ``cfg.log_every`` steps and at the end.
        say: Where progress lines go.
        upload_backoff: Retry schedule for uploads.

    Returns:
        The run's summary.
    """
    fs = fs or LocalFS()
    cfg.check_checkpoint_dir()
    # Under torchrun with several processes (issue 16); None: the single-process path.
    ranks = distributed.setup(cfg)
    device = ranks.device if ranks else resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    shape = shape_for_bytes(cfg.model_size, cfg.seq_len)
    model = TinyGPT(shape, cfg.seq_len).to(device)
    if ranks:
        model = distributed.wrap(model, ranks)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    param_count = sum(p.numel() for p in model.parameters())
    say(
        f"model: d_model={shape.d_model} layers={shape.n_layers} params={param_count:,} "
        f"({param_count * 4 / 2**20:.1f} MiB fp32) on {device}"
        + (f", {ranks.world_size} ranks ({ranks.parallel})" if ranks else "")
    )

    start = 0
    if not cfg.resume and (existing := store.list_checkpoints(cfg.checkpoint_dir)):
        # Retention would otherwise count the old run's checkpoints and delete the new ones.
        raise CheckpointDirError(
            f"{cfg.checkpoint_dir} already holds checkpoints (newest {existing[0].path.name}): "
            "pass --resume to continue that run, or use a new directory"
        )
    if cfg.resume and ranks:
        resumed = sharded.restore(
            cfg.checkpoint_dir,
            cfg.format,
            make_format(cfg.format),
            fs,
            model,
            opt,
            ranks,
            say,
            check_config=lambda saved, name: _check_same_model(cfg, saved, name),
        )
    elif cfg.resume:
        resumed = restore_latest(cfg, fs, model, opt, say)
    if cfg.resume:
        if resumed is None:
            say("resume: no complete checkpoint found; starting from step 0")
        start = resumed or 0
    if ranks:
        sharded.prepare_dir(fs, cfg.checkpoint_dir, ranks)
    else:
        store.remove_stale_tmp(fs, cfg.checkpoint_dir)
    uploader = Uploader(cfg.upload_to, upload_backoff) if cfg.upload_to else None
    ckpt: Checkpointer | sharded.ShardedCheckpointer
    if ranks:
        ckpt = sharded.ShardedCheckpointer(
            cfg.checkpoint_dir,
            make_format(cfg.format, pin=device.type == "cuda"),
            fs,
            durable=cfg.durability == "fsync",
            keep=cfg.keep,
            ranks=ranks,
            uploader=uploader,
            asynchronous=cfg.async_checkpoint,
        )
    else:
        ckpt = Checkpointer(
            cfg.checkpoint_dir,
            make_format(cfg.format, pin=device.type == "cuda"),
            fs,
            durable=cfg.durability == "fsync",
            keep=cfg.keep,
            uploader=uploader,
            asynchronous=cfg.async_checkpoint,
            device=device,
        )
    data = SyntheticTokens(cfg.seed, cfg.batch_size, cfg.seq_len)
    if ranks:
        data = distributed.RankData(data, ranks)  # each rank its own batches
    records: list[CheckpointRecord] = []
    curve: list[tuple[int, float]] = []

    def hand_over(done: list[CheckpointRecord]) -> None:
        for record in done:
            records.append(record)
            on_checkpoint(record)

    loss_value = float("nan")
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
                loss_value = ranks.mean(loss) if ranks else loss.item()
                curve.append((step, loss_value))
                on_loss(step, loss_value)
            if step % cfg.checkpoint_every == 0:
                ckpt.save(step, lambda step=step: _state(model, opt, step, cfg))
            hand_over(ckpt.poll())
    finally:
        # Even when training fails, wait for (and surface) the checkpoint in flight.
        hand_over(ckpt.finish())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    runtime = time.monotonic() - t_start
    if ranks:
        ranks.close()
    return RunSummary(
        storage_profile=cfg.storage_profile,
        checkpoint_dir=str(Path(cfg.checkpoint_dir)),
        inputs={**run_inputs(cfg), "param_count": param_count, "device": str(device)},
        runtime_s=runtime,
        steps_run=cfg.steps - start,
        final_loss=loss_value,
        checkpoints=records,
        loss_curve=curve,
        resumed_from=start if cfg.resume else None,
        world_size=ranks.world_size if ranks else 1,
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
        "steps": cfg.steps,
        "checkpoint_every": cfg.checkpoint_every,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "world_size": world,
        "parallel": distributed.effective_parallel(cfg.parallel, world),
    }
