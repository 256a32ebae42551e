"""Shared by the trainer tests: tiny configs, running the CLI, reading offline runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]
TINY = {"model_size": "256KiB", "batch_size": 2, "seq_len": 16}


def tiny_config(checkpoint_dir: Path, **overrides: Any) -> TrainConfig:
    values = {"steps": 6, "checkpoint_every": 2, "keep": 2, "device": "cpu", **TINY, **overrides}
    return TrainConfig(checkpoint_dir=checkpoint_dir, **values)


def trainer_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainer", *args]


def run_trainer(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        trainer_cmd(*args), capture_output=True, text=True, env=full_env, timeout=timeout, cwd=REPO
    )


def offline_runs(root: Path) -> list[dict[str, Any]]:
    runs = []
    for path in sorted((root / "runs").glob("*/run.plx.json")):
        data = json.loads(path.read_text())
        data["_dir"] = path.parent
        runs.append(data)
    return runs


def metric_events(run_dir: Path, name: str) -> list[tuple[int, float]]:
    """Parse ``events/metric/<name>.plx`` (a header line, then ``step|timestamp|value``)."""
    path = run_dir / "events" / "metric" / f"{name}.plx"
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0].isdigit():
            rows.append((int(parts[0]), float(parts[2])))
    return rows


TINY_ARGS = ("--model-size", "256KiB", "--batch-size", "2", "--seq-len", "16", "--device", "cpu")


def quiet(_: str) -> None:
    pass


def flip_byte(path: Path) -> None:
    """Flip the byte in the middle of ``path``: damage a checksum must catch."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def verifies(path: Path) -> bool:
    """Whether the checkpoint at ``path`` reads back and matches its manifest."""
    from trainer.ckpt import store
    from trainer.ckpt.fs import LocalFS
    from trainer.ckpt.io import AlignedBuffer

    try:
        store.read_verified(LocalFS(), path, AlignedBuffer())
    except Exception:  # noqa: BLE001
        return False
    return True


def steps_of(directory: Path) -> list[int]:
    from trainer.ckpt import store

    return [r.step for r in store.list_checkpoints(directory)]


def state_step(path: Path) -> int:
    """The step inside a raw checkpoint's state (not the one its name says)."""
    from trainer.ckpt import store
    from trainer.ckpt.formats import make_format
    from trainer.ckpt.fs import LocalFS
    from trainer.ckpt.io import AlignedBuffer

    manifest, data = store.read_verified(LocalFS(), path, AlignedBuffer())
    return make_format("raw").load(data)["step"]


def edit_manifest_and_resume(
    directory: Path, edit: Callable[[dict[str, Any]], Any]
) -> tuple[int | None, list[str]]:
    """Rewrite step 6's manifest as ``edit`` returns it, then resume to step 8 (keep 3).

    Returns:
        The step the run resumed from, and what it said.
    """
    from trainer.ckpt import store
    from trainer.train import train

    path = directory / "step-00000006" / store.MANIFEST
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    said: list[str] = []
    cfg = tiny_config(directory, steps=8, keep=3, resume="always")
    return train(cfg, say=said.append).resumed_from, said
