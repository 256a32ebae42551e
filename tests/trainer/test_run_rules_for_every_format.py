"""The trainer's run rules hold for every way a checkpoint is written.

A state striped over ``--io-streams`` files, and the dcp and safetensors libraries writing
files of their own, must keep the rules of one file: retention counts only good
checkpoints (and deletes nothing without durability), every temporary name carries its
owner (run, pod, pid), and the manifest says whose checkpoint it is (``run_id``) beside how
it was checksummed (``checksum``, ``layout``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.trainer.helpers import flip_byte, tiny_config, verifies
from trainer.ckpt import store
from trainer.ckpt.fs import LocalFS
from trainer.train import train

RUN = "c" * 32
HOST = "train-pod-3"

# (format, io_streams): one file, a stripe over several, and the two libraries, one of them
# with several writer threads (dcp) or shards (safetensors).
CASES = [
    ("raw", 1),
    ("raw", 3),
    ("torch", 2),
    ("dcp", 1),
    ("dcp", 2),
    ("safetensors", 2),
]
LIBRARY = {"dcp", "safetensors"}


def quiet(_: str) -> None:
    pass


def in_run(monkeypatch) -> None:
    monkeypatch.setenv("POLYAXON_RUN_INSTANCE", f"acme.checkpoint-storage.runs.{RUN}")
    monkeypatch.setenv("HOSTNAME", HOST)


def data_files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.iterdir() if p.is_file() and p.name != store.MANIFEST)


def damage(checkpoint: Path) -> None:
    """Flip one byte in the middle of the checkpoint's largest state file."""
    flip_byte(max(data_files(checkpoint), key=lambda p: p.stat().st_size))


class Recording(LocalFS):
    """Records every directory the writer creates and every rename target."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def mkdir(self, path: Path) -> None:
        self.names.append(path.name)
        super().mkdir(path)

    def rename(self, src: Path, dst: Path) -> None:
        self.names.append(dst.name)
        super().rename(src, dst)


@pytest.mark.parametrize(("fmt", "streams"), CASES)
def test_retention_counts_only_good_checkpoints(tmp_path, fmt, streams):
    settings = {"format": fmt, "io_streams": streams, "keep": 2}
    train(tiny_config(tmp_path, steps=20, checkpoint_every=10, **settings), say=quiet)
    newest = tmp_path / "step-00000020"
    manifest = store.read_manifest(newest)
    # The case is what it says: a stripe has one file per stream, a library its own files.
    assert [f["name"] for f in manifest["files"]] == [p.name for p in data_files(newest)]
    if fmt == "raw":
        assert len(manifest["files"]) == streams
    damage(newest)
    said: list[str] = []
    cfg = tiny_config(tmp_path, steps=30, checkpoint_every=15, resume="always", **settings)
    assert train(cfg, say=said.append).resumed_from == 10
    assert any("skipping step-00000020" in line for line in said), said
    good = [r.step for r in store.list_checkpoints(tmp_path) if verifies(r.path)]
    # The two newest good ones are kept; the corrupt 20 pushed neither out.
    assert good == [30, 15]


@pytest.mark.parametrize(("fmt", "streams"), CASES)
def test_durability_none_deletes_nothing(tmp_path, fmt, streams):
    cfg = tiny_config(tmp_path, steps=6, keep=1, durability="none", format=fmt, io_streams=streams)
    train(cfg, say=quiet)
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [6, 4, 2]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("fmt", "streams"), CASES)
def test_every_temporary_name_carries_the_owner(tmp_path, monkeypatch, fmt, streams, asynchronous):
    in_run(monkeypatch)
    settings = {"format": fmt, "io_streams": streams, "async_checkpoint": asynchronous}
    train(tiny_config(tmp_path, steps=4, **settings), fs=Recording(), say=quiet)
    damage(tmp_path / "step-00000004")
    fs = Recording()
    # Resumes from 2 and saves step 4 again: the corrupt copy is moved aside (.old) first.
    train(tiny_config(tmp_path, steps=4, resume="always", **settings), fs=fs, say=quiet)
    hidden = [n for n in fs.names if n.startswith(".step-")]
    token = re.escape(f"{RUN}-{HOST}-{os.getpid()}")
    assert ".step-00000004.tmp-" + f"{RUN}-{HOST}-{os.getpid()}" in hidden
    assert any(".old-" in n for n in hidden), hidden
    assert all(re.fullmatch(rf"\.step-\d{{8}}\.(?:tmp|old)-{token}", n) for n in hidden), hidden
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".step-")]
    assert verifies(tmp_path / "step-00000004")


@pytest.mark.parametrize(("fmt", "streams"), CASES)
def test_manifest_says_whose_and_how_checksummed(tmp_path, monkeypatch, fmt, streams):
    in_run(monkeypatch)
    train(tiny_config(tmp_path, steps=4, format=fmt, io_streams=streams), say=quiet)
    manifest = store.read_manifest(tmp_path / "step-00000004")
    assert manifest["run_id"] == RUN
    assert manifest["checksum"] == "crc32"
    assert manifest["layout"] == ("files" if fmt in LIBRARY else "striped")
    assert all(isinstance(f["crc32"], list) for f in manifest["files"])
    # --resume auto continues this run's own checkpoints, by that run_id.
    cfg = tiny_config(tmp_path, steps=6, resume="auto", format=fmt, io_streams=streams)
    assert train(cfg, say=quiet).resumed_from == 4
