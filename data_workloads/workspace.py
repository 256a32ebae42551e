"""The workspace workload: a notebook workspace's saves, as Jupyter and git make them.

A tree of notebook files, saved round after round the way Jupyter's autosave does it
(write a temporary file, fsync it, rename it over the notebook, fsync the directory), then
the tree walked and every entry stat'ed (what ``git status`` does), then every file
reopened and read back (its cache dropped first, as after a restart). Each operation's
latency is recorded; the figures are p50, p99 and max per operation. The workspace is a
scratch directory inside the data dir, removed afterwards.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from checkpoint_storage_bench.contract import (
    DATA_SUMMARY_ROUNDS,
    WORKSPACE_OPERATIONS,
    WORKSPACE_QUANTILES,
    workspace_output,
)
from data_workloads import dataset as ds
from data_workloads.stats import percentile

FILES_PER_DIR = 25


def notebook(rng: random.Random, size: int, round_: int) -> bytes:
    """A notebook-like JSON document of about ``size`` bytes (its cells change each round)."""
    cell = {"cell_type": "code", "execution_count": round_, "source": "", "outputs": []}
    body = json.dumps({"cells": [cell], "metadata": {"round": round_}, "nbformat": 4})
    filler = size - len(body)
    cell["source"] = rng.randbytes(max(0, filler) // 2 + 1).hex()[: max(0, filler)]
    return json.dumps({"cells": [cell], "metadata": {"round": round_}, "nbformat": 4}).encode()


def save(path: Path, data: bytes) -> None:
    """Jupyter's atomic save: a temporary file, fsynced, renamed over the notebook, and
    the directory fsynced so that the rename is durable too."""
    tmp = path.with_name(f".~{path.name}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    ds.fsync_dir(path.parent)


def list_tree(root: Path) -> int:
    """Walk the tree and stat every entry, as ``git status`` does; the entries seen."""
    seen = 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                entry.stat(follow_symlinks=False)
                seen += 1
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
    return seen


def run_workspace(cfg: Any, scratch: Path) -> dict[str, Any]:
    """Every round over a workspace made in ``scratch/home`` (a directory of its own: the
    listing counts every entry of it)."""
    rng = random.Random(cfg.seed)
    home = scratch / "home"
    paths = [
        home / f"project-{i // FILES_PER_DIR:03d}" / f"notebook-{i:05d}.ipynb"
        for i in range(cfg.files)
    ]
    latencies: dict[str, list[float]] = {op: [] for op in WORKSPACE_OPERATIONS}
    rounds: list[float] = []  # each round's p99 save latency, ms: the verdict's samples
    try:
        home.mkdir()
        for sub in sorted({p.parent for p in paths}):
            sub.mkdir()
        for round_ in range(cfg.rounds):
            saves = []
            for path in paths:
                data = notebook(rng, cfg.file_size, round_)
                start = time.monotonic()
                save(path, data)
                saves.append(time.monotonic() - start)
            latencies["save"] += saves
            rounds.append(1000 * (percentile(saves, 99) or 0.0))
            start = time.monotonic()
            seen = list_tree(home)
            latencies["list"].append(time.monotonic() - start)
            if seen != len(paths) + len({p.parent for p in paths}):
                raise ValueError(f"listed {seen} entries, expected {len(paths)} files and dirs")
            ds.drop_cache(paths)
            for path in paths:
                start = time.monotonic()
                with open(path, "rb", buffering=0) as f:
                    f.read()
                latencies["reopen"].append(time.monotonic() - start)
    except OSError as exc:
        raise ds.storage_error(exc, f"the workspace in {scratch}") from exc
    figures = {}
    for op, values in latencies.items():
        for name, q in WORKSPACE_QUANTILES.items():
            figures[workspace_output(op, name)] = 1000 * (percentile(values, q) or 0.0)
    counts = {op: len(v) for op, v in latencies.items()}
    return {"figures": figures, "operations": counts, DATA_SUMMARY_ROUNDS: rounds}
