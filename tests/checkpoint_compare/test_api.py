"""Loading runs from a real Polyaxon CE server (haupt sandbox on loopback)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkpoint_compare.cli import main
from checkpoint_storage_bench.ports import free_port
from tests.checkpoint_compare.recorded import (
    write_fio_run,
    write_hook_run,
    write_repeats,
    write_training_run,
)

HAUPT = Path(sys.executable).with_name("haupt")
REPO = Path(__file__).resolve().parents[2]
OWNER, PROJECT = "default", "compare-test"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not HAUPT.exists(), reason="haupt[sandbox] is not installed"),
]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """A Polyaxon CE server with one project; yields its URL."""
    port, root = free_port(), tmp_path / "server"
    (root / "home").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYAXON_")}
    env |= {
        "HOME": str(root / "home"),
        "POLYAXON_UI_IN_SANDBOX": "true",
        "POLYAXON_UI_OFFLINE": "true",
        "POLYAXON_DB_OPTIONS": json.dumps({"timeout": 30, "transaction_mode": "IMMEDIATE"}),
        "POLYAXON_ARCHIVES_ROOT": str(root / "archives"),
    }
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(HAUPT), "sandbox", "start", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--path", str(root / "data")],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # a busy disk slows its migrations
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (root / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.5)
        from polyaxon.client import ProjectClient

        ProjectClient(owner=OWNER, client=_polyaxon(url)).create({"name": PROJECT})
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _polyaxon(url: str):  # noqa: ANN202
    from polyaxon.client import ClientConfig, PolyaxonClient

    return PolyaxonClient(config=ClientConfig(host=url, verify_ssl=False), token="no-auth")


def _client(url: str, run_uuid: str):  # noqa: ANN202
    from polyaxon.client import RunClient

    return RunClient(owner=OWNER, project=PROJECT, run_uuid=run_uuid or None, client=_polyaxon(url))


def _report(tmp_path: Path, *args: str) -> tuple[int, str, dict | None]:
    out = tmp_path / "report.json"
    out.unlink(missing_ok=True)
    result = CliRunner().invoke(main, [*args, "--json", str(out), "--no-track"])
    return result.exit_code, result.output, json.loads(out.read_text()) if out.exists() else None


def test_runs_pushed_to_the_server(server: str, tmp_path: Path, runs_root: Path, monkeypatch):
    monkeypatch.setenv("POLYAXON_OWNER", OWNER)
    monkeypatch.setenv("POLYAXON_PROJECT", PROJECT)
    uuids = {}
    for profile, pauses, runtime in (
        ("checkpoint-baseline", [2.0, 2.2, 1.8, 2.1, 1.9, 2.0], 100.0),
        ("checkpoint-throughput", [1.0, 1.1, 0.9, 1.05, 0.95, 1.0], 90.0),
    ):
        write_hook_run(profile)
        write_fio_run(bw_mbps=100, lat_p99_us=1000)
        uuids[profile] = write_repeats(profile, pauses, runtime_s=runtime)
    failed = write_training_run("checkpoint-fast", [0.5], 50.0, fail="No space left on device")
    push = subprocess.run(
        [str(Path(sys.executable).with_name("polyaxon")), "ops", "push", "-a",
         "-p", f"{OWNER}/{PROJECT}"],
        env={**os.environ, "POLYAXON_HOST": server}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert push.returncode == 0, push.stdout + push.stderr
    shutil.rmtree(runs_root)  # from here on, the server is the only copy

    args = ["--api-host", server, "--project", f"{OWNER}/{PROJECT}"]
    code, output, report = _report(
        tmp_path, *args, *[a for p, us in uuids.items() for u in us for a in ("--run", f"{p}={u}")]
    )
    assert code == 0, output
    assert report["verdict"] == "checkpoint-throughput"
    base = report["profiles"]["checkpoint-baseline"]
    # per-checkpoint figures came through the server's metric events
    assert [v for _, v in base["pause_per_checkpoint"]][:6] == [2.0, 2.2, 1.8, 2.1, 1.9, 2.0]
    assert base["stages"]["pause"]["min"] == 1.8
    assert base["warmup_pause_s_median"] == pytest.approx(2.0, abs=0.02)

    code, output, _ = _report(tmp_path, *args, "--run", "0" * 32)
    assert code == 3 and "HTTP 404" in output

    code, output, _ = _report(
        tmp_path, *args, "--run", uuids["checkpoint-baseline"][0], "--run", failed
    )
    assert code == 3
    assert f"profile checkpoint-fast: run train-checkpoint-fast ({failed[:8]}) failed" in output
    assert "RuntimeError: No space left on device" in output


def _op_env(server: str, tmp_path: Path, run_uuid: str) -> dict[str, str]:
    """The environment an agent gives the op ``run_uuid``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYAXON_")}
    return env | {
        "PYTHONPATH": str(REPO),
        "POLYAXON_HOST": server,
        "POLYAXON_IS_MANAGED": "true",
        "POLYAXON_RUN_INSTANCE": f"{OWNER}.{PROJECT}.runs.{run_uuid}",
        "POLYAXON_CONTEXT_ROOT": str(tmp_path / "plx-context"),
        "POLYAXON_TRACKING_FLUSH_DELAY": "0",
    }


