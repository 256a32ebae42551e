"""--resume never|auto|always, leftovers judged by owner, and progress people can watch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from tests.trainer.helpers import tiny_config
from trainer import cli
from trainer.ckpt import store
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.upload import Uploader
from trainer.errors import CheckpointDirError, ConfigError
from trainer.progress import StepProgress, duration
from trainer.train import train

RUN_A = "a" * 32
RUN_B = "b" * 32


def quiet(_: str) -> None:
    pass


def in_run(monkeypatch, uuid: str | None) -> None:
    """Be (or not be) a process of the Polyaxon run ``uuid``."""
    if uuid is None:
        monkeypatch.delenv("POLYAXON_RUN_INSTANCE", raising=False)
    else:
        monkeypatch.setenv("POLYAXON_RUN_INSTANCE", f"acme.checkpoint-storage.runs.{uuid}")


# ---- the option ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "mode"),
    [
        ([], "never"),
        (["--resume"], "always"),
        (["--resume", "--steps", "5"], "always"),
        (["--steps", "5", "--resume"], "always"),
        (["--resume", "auto"], "auto"),
        (["--resume=never"], "never"),
    ],
)
def test_bare_resume_means_always(tmp_path, args, mode):
    ctx = cli.main.make_context("trainer", ["--checkpoint-dir", str(tmp_path), *args])
    assert ctx.params["resume"] == mode


# ---- the modes -------------------------------------------------------------------------------


def test_auto_starts_fresh_in_an_empty_directory(tmp_path, monkeypatch):
    in_run(monkeypatch, RUN_A)
    summary = train(tiny_config(tmp_path, steps=4, resume="auto"), say=quiet)
    assert summary.resumed_from is None and [r.step for r in summary.checkpoints] == [2, 4]
    manifest = store.read_manifest(tmp_path / "step-00000004")
    assert manifest["run_id"] == RUN_A


def test_auto_continues_its_own_run(tmp_path, monkeypatch):
    in_run(monkeypatch, RUN_A)
    train(tiny_config(tmp_path, steps=4), say=quiet)
    said: list[str] = []
    summary = train(tiny_config(tmp_path, steps=6, resume="auto"), say=said.append)
    assert summary.resumed_from == 4
    assert summary.to_json()["resumed_from_step"] == 4
    assert summary.outputs()["resumed_from_step"] == 4


@pytest.mark.parametrize("me", [RUN_B, None], ids=["another-run", "outside-polyaxon"])
def test_auto_refuses_another_runs_checkpoints(tmp_path, monkeypatch, me):
    in_run(monkeypatch, RUN_A)
    train(tiny_config(tmp_path, steps=4), say=quiet)
    in_run(monkeypatch, me)
    with pytest.raises(CheckpointDirError, match="checkpoints of another run") as info:
        train(tiny_config(tmp_path, steps=6, resume="auto"), say=quiet)
    assert info.value.exit_code == 3
    assert "--resume always" in str(info.value)
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [4, 2]
    # Told to, it continues them.
    assert train(tiny_config(tmp_path, steps=6, resume="always"), say=quiet).resumed_from == 4


def test_never_refuses_any_checkpoints(tmp_path, monkeypatch):
    in_run(monkeypatch, RUN_A)
    train(tiny_config(tmp_path, steps=2), say=quiet)
    with pytest.raises(CheckpointDirError, match="--resume auto to continue"):
        train(tiny_config(tmp_path, steps=4), say=quiet)


def test_a_resumed_run_says_so_in_its_timeline(tmp_path):
    from trainer.summary import format_timeline

    train(tiny_config(tmp_path, steps=2), say=quiet)
    summary = train(tiny_config(tmp_path, steps=4, resume="always"), say=quiet)
    assert "resumed from step 2: the figures cover only the steps after it" in format_timeline(
        summary
    )


# ---- leftovers by owner ----------------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporary_names_carry_run_host_and_pid(monkeypatch):
    in_run(monkeypatch, RUN_A)
    monkeypatch.setenv("HOSTNAME", "train-pod-7x2k.ns")
    name = store.tmp_name(12)
    assert name == f".step-00000012.tmp-{RUN_A}-train-pod-7x2k-ns-{os.getpid()}"


def test_cleanup_removes_only_what_this_runs_predecessors_left(tmp_path):
    me = store.Owner(RUN_A, "pod-2", os.getpid())
    leftovers = {
        # this run, this pod: a restarted container gets the same pids again
        store.tmp_name(2, store.Owner(RUN_A, "pod-2", os.getpid())): "removed",
        store.tmp_name(3, store.Owner(RUN_A, "pod-2", dead_pid())): "removed",
        store.old_name(4, store.Owner(RUN_A, "pod-1", 1)): "removed",  # the pod before a retry
        store.tmp_name(5, store.Owner(RUN_A, "pod-2", os.getppid())): "left",  # alive here
        store.tmp_name(6, store.Owner(RUN_B, "pod-2", dead_pid())): "left",  # another run
        store.tmp_name(7, store.Owner(store.LOCAL_RUN, "pod-2", dead_pid())): "left",
        # no owner this trainer writes (run, host and pid): nothing says whose it is
        ".step-00000008.tmp-1234": "left",
        ".step-00000009.old-someone": "left",
    }
    for name in leftovers:
        (tmp_path / name).mkdir()
    (tmp_path / "step-00000001").mkdir()
    removed, left = store.remove_stale_tmp(LocalFS(), tmp_path, me)
    assert sorted(p.name for p in removed) == sorted(
        n for n, w in leftovers.items() if w == "removed"
    )
    assert sorted(p.name for p in left) == sorted(n for n, w in leftovers.items() if w == "left")
    assert (tmp_path / "step-00000001").is_dir()


def test_outside_polyaxon_only_this_hosts_dead_pids_are_removed(tmp_path):
    me = store.Owner(store.LOCAL_RUN, "laptop", os.getpid())
    (tmp_path / store.tmp_name(2, store.Owner(store.LOCAL_RUN, "laptop", dead_pid()))).mkdir()
    (tmp_path / store.tmp_name(3, store.Owner(store.LOCAL_RUN, "other", dead_pid()))).mkdir()
    removed, left = store.remove_stale_tmp(LocalFS(), tmp_path, me)
    assert [p.name[:14] for p in removed] == [".step-00000002"]
    assert [p.name[:14] for p in left] == [".step-00000003"]


# ---- progress --------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_step_progress_is_bounded_in_rate_and_ends_at_the_last_step():
    clock, lines, fractions = Clock(), [], []
    progress = StepProgress(100, 200, lines.append, fractions.append, every_s=5, clock=clock)
    for step in range(101, 201):
        clock.now += 0.5  # 2 steps/s
        progress.update(step, 2.5)
    assert len(lines) == 10  # one every 5 s of 50 s; the last step (at 50 s) is one of them
    assert lines[0] == "step 110/200 (55%) loss 2.5 2 steps/s ETA 45s"
    assert lines[-1].startswith("step 200/200 (100%)") and lines[-1].endswith("ETA 0s")
    assert fractions[0] == 0.55 and fractions[-1] == 1.0
    # The last step gets its line even between two intervals.
    progress.update(200, None)
    assert lines[-1].startswith("step 200/200 (100%) 2 steps/s")


def test_duration_reads_well():
    assert [duration(s) for s in (0, 59.4, 61, 3600, 86399)] == [
        "0s", "59s", "1m01s", "1h00m", "23h59m",
    ]  # fmt: skip


def test_train_reports_progress(tmp_path):
    lines: list[str] = []
    fractions: list[float] = []
    train(
        tiny_config(tmp_path, steps=4),
        say=lines.append,
        on_progress=fractions.append,
        progress_every_s=0,
    )
    assert [line.split(" (")[0] for line in lines if line.startswith("step ")] == [
        "step 1/4", "step 2/4", "step 3/4", "step 4/4",
    ]  # fmt: skip
    assert fractions == [0.25, 0.5, 0.75, 1.0]


def test_upload_says_bytes_done(tmp_path):
    MemoryFileSystem.store.clear()
    ckpt = tmp_path / "step-00000002"
    ckpt.mkdir()
    (ckpt / "state.ckpt").write_bytes(os.urandom(3 * 2**20))
    (ckpt / store.MANIFEST).write_text(json.dumps({"m": 1}))
    lines: list[str] = []
    uploader = Uploader("memory://bucket/run", say=lines.append, progress_every_s=0)
    uploader.fs.blocksize = 2**20  # memory:// reports once per block
    uploader.upload(ckpt, ["state.ckpt", store.MANIFEST])
    done = [float(line.split(": ")[1].split("/")[0]) for line in lines]
    assert done == sorted(done) and len(done) >= 4
    assert lines[-1] == "upload step-00000002: 3.1/3.1 MB"
    assert (
        fsspec.filesystem("memory").cat_file("/bucket/run/step-00000002/state.ckpt")
        == (ckpt / "state.ckpt").read_bytes()
    )


def test_run_artifacts_target_needs_a_tracked_run(tmp_path):
    with pytest.raises(ConfigError, match="only a tracked run"):
        train(tiny_config(tmp_path, steps=2, upload_to="run-artifacts"), say=quiet)


class FakeRun:
    """The two calls of a Polyaxon run that ``--upload-to run-artifacts[-store]`` makes."""

    run_uuid = RUN_A

    def __init__(self, store_path: str | None) -> None:
        self.store_path = store_path

    def get_artifacts_store_connection(self):
        return None if self.store_path is None else object()

    def get_outputs_path(self, rel_path, ensure_path, is_dir, use_store_path):
        base = self.store_path if use_store_path else "/plx-context/artifacts/outputs"
        return f"{base}/{RUN_A}/outputs/{rel_path}"


@pytest.mark.parametrize(
    ("target", "store_path", "expected"),
    [
        ("run-artifacts", None, f"/plx-context/artifacts/outputs/{RUN_A}/outputs/checkpoints"),
        ("run-artifacts-store", "s3://plx", f"s3://plx/{RUN_A}/outputs/checkpoints"),
        ("run-artifacts-store", None, None),
        ("s3://bucket/x", None, "s3://bucket/x"),
    ],
)
def test_run_artifacts_targets_resolve_to_the_runs_outputs(tmp_path, target, store_path, expected):
    from checkpoint_storage_bench.tracking import Tracker
    from trainer.commands import upload_url

    cfg = tiny_config(tmp_path, upload_to=target)
    tracker = Tracker(FakeRun(store_path))
    if expected is None:
        with pytest.raises(ConfigError, match="no artifacts store connection"):
            upload_url(cfg, tracker)
    else:
        assert upload_url(cfg, tracker) == expected
    if target.startswith("run-"):
        with pytest.raises(ConfigError, match="needs Polyaxon tracking"):
            upload_url(cfg, Tracker(None))


# ---- what a resumed run trains with ------------------------------------------------------------


def test_resume_in_another_format_is_refused_naming_both(tmp_path):
    train(tiny_config(tmp_path, steps=2), say=quiet)  # raw
    cfg = tiny_config(tmp_path, steps=4, format="torch", resume="always")
    with pytest.raises(ConfigError) as refused:
        train(cfg, say=quiet)
    assert refused.value.exit_code == 2
    assert "step-00000002 was written with --format raw, this run uses --format torch" in str(
        refused.value
    )
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [2]  # healthy, untouched


def test_resume_trains_at_the_new_lr_and_records_it(tmp_path):
    from trainer.ckpt.formats import make_format
    from trainer.ckpt.io import AlignedBuffer

    train(tiny_config(tmp_path, steps=2, lr=3e-4), say=quiet)
    said: list[str] = []
    train(tiny_config(tmp_path, steps=4, lr=1e-2, resume="always"), say=said.append)
    assert any("training at --lr 0.01; the checkpoint's optimizer had 0.0003" in s for s in said)
    _, data = store.read_verified(LocalFS(), tmp_path / store.final_name(4), AlignedBuffer())
    state = make_format("raw").load(data)
    # What the checkpoint says it trained with is what the optimizer used.
    assert state["config"]["lr"] == 1e-2
    assert {g["lr"] for g in state["optimizer"]["param_groups"]} == {1e-2}


def test_a_checkpoint_of_another_model_shape_is_refused_not_a_traceback(tmp_path, monkeypatch):
    import trainer.train
    from trainer.model import ModelShape

    train(tiny_config(tmp_path, steps=2), say=quiet)
    # The same settings building another shape (another trainer version).
    monkeypatch.setattr(trainer.train, "shape_for_bytes", lambda size, seq: ModelShape(32, 1, 1))
    with pytest.raises(ConfigError, match="step-00000002 holds a model of another shape") as no:
        train(tiny_config(tmp_path, steps=4, resume="always"), say=quiet)
    assert no.value.exit_code == 2
