"""Many ranks, one checkpoint: the trainer under torchrun (2 CPU ranks, gloo), for real.

The slow tests start ``python -m torch.distributed.run --standalone --nproc-per-node 2 -m
trainer ...`` as a subprocess; the others check the pieces in this process.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from checkpoint_storage_bench import contract
from tests.trainer.helpers import (
    REPO,
    flip_byte,
    metric_events,
    offline_runs,
    run_trainer,
    tiny_config,
)
from trainer import distributed
from trainer.ckpt import checkpointer, sharded, store
from trainer.ckpt.checkpointer import CheckpointRecord
from trainer.ckpt.formats import RawFormat, WriteOptions, flatten, make_format
from trainer.ckpt.fs import LocalFS
from trainer.ckpt.io import AlignedBuffer, write_file
from trainer.ckpt.lock import LOCK_NAME
from trainer.config import PARALLEL, TrainConfig
from trainer.errors import (
    CheckpointCorruptError,
    ConfigError,
    RankFailedError,
    StorageFullError,
    TrainerError,
    WorldSizeError,
)
from trainer.summary import RunSummary
from trainer.train import train

ARGS = [
    "--steps", "6", "--checkpoint-every", "2", "--keep", "10", "--model-size", "256KiB",
    "--batch-size", "2", "--seq-len", "16", "--device", "cpu", "--log-every", "1",
]  # fmt: skip


@pytest.fixture(autouse=True)
def torchrun_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's agent makes a log directory under TMPDIR for every run and never removes
    it: the test's own directory takes them."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))


def torchrun_cmd(*args: str | Path, nproc: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), "-m", "trainer", *map(str, args),
    ]  # fmt: skip


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **(extra or {})}


def torchrun(
    *args: str | Path, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        torchrun_cmd(*args),
        capture_output=True,
        text=True,
        env=_env(env),
        timeout=timeout,
        cwd=REPO,
    )


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


def rank_exit_codes(text: str) -> dict[int, int]:
    """Every failed rank's exit code in torchrun's failure report (a signal: minus its number)."""
    found = re.findall(r"rank\s+: (\d+) \(local_rank: \d+\)\n\s+exitcode\s+: (-?\d+)", text)
    return {int(rank): int(code) for rank, code in found}


def hidden(directory: Path) -> list[str]:
    """The hidden entries a checkpoint left (in progress, replaced); not the trainers' lock
    file, which a rank killed by torchrun's SIGTERM leaves unlocked for the next to take."""
    return sorted(
        p.name for p in directory.iterdir() if p.name.startswith(".") and p.name != LOCK_NAME
    )


def shard_tensors(step_dir: Path) -> list[list[torch.Tensor]]:
    """Every shard's tensors, verified against the manifest, in rank order."""
    manifest = store.read_manifest(step_dir)
    out = []
    for entry in sorted(manifest["files"], key=lambda e: e["rank"]):
        data = store.verify_file(LocalFS(), step_dir, entry, "crc32", AlignedBuffer())
        out.append([t.clone() for t in RawFormat().load(data)["tensors"]])
    return out


