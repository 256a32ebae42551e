"""Shared by the trainer tests: tiny configs, running the CLI, reading offline runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
