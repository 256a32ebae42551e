"""Shared helpers and the session's sandbox (a real CE server and agent on a free port)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

from checkpoint_storage_bench.ports import free_port
from localcluster.emulation import loop_volume
from localcluster.emulation.io_limits import BlockDevice, Cgroup, ThrottleUnavailable, probe
from sandbox.commands import stop
from sandbox.config import DEFAULT_OWNER, REPO_ROOT, SandboxPaths, load_agent_settings
from sandbox.local import LocalRuntime
from sandbox.server import Sandbox


def polyaxon_cli(args: list[str], host: str, home: Path) -> subprocess.CompletedProcess:
    """Polyaxon's own CLI (this venv's) against ``host``, with its own HOME: the tests check
    the sandbox with the tool a user would use."""
    env = dict(os.environ, COLUMNS="400", TERM="dumb", POLYAXON_HOST=host, HOME=str(home))
    home.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("polyaxon")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "polyaxon"]
    return subprocess.run(cmd + args, env=env, capture_output=True, text=True, check=False)


def write_profiles(root: Path, throughput: Path, extra: dict | None = None) -> Path:
    """A sandbox-profiles.yaml (the contracts.md format) under ``root``."""
    profiles = {
        "checkpoint-baseline": {"path": ".sandbox/media/disk", "description": "disk"},
        "checkpoint-throughput": {"path": str(throughput), "description": "tmpfs"},
        **(extra or {}),
    }
    path = root / "profiles.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "claim": "training-checkpoints",
                "namespace": "sandbox",
                "claimPath": ".sandbox/claims/training-checkpoints",
                "profiles": profiles,
            }
        )
    )
    return path


def needs_throttle(path: Path, name: str) -> tuple[Cgroup, BlockDevice]:
    """The cgroup ``name`` (not created) and the device under ``path``, where the kernel can
    throttle block I/O; else skip the test with the reason in one line (fail under CI,
    which runs as root on a host with the controller)."""
    try:
        return probe(path, name)
    except ThrottleUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to throttle block I/O: {exc}")
        pytest.skip(f"needs root and a block-I/O controller: {exc}")


def needs_volume(name: str, mount_point: Path, size: int) -> loop_volume.LoopVolume:
    """The loop-device volume ``name`` at ``mount_point``; where none can be made (not root,
    no loop devices), skip with the reason in one line (fail under CI, which can)."""
    try:
        return loop_volume.create(name, mount_point, size)
    except loop_volume.VolumeUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to make a loop-device volume: {exc}")
        pytest.skip(f"needs root and loop devices: {exc}")


def emulated_profiles(root: Path) -> Path:
    """The shipped, emulating profiles file, its classes files made absolute, under ``root``."""
    spec = yaml.safe_load((REPO_ROOT / "connections" / "sandbox-profiles.yaml").read_text())
    files = spec["classesFile"]
    files = [files] if isinstance(files, str) else files
    spec["classesFile"] = [str(REPO_ROOT / "connections" / f) for f in files]
    path = root / "emulated-profiles.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def shm_dir(fallback: Path) -> Path:
    """A fresh directory name on /dev/shm (tmpfs), or under ``fallback`` without one."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else fallback
    return base / f"sandbox-test-{uuid.uuid4().hex[:8]}"


def sandbox_processes(root: Path) -> list[psutil.Process]:
    """Every process that belongs to the sandbox under ``root`` (by cmdline, cwd or HOME)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "environ"]):
        try:
            text = " ".join(proc.info["cmdline"] or []) + " " + (proc.info["cwd"] or "")
            home = (proc.info["environ"] or {}).get("HOME", "")
            if str(root) in text or str(root) in home:
                found.append(proc)
        except (psutil.Error, TypeError):
            continue
    return [p for p in found if p.pid != os.getpid()]


def wait_gone(root: Path, timeout: float = 20) -> list[psutil.Process]:
    """Wait until no process of the sandbox under ``root`` is left; return the stragglers."""
    deadline = time.monotonic() + timeout
    while sandbox_processes(root) and time.monotonic() < deadline:
        time.sleep(0.5)
    return sandbox_processes(root)


@pytest.fixture(scope="session")
def sandbox():
    """A started sandbox (server, project ``e2e``, agent) in a tmp root; stopped at the end,
    and nothing of it may be left running."""
    root = Path(tempfile.mkdtemp(prefix="sandbox-e2e-"))
    shm = shm_dir(root)
    profiles = write_profiles(root, shm / "media")
    sb = Sandbox(
        paths=SandboxPaths(root),
        agent=load_agent_settings(root, profiles_file=profiles),
        port=free_port(),
    )
    try:
        LocalRuntime().start(sb, DEFAULT_OWNER, "e2e", echo=print)
        yield sb
    finally:
        stopped = stop(sb)
        left = wait_gone(root)
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"processes left behind: {[p.info['cmdline'] for p in left]}"
        assert stopped, "the sandbox was not running at teardown"


def sweep_emulation(root: Path, group: Cgroup, cgroup_name: str, mounts: list[Path]) -> None:
    """After a ``stop`` of an emulating sandbox: check it removed the claim's cgroup, its
    loop-device volumes and mounts and every process under ``root``; sweep them anyway."""
    left = wait_gone(root)
    gone = not group.exists()
    if not gone:
        group.remove()
    volumes = [f for f in loop_volume.loop_devices()
               if f.name.startswith(f"{loop_volume.PREFIX}{cgroup_name}")]  # fmt: skip
    mounted = [m for m in mounts if os.path.ismount(m)]
    loop_volume.sweep(cgroup_name)
    shutil.rmtree(root, ignore_errors=True)
    assert gone, f"stop left the claim's cgroup {group.path}"
    assert not volumes and not mounted, f"stop left {volumes} {mounted}"
    assert not left, f"processes left behind: {[p.info['cmdline'] for p in left]}"