@dataclass
class Reference:
    """An uninterrupted 2-rank run: its checkpoint dir, summary and offline Polyaxon root."""

    ckpt: Path
    summary: dict[str, Any]
    offline: Path
    output: str


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of a mode, started once per module (torchrun is slow to start)."""
    cache: dict[str, Reference] = {}

    def get(mode: str) -> Reference:
        if mode not in cache:
            base = tmp_path_factory.mktemp(f"reference-{mode}")
            ckpt, offline, summary = base / "ckpt", base / "offline", base / "summary.json"
            track = (
                ["--storage-profile", "checkpoint-baseline"] if mode == "ddp" else ["--no-track"]
            )
            proc = torchrun(
                "--checkpoint-dir", ckpt, *ARGS, "--parallel", mode, "--summary-json", summary,
                *track, env={"POLYAXON_OFFLINE_ROOT": str(offline)},
            )  # fmt: skip
            assert proc.returncode == 0, _output(proc)[-4000:]
            cache[mode] = Reference(ckpt, json.loads(summary.read_text()), offline, _output(proc))
        return cache[mode]

    return get


# ------------------------------------------------------------------ end to end (slow)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_sharded_save_commit_and_resume_continue_the_same_loss_curve(reference, tmp_path, mode):
    ref = reference(mode)

    # What was written: one shard per rank and one global manifest per checkpoint.
    assert [r.step for r in store.list_checkpoints(ref.ckpt)] == [6, 4, 2]
    assert hidden(ref.ckpt) == []
    for step in (2, 4, 6):
        step_dir = ref.ckpt / store.final_name(step)
        manifest = store.read_manifest(step_dir)
        assert (manifest["layout"], manifest["world_size"], manifest["parallel"]) == (
            "sharded",
            2,
            mode,
        )
        assert [(e["rank"], e["name"]) for e in manifest["files"]] == [
            (0, "shard-00000-of-00002.ckpt"),
            (1, "shard-00001-of-00002.ckpt"),
        ]
        assert sorted(p.name for p in step_dir.iterdir()) == [
            store.MANIFEST,
            "shard-00000-of-00002.ckpt",
            "shard-00001-of-00002.ckpt",
        ]
        for entry in manifest["files"]:
            assert (step_dir / entry["name"]).stat().st_size == entry["bytes"]
            assert entry["crc32"] and entry["chunk_bytes"] > 0

    # Per-rank stages and the whole: no rank wrote it all.
    summary = ref.summary
    assert summary["world_size"] == 2
    assert [c["step"] for c in summary["checkpoints"]] == [2, 4, 6]
    for c in summary["checkpoints"]:
        assert set(contract.DISTRIBUTED_CHECKPOINT_KEYS) <= set(c)
        assert [r["rank"] for r in c["ranks"]] == [0, 1]
        assert all(set(r) == set(contract.RANK_STAGE_KEYS) for r in c["ranks"])
        assert c["bytes"] == sum(r["bytes"] for r in c["ranks"])
        assert all(r["bytes"] < 0.75 * c["bytes"] for r in c["ranks"]), c["ranks"]
        assert c["slowest_pause_s"] == c["pause_s"] == max(r["pause_s"] for r in c["ranks"])
        assert c["write_s"] == max(r["write_s"] for r in c["ranks"])
        assert c["aggregate_gbps"] > 0 and c["commit_s"] > 0
        # all bytes over (first write → commit) cannot beat the bytes over the write span
        assert c["aggregate_gbps"] <= c["write_gbps"]
        assert all(r["pause_s"] > r["write_s"] + r["fsync_s"] for r in c["ranks"])

    # As if the job had died after step 2: a fresh directory with only that checkpoint.
    work = tmp_path / "ckpt"
    shutil.copytree(ref.ckpt / "step-00000002", work / "step-00000002")
    out = tmp_path / "resumed.json"
    proc = torchrun(
        "--checkpoint-dir", work, *ARGS, "--parallel", mode, "--resume", "--no-track",
        "--summary-json", out,
    )  # fmt: skip
    assert proc.returncode == 0, _output(proc)[-4000:]
    assert "resume: continuing from step-00000002 (step 2), 2 shards verified" in proc.stdout
    resumed = json.loads(out.read_text())
    assert resumed["resumed_from_step"] == 2
    assert resumed["loss_curve"] == summary["loss_curve"][2:]
    # The resumed run's state after step 6 is the uninterrupted run's, tensor for tensor.
    for mine, theirs in zip(
        shard_tensors(work / "step-00000006"),
        shard_tensors(ref.ckpt / "step-00000006"),
        strict=True,
    ):
        assert len(mine) == len(theirs)
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))

    if mode == "ddp":
        # Only rank 0 tracks: one Polyaxon run, with the job's figures.
        (run,) = offline_runs(ref.offline)
        assert run["status"] == "succeeded"
        assert run["inputs"]["world_size"] == 2 and run["inputs"]["parallel"] == "ddp"
        outputs = run["outputs"]
        assert outputs["world_size"] == 2
        assert outputs["ckpt_aggregate_gbps_median"] > 0
        assert outputs["ckpt_slowest_pause_s_median"] > 0
        events = metric_events(run["_dir"], "ckpt_aggregate_gbps")
        assert [s for s, _ in events] == [2, 4, 6]
        assert [s for s, _ in metric_events(run["_dir"], "ckpt_slowest_pause_s")] == [2, 4, 6]


# Every format and writer mode under torchrun, through the one checkpointer: (format,
# mode, options, the files one rank writes). Each case is two short jobs, so the matrix
# pairs the modes with the formats instead of multiplying them.
FORMAT_CASES = [
    ("raw", "ddp", ["--io-streams", "2", "--restore-check"], ["ckpt.00-of-02", "ckpt.01-of-02"]),
    ("torch", "fsdp", ["--async", "--no-overlap"], ["pt"]),
    ("safetensors", "ddp", ["--io-streams", "2", "--async"], ["safetensors.00-of-02", "safetensors.01-of-02"]),
    ("dcp", "fsdp", ["--restore-check"], None),
    ("dcp", "ddp", ["--async", "--io-streams", "2"], None),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fmt", "mode", "options", "suffixes"),
    FORMAT_CASES,
    ids=[
        f"{c[0]}-{c[1]}-{'-'.join(o.strip('-') for o in c[2] if o.startswith('--'))}"
        for c in FORMAT_CASES
    ],
)
def test_every_format_saves_commits_and_resumes_under_torchrun(
    reference, tmp_path, fmt, mode, options, suffixes
):
    ref = reference(mode)
    ckpt, summary = tmp_path / "ckpt", tmp_path / "summary.json"
    common = ["--format", fmt, "--parallel", mode, "--no-track", *options]
    proc = torchrun("--checkpoint-dir", ckpt, *ARGS, *common, "--summary-json", summary)
    assert proc.returncode == 0, _output(proc)[-4000:]
    data = json.loads(summary.read_text())
    # Training is the format's business not at all: the same loss as the raw reference.
    assert data["loss_curve"] == ref.summary["loss_curve"]
    assert [c["step"] for c in data["checkpoints"]] == [2, 4, 6]
    for c in data["checkpoints"]:
        assert c["world_size"] == 2 and [r["rank"] for r in c["ranks"]] == [0, 1]
        assert c["pause_s"] <= c["total_s"] and c["slowest_pause_s"] == c["pause_s"]
    assert hidden(ckpt) == []
    manifest = store.read_manifest(ckpt / store.final_name(6))
    assert (manifest["format"], manifest["layout"], manifest["world_size"]) == (fmt, "sharded", 2)
    names = {(e["rank"], e["name"]) for e in manifest["files"]}
    if suffixes is not None:  # every rank its own shard files, striped over the streams
        assert names == {
            (r, f"shard-{r:05d}-of-00002.{suffix}") for r in (0, 1) for suffix in suffixes
        }
    else:  # DCP's own sharded save: each rank its __<rank>_*.distcp, rank 0 the metadata
        assert (0, ".metadata") in names
        assert all(n.startswith(f"__{r}_") for r, n in names if n != ".metadata")
        assert {r for r, _ in names} == {0, 1}
    if "--restore-check" in options:
        assert data["restore_measured"] == "end" and data["restore_bytes"] > 0

    # As if the job had died after step 2: resumed, it ends where the reference ended.
    work = tmp_path / "resumed"
    shutil.copytree(ckpt / "step-00000002", work / "step-00000002")
    out = tmp_path / "resumed.json"
    proc = torchrun("--checkpoint-dir", work, *ARGS, *common, "--resume", "--summary-json", out)
    assert proc.returncode == 0, _output(proc)[-4000:]
    assert "resume: continuing from step-00000002 (step 2)" in proc.stdout
    resumed = json.loads(out.read_text())
    assert resumed["resumed_from_step"] == 2 and resumed["restore_measured"] in ("resume", "end")
    assert resumed["loss_curve"] == ref.summary["loss_curve"][2:]


def _kill_rank_in_write(proc: subprocess.Popen, ckpt: Path, step: int, rank: int) -> None:
    """Wait until ``rank``'s shard of ``step`` is being written (the fault seam holds it
    there), then SIGKILL that rank's process."""
    shard = f"shard-{rank:05d}-of-00002.ckpt"
    _kill_rank_when(
        proc, rank, lambda: any((p / shard).exists() for p in ckpt.glob(f".step-{step:08d}.tmp-*"))
    )


