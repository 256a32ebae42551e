"""`python -m localcluster`: the one command line of the local cluster, without starting it
(tests/kube/test_localcluster_status.py checks `status` against a running control plane)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from localcluster import cli, state
from localcluster.controlplane import PIDS_FILE, _proc_start_time
from localcluster.node import NODE_PIDS_FILE

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli.main, list(args), prog_name="python -m localcluster")


def _record(path: Path, procs: list[tuple[str, int, str | None]], **extra: str) -> None:
    data = {"procs": [{"name": n, "pid": p, "start_time": t} for n, p, t in procs], **extra}
    path.write_text(json.dumps(data))


def test_status_of_a_state_dir_nothing_started_in_exits_1(tmp_path: Path) -> None:
    done = _run("status", "--state-dir", str(tmp_path))
    assert done.exit_code == cli.EXIT_FAILED
    assert done.stdout == f"not started (no pid file in {tmp_path})\n"


def test_status_lists_each_recorded_process_and_exits_0_when_all_run(tmp_path: Path) -> None:
    me = os.getpid()
    _record(tmp_path / PIDS_FILE, [("etcd", me, _proc_start_time(me))], server="https://x:1")
    _record(tmp_path / NODE_PIDS_FILE, [("kubelet", me, _proc_start_time(me))])
    (tmp_path / "admin.kubeconfig").write_text("{}")
    done = _run("status", "--state-dir", str(tmp_path))
    assert done.exit_code == 0, done.output
    out = done.stdout
    assert [line.split()[:2] for line in out.splitlines()[:2]] == [
        ["controlplane", "etcd"],
        ["node", "kubelet"],
    ]
    assert "server: https://x:1" in out
    assert f"export KUBECONFIG={tmp_path / 'admin.kubeconfig'}" in out


def test_status_exits_1_when_a_recorded_process_is_gone(tmp_path: Path) -> None:
    me = os.getpid()
    # Same pid, another start time: a later process that reused the pid is not the recorded one.
    _record(tmp_path / PIDS_FILE, [("etcd", me, _proc_start_time(me)), ("kube-apiserver", me, "1")])
    done = _run("status", "--state-dir", str(tmp_path))
    assert done.exit_code == cli.EXIT_FAILED
    lines = done.stdout.splitlines()
    assert lines[0].endswith("running") and lines[1].endswith("gone"), lines


def test_start_without_the_build_script_or_a_bin_dir_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "BUILD_SCRIPT", tmp_path / "absent.sh")
    done = _run("start", "--state-dir", str(tmp_path / "s"))
    assert done.exit_code == cli.EXIT_SETUP
    err = done.stderr
    assert err.count("\n") == 1 and "pass --bin-dir" in err
    assert not (tmp_path / "s").exists()


def test_build_with_node_and_names_is_refused_as_usage() -> None:
    done = _run("build", "--node", "etcd")
    assert done.exit_code == 2
    assert done.stderr == "localcluster: error: build --node builds every binary; name none\n"


def test_the_default_state_dirs_are_the_build_scripts_and_apart_per_kind(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("CONTROLPLANE_STATE_DIR", None)
    # `env` names the state dir it looked in when nothing was started there.
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "controlplane.sh"), "env"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    probe = "from localcluster.state import default_state_dir as d; print(d(), d(node=True))"
    plane, node = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert f"no {plane}/pids.json" in done.stderr
    assert Path(plane).parent == Path(node).parent == tmp_path
    assert plane != node


def test_help_names_the_four_commands_and_the_exit_codes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "localcluster", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("Usage: python -m localcluster [OPTIONS] COMMAND")
    commands = done.stdout.split("Commands:\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in commands] == ["build", "start", "status", "stop"]
    assert "3  what the command needs is missing here" in done.stdout


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("build", ["--node", "--bin-dir PATH"]),
        ("start", ["--node", "--bin-dir PATH", "--state-dir PATH"]),
        ("stop", ["--node", "--bin-dir PATH", "--state-dir PATH"]),
        ("status", ["--node", "--state-dir PATH"]),
    ],
)
def test_each_commands_options_are_its_settings_fields(command: str, options: list[str]) -> None:
    done = _run(command, "--help")
    assert done.exit_code == 0, done.output
    listed = [
        line.strip().split("  ")[0]
        for line in done.stdout.split("Options:\n")[1].splitlines()
        if line.startswith("  --")
    ]
    assert listed == options
    assert ("[NAME]..." in done.stdout.splitlines()[0]) == (command == "build")


@pytest.mark.parametrize("command", ["build", "start", "stop", "status"])
def test_an_unknown_option_is_a_usage_error(command: str) -> None:
    done = _run(command, "--nodes")
    assert done.exit_code == 2
    assert "No such option '--nodes'" in done.stderr


def test_build_passes_the_names_and_the_bin_dir_to_the_build_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, seen = tmp_path / "build.sh", tmp_path / "seen"
    script.write_text(f'echo "$* bin=$CONTROLPLANE_BIN_DIR" >{seen}; exit 7\n')
    monkeypatch.setattr(state, "BUILD_SCRIPT", script)
    done = _run("build", "--bin-dir", str(tmp_path / "bin"), "etcd", "kubelet")
    assert done.exit_code == 7  # the script's own
    assert seen.read_text() == f"build etcd kubelet bin={tmp_path / 'bin'}\n"


def test_start_with_a_binary_missing_fails_with_one_line_and_exit_1(tmp_path: Path) -> None:
    done = _run("start", "--bin-dir", str(tmp_path / "bin"), "--state-dir", str(tmp_path / "s"))
    assert done.exit_code == cli.EXIT_FAILED
    assert done.stderr.startswith("localcluster: error: ") and done.stderr.count("\n") == 1
    assert "is not built (scripts/controlplane.sh build)" in done.stderr
