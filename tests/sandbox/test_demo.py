"""The README's main-job command, for real: ``python -m sandbox demo`` runs the bundle's
pipeline (storage-profile hook with the local backend, fio sweep, trainer, compare).

- With the default profiles and the default demo sizes it emulates the classes of
  connections/vac-ebs-gp3.yaml: the fio write bandwidth of each profile lands within 15% of
  its class's throughput, the checkpoint pause differs as the classes predict, and the
  verdict names the faster profile; ``stop`` removes the claim's cgroup. Needs root and a
  block-I/O controller (skips with one line elsewhere, never under CI).
- With two plain media and tiny sizes it runs anywhere, twice (re-running must work).

Either way ``stop`` leaves nothing running.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from checkpoint_storage_bench.contract import SANDBOX_PROFILES_FILE, load_sandbox_profiles
from sandbox.components import api_client
from sandbox.config import DEFAULT_OWNER, REPO_ROOT
from sandbox.orchestration import DEFAULT_PIPELINE
from sandbox.pipeline import get_run, list_runs, pipeline_ops
from sandbox.server import free_port

from .conftest import needs_throttle, shm_dir, wait_gone, write_profiles

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


@pytest.mark.timeout(1800)
def test_the_demo_emulates_the_classes_and_the_verdict_names_the_faster_one():
    root = Path(tempfile.mkdtemp(prefix="sandbox-demo-"))
    port = free_port()
    profiles = load_sandbox_profiles(REPO_ROOT / SANDBOX_PROFILES_FILE, root)
    group, _ = needs_throttle(root, profiles.cgroup_name)
    classes = {name: p.limits for name, p in profiles.profiles.items()}
    common = ["--root", str(root), "--port", str(port)]  # the default profiles file
    try:
        done = _sandbox(["demo", *common, "--project", "demo"], timeout=1700)
        out = done.stdout + done.stderr
        print(out[-6000:])
        assert done.returncode == 0, f"demo failed:\n{out[-4000:]}"
        assert "NOT AN EMULATION" not in out
        assert "profile checkpoint-baseline emulates checkpoint-baseline (125 MiB/s" in out
        client = api_client(f"http://127.0.0.1:{port}")
        (pipeline,) = list_runs(client, DEFAULT_OWNER, "demo", query="kind:dag")
        ops = {
            op.name: get_run(client, DEFAULT_OWNER, "demo", op.uuid)
            for op in pipeline_ops(client, DEFAULT_OWNER, "demo", pipeline.uuid)
        }
        pause, write = {}, {}
        for profile, limits in classes.items():
            short = profile.removeprefix("checkpoint-")
            switch = ops[f"switch-{short}"]
            assert switch.inputs["driver"] == "local-throttled"
            assert switch.inputs["vac_throughput"] == str(limits.write_bps // (1024 * 1024))
            fio = ops[f"fio-{short}"].outputs["fio_seqwrite_1m_bw_mbps"]
            expected = limits.write_bps / 1e6
            print(f"{profile}: fio seqwrite {fio:.1f} MB/s, class {expected:.1f} MB/s")
            assert abs(fio - expected) <= 0.15 * expected, (profile, fio, expected)
            train = ops[f"train-{short}"].outputs
            pause[profile] = train["ckpt_pause_s_median"]
            write[profile] = train["ckpt_write_s_median"]
            print(f"{profile}: pause median {pause[profile]:.3f}s, write {write[profile]:.3f}s")
        # Twice the throughput: the write stage (O_DIRECT writes, and the CRCs computed on
        # the way, which a loaded CPU slows down) takes about half as long, and the pause
        # (serialize + write + fsync) is shorter.
        ratio = write["checkpoint-baseline"] / write["checkpoint-throughput"]
        assert 1.6 <= ratio <= 2.4, ratio
        assert pause["checkpoint-baseline"] > pause["checkpoint-throughput"], pause
        verdict = ops["compare"].outputs
        print(f"verdict: {verdict.get('verdict')} ({verdict.get('verdict_outcome')}): "
              f"{verdict.get('verdict_reason')}")  # fmt: skip
        assert verdict["candidate_profile"] == "checkpoint-throughput"
        assert verdict["pause_speedup"] > 1 and verdict["verdict_outcome"] != "worse"
        if verdict["verdict_outcome"] == "better":  # measurably faster: named
            assert verdict["verdict"] == "checkpoint-throughput"
    finally:
        stop = _sandbox(["stop", *common], timeout=120)
        left = wait_gone(root)
        gone = not group.exists()
        if not gone:
            group.remove()
        shutil.rmtree(root, ignore_errors=True)
    assert f"claim cgroup {group.path}" in stop.stdout, stop.stdout + stop.stderr
    assert gone, f"stop left the claim's cgroup {group.path}"
    assert not left, f"processes left behind: {[p.info['cmdline'] for p in left]}"


def test_demo_on_plain_media_runs_the_pipeline_twice_and_stop_leaves_nothing():
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