def _kill_rank_when(proc: subprocess.Popen, rank: int, ready: Callable[[], bool]) -> None:
    """Wait until ``ready()`` (the rank is held inside its write), then SIGKILL that rank."""
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None:
        if ready():
            break
        time.sleep(0.05)
    else:
        pytest.fail("never saw the shard being written")
    victims = [
        p for p in psutil.Process(proc.pid).children(recursive=True)
        if p.environ().get("RANK") == str(rank)
    ]  # fmt: skip
    assert len(victims) == 1, victims
    victims[0].send_signal(signal.SIGKILL)


@pytest.mark.slow
def test_rank_killed_mid_write_commits_nothing_and_resume_takes_the_previous(reference, tmp_path):
    ref = reference("ddp")
    ckpt = tmp_path / "ckpt"
    log = tmp_path / "killed.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            torchrun_cmd("--checkpoint-dir", ckpt, *ARGS, "--parallel", "ddp", "--no-track"),
            env=_env({checkpointer.FAULT_ENV: "1:4:pause=120"}),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        try:
            _kill_rank_in_write(proc, ckpt, step=4, rank=1)
            assert proc.wait(timeout=90) != 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    # The checkpoint being written is not published; the previous one is untouched.
    assert [r.step for r in store.list_checkpoints(ckpt)] == [2]
    assert "exitcode  : -9" in text  # torchrun names the killed rank
    # Rank 0 learns it from the broken gather, unless torchrun's SIGTERM is faster.
    assert "step-00000004 was not committed" in text or "exitcode  : -15" in text, text[-3000:]

    out = tmp_path / "resumed.json"
    resumed = torchrun(
        "--checkpoint-dir", ckpt, *ARGS, "--parallel", "ddp", "--resume", "--no-track",
        "--summary-json", out,
    )  # fmt: skip
    assert resumed.returncode == 0, _output(resumed)[-4000:]
    data = json.loads(out.read_text())
    assert data["resumed_from_step"] == 2
    assert data["loss_curve"] == ref.summary["loss_curve"][2:]
    assert [r.step for r in store.list_checkpoints(ckpt)] == [6, 4, 2]
    assert hidden(ckpt) == []  # whatever the killed job left is gone


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [[], ["--format", "torch", "--io-streams", "2", "--async"]],
    ids=["raw-sync", "torch-streams-async"],
)
def test_rank_write_error_commits_nothing_and_every_rank_is_told(tmp_path, options):
    ckpt = tmp_path / "ckpt"
    proc = torchrun(
        "--checkpoint-dir", ckpt, *ARGS, "--parallel", "fsdp", "--no-track", *options,
        env={checkpointer.FAULT_ENV: "1:4:eio"},
    )  # fmt: skip
    text = _output(proc)
    assert proc.returncode != 0
    assert [r.step for r in store.list_checkpoints(ckpt)] == [2]
    assert hidden(ckpt) == []  # rank 0 removed it before telling anyone
    # Rank 0 (told by the gather) says which rank failed and why, and waits.
    assert_rank_1_failed_and_is_the_root_cause(text)


