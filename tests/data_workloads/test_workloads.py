"""Materialize (stage-timed cache build, real shards, fsynced) and workspace (notebook saves:
write, fsync, rename into place; list; reopen), both in a scratch dir removed afterwards."""

from __future__ import annotations

import io
import math
import tarfile
from pathlib import Path

import pytest
import torch

from checkpoint_storage_bench.contract import MATERIALIZE_OUTPUTS, WORKSPACE_OUTPUTS
from data_workloads import dataset as ds
from data_workloads import materialize, workspace
from data_workloads.config import MaterializeConfig, WorkspaceConfig


@pytest.mark.parametrize("fmt", ["webdataset", "files"])
def test_materialize_writes_every_record_transformed_and_times_each_stage(
    data_dir: Path, tmp_path: Path, fmt: str, monkeypatch
) -> None:
    cfg = MaterializeConfig(
        data_dir=data_dir,
        dataset_format=fmt,
        dataset_size="128KiB",
        record_size="4KiB",
        shard_size="32KiB",
        output_shard_size="16KiB",
        track=False,
    )
    cfg.check_data_dir()
    spec = ds.DatasetSpec(fmt, 0, cfg.dataset_size, cfg.record_size, cfg.shard_size)
    data = ds.open_dataset(data_dir, spec)
    out = tmp_path / "out"
    out.mkdir()
    fsynced: list[int] = []
    real_fsync = materialize.os.fsync
    monkeypatch.setattr(materialize.os, "fsync", lambda fd: (fsynced.append(fd), real_fsync(fd)))
    result = materialize.run_materialize(data, cfg, out)
    assert result["records"] == data.records
    shards = sorted(out.glob("shard-*.tar"))
    assert (
        len(shards) == result["shards"] > 1 and len(fsynced) == len(shards) + 1
    )  # + the directory
    figures = result["figures"]
    assert set(figures) == set(MATERIALIZE_OUTPUTS)
    assert figures["materialize_output_bytes"] == sum(p.stat().st_size for p in shards)
    assert all(figures[f"materialize_{s}_s"] > 0 for s in ("read", "transform", "write", "fsync"))
    staged = sum(figures[f"materialize_{s}_s"] for s in ("read", "transform", "write", "fsync"))
    assert staged <= figures["materialize_total_s"]
    # The cache holds each record normalized, float16: check one against its source.
    with tarfile.open(shards[0]) as tar:
        payload = tar.extractfile("00000000.f16").read()
    got = torch.frombuffer(bytearray(payload), dtype=torch.float16).view(3, spec.side, spec.side)
    image, _ = ds.decode(*ds.encode(spec, 0))
    want = (image.float() / 255 - materialize.MEAN) / materialize.STD
    assert torch.allclose(got.float(), want, atol=1e-2)


def test_workspace_saves_atomically_lists_and_reopens(tmp_path: Path, monkeypatch) -> None:
    cfg = WorkspaceConfig(data_dir=tmp_path, files=30, file_size="2KiB", rounds=2, track=False)
    scratch = tmp_path / "ws"
    scratch.mkdir()
    renames: list[tuple[str, str]] = []
    real_replace = workspace.os.replace
    monkeypatch.setattr(
        workspace.os,
        "replace",
        lambda a, b: (renames.append((Path(a).name, Path(b).name)), real_replace(a, b)),
    )
    result = workspace.run_workspace(cfg, scratch)
    assert result["operations"] == {"save": 60, "list": 2, "reopen": 60}
    assert len(result["rounds"]) == 2 and all(p99 > 0 for p99 in result["rounds"])
    assert len(renames) == 60 and all(a == f".~{b}" for a, b in renames)
    notebooks = sorted(scratch.rglob("*.ipynb"))
    assert len(notebooks) == 30 and not list(scratch.rglob(".~*"))
    assert all(abs(p.stat().st_size - 2048) < 200 for p in notebooks)
    figures = result["figures"]
    assert set(figures) == set(WORKSPACE_OUTPUTS)
    for op in ("save", "list", "reopen"):
        p50, p99, top = (figures[f"workspace_{op}_{q}_ms"] for q in ("p50", "p99", "max"))
        assert 0 < p50 <= p99 <= top and math.isfinite(top)


def test_notebook_is_json_of_the_given_size() -> None:
    import json
    import random

    doc = workspace.notebook(random.Random(0), 4096, 3)
    assert json.load(io.BytesIO(doc))["metadata"] == {"round": 3}
    assert abs(len(doc) - 4096) < 100
