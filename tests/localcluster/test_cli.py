"""`python -m localcluster`: the one command line of the local cluster, without starting it
(tests/kube/test_localcluster_status.py checks `status` against a running control plane)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import cli, state
from localcluster.controlplane import PIDS_FILE, _proc_start_time
from localcluster.node import NODE_PIDS_FILE

REPO = Path(__file__).resolve().parents[2]


def _record(path: Path, procs: list[tuple[str, int, str | None]], **extra: str) -> None:
    data = {"procs": [{"name": n, "pid": p, "start_time": t} for n, p, t in procs], **extra}
    path.write_text(json.dumps(data))


def test_status_of_a_state_dir_nothing_started_in_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", "--state-dir", str(tmp_path)]) == cli.EXIT_FAILED
    assert "not started" in capsys.readouterr().out


def test_status_lists_each_recorded_process_and_exits_0_when_all_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    me = os.getpid()
    _record(tmp_path / PIDS_FILE, [("etcd", me, _proc_start_time(me))], server="https://x:1")
    _record(tmp_path / NODE_PIDS_FILE, [("kubelet", me, _proc_start_time(me))])
    (tmp_path / "admin.kubeconfig").write_text("{}")
    assert cli.main(["status", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert [line.split()[:2] for line in out.splitlines()[:2]] == [
        ["controlplane", "etcd"],
        ["node", "kubelet"],
    ]
    assert "server: https://x:1" in out
    assert f"export KUBECONFIG={tmp_path / 'admin.kubeconfig'}" in out


def test_status_exits_1_when_a_recorded_process_is_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    me = os.getpid()
    # Same pid, another start time: a later process that reused the pid is not the recorded one.
    _record(tmp_path / PIDS_FILE, [("etcd", me, _proc_start_time(me)), ("kube-apiserver", me, "1")])
    assert cli.main(["status", "--state-dir", str(tmp_path)]) == cli.EXIT_FAILED
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("running") and lines[1].endswith("gone"), lines


def test_start_without_the_build_script_or_a_bin_dir_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(state, "BUILD_SCRIPT", tmp_path / "absent.sh")
    assert cli.main(["start", "--state-dir", str(tmp_path / "s")]) == cli.EXIT_SETUP
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --bin-dir" in err
    assert not (tmp_path / "s").exists()


def test_build_with_node_and_names_is_refused_as_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["build", "--node", "etcd"]) == 2
    assert "name none" in capsys.readouterr().err


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


def test_help_names_the_four_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "localcluster", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert "{build,start,stop,status}" in done.stdout