def assert_rank_1_failed_and_is_the_root_cause(text: str) -> None:
    """Rank 0 says rank 1's injected error kept step 4 from being committed, and torchrun
    names rank 1, with its own exit code 1, as the root cause."""
    assert (
        "rank 0: checkpoint step-00000004 was not committed: rank 1: OSError: [Errno 5] I/O "
        "error injected" in text
    ), text[-3000:]
    root = text[text.index("Root Cause") :]
    assert "rank      : 1" in root and "exitcode  : 1" in root, root


DCP_ASYNC = ["--format", "dcp", "--async", "--parallel", "ddp", "--no-track"]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["eio", checkpointer.START_EIO], ids=["in-write", "at-start"])
def test_rank_failing_in_an_async_dcp_save_fails_fast_and_is_the_root_cause(tmp_path, fault):
    # DCP tells every rank of a failed save alike; only the rank that failed may exit with
    # its own code. A rank that fails before its save joins the others' (DCP's plan) to
    # fail it. No rank waits for --checkpoint-timeout (600 s here) to learn it.
    ckpt = tmp_path / "ckpt"
    proc = torchrun(
        "--checkpoint-dir", ckpt, *ARGS, *DCP_ASYNC, "--checkpoint-timeout", "600",
        env={checkpointer.FAULT_ENV: f"1:4:{fault}"}, timeout=150,
    )  # fmt: skip
    text = _output(proc)
    assert proc.returncode != 0
    assert_rank_1_failed_and_is_the_root_cause(text)
    assert rank_exit_codes(text).get(0) in (None, 7, -15), text[-3000:]  # told, or stopped
    assert [r.step for r in store.list_checkpoints(ckpt)] == [2]
    assert hidden(ckpt) == []


@pytest.mark.slow
def test_rank_killed_in_an_async_dcp_save_fails_fast_and_commits_nothing(reference, tmp_path):
    ckpt = tmp_path / "ckpt"
    log = tmp_path / "killed.log"
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            torchrun_cmd(
                "--checkpoint-dir", ckpt, *ARGS, *DCP_ASYNC, "--checkpoint-timeout", "600"
            ),
            env=_env({checkpointer.FAULT_ENV: "1:4:pause=120"}),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        try:
            _kill_rank_when(proc, 1, lambda: "pausing inside the write" in log.read_text())
            assert proc.wait(timeout=60) != 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert time.monotonic() - started < 120  # neither the pause nor the timeout was waited
    text = log.read_text()
    assert "exitcode  : -9" in text
    assert [r.step for r in store.list_checkpoints(ckpt)] == [2]

    out = tmp_path / "resumed.json"
    resumed = torchrun(
        "--checkpoint-dir", ckpt, *ARGS, *DCP_ASYNC, "--resume", "--summary-json", out,
    )  # fmt: skip
    assert resumed.returncode == 0, _output(resumed)[-4000:]
    data = json.loads(out.read_text())
    assert data["resumed_from_step"] == 2
    assert data["loss_curve"] == reference("ddp").summary["loss_curve"][2:]
    assert [r.step for r in store.list_checkpoints(ckpt)] == [6, 4, 2]
    assert hidden(ckpt) == []


