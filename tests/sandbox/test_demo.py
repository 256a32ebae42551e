"""The README's main-job command, for real: ``python -m sandbox demo`` runs the bundle's
pipeline (storage-profile hook with the local backend, fio sweep, trainer, compare) on a
fresh sandbox with tiny sizes, twice (re-running must work), then ``stop`` leaves nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandbox.components import api_client
from sandbox.config import DEFAULT_OWNER, REPO_ROOT
from sandbox.orchestration import DEFAULT_PIPELINE
from sandbox.pipeline import get_run, list_runs, pipeline_ops
from sandbox.server import free_port

from .conftest import shm_dir, wait_gone, write_profiles

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(
        not DEFAULT_PIPELINE.exists() or not (REPO_ROOT / "components").is_dir(),
        reason="the bundle's pipeline and components are not in this checkout",
    ),
]

ORDER = ["switch-baseline", "fio-baseline", "train-baseline", "switch-throughput",
         "fio-throughput", "train-throughput", "compare"]  # fmt: skip
TINY = ["-P", "steps=4", "-P", "checkpoint_every=2", "-P", "model_size=1MiB",
        "-P", "size_scale=0.01", "-P", "fio_runtime=1"]  # fmt: skip


def _sandbox(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sandbox", *args], cwd=REPO_ROOT, capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _untracked_repo_files() -> set[str]:
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    return set(out.stdout.splitlines()) if out.returncode == 0 else set()


def test_demo_runs_the_pipeline_twice_and_stop_leaves_nothing():
    root = Path(tempfile.mkdtemp(prefix="sandbox-demo-"))
    shm = shm_dir(root)
    profiles = write_profiles(root, shm / "media")
    port = free_port()
    common = ["--root", str(root), "--port", str(port), "--profiles-file", str(profiles)]
    repo_files_before = _untracked_repo_files()
    try:
        for attempt in (1, 2):
            done = _sandbox(["demo", *common, "--project", "demo", *TINY])
            out = done.stdout + done.stderr
            assert done.returncode == 0, f"demo run {attempt} failed:\n{out[-4000:]}"
            assert "runs table: http://127.0.0.1:" in out
            assert f"-m sandbox stop --root {root}" in out
            assert "ERROR" not in out, out
        # Runs work in their own directories: nothing lands in the repository.
        assert _untracked_repo_files() == repo_files_before
        client = api_client(f"http://127.0.0.1:{port}")
        pipelines = list_runs(client, DEFAULT_OWNER, "demo", query="kind:dag")
        assert len(pipelines) == 2 and all(p.status == "succeeded" for p in pipelines)
        ops = {
            op.name: get_run(client, DEFAULT_OWNER, "demo", op.uuid)
            for op in pipeline_ops(client, DEFAULT_OWNER, "demo", pipelines[0].uuid)
        }
        ran = sorted((op for op in ops.values() if op.status != "skipped"),
                     key=lambda op: op.started_at)  # fmt: skip
        assert [op.name for op in ran] == ORDER
        assert all(op.status == "succeeded" for op in ran)
        for before, after in zip(ran, ran[1:], strict=False):
            assert before.finished_at <= after.started_at
        for profile in ("baseline", "throughput"):
            train = ops[f"train-{profile}"]
            assert train.inputs["storage_profile"] == f"checkpoint-{profile}"
            for stage in ("serialize", "write", "fsync", "pause"):
                assert train.outputs[f"ckpt_{stage}_s_median"] >= 0
            assert train.outputs["ckpt_pause_s_total"] > 0
            fio = ops[f"fio-{profile}"].outputs
            assert any(k.endswith("_bw_mbps") and v for k, v in fio.items())
        # The two profiles really were different media: baseline on disk, throughput on shm.
        assert (
            ops["train-baseline"]
            .inputs["checkpoint_dir"]
            .startswith(str(root / ".sandbox/claims/training-checkpoints"))
        )
        assert any((shm / "media").rglob("*")), "nothing was written on the tmpfs medium"
        assert any((root / ".sandbox/media/disk").rglob("*")), "nothing on the disk medium"
        # The server stays up after the demo until stopped.
        assert _sandbox(["status", *common]).returncode == 0
    finally:
        stop = _sandbox(["stop", *common], timeout=120)
        left = wait_gone(root)
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    assert "stopped agent" in stop.stdout and "server" in stop.stdout, stop.stdout + stop.stderr
    assert not left, f"processes left behind: {[p.info['cmdline'] for p in left]}"
