"""Where uploads go: a re-uploaded step never leaves an old manifest beside a new state; a
target inside the checkpoint directory is refused before training."""

from __future__ import annotations

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from checkpoint_storage_bench.retry import Backoff
from tests.trainer.helpers import TINY_ARGS, quiet, run_trainer, tiny_config
from trainer.ckpt import store
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer
from trainer.ckpt.upload import Uploader
from trainer.errors import (
    EXIT_USAGE,
    ConfigError,
    UploadError,
)
from trainer.train import train


class StateFails(MemoryFileSystem):
    """Uploads of the state file fail; the manifest would go through."""

    protocol = "statefails"

    @classmethod
    def _strip_protocol(cls, path):
        # The same paths as memory:// (whose own method knows only that prefix).
        return super()._strip_protocol(str(path).replace("statefails://", "memory://", 1))

    def put_file(self, lpath, rpath, **kwargs):
        if rpath.endswith("state.ckpt"):
            raise ConnectionError("dropped")
        return super().put_file(lpath, rpath, **kwargs)


def test_a_reuploaded_step_never_leaves_the_old_manifest_beside_a_new_state(tmp_path):
    MemoryFileSystem.store.clear()
    fsspec.register_implementation("statefails", StateFails, clobber=True)
    ckpt = tmp_path / "step-00000006"
    ckpt.mkdir()
    (ckpt / "state.ckpt").write_bytes(b"old state")
    (ckpt / store.MANIFEST).write_text('{"old": true}')
    Uploader("memory://bucket/run").upload(ckpt, ["state.ckpt", store.MANIFEST])
    remote = fsspec.filesystem("memory")
    assert remote.exists("/bucket/run/step-00000006/MANIFEST.json")

    (ckpt / "state.ckpt").write_bytes(b"new state")
    with pytest.raises(UploadError):
        Uploader("statefails://bucket/run", backoff=Backoff(delays=(0,))).upload(
            ckpt, ["state.ckpt", store.MANIFEST]
        )
    # A remote copy without a manifest is incomplete; one with the old manifest would look
    # complete and fail its checksums.
    assert not remote.exists("/bucket/run/step-00000006/MANIFEST.json")


def test_upload_into_the_checkpoint_dir_is_refused_before_training(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (tmp_path / "link").symlink_to(ckpt)
    for target in (f"file://{ckpt}", f"file://{ckpt}/remote", str(tmp_path / "link" / "r")):
        proc = run_trainer(
            "--checkpoint-dir", str(ckpt), "--steps", "2", "--checkpoint-every", "2",
            *TINY_ARGS, "--no-track", "--upload-to", target,
        )  # fmt: skip
        assert proc.returncode == EXIT_USAGE, (target, proc.stderr)
        assert "inside the checkpoint dir" in proc.stderr and "Traceback" not in proc.stderr
        assert "step 1/" not in proc.stdout  # refused before any training step
        assert list(ckpt.iterdir()) == []


def test_upload_beside_the_checkpoint_dir_is_accepted(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with pytest.raises(ConfigError, match="inside the checkpoint dir"):
        Uploader(f"file://{ckpt}/../ckpt/x", checkpoint_dir=ckpt)
    Uploader(f"file://{tmp_path}/ckpt2", checkpoint_dir=ckpt)  # a name that merely starts alike
    Uploader(f"file://{tmp_path}", checkpoint_dir=ckpt)  # the parent: step-N lands beside ckpt
    Uploader(f"memory://{ckpt}", checkpoint_dir=ckpt)  # another file system entirely
    summary = train(
        tiny_config(ckpt, steps=2, checkpoint_every=2, upload_to=f"file://{tmp_path}/remote"),
        say=quiet,
    )
    assert summary.checkpoints and store.read_verified(
        LocalFS(), tmp_path / "remote" / "step-00000002", AlignedBuffer()
    )
