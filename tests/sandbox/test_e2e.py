"""End to end: a real Polyaxon CE server and the local agent on a free loopback port.

One sandbox (conftest.py) serves the whole session (starting it costs ~5 s). The tests submit small DAGs
whose ops run real processes that track to the server, check the results through the REST
API and a headless Chromium, and the teardown proves nothing is left running.

The runs-table screenshot is kept at ``artifacts/sandbox/runs-table.png`` (or under
``$SANDBOX_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sandbox.commands import submit_and_follow
from sandbox.config import DEFAULT_OWNER, REPO_ROOT
from sandbox.errors import RunFailedError
from sandbox.pipeline import get_run, log_lines, pipeline_ops, runs_table_url, submit
from tests.browser import chromium, render, runs_table

from .conftest import polyaxon_cli, write_profiles

pytestmark = [pytest.mark.slow, pytest.mark.integration]

HERE = Path(__file__).parent
FILES = HERE / "polyaxonfiles"
COMPONENTS = FILES / "components"
PROJECT = "e2e"
ARTIFACTS = Path(os.environ.get("SANDBOX_TEST_ARTIFACTS") or REPO_ROOT / "artifacts" / "sandbox")


@pytest.fixture(scope="module")
def mini_pipeline(sandbox):
    """The mini pipeline, run once through the component hub (hubRef twin)."""
    uuid_, ops = submit_and_follow(
        sandbox, FILES / "mini-pipeline.yaml", {}, PROJECT, True, 240, COMPONENTS, echo=print
    )
    return uuid_, ops


def test_every_op_succeeds_in_dag_order(sandbox, mini_pipeline):
    uuid_, _ = mini_pipeline
    client = sandbox.client
    assert get_run(client, DEFAULT_OWNER, PROJECT, uuid_).status == "succeeded"
    ops = {op.name: get_run(client, DEFAULT_OWNER, PROJECT, op.uuid) for op in
           pipeline_ops(client, DEFAULT_OWNER, PROJECT, uuid_)}  # fmt: skip
    assert set(ops) == {"prepare", "train-a", "train-b"}
    assert all(op.status == "succeeded" for op in ops.values())
    order = sorted(ops.values(), key=lambda op: op.started_at)
    assert [op.name for op in order] == ["prepare", "train-a", "train-b"]
    for before, after in zip(order, order[1:], strict=False):
        assert before.finished_at <= after.started_at


def test_training_runs_carry_inputs_stage_outputs_and_logs(sandbox, mini_pipeline):
    uuid_, _ = mini_pipeline
    client = sandbox.client
    claim = sandbox.agent.local_mounts["/checkpoints"]
    for op in pipeline_ops(client, DEFAULT_OWNER, PROJECT, uuid_):
        if not op.name.startswith("train-"):
            continue
        run = get_run(client, DEFAULT_OWNER, PROJECT, op.uuid)
        profile = {"train-a": "baseline", "train-b": "throughput"}[op.name]
        assert run.inputs["storage_profile"] == profile
        # /checkpoints was mapped to the sandbox claim path in the command's args.
        run_dir = claim / f"{profile}-run" / op.uuid
        assert run.inputs["checkpoint_dir"] == str(run_dir)
        assert sorted(p.name for p in run_dir.glob("step-*"))
        for stage in ("serialize", "write", "fsync", "pause", "total"):
            assert isinstance(run.outputs[f"ckpt_{stage}_s_median"], float), stage
        for key in ("ckpt_pause_s_total", "runtime_s", "final_loss"):
            assert isinstance(run.outputs[key], float), key
        assert run.outputs["checkpoint_count"] == 2
        logs = _wait_for_log(client, op.uuid, "final loss")
        assert any(f"checkpoints: {run_dir}" in line for line in logs), logs
        # Each run had its own HOME and context dir under the sandbox...
        assert (sandbox.paths.runs / op.uuid / "home").is_dir()
        # ...and its metric events landed in the artifacts store, where the UI reads them.
        events = sandbox.paths.server_data / op.uuid / "events" / "metric"
        assert (events / "ckpt_pause_s.plx").exists()


def test_hub_ref_pipeline_checks_against_the_server(sandbox, mini_pipeline):
    twin = sandbox.paths.generated / "mini-pipeline.yaml"
    assert "hubRef: default/train:v1.0" in twin.read_text()
    done = polyaxon_cli(["check", "-f", str(twin)], sandbox.url, sandbox.paths.cli_home)
    assert done.returncode == 0 and "valid" in done.stdout, done.stdout + done.stderr
    # An unregistered version does not resolve: the check really asks the hub.
    bad = twin.with_name("bad.yaml")
    bad.write_text(twin.read_text().replace("train:v1.0", "train:v9.9"))
    done = polyaxon_cli(["check", "-f", str(bad)], sandbox.url, sandbox.paths.cli_home)
    assert "not valid" in done.stdout + done.stderr
    # Polyaxon's own CLI registers against the sandbox too; then that version resolves.
    component = COMPONENTS / "train" / "v1.0.yaml"
    done = polyaxon_cli(
        ["components", "register", "-f", str(component), "-p", "default/train", "-ver", "v9.9"],
        sandbox.url, sandbox.paths.cli_home,
    )  # fmt: skip
    assert "created successfully" in done.stdout, done.stdout + done.stderr
    done = polyaxon_cli(["check", "-f", str(bad)], sandbox.url, sandbox.paths.cli_home)
    assert done.returncode == 0 and "valid" in done.stdout, done.stdout + done.stderr


def test_a_failing_op_fails_the_pipeline_and_the_agent_keeps_serving(sandbox):
    # train-b's checkpoint dir lies on a medium directory that does not exist.
    with pytest.raises(RunFailedError) as err:
        submit_and_follow(
            sandbox, FILES / "mini-pipeline.yaml", {"dir_b": "missing-medium"},
            PROJECT, False, 240, echo=print,
        )  # fmt: skip
    report = str(err.value)
    assert "ended failed" in report
    assert "op train-b failed: exit code 3" in report
    # The reason, from the run's own output, in the status message and the log tail.
    assert report.count("neither does") >= 2 and "/missing-medium " in report, report
    # The storage-profile op itself fails when the profile's medium directory is missing.
    profiles = sandbox.paths.root / "profiles-with-missing.yaml"
    write_profiles(
        sandbox.paths.root,
        sandbox.paths.root / "shm-unused",
        extra={"checkpoint-gone": {"path": str(sandbox.paths.root / "no-such-medium")}},
    ).rename(profiles)
    with pytest.raises(RunFailedError) as err:
        submit_and_follow(
            sandbox, FILES / "switch-then-train.yaml",
            {"target_class": "checkpoint-gone", "profiles_file": str(profiles)},
            PROJECT, False, 240, echo=print,
        )  # fmt: skip
    report = str(err.value)
    assert "op switch failed" in report, report
    # The hook's reason, in the run's status and in its log tail.
    assert report.count("no-such-medium of profile checkpoint-gone does not exist") >= 2, report
    assert sandbox.agent.local_mounts["/checkpoints"].resolve() != (
        sandbox.paths.root / "no-such-medium"
    )
    # The next run is served as usual.
    uuid_, _ = submit_and_follow(sandbox, FILES / "echo-job.yaml", {}, PROJECT, False, 120)
    assert get_run(sandbox.client, DEFAULT_OWNER, PROJECT, uuid_).status == "succeeded"
    _wait_for_log(sandbox.client, uuid_, "still serving")


def test_a_stop_request_ends_the_run_process(sandbox):
    from sandbox.components import pipeline_twin

    twin = pipeline_twin(FILES / "slow-job.yaml", sandbox.paths.generated / "slow.yaml", None)
    client = sandbox.client
    run_uuid = submit(client, sandbox.url, twin, DEFAULT_OWNER, PROJECT, {})
    deadline = time.monotonic() + 60
    while get_run(client, DEFAULT_OWNER, PROJECT, run_uuid).status != "running":
        assert time.monotonic() < deadline, "the slow job never started"
        time.sleep(0.5)
    home = str(sandbox.paths.runs / run_uuid / "home")
    assert _procs_with_home(home), "no local process for the running run"
    done = polyaxon_cli(
        ["ops", "stop", "-p", f"{DEFAULT_OWNER}/{PROJECT}", "-uid", run_uuid, "--yes"],
        sandbox.url, sandbox.paths.cli_home,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    deadline = time.monotonic() + 60
    while get_run(client, DEFAULT_OWNER, PROJECT, run_uuid).status != "stopped":
        assert time.monotonic() < deadline, "the run was not reported stopped"
        time.sleep(0.5)
    assert not _procs_with_home(home)


def _wait_for_log(client, run_uuid: str, needle: str, timeout: float = 60) -> list[str]:
    """The run's log once it has ``needle``: a run marks itself succeeded when its tracking
    ends, a moment before its process exits and the agent uploads the last lines."""
    deadline = time.monotonic() + timeout
    while True:
        logs = log_lines(client, DEFAULT_OWNER, PROJECT, run_uuid)
        if any(needle in line for line in logs) or time.monotonic() > deadline:
            assert any(needle in line for line in logs), logs[-5:]
            return logs
        time.sleep(1)


def _procs_with_home(home: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["environ"]):
        try:
            if (proc.info["environ"] or {}).get("HOME") == home:
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.skipif(chromium() is None, reason="Debian package chromium is not installed")
def test_browser_renders_the_runs_table_with_profiles_and_stage_outputs(sandbox, mini_pipeline):
    uuid_, _ = mini_pipeline
    url = runs_table_url(sandbox.url, DEFAULT_OWNER, PROJECT, uuid_)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "runs-table.png"
    dom = render(url, "--dump-dom")
    render(url, f"--screenshot={shot}")
    print(f"runs-table screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    by_name = {r.get("name"): r for r in runs_table(dom)}
    assert {"train-a", "train-b", "prepare"} <= set(by_name), by_name
    assert by_name["train-a"]["in.storage_profile"] == "baseline"
    assert by_name["train-b"]["in.storage_profile"] == "throughput"
    for name in ("train-a", "train-b"):
        assert float(by_name[name]["out.ckpt_pause_s_total"]) > 0
    # A run's page, logs tab: the log lines the agent uploaded, as the UI streams them.
    (train_a,) = [op for op in pipeline_ops(sandbox.client, DEFAULT_OWNER, PROJECT, uuid_)
                  if op.name == "train-a"]  # fmt: skip
    logs = render(f"{sandbox.url}/ui/{DEFAULT_OWNER}/{PROJECT}/runs/{train_a.uuid}/logs",
                  "--dump-dom")  # fmt: skip
    assert "final loss" in logs, logs[-3000:]


def test_cli_stop_command_is_printed(sandbox):
    done = subprocess.run(
        [sys.executable, "-m", "sandbox", "status", "--root", str(sandbox.paths.root)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert sandbox.url in done.stdout


def test_stopping_the_sandbox_ends_a_running_run(tmp_path):
    """``stop`` while a run is going: the run is stopped through the API (so it does not
    resume at the next start) and the agent ends its process group, then the agent and the
    server stop; nothing of this sandbox is left running."""
    from checkpoint_storage_bench.ports import free_port
    from sandbox.commands import stop
    from sandbox.components import pipeline_twin
    from sandbox.config import SandboxPaths, load_agent_settings
    from sandbox.local import LocalRuntime
    from sandbox.server import Sandbox

    from .conftest import shm_dir, wait_gone, write_profiles

    shm = shm_dir(tmp_path)
    profiles = write_profiles(tmp_path, shm / "media")
    sb = Sandbox(SandboxPaths(tmp_path), load_agent_settings(tmp_path, profiles_file=profiles),
                 port=free_port())  # fmt: skip
    try:
        LocalRuntime().start(sb, DEFAULT_OWNER, "stop-test", echo=print)
        twin = pipeline_twin(FILES / "slow-job.yaml", sb.paths.generated / "slow.yaml", None)
        run_uuid = submit(sb.client, sb.url, twin, DEFAULT_OWNER, "stop-test", {})
        deadline = time.monotonic() + 60
        while get_run(sb.client, DEFAULT_OWNER, "stop-test", run_uuid).status != "running":
            assert time.monotonic() < deadline, "the slow job never started"
            time.sleep(0.5)
        home = str(sb.paths.runs / run_uuid / "home")
        assert _procs_with_home(home)
        # The server knows the run ended stopped: a later start will not resume it.
        assert sb.stop_unfinished_runs() == [run_uuid]
        assert get_run(sb.client, DEFAULT_OWNER, "stop-test", run_uuid).status == "stopped"
        assert not _procs_with_home(home)
    finally:
        stopped = stop(sb)
        left = wait_gone(tmp_path)
        shutil.rmtree(shm, ignore_errors=True)
    assert [s.split(" ")[0] for s in stopped] == ["agent", "server"], stopped
    assert not left, [p.info["cmdline"] for p in left]
    assert f"({run_uuid}) ended with exit code" in sb.paths.agent_log.read_text()


def test_starting_again_on_another_port_is_refused(sandbox):
    from checkpoint_storage_bench.ports import free_port
    from sandbox.errors import PortInUseError
    from sandbox.server import Sandbox

    other = Sandbox(sandbox.paths, sandbox.agent, port=free_port())
    with pytest.raises(PortInUseError, match=f"already runs on port {sandbox.port}"):
        other.start_server()
    sandbox.start_server()  # the same port: nothing to do, it is up
    assert sandbox.healthy()
