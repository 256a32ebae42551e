"""The trainer end to end: stage timeline, tracking record, retention, upload, bad input."""

from __future__ import annotations

import json
import math

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

from checkpoint_storage_bench.contract import PROVENANCE_KEYS, RUN_OUTPUTS, STAGE_OUTPUTS
from checkpoint_storage_bench.retry import Backoff
from checkpoint_storage_bench.units import significant
from tests.trainer.helpers import metric_events, offline_runs, run_trainer, tiny_config
from trainer.ckpt import store
from trainer.errors import UploadError
from trainer.train import train

FAST = Backoff(delays=(0.001, 0.001))
IMAGE_REF = "registry.example.com/ml/checkpoint-storage-bench@sha256:" + "ab" * 32


def test_stage_timeline_is_complete_and_adds_up(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    cfg = tiny_config(ckpt_dir, upload_to=f"file://{tmp_path / 'store'}")
    summary = train(cfg, say=lambda s: None)

    assert [r.step for r in summary.checkpoints] == [2, 4, 6]
    for r in summary.checkpoints:
        for stage in ("serialize_s", "write_s", "fsync_s", "upload_s", "pause_s", "total_s"):
            assert getattr(r, stage) > 0, stage
        parts = r.serialize_s + r.write_s + r.fsync_s + r.upload_s
        assert parts <= r.total_s
        # Sync mode: the loop is blocked for the whole save, and the stages cover it.
        # (pause also covers the device sync before staging: nothing to sync on a CPU)
        assert r.total_s <= r.pause_s < r.total_s + 0.01
        assert r.total_s - parts < 0.5 * r.total_s + 0.05
        assert r.bytes > 3 * 256 * 1024 * 0.5  # params + two AdamW moments
        assert r.write_gbps == pytest.approx(r.bytes / r.write_s / 1e9)
    data = summary.to_json()
    assert data["checkpoint_count"] == 3
    assert 0 < data["ckpt_pause_share"] < 1
    assert data["ckpt_pause_s_total"] == pytest.approx(sum(r.pause_s for r in summary.checkpoints))
    assert math.isfinite(data["final_loss"])
    assert set(data["stages"]) == {
        f"{s}_s" for s in ("serialize", "write", "fsync", "upload", "pause", "total")
    }


def test_the_run_object_resumes_steps_and_saves_as_train_does(tmp_path):
    from trainer import distributed
    from trainer.ckpt.fs import LocalFS
    from trainer.train import TrainingRun

    whole = train(tiny_config(tmp_path / "whole", steps=4, log_every=1), say=lambda s: None)
    cfg = tiny_config(tmp_path / "parts", steps=4, log_every=1)
    cfg.check_checkpoint_dir()
    ranks = distributed.join(cfg)
    saved = []
    run = TrainingRun(cfg, ranks, LocalFS(), lambda s: None, saved.append, lambda s, v: None)
    assert run.resume() == 0  # an empty directory: from the beginning
    run.prepare(None, FAST, 5.0)
    for step in (1, 2, 3):
        run.step(step)
        run.save_if_due(step)
    assert [r.step for r in saved] == [2]  # due at every --checkpoint-every step only
    run.step(4)
    run.save_if_due(4)
    run.finish()
    assert [r.step for r in saved] == [2, 4]
    assert run.curve == whole.loss_curve  # the same steps as train() takes

    # A second run object over the same directory continues after the newest checkpoint.
    again = tiny_config(tmp_path / "parts", steps=6, resume="always")
    resumed = TrainingRun(again, ranks, LocalFS(), lambda s: None, saved.append, lambda s, v: None)
    assert resumed.resume() == 4 and resumed.restore is not None
    assert resumed.restore.measured == "resume" and resumed.restore.step == 4


def test_loss_falls(tmp_path):
    cfg = tiny_config(tmp_path, steps=60, checkpoint_every=60, log_every=1, lr=3e-3, batch_size=8)
    curve = train(cfg, say=lambda s: None).loss_curve
    first = sum(v for _, v in curve[:5]) / 5
    last = sum(v for _, v in curve[-5:]) / 5
    assert last < first - 0.5, (first, last)


def test_cli_records_offline_polyaxon_run_and_summary(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    offline = tmp_path / "offline"
    summary_path = tmp_path / "out" / "summary.json"
    proc = run_trainer(
        "--checkpoint-dir", str(ckpt_dir), "--steps", "6", "--checkpoint-every", "2",
        "--model-size", "256KiB", "--batch-size", "2", "--seq-len", "16", "--device", "cpu",
        "--storage-profile", "checkpoint-baseline", "--summary-json", str(summary_path),
        "--log-every", "2", "--upload-to", "run-artifacts",
        env={"POLYAXON_OFFLINE_ROOT": str(offline), "CODE_REVISION": "abc123",
             "IMAGE_REF": IMAGE_REF, "NODE_NAME": "node-a"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "serialize" in proc.stdout and "checkpoint step 6" in proc.stdout
    assert "step 6/6 (100%)" in proc.stdout  # the last step always gets its progress line
    # 256KiB of parameters (3 layers: the model fits the size asked for) and AdamW moments.
    assert "upload step-00000006: 0.7/0.7 MB" in proc.stdout

    (run,) = offline_runs(offline)
    assert run["status"] == "succeeded"
    inputs = run["inputs"]
    assert inputs["storage_profile"] == "checkpoint-baseline"
    assert inputs["checkpoint_format"] == "raw"
    assert inputs["durability"] == "fsync"
    assert inputs["dataset_seed"] == 0
    assert inputs["model_size_bytes"] == 256 * 1024
    assert inputs["device"] == "cpu" and inputs["param_count"] > 10_000
    outputs = run["outputs"]
    for key in (
        "runtime_s",
        "steps_per_s",
        "final_loss",
        "ckpt_pause_s_median",
        "ckpt_write_s_median",
        "ckpt_fsync_s_median",
        "ckpt_serialize_s_median",
        "ckpt_pause_share",
        "checkpoint_bytes",
    ):
        assert isinstance(outputs[key], int | float), key  # fmt: skip
    assert inputs["image"] == IMAGE_REF and inputs["resume"] == "never"
    assert inputs["upload_to"] == "run-artifacts"
    meta = run["meta_info"]
    assert meta["code_revision"] == "abc123"
    assert meta["image_digest"] == IMAGE_REF.split("@")[1]  # the digest the reference pins
    assert meta["node_name"] == "node-a"
    assert meta["gpu_count"] == 0 and "gpu_model" not in meta  # None is not logged
    assert meta["torch_version"] == torch.__version__ and meta["cpu_count"] >= 1
    assert meta["progress"] == 1.0  # the run's progress bar in Polyaxon
    assert outputs["resumed_from_step"] == 0
    for key in (*RUN_OUTPUTS, *STAGE_OUTPUTS):
        if isinstance(outputs.get(key), float):
            assert outputs[key] == significant(outputs[key], 4), (key, outputs[key])
    # --upload-to run-artifacts: into the run's outputs, which Polyaxon syncs to its store.
    local = (ckpt_dir / "step-00000006" / "state.ckpt").read_bytes()
    assert (
        run["_dir"] / "outputs" / "checkpoints" / "step-00000006" / "state.ckpt"
    ).read_bytes() == local
    writes = metric_events(run["_dir"], "ckpt_write_s")
    assert [s for s, _ in writes] == [2, 4, 6]
    assert all(v > 0 for _, v in writes)
    assert [s for s, _ in metric_events(run["_dir"], "loss")] == [2, 4, 6]

    summary = json.loads(summary_path.read_text())
    assert summary["schema"] == "checkpoint-training/1"
    assert summary["polyaxon_run_uuid"] == run["uuid"]
    assert [c["step"] for c in summary["checkpoints"]] == [2, 4, 6]
    assert summary["ckpt_pause_s_total"] == pytest.approx(
        sum(c["pause_s"] for c in summary["checkpoints"])
    )
    assert list(summary["provenance"]) == list(PROVENANCE_KEYS)
    # The build is told once, under provenance, where the verdict reads it.
    assert "code_revision" not in summary and "image_digest" not in summary["inputs"]
    assert summary["provenance"]["node_name"] == "node-a"
    assert summary["provenance"]["image"] == IMAGE_REF
    assert summary["resumed_from_step"] is None


def test_retention_keeps_newest_and_uploads_all(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    train(
        tiny_config(ckpt_dir, steps=10, keep=2, upload_to=f"file://{tmp_path / 'store'}"),
        say=lambda s: None,
    )
    assert [p.name for p in sorted(ckpt_dir.iterdir())] == ["step-00000008", "step-00000010"]
    uploaded = sorted(p.name for p in (tmp_path / "store").iterdir())
    assert uploaded == [f"step-{s:08d}" for s in (2, 4, 6, 8, 10)]
    for name in uploaded:
        assert {p.name for p in (tmp_path / "store" / name).iterdir()} == {
            "state.ckpt",
            "MANIFEST.json",
        }


def test_upload_to_memory_filesystem(tmp_path):
    MemoryFileSystem.store.clear()
    train(tiny_config(tmp_path, steps=4, upload_to="memory://bucket/run1"), say=lambda s: None)
    fs = fsspec.filesystem("memory")
    local = (tmp_path / "step-00000004" / "state.ckpt").read_bytes()
    assert fs.cat_file("/bucket/run1/step-00000004/state.ckpt") == local


class FlakyFS(MemoryFileSystem):
    """A store whose uploads fail ``failures`` times before succeeding (or forever)."""

    protocol = "flaky"
    failures = 0
    calls = 0

    def put_file(self, lpath, rpath, **kwargs):
        FlakyFS.calls += 1
        if FlakyFS.failures != 0:
            FlakyFS.failures -= 1
            raise ConnectionError("store unavailable")
        return super().put_file(lpath, rpath, **kwargs)


@pytest.fixture
def flaky():
    fsspec.register_implementation("flaky", FlakyFS, clobber=True)
    FlakyFS.calls = 0
    MemoryFileSystem.store.clear()
    yield FlakyFS


def test_upload_retries_then_succeeds(tmp_path, flaky):
    flaky.failures = 2
    summary = train(
        tiny_config(tmp_path, steps=2, upload_to="flaky://b/r"),
        say=lambda s: None,
        upload_backoff=FAST,
    )
    assert summary.checkpoints[0].upload_s > 0
    assert flaky.calls == 4  # two failures, then state file and manifest


@pytest.mark.parametrize("asynchronous", [False, True])
def test_upload_failure_is_an_error_and_keeps_local_checkpoint(tmp_path, flaky, asynchronous):
    flaky.failures = -1  # forever
    cfg = tiny_config(tmp_path, steps=4, upload_to="flaky://b/r", async_checkpoint=asynchronous)
    with pytest.raises(UploadError, match="failed after 3 attempts"):
        train(cfg, say=lambda s: None, upload_backoff=FAST)
    (ref,) = store.list_checkpoints(tmp_path)
    assert ref.step == 2
    store.read_verified(store.LocalFS(), ref.path, store.AlignedBuffer())


def test_upload_failure_exit_code(tmp_path):
    proc = run_trainer(
        "--checkpoint-dir", str(tmp_path), "--steps", "2", "--checkpoint-every", "2",
        "--model-size", "256KiB", "--upload-to", "nosuchproto://x", "--no-track",
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--upload-to" in proc.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--steps", "0"], 2, "--steps must be positive"),
        (["--checkpoint-every", "-1"], 2, "--checkpoint-every must be positive"),
        (["--device", "tpu"], 2, "Invalid value for '--device'"),
        (["--model-size", "lots"], 2, "--model-size"),
        (["--format", "zip"], 2, "Invalid value for '--format'"),
    ],
)
def test_bad_arguments(tmp_path, args, code, message):
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    proc = run_trainer("--checkpoint-dir", str(ckpt_dir), "--no-track", *args)
    assert proc.returncode == code
    assert message in proc.stderr
    assert list(ckpt_dir.iterdir()) == []


def test_missing_and_non_directory_checkpoint_dir(tmp_path):
    proc = run_trainer("--checkpoint-dir", str(tmp_path / "unmounted" / "run"), "--no-track")
    assert proc.returncode == 3
    assert "is the claim mounted?" in proc.stderr
    assert not (tmp_path / "unmounted").exists()
    afile = tmp_path / "file"
    afile.write_text("x")
    proc = run_trainer("--checkpoint-dir", str(afile), "--no-track")
    assert proc.returncode == 3
    assert "not a directory" in proc.stderr


def test_run_directory_is_created_inside_the_mount(tmp_path):
    summary = train(tiny_config(tmp_path / "run-1", steps=2), say=lambda s: None)
    assert [r.step for r in summary.checkpoints] == [2]
    assert (tmp_path / "run-1" / "step-00000002").is_dir()


def test_cuda_requested_without_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = run_trainer("--checkpoint-dir", str(tmp_path), "--device", "cuda", "--no-track")
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr
