"""The server (sandbox/server.py) and the sandbox's processes (sandbox/processes.py):
start-up errors, exit 6 without a server, and stop ending leftover process groups but
never a stranger's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from sandbox.commands import stop
from sandbox.config import REPO_ROOT, SandboxPaths, load_agent_settings
from sandbox.errors import PortInUseError, ServerStartError
from sandbox.server import Sandbox

HERE = Path(__file__).parent

MINI = HERE / "polyaxonfiles" / "mini-pipeline.yaml"


def test_start_refuses_a_taken_port(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path), port=port)
        with pytest.raises(PortInUseError, match=f"port {port} .* already in use"):
            sb.start_server()
        # The CLI says it in one line, with its own exit code.
        done = subprocess.run(
            [sys.executable, "-m", "sandbox", "start", "--root", str(tmp_path),
             "--port", str(port)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == PortInUseError.exit_code
        assert "already in use" in done.stderr


@pytest.mark.slow
def test_a_server_that_cannot_start_shows_its_log(tmp_path):
    from checkpoint_storage_bench.ports import free_port

    paths = SandboxPaths(tmp_path)
    # The server must create .polyaxon/ in its data dir: a file there makes it fail.
    paths.server_data.mkdir(parents=True)
    (paths.server_data / ".polyaxon").write_text("not a directory")
    sb = Sandbox(paths, load_agent_settings(tmp_path), port=free_port())
    with pytest.raises(ServerStartError, match="last lines of") as err:
        sb.start_server(timeout=60)
    assert str(paths.server_log) in str(err.value)
    assert sb.server_pid() is None


def test_status_exits_6_when_nothing_runs(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sandbox", "status", "--root", str(tmp_path), "--output", "json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 6
    assert json.loads(done.stdout)["server_healthy"] is False


def _orphaned_group(cwd: Path) -> tuple[int, int]:
    """A process group whose leader has exited while a child lives on: (pgid, child pid)."""
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!"], cwd=cwd, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    child = int(leader.stdout.readline())
    leader.wait()
    assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE
    return leader.pid, child


def test_stop_ends_a_group_whose_leader_is_gone(tmp_path):
    from checkpoint_storage_bench.processes import stop_group

    pgid, child = _orphaned_group(tmp_path)
    stop_group(pgid, grace=5)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    stop_group(pgid, grace=1)  # nothing left: no error


def test_sandbox_stop_ends_its_leftovers_but_not_a_stranger_group(tmp_path):
    paths = SandboxPaths(tmp_path / "root")
    paths.state.mkdir(parents=True)
    sb = Sandbox(paths, load_agent_settings(paths.root))
    ours, our_child = _orphaned_group(paths.state)
    paths.agent_pid.write_text(str(ours))
    stranger, strangers_child = _orphaned_group(tmp_path)  # not under the sandbox root
    paths.server_pid.write_text(str(stranger))
    try:
        assert stop(sb) == [f"agent's leftover processes (group {ours})"]
        assert not psutil.pid_exists(our_child) or (
            psutil.Process(our_child).status() == psutil.STATUS_ZOMBIE
        )
        assert psutil.Process(strangers_child).is_running()
        assert not paths.agent_pid.exists() and not paths.server_pid.exists()
    finally:
        os.killpg(stranger, signal.SIGKILL)


@pytest.mark.parametrize(
    "args",
    [["submit", "-f", str(MINI)], ["register-components", "--components-dir",
                                    str(HERE / "polyaxonfiles" / "components")]],
)  # fmt: skip
def test_commands_need_a_running_server_and_say_so_with_exit_6(tmp_path, args):
    from checkpoint_storage_bench.ports import free_port

    done = subprocess.run(
        [sys.executable, "-m", "sandbox", *args, "--root", str(tmp_path),
         "--port", str(free_port())],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 6, done.stderr
    assert done.stderr.startswith("sandbox: error: no sandbox server answers at http://127.0.0.1:")
    assert "Traceback" not in done.stderr