@pytest.mark.slow
def test_rank_that_hangs_times_out_and_commits_nothing(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = torchrun(
        "--checkpoint-dir", ckpt, *ARGS, "--parallel", "ddp", "--no-track",
        "--checkpoint-timeout", "3", env={checkpointer.FAULT_ENV: "1:4:pause=60"},
    )  # fmt: skip
    text = _output(proc)
    assert proc.returncode != 0
    assert "error: checkpoint step-00000004 was not committed" in text, text[-3000:]
    assert "timed out after 3s (--checkpoint-timeout)" in text
    root = text[text.index("Root Cause") :]
    assert "rank      : 0" in root and "exitcode  : 7" in root, root  # RankFailedError
    assert [r.step for r in store.list_checkpoints(ckpt)] == [2]
    assert hidden(ckpt) == []


@pytest.mark.slow
def test_resume_with_another_world_size_is_refused(reference, tmp_path):
    # 2 ranks' shards, resumed by one process: exit 2, nothing misread.
    two = tmp_path / "two"
    shutil.copytree(reference("ddp").ckpt, two)
    proc = run_trainer("--checkpoint-dir", str(two), *ARGS, "--resume", "--no-track")
    assert proc.returncode == 2, proc.stderr
    assert "step-00000006 was written by 2 rank(s), this run has 1" in proc.stderr
    # One process's checkpoint, resumed by 2 ranks: both refuse it the same way.
    one = tmp_path / "one"
    train(tiny_config(one, steps=2, checkpoint_every=2), say=lambda s: None)  # in this process
    proc = torchrun("--checkpoint-dir", one, *ARGS, "--parallel", "ddp", "--resume", "--no-track")
    text = _output(proc)
    assert proc.returncode != 0
    assert text.count("step-00000002 was written by 1 rank(s), this run has 2") == 2, text[-3000:]
    # Every rank exits with the refusal's code: none is killed by torchrun's SIGTERM
    # after the first one left, nor aborts in its process group's teardown (SIGABRT).
    assert rank_exit_codes(text) == {0: 2, 1: 2}, text[-3000:]
    assert "terminate called" not in text
    assert [r.step for r in store.list_checkpoints(one)] == [2]


# ------------------------------------------------------------------ the pieces (fast)


def test_assign_is_balanced_and_deterministic():
    sizes = [4096, 16, 4096, 1024, 16, 512, 4096, 8]
    owners = sharded.assign(sizes, 3)
    assert owners == sharded.assign(sizes, 3)
    load = [sum(s for s, o in zip(sizes, owners, strict=True) if o == r) for r in range(3)]
    assert max(load) - min(load) <= max(sizes)
    assert sharded.assign(sizes, 1) == [0] * len(sizes)


def _ranks(rank: int, world: int, parallel: str = "ddp") -> distributed.Ranks:
    return distributed.Ranks(rank, world, rank, parallel, torch.device("cpu"), None, 60.0)


def _state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(1)
    model = {f"layer{i}.weight": torch.randn(64 + i, 32, generator=gen) for i in range(5)}
    return {
        "step": 7,
        "model": model,
        "optimizer": {
            "state": {i: {"step": torch.tensor(7.0), "exp_avg": torch.randn(8)} for i in range(5)},
            "param_groups": [{"lr": 0.1, "params": list(range(5))}],
        },
        "rng": {"torch": torch.get_rng_state()},
        "config": {"model_size": 1},
    }


def test_ddp_shards_split_the_state_and_merge_back():
    state = _state()
    shards = []
    for rank in range(3):
        image = RawFormat().stage(sharded.split_state(state, _ranks(rank, 3), step=7))
        shards.append(RawFormat().load(bytearray(image.data)))
    ids = [set(s["ids"]) for s in shards]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    leaves: list[torch.Tensor] = []
    flatten({k: v for k, v in state.items() if k != "rng"}, leaves)
    assert set().union(*ids) == set(range(len(leaves)))
    assert all(0 < len(i) < len(leaves) for i in ids)  # no rank writes it all

    merged = sharded.merge_shards(shards, shards[1], _ranks(1, 3))
    assert merged["step"] == 7 and merged["config"] == {"model_size": 1}
    for key, tensor in state["model"].items():
        assert torch.equal(merged["model"][key], tensor)
    assert torch.equal(
        merged["optimizer"]["state"][3]["exp_avg"], state["optimizer"]["state"][3]["exp_avg"]
    )
    assert torch.equal(merged["rng"]["torch"], state["rng"]["torch"])

    with pytest.raises(CheckpointCorruptError, match="in no shard"):
        sharded.merge_shards(shards[:2], shards[1], _ranks(1, 3))


def test_fsdp_replicated_leftovers_stay_with_every_rank():
    # Without DTensors every leaf is replicated: under fsdp each rank keeps them all.
    state = _state()
    shard = sharded.split_state(state, _ranks(1, 2, "fsdp"), step=7)
    assert shard["ids"] == list(range(shard["leaf_count"])) and shard["dtensors"] == {}


def test_check_world_refuses_other_world_sizes_and_modes():
    sharded.check_world({}, "step-1", 1, "none")  # one process's manifest
    sharded.check_world({"world_size": 4, "parallel": "fsdp"}, "step-1", 4, "fsdp")
    with pytest.raises(WorldSizeError, match="written by 4 rank.*this run has 2.*nproc-per-node 4"):
        sharded.check_world({"world_size": 4, "parallel": "fsdp"}, "step-1", 2, "fsdp")
    with pytest.raises(WorldSizeError, match="--parallel ddp, this run uses --parallel fsdp"):
        sharded.check_world({"world_size": 2, "parallel": "ddp"}, "step-1", 2, "fsdp")
    assert WorldSizeError.exit_code == 2


def test_single_process_resume_refuses_shards_of_several_ranks(tmp_path):
    step_dir = tmp_path / "step-00000002"
    step_dir.mkdir()
    manifest = {
        "schema": store.MANIFEST_SCHEMA, "step": 2, "run_id": None, "format": "raw",
        "checksum": "crc32", "layout": "sharded", "shard_layout": "striped", "world_size": 2,
        "parallel": "ddp", "files": [{"name": "x", "rank": 0}],
    }  # fmt: skip
    (step_dir / store.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(WorldSizeError, match="written by 2 rank"):
        train(tiny_config(tmp_path, resume="always"), say=lambda s: None)


def test_verify_shard_catches_damage(tmp_path):
    data = memoryview(bytearray(os.urandom(3 * 4096)))
    written = write_file(LocalFS(), tmp_path / "shard", data, direct=False, chunk_bytes=4096)
    os.close(written.fd)
    entry = {
        "name": "shard",
        "bytes": written.nbytes,
        "chunk_bytes": 4096,
        "crc32": written.checksums,
    }
    assert bytes(store.verify_file(LocalFS(), tmp_path, entry, "crc32", AlignedBuffer())) == bytes(
        data
    )
    with (tmp_path / "shard").open("r+b") as f:
        f.seek(5000)
        f.write(b"\xff" if data[5000] != 0xFF else b"\x00")
    with pytest.raises(CheckpointCorruptError, match="chunk 1 of shard"):
        store.verify_file(LocalFS(), tmp_path, entry, "crc32", AlignedBuffer())
    (tmp_path / "shard").write_bytes(b"short")
    with pytest.raises(CheckpointCorruptError, match="has 5 bytes"):
        store.verify_file(LocalFS(), tmp_path, entry, "crc32", AlignedBuffer())


def test_world_env_and_setup_refusals(tmp_path, monkeypatch):
    assert distributed.world_env({}) == distributed.WorldEnv(0, 1, 0)
    with pytest.raises(ConfigError, match="must be integers"):
        distributed.world_env({"WORLD_SIZE": "two"})
    with pytest.raises(ConfigError, match="does not fit"):
        distributed.world_env({"WORLD_SIZE": "2", "RANK": "2"})
    cfg = tiny_config(tmp_path)
    assert distributed.setup(cfg) is None  # one process: the single-process path
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc-per-node 1
    monkeypatch.setenv("RANK", "0")
    assert distributed.setup(tiny_config(tmp_path, parallel="fsdp")) is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="--parallel none"):
        distributed.setup(cfg)  # refused before joining any group


def test_a_world_of_one_is_ranks_without_a_process_group(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc-per-node 1
    monkeypatch.setenv("RANK", "0")
    ranks = distributed.join(tiny_config(tmp_path, parallel="fsdp"))
    assert (ranks.rank, ranks.world_size, ranks.parallel) == (0, 1, "none")
    assert ranks.device == torch.device("cpu") and ranks.ckpt_group is None
    model = torch.nn.Linear(2, 2)
    assert distributed.wrap(model, ranks) is model
    assert ranks.mean(torch.tensor(2.5)) == 2.5
    assert ranks.broadcast("x") == "x" and ranks.gather("x") == ranks.all_gather("x") == ["x"]
    ranks.barrier()
    ranks.close()
    assert not torch.distributed.is_initialized()  # no collective, no group, nothing joined
    summary = train(tiny_config(tmp_path, steps=2, checkpoint_every=2), say=lambda s: None)
    assert summary.world_size == 1 and not torch.distributed.is_initialized()
    manifest = store.read_manifest(tmp_path / store.final_name(2))
    assert manifest["layout"] == store.LAYOUT_STRIPED and "world_size" not in manifest


def test_config_parallel_choices_match_the_contract(tmp_path):
    assert PARALLEL == contract.PARALLEL_MODES
    with pytest.raises(ConfigError, match="unknown --parallel 'zero'"):
        TrainConfig(checkpoint_dir=tmp_path, parallel="zero")
    with pytest.raises(ConfigError, match="--checkpoint-timeout must be positive"):
        TrainConfig(checkpoint_dir=tmp_path, checkpoint_timeout=0)
    assert set(contract.DISTRIBUTED_INPUTS) <= set(contract.COMPARABLE_INPUTS)
    assert set(contract.DISTRIBUTED_OUTPUTS) <= set(contract.TRAINING_OUTPUTS)


def _record(step: int, pause: float, **extra: Any) -> CheckpointRecord:
    base = dict(step=step, bytes=100, serialize_s=0.1, write_s=0.2, fsync_s=0.1, upload_s=None,
                pause_s=pause, total_s=0.5, write_gbps=1.0, upload_gbps=None, path="p", io_mode="direct")  # fmt: skip
    return CheckpointRecord(**base, **extra)


def test_summary_outputs_of_many_ranks_and_of_one():
    many = [
        _record(s, p, world_size=2, ranks=[], aggregate_gbps=g, slowest_pause_s=p, commit_s=0.01)
        for s, p, g in ((2, 0.5, 1.0), (4, 0.7, 3.0), (6, 0.6, 2.0))
    ]
    summary = RunSummary("p", "d", {}, 10.0, 6, 1.0, many, world_size=2)
    outputs = summary.outputs()
    assert outputs["world_size"] == 2
    assert outputs["ckpt_aggregate_gbps_median"] == 2.0
    assert outputs["ckpt_slowest_pause_s_median"] == 0.6 == outputs["ckpt_pause_s_median"]
    assert summary.to_json()["checkpoints"][0]["ranks"] == []
    one = RunSummary("p", "d", {}, 10.0, 6, 1.0, [_record(2, 0.5)]).outputs()
    assert one["world_size"] == 1 and "ckpt_aggregate_gbps_median" not in one
    # One record type: a single process's has none of the keys of many ranks.
    single = RunSummary("p", "d", {}, 10.0, 6, 1.0, [_record(2, 0.5)]).to_json()
    assert not set(contract.DISTRIBUTED_CHECKPOINT_KEYS) & set(single["checkpoints"][0])


@pytest.mark.slow
def test_bench_ranks_writes_shards_from_several_processes_against_fio(tmp_path):
    from trainer import bench

    out = tmp_path / "ranks.json"
    bench.main.main(
        ["--dir", str(tmp_path / "vol"), "--size", "8MiB", "--repeats", "2", "--ranks", "2",
         "--json", str(out)],
        standalone_mode=False,
    )  # fmt: skip
    data = json.loads(out.read_text())
    assert data["ranks"] == 2 and data["repeats"] == 2
    saves = data["samples"]["save"]
    assert [s["step"] for s in saves] == [1, 2]
    for save in saves:
        assert save["world_size"] == 2 and [r["rank"] for r in save["ranks"]] == [0, 1]
        assert all(0 < r["bytes"] < save["bytes"] for r in save["ranks"])  # split, not copied
        assert save["aggregate_gbps"] > 0 and save["slowest_pause_s"] > 0
    assert data["aggregate_gbps"] == statistics.median(s["aggregate_gbps"] for s in saves)
    # Beside it, in the same run: DCP's own multi-rank save (sync and async), the async
    # save of ours, and the copy that bounds an async pause; CPU per MB for each.
    for case in ("ours-async", "dcp", "dcp-async", "copy"):
        assert len(data["samples"][case]) == 2, case
        key = case.replace("-", "_")
        assert data[f"{key}_gbps"] > 0 and data[f"{key}_cpu_s_per_mb"] > 0, case
    assert data["aggregate_vs_dcp"] == pytest.approx(data["aggregate_gbps"] / data["dcp_gbps"])
    for sample in data["samples"]["ours-async"]:
        assert len(sample["rank_pause_s"]) == 2
    assert data["cpu_s_per_mb"] > 0
    if shutil.which("fio"):
        assert data["fio_gbps"] > 0 and len(data["samples"]["fio"]) == 2
        assert data["aggregate_vs_fio"] == pytest.approx(data["aggregate_gbps"] / data["fio_gbps"])
    assert list((tmp_path / "vol").iterdir()) == []  # cleaned up


@pytest.mark.parametrize("module", [distributed, sharded])
def test_doctests(module):
    import doctest

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_sharded_total_includes_the_wait_for_the_previous_checkpoint(tmp_path, monkeypatch):
    # Step 2's write is held up 0.6 s; step 4, saved at once, waits for it: that wait is
    # in its pause, and the total (from the save request) covers the pause.
    monkeypatch.setenv(checkpointer.FAULT_ENV, "0:2:pause=0.6")
    ranks = distributed.OneProcess(0, 1, 0, "none", torch.device("cpu"), None, 60.0)
    ckpt = checkpointer.Checkpointer(
        tmp_path, RawFormat(), LocalFS(), durable=True, keep=5, ranks=ranks, asynchronous=True
    )

    def state(step: int) -> dict[str, Any]:
        return {"step": step, "model": {"w": torch.ones(4096)}, "rng": {}}

    ckpt.save(2, lambda: state(2))
    ckpt.save(4, lambda: state(4))
    records = {r.step: r for r in ckpt.finish()}
    assert records[4].pause_s >= 0.5
    for record in records.values():
        assert record.pause_s <= record.total_s, record
        for rank in record.ranks or []:
            assert rank["pause_s"] <= rank["total_s"], rank


@dataclass
class _Board:
    """Where two thread-ranks meet: one slot each, and a barrier around every exchange."""

    world: int
    slots: list[Any]
    barrier: threading.Barrier


@dataclass
class ThreadRanks(distributed.Ranks):
    """A rank of a world whose ranks are threads of this process: the checkpoint
    protocol's collectives go over a shared board, so the commit of every format can be
    tested with several ranks and no torchrun."""

    board: _Board | None = None

    def _exchange(self, obj: Any) -> list[Any]:
        assert self.board is not None
        self.board.slots[self.rank] = obj
        self.board.barrier.wait(timeout=60)
        out = list(self.board.slots)
        self.board.barrier.wait(timeout=60)
        return out

    def barrier(self) -> None:
        self._exchange(None)

    def broadcast(self, obj: Any) -> Any:
        return self._exchange(obj)[0]

    def gather(self, obj: Any) -> list[Any] | None:
        out = self._exchange(obj)
        return out if self.is_main else None

    def all_gather(self, obj: Any) -> list[Any]:
        return self._exchange(obj)


class _FullOnFsync(LocalFS):
    """A volume that fills up once ``full`` is set: the next file fsync fails (ENOSPC)."""

    full = False

    def fsync(self, fd: int) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().fsync(fd)


@pytest.mark.parametrize("fmt", ["raw", "torch", "safetensors"])
def test_a_rank_whose_volume_fills_commits_nothing_in_every_format(tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(checkpointer, "FAILED_RANK_GRACE_S", 0.0)
    board = _Board(2, [None, None], threading.Barrier(2))
    outcome: dict[int, Any] = {}

    def state(step: int) -> dict[str, Any]:
        weights = {"w": torch.arange(40_000, dtype=torch.float32), "b": torch.ones(3000)}
        return {"step": step, "model": weights, "rng": {"torch": torch.get_rng_state()}}

    def rank_main(rank: int) -> None:
        ranks = ThreadRanks(rank, 2, rank, "ddp", torch.device("cpu"), None, 60.0, board=board)
        fs = _FullOnFsync()
        ckpt = checkpointer.Checkpointer(
            tmp_path, make_format(fmt), fs, durable=True, keep=5, ranks=ranks,
            options=WriteOptions(io_streams=2),
        )  # fmt: skip
        try:
            ckpt.save(2, lambda: state(2))
            outcome[rank] = ckpt.poll()
            fs.full = rank == 1
            ckpt.save(4, lambda: state(4))
        except TrainerError as exc:
            outcome[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    # The rank whose volume filled stops with its own error (exit 4), the other is told
    # (exit 7); nothing of step 4 is published or left behind.
    assert isinstance(outcome[1], StorageFullError), outcome
    assert isinstance(outcome[0], RankFailedError) and "rank 1: StorageFullError" in str(outcome[0])
    assert [r.step for r in store.list_checkpoints(tmp_path)] == [2]
    assert hidden(tmp_path) == []
    # Step 2, committed: every rank's shard, striped over two streams (or two library files).
    manifest = store.read_manifest(tmp_path / store.final_name(2))
    assert (manifest["layout"], manifest["world_size"]) == ("sharded", 2)
    assert sorted(e["rank"] for e in manifest["files"]) == [0, 0, 1, 1]
    assert manifest["shard_layout"] == make_format(fmt).layout


def _in_two_thread_ranks(body) -> dict[int, Any]:
    """Run ``body(ranks)`` on two thread-ranks at once; returns each rank's result (or the
    error it raised)."""
    board = _Board(2, [None, None], threading.Barrier(2))
    outcome: dict[int, Any] = {}

    def rank_main(rank: int) -> None:
        ranks = ThreadRanks(rank, 2, rank, "ddp", torch.device("cpu"), None, 60.0, board=board)
        try:
            outcome[rank] = body(ranks)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return outcome


def _two_ranks_model_and_opt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(32, 32)
    with torch.no_grad():
        model.weight.copy_(torch.arange(32 * 32, dtype=torch.float32).reshape(32, 32))
        model.bias.zero_()
    return model, torch.optim.AdamW(model.parameters())


def _two_ranks_save_steps_2_and_4(directory: Path, fmt: str) -> dict[int, Any]:
    """Two thread-ranks save steps 2 and 4 (two streams each); returns each rank's bias at
    step 2."""

    def save(ranks: distributed.Ranks) -> torch.Tensor:
        model, opt = _two_ranks_model_and_opt()
        ckpt = checkpointer.Checkpointer(
            directory, make_format(fmt), LocalFS(), durable=True, keep=5, ranks=ranks,
            options=WriteOptions(io_streams=2),
        )  # fmt: skip
        for step in (2, 4):
            model(torch.ones(1, 32)).sum().backward()
            opt.step()
            state = {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                     "rng": {"torch": torch.get_rng_state()}, "config": {}}  # fmt: skip
            ckpt.save(step, lambda state=state: state)
            if step == 2:
                bias_at_2 = model.bias.detach().clone()
        ckpt.finish()
        return bias_at_2

    saved = _in_two_thread_ranks(save)
    assert all(isinstance(v, torch.Tensor) for v in saved.values()), saved
    return saved


def _two_ranks_resume(directory: Path, fmt: str, told: list[str]) -> dict[int, Any]:
    """Two thread-ranks resume from ``directory``; returns each rank's restored step and
    bias."""

    def resume(ranks: distributed.Ranks) -> Any:
        model, opt = _two_ranks_model_and_opt()
        restored = sharded.restore(
            directory, make_format(fmt), LocalFS(), model, opt, ranks, told.append,
            check_config=lambda saved, name: None,
        )  # fmt: skip
        return restored, model.bias.detach().clone()

    return _in_two_thread_ranks(resume)


@pytest.mark.parametrize("fmt", ["raw", "torch", "safetensors"])
def test_two_ranks_resume_the_newest_checkpoint_every_rank_verifies_in_every_format(tmp_path, fmt):
    saved = _two_ranks_save_steps_2_and_4(tmp_path, fmt)
    # Rank 1's part of step 4 is damaged: every rank skips step 4 and resumes step 2.
    step4 = tmp_path / store.final_name(4)
    manifest = store.read_manifest(step4)
    flip_byte(step4 / max((e for e in manifest["files"] if e["rank"] == 1),
                          key=lambda e: e["bytes"])["name"])  # fmt: skip
    told: list[str] = []
    resumed = _two_ranks_resume(tmp_path, fmt, told)
    for rank in (0, 1):
        restored, bias = resumed[rank]
        assert restored.step == 2, resumed
        assert torch.equal(bias, saved[rank])
    assert any("skipping" in line and "step-00000004" in line for line in told), told
    assert sum("continuing from step-00000002 (step 2), 2 shards verified" in t for t in told) == 2


def test_a_sharded_manifest_without_its_shard_layout_is_incomplete(tmp_path):
    """Every sharded manifest says how a rank's files hold its part: one without is
    skipped on every rank, never read as one striped file per rank."""
    saved = _two_ranks_save_steps_2_and_4(tmp_path, "raw")
    path = tmp_path / store.final_name(4) / store.MANIFEST
    manifest = json.loads(path.read_text())
    del manifest["shard_layout"]
    path.write_text(json.dumps(manifest))
    told: list[str] = []
    resumed = _two_ranks_resume(tmp_path, "raw", told)
    for rank in (0, 1):
        restored, bias = resumed[rank]
        assert restored.step == 2, resumed
        assert torch.equal(bias, saved[rank])
    assert any(
        "skipping" in line and "step-00000004: MANIFEST.json has no field 'shard_layout'" in line
        for line in told
    ), told
