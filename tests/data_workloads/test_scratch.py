"""The runs' scratch on a shared claim: names no other pod can take, removed when a run is
stopped (SIGTERM as SIGINT), and removed by a later run only when provably abandoned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_workloads import dataset as ds
from data_workloads import scratch
from data_workloads.errors import DatasetMismatchError

from .helpers import TINY, run_cli

REPO = Path(__file__).resolve().parents[2]
SPEC = ds.DatasetSpec("files", 0, 256 * 1024, 4096, 64 * 1024)


def _hidden(data_dir: Path) -> list[str]:
    return sorted(p.name for p in data_dir.iterdir() if p.name.startswith("."))


def test_a_second_generator_uses_the_same_dataset_put_in_place_first(
    data_dir: Path, monkeypatch
) -> None:
    # Two runs generate the same dataset at once: the other one renames its copy into
    # place while ours is being written; ours is then verified against it and used.
    data_dir.mkdir()
    real = ds._generate_into
    raced: list[ds.Dataset] = []
    calls: list[Path] = []

    def generate_while_another_finishes(tmp: Path, s: ds.DatasetSpec) -> list[Path]:
        calls.append(tmp)
        files = real(tmp, s)
        if len(calls) == 1:
            raced.append(ds.open_dataset(data_dir, SPEC))
        return files

    monkeypatch.setattr(ds, "_generate_into", generate_while_another_finishes)
    data = ds.open_dataset(data_dir, SPEC)
    assert len(calls) == 2 and raced[0].generated and not data.generated
    assert data.files == raced[0].files and data.bytes == raced[0].bytes
    assert [p.name for p in data_dir.iterdir()] == ["files"]  # our copy is gone


def test_another_dataset_put_in_place_first_is_still_refused(data_dir: Path, monkeypatch) -> None:
    data_dir.mkdir()
    other = ds.DatasetSpec("files", 7, SPEC.dataset_size, SPEC.record_size, SPEC.shard_size)
    real = ds._generate_into

    def another_finishes_first(tmp: Path, s: ds.DatasetSpec) -> list[Path]:
        files = real(tmp, s)
        if s == SPEC:
            ds.open_dataset(data_dir, other)
        return files

    monkeypatch.setattr(ds, "_generate_into", another_finishes_first)
    with pytest.raises(DatasetMismatchError, match="seed=7"):
        ds.open_dataset(data_dir, SPEC)
    assert [p.name for p in data_dir.iterdir()] == ["files"]


def test_scratch_names_differ_across_pods_with_the_same_pid(monkeypatch, tmp_path: Path) -> None:
    # Every container's first process is PID 1: the name must not be the PID's alone.
    monkeypatch.setattr(scratch.os, "getpid", lambda: 1)
    names = {scratch.ScratchDir(tmp_path, "files.generating").path.name for _ in range(20)}
    assert len(names) == 20
    assert all(scratch.SCRATCH_NAME.match(n) for n in names)
    monkeypatch.setattr(scratch.socket, "gethostname", lambda: "pod-a/../x y")
    assert scratch.ScratchDir(tmp_path, "w").path.parent == tmp_path


def test_a_live_runs_scratch_is_left_alone_and_an_abandoned_one_removed(tmp_path: Path) -> None:
    live = scratch.ScratchDir(tmp_path, "files.generating")
    live.create()
    (live.path / "shard").write_bytes(b"x")
    # A run killed where it stood: its process is gone, so is its lock.
    code = (
        "import os, sys\nfrom pathlib import Path\nfrom data_workloads import scratch\n"
        "s = scratch.ScratchDir(Path(sys.argv[1]), 'workspace')\ns.create()\n"
        "print(s.path, flush=True)\nos._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    dead = Path(out.stdout.strip())
    assert dead.is_dir()
    # Not ours (no tag), another program's, and an old run's PID-named directory.
    others = [tmp_path / ".files.generating-1", tmp_path / ".cache", tmp_path / "files"]
    for path in others:
        path.mkdir()
    assert scratch.remove_stale(tmp_path) == [dead]
    assert live.path.is_dir() and (live.path / "shard").exists()
    assert all(p.is_dir() for p in others)
    live.remove()
    assert not live.path.exists()


def test_a_scratch_dir_without_an_owner_is_removed_only_once_old(tmp_path: Path) -> None:
    young = scratch.ScratchDir(tmp_path, "materialize").path
    young.mkdir()
    assert scratch.remove_stale(tmp_path) == [] and young.is_dir()
    old = time.time() - scratch.GRACE_S - 5
    os.utime(young, (old, old))
    assert scratch.remove_stale(tmp_path) == [young] and not young.exists()


def test_a_rerun_with_the_pid_of_an_interrupted_generation_succeeds(data_dir: Path) -> None:
    # An interrupted generation of a pod whose PID this run now has (or one in progress).
    data_dir.mkdir()
    theirs = data_dir / f".files.generating-{os.getpid()}"
    theirs.mkdir()
    (theirs / "0000").mkdir()
    args = ["--dataset-format", "files", "--epochs", "1", "--num-workers", "0"]
    result = run_cli("scan", "--data-dir", data_dir, "--no-track", *TINY, *args)
    assert result.exit_code == 0, result.output
    assert (theirs / "0000").is_dir()  # not ours to delete


def _start(args: list[str], data_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "data_workloads", *args, "--data-dir", str(data_dir), "--no-track"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=data_dir.parent,
    )


def _wait_for(data_dir: Path, prefix: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if data_dir.is_dir() and any(n.startswith(prefix) for n in _hidden(data_dir)):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError(f"no {prefix}* in {data_dir}")


@pytest.mark.parametrize(
    ("args", "prefix"),
    [
        (["scan", "--dataset-format", "files", "--dataset-size", "64MiB", "--record-size",
          "4KiB"], ".files.generating-"),
        (["workspace", "--files", "50", "--rounds", "100000"], ".workspace-"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_run_removes_its_scratch(
    data_dir: Path, args: list[str], prefix: str, sig: int
) -> None:
    proc = _start(args, data_dir)
    try:
        _wait_for(data_dir, prefix, proc)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines()[-1] == (
        f"data-workloads: error: interrupted by {signal.Signals(sig).name}"
    )
    assert "Traceback" not in err
    assert _hidden(data_dir) == []
    assert not (data_dir / "files").exists()


def test_a_scratch_name_already_taken_is_not_removed(tmp_path: Path, monkeypatch) -> None:
    taken = scratch.ScratchDir(tmp_path, "files.generating")
    taken.create()
    monkeypatch.setattr(scratch, "scratch_tag", lambda: taken.path.name.split("generating-")[1])
    again = scratch.ScratchDir(tmp_path, "files.generating")
    with pytest.raises(FileExistsError):
        again.create()
    again.remove()
    assert (taken.path / scratch.OWNER).is_file()
    taken.remove()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_scan_stopped_with_its_workers_exits_with_the_signals_code(data_dir: Path, sig: int):
    # The whole process group signalled (Ctrl-C, or a container runtime that signals every
    # process): the workers leave the stopping to the main process.
    args = ["scan", *TINY, "--epochs", "100000", "--num-workers", "2", "--compute-ms", "1"]
    assert run_cli(*args[:7], "--epochs", "1", "--data-dir", data_dir, "--no-track").exit_code == 0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "data_workloads", *args, "--data-dir", str(data_dir), "--no-track"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    try:
        deadline = time.monotonic() + 60
        while len(children.read_text().split()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        workers = [int(pid) for pid in children.read_text().split()]
        time.sleep(0.5)
        os.killpg(proc.pid, sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines() == [
        f"data-workloads: error: interrupted by {signal.Signals(sig).name}"
    ]
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


@pytest.mark.parametrize("at", ["after the mkdir", "in the removal"])
def test_a_signal_while_scratch_is_made_or_removed_leaves_none(
    tmp_path: Path, monkeypatch, at
) -> None:
    """The signal lands where a run is most exposed: between the mkdir and the owner file
    (no ``with`` block owns the directory yet), or half-way through the removal."""
    from checkpoint_storage_bench.interrupts import signals_raise

    class Stopped(Exception):
        pass

    real_open, real_unlink = os.open, os.unlink

    def interrupt() -> None:
        os.kill(os.getpid(), signal.SIGINT)

    def open_then_signal(path, *args, **kwargs):
        if at == "after the mkdir" and str(path).endswith(".owner.new"):
            interrupt()
        return real_open(path, *args, **kwargs)

    def unlink_then_signal(path, *args, **kwargs):
        real_unlink(path, *args, **kwargs)
        if at == "in the removal":
            interrupt()

    monkeypatch.setattr(scratch.os, "open", open_then_signal)
    with pytest.raises(Stopped), signals_raise(lambda signum: Stopped()):
        with scratch.ScratchDir(tmp_path, "workspace") as made:
            (made / "a").write_text("x")
            (made / "b").write_text("y")
            monkeypatch.setattr(scratch.os, "unlink", unlink_then_signal)
    assert _hidden(tmp_path) == []