def _wait_for(url: str, run_uuid: str, status: str) -> None:
    client = _client(url, run_uuid)
    deadline = time.monotonic() + 30
    while client.refresh_data() or client.run_data.status != status:
        assert time.monotonic() < deadline, f"{run_uuid} never became {status}"
        time.sleep(0.3)


def test_children_of_a_pipeline(server: str, tmp_path: Path) -> None:
    from polyaxon.polyaxonfile import check_polyaxonfile

    dag = tmp_path / "pipeline.yaml"
    ops = "\n".join(
        f"""    - name: train-{p}
      cache: {{disable: true}}
      component: {{run: {{kind: job, container: {{image: busybox, command: ["true"]}}}}}}"""
        for p in ("baseline", "throughput", "compare")
    )
    dag.write_text(
        f"kind: component\nname: two-profiles\nrun:\n  kind: dag\n  operations:\n{ops}\n"
    )
    pipeline = _client(server, "")
    pipeline.create(content=check_polyaxonfile(polyaxonfile=str(dag), is_cli=False, verbose=False))
    deadline = time.monotonic() + 30
    while len(children := pipeline.list_children(limit=10).results or []) < 3:
        assert time.monotonic() < deadline, "the pipeline's operations were never created"
        time.sleep(0.3)

    # What the trainer would log from inside each operation (outputs only: no metric events).
    compare_op = next(c for c in children if c.name == "train-compare")
    for child in children:
        if child is compare_op:
            continue
        profile = "checkpoint-" + child.name.removeprefix("train-")
        pause = 2.0 if "baseline" in profile else 1.0
        run = _client(server, child.uuid)
        run.log_inputs(storage_profile=profile, model_size_bytes=2**20, checkpoint_format="raw",
                       dataset_seed=0, durability="fsync")  # fmt: skip
        # 40 checkpoints 1 s apart in pause: a 40 s shorter run that checkpoints explain.
        run.log_outputs(runtime_s=100 + 40 * pause, checkpoint_count=40, ckpt_pause_s_median=pause,
                        ckpt_pause_s_min=pause - 0.1, ckpt_pause_s_max=pause + 0.1,
                        final_loss=2.5)  # fmt: skip
        run.log_status("succeeded", reason="Test")
        _wait_for(server, child.uuid, "succeeded")

    # The operations ran at the same moment here, so "the profile run first" is ambiguous.
    args = ["--api-host", server, "--project", f"{OWNER}/{PROJECT}", "--pipeline",
            pipeline.run_uuid, "--baseline", "checkpoint-baseline"]  # fmt: skip
    code, output, report = _report(tmp_path, *args)
    assert code == 0, output
    # Outputs alone (no per-checkpoint events) give medians but no interval: no pause
    # difference counts, and the report says why.
    assert report["verdict"] == "no measurable difference"
    comp = report["comparisons"][0]
    assert comp["pause"]["low"] is None and "no per-checkpoint pauses" in comp["pause"]["method"]
    assert report["outputs"]["pause_speedup"] == pytest.approx(2.0)
    assert report["profiles"]["checkpoint-throughput"]["stages"]["pause"]["median"] == 1.0
    assert report["profiles"]["checkpoint-baseline"]["pause_per_checkpoint"] == []

    # Inside the pipeline's compare op: no source given, the op compares its own pipeline's
    # runs and logs the verdict as its outputs.
    env = _op_env(server, tmp_path, compare_op.uuid)
    op = subprocess.run(
        [sys.executable, "-m", "checkpoint_compare", "--baseline", "checkpoint-baseline",
         "--max-pause-s", "5"],
        env=env, capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert op.returncode == 0, op.stdout[-2000:] + op.stderr[-3000:]
    assert "VERDICT: no measurable difference" in op.stdout
    client = _client(server, compare_op.uuid)
    deadline = time.monotonic() + 30
    while client.refresh_data() or "verdict" not in (client.run_data.outputs or {}):
        assert time.monotonic() < deadline, "the compare op's outputs never arrived"
        time.sleep(0.3)
    outputs = client.run_data.outputs
    assert outputs["verdict"] == "no measurable difference"
    assert outputs["pause_speedup"] == pytest.approx(2.0)
    assert outputs["runtime_delta_s"] == pytest.approx(-40.0)
    # Too few per-checkpoint figures to bound a pause with confidence: none meets a budget.
    assert outputs["recommended_profile"] == "none"
    # The verdict is the readme of the compare op and of the pipeline: the pipeline's own
    # page in the UI shows it.
    assert "**Verdict: no measurable difference**" in client.run_data.readme
    pipeline.refresh_data()
    assert pipeline.run_data.readme == client.run_data.readme
    assert "**Recommended: none**" in pipeline.run_data.readme


def test_the_verdict_is_the_readme_of_the_outermost_pipeline(server: str, tmp_path: Path) -> None:
    """The profiles pipeline runs each stage as a pipeline of its own and gives the compare
    op its runs by uuid (joins): the op still finds, from its own run on the server, the
    pipeline the user started, and its page shows the verdict."""
    from polyaxon.polyaxonfile import check_polyaxonfile

    ops = "\n".join(
        f"""          - name: {name}
            cache: {{disable: true}}
            component: {{run: {{kind: job, container: {{image: busybox, command: ["true"]}}}}}}"""
        for name in ("train-baseline", "train-throughput", "compare")
    )
    dag = tmp_path / "outer.yaml"
    dag.write_text(
        "kind: component\nname: outer\nrun:\n  kind: dag\n  operations:\n"
        "    - name: stage\n      cache: {disable: true}\n      component:\n"
        f"        run:\n          kind: dag\n          operations:\n{ops}\n"
    )
    outer = _client(server, "")
    outer.create(content=check_polyaxonfile(polyaxonfile=str(dag), is_cli=False, verbose=False))
    deadline = time.monotonic() + 60
    while not (stages := outer.list_children(limit=10).results or []):
        assert time.monotonic() < deadline, "the outer pipeline's stage was never created"
        time.sleep(0.3)
    stage = _client(server, stages[0].uuid)
    while len(children := stage.list_children(limit=10).results or []) < 3:
        assert time.monotonic() < deadline, "the stage's operations were never created"
        time.sleep(0.3)
    compare_op = next(c for c in children if c.name == "compare")
    runs = []
    for child in children:
        if child is compare_op:
            continue
        profile = "checkpoint-" + child.name.removeprefix("train-")
        run = _client(server, child.uuid)
        run.log_inputs(storage_profile=profile, model_size_bytes=2**20, checkpoint_format="raw",
                       dataset_seed=0, durability="fsync")  # fmt: skip
        run.log_outputs(runtime_s=100.0, checkpoint_count=4, ckpt_pause_s_median=1.0,
                        ckpt_pause_s_min=0.9, ckpt_pause_s_max=1.1, final_loss=2.5)  # fmt: skip
        run.log_status("succeeded", reason="Test")
        _wait_for(server, child.uuid, "succeeded")
        runs += ["--run", f"{profile}={child.uuid}"]

    env = _op_env(server, tmp_path, compare_op.uuid)
    op = subprocess.run(
        # --project as the compiled compare op gives it (its own project, by name)
        [sys.executable, "-m", "checkpoint_compare", "--project", f"{OWNER}/{PROJECT}", *runs,
         "--baseline", "checkpoint-baseline"],
        env=env, capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert op.returncode == 0, op.stdout[-2000:] + op.stderr[-3000:]
    assert f"the verdict is the readme of pipeline {outer.run_uuid}" in op.stdout
    client = _client(server, compare_op.uuid)
    deadline = time.monotonic() + 30
    while client.refresh_data() or not client.run_data.readme:
        assert time.monotonic() < deadline, "the compare op's readme never arrived"
        time.sleep(0.3)
    outer.refresh_data()
    assert "**Verdict: no measurable difference**" in client.run_data.readme
    assert outer.run_data.readme == client.run_data.readme
