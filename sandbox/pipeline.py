"""Submit a pipeline to the sandbox, follow it to the end, and summarise its training runs."""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkpoint_storage_bench.contract import STAGES
from sandbox.api import DONE_STATUSES, Api
from sandbox.components import polyaxon_cli
from sandbox.errors import (
    FollowTimeoutError,
    RunFailedError,
    SandboxError,
    ServerUnavailableError,
)

RUN_UUID = re.compile(r"@([0-9a-f]{32})")
LOG_WAIT = 15.0  # seconds to wait for a failed run's log upload


def submit(
    polyaxonfile: Path,
    owner: str,
    project: str,
    host: str,
    params: dict[str, str],
    home: Path | None = None,
) -> str:
    """``polyaxon run -f FILE -p OWNER/PROJECT -P k=v ...``; returns the new run's uuid."""
    args = ["run", "-f", str(polyaxonfile), "-p", f"{owner}/{project}"]
    for key, value in params.items():
        args += ["-P", f"{key}={value}"]
    done = polyaxon_cli(args, host, home)
    out = done.stdout + done.stderr
    # Rich may still wrap a long line in the middle of the uuid.
    match = RUN_UUID.search(re.sub(r"\s+", "", out))
    if done.returncode != 0 or not match:
        raise SandboxError(f"polyaxon run -f {polyaxonfile} failed:\n{out.strip()[-2000:]}")
    return match.group(1)


def follow(
    api: Api,
    owner: str,
    project: str,
    uuid: str,
    timeout: float,
    echo: Callable[[str], None] = print,
    every: float = 2.0,
) -> list[dict[str, Any]]:
    """Print each op's status changes until the pipeline is done; return its ops.

    Raises:
        RunFailedError: The pipeline did not succeed (with the failed op's log tail).
        FollowTimeoutError: ``timeout`` passed first; the pipeline is then stopped, so it
            does not go on running unwatched.
        ServerUnavailableError: The server stopped answering.
    """
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        pipeline = api.run(owner, project, uuid)
        ops = api.pipeline_runs(owner, project, uuid)
        for op in ops:
            if seen.get(op["uuid"]) != op["status"]:
                seen[op["uuid"]] = op["status"]
                echo(f"  {op['name']:<22} {op['status']}")
        if pipeline["status"] in DONE_STATUSES:
            break
        if time.monotonic() > deadline:
            try:
                api.stop(owner, project, uuid)
                stopped = "; stopped it"
            except ServerUnavailableError as exc:
                stopped = f"; could not stop it: {exc}"
            raise FollowTimeoutError(
                f"pipeline {uuid} still {pipeline['status']} after {timeout:.0f}s{stopped}"
            )
        time.sleep(every)
    if pipeline["status"] != "succeeded":
        raise RunFailedError(failure_report(api, owner, project, pipeline, ops))
    return ops


def failure_report(
    api: Api, owner: str, project: str, pipeline: dict[str, Any], ops: list[dict[str, Any]]
) -> str:
    """Which op failed, its status message and its log tail."""
    lines = [f"pipeline {pipeline['name']} ({pipeline['uuid']}) ended {pipeline['status']}"]
    for op in ops:
        if op["status"] not in ("failed", "stopped"):
            continue
        conditions = api.statuses(owner, project, op["uuid"])
        message = next(
            (c.get("message") for c in reversed(conditions) if c.get("type") == op["status"]),
            "",
        )
        lines.append(f"op {op['name']} {op['status']}: {message}")
        logs = _logs_when_uploaded(api, owner, project, op["uuid"])
        if logs:
            lines.append(f"last lines of {op['name']}'s log:")
            lines += ["  " + line for line in logs[-20:]]
    return "\n".join(lines)


def _logs_when_uploaded(
    api: Api, owner: str, project: str, uuid: str, wait: float = LOG_WAIT
) -> list[str]:
    """The run's log lines; a run that reported its own failure may still be exiting, so
    give the agent a moment to upload them."""
    deadline = time.monotonic() + wait
    while True:
        try:
            logs = api.logs(owner, project, uuid)
        except ServerUnavailableError:
            logs = []
        if logs or time.monotonic() > deadline:
            return logs
        time.sleep(1.0)


def _fmt(value: Any, unit: str = "", digits: int = 3) -> str:
    if isinstance(value, int | float):
        return f"{value:.{digits}f}{unit}"
    return "-"


def comparison(ops: list[dict[str, Any]]) -> str:
    """A profile-by-profile table of the training runs: pause, stages, fio, runtime, loss.

    The training op is the one with a ``ckpt_pause_s_total`` output; its fio op is the op
    whose name has the same suffix (``train-baseline`` -> ``fio-baseline``).
    """
    by_suffix = {op["name"].split("-", 1)[-1]: op for op in ops if op["name"].startswith("fio")}
    rows = []
    for op in ops:
        out = op.get("outputs") or {}
        if "ckpt_pause_s_total" not in out:
            continue
        inputs = op.get("inputs") or {}
        suffix = op["name"].split("-", 1)[-1]
        fio = (by_suffix.get(suffix) or {}).get("outputs") or {}
        bw = {k: v for k, v in fio.items() if k.endswith("_bw_mbps")}
        headline = max(bw.items(), key=lambda kv: kv[1], default=None)
        stages = "  ".join(
            f"{s} {_fmt(out.get(f'ckpt_{s}_s_median'), 's')}"
            for s in STAGES
            if out.get(f"ckpt_{s}_s_median") is not None
        )
        rows.append(
            [
                f"profile {inputs.get('storage_profile', suffix)} ({op['name']})",
                f"  checkpoint pause: total {_fmt(out.get('ckpt_pause_s_total'), 's')}, "
                f"median {_fmt(out.get('ckpt_pause_s_median'), 's')}, "
                f"share {_fmt(out.get('ckpt_pause_share'), '', 3)} of the run",
                f"  stage medians:    {stages or '-'}",
                "  fio headline:     "
                + (f"{headline[0]} = {headline[1]:.1f} MB/s" if headline else "-"),
                f"  total runtime:    {_fmt(out.get('runtime_s'), 's', 2)}",
                f"  final loss:       {_fmt(out.get('final_loss'), '', 4)}",
            ]
        )
    if not rows:
        return "no training run with checkpoint outputs in this pipeline"
    return "\n".join("\n".join(r) for r in rows)


# The runs-table columns that compare profiles side by side (the UI names inputs ``in.X``
# and outputs ``out.X``).
TABLE_COLUMNS = (
    "name",
    "in.storage_profile",
    "out.ckpt_pause_s_total",
    "out.ckpt_pause_s_median",
    "out.ckpt_write_s_median",
    "out.ckpt_fsync_s_median",
    "out.runtime_s",
    "out.final_loss",
)


def runs_table_url(
    host: str, owner: str, project: str, pipeline: str | None = None, columns=TABLE_COLUMNS
) -> str:
    """The UI's runs table with the comparison columns chosen (and the pipeline's ops only)."""
    search: dict[str, str] = {"columns": ",".join(columns)}
    if pipeline:
        search["query"] = f"pipeline.uuid:{pipeline}"
    token = base64.b64encode(json.dumps(search).encode()).decode()
    return f"{host}/ui/{owner}/{project}/runs?" + urllib.parse.urlencode({"search": token})
