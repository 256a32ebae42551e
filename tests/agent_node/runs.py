"""Runs of the agent tier: submitted with the ``polyaxon`` CLI as a user runs it against the
sandbox's server, onto the queue of Polyaxon's agent on the node; their state as the server
holds it, and their pods on the node."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localcluster.node import Node
from sandbox.pipeline import get_run, run_client
from sandbox.server import Sandbox
from tests.kube.cluster import NAMESPACE, wait_for

OWNER = "default"
PROJECT = "agent-node"
QUEUE = "agent/queue"
"""The queue of the agent the sandbox starts on the node."""
# The CLI wraps its output at the terminal width (80 without one): the uuid may follow a
# line break.
RUN_CREATED = re.compile(r"A new run was created:\s+\S+@([0-9a-f]{32})")


def polyaxon(sb: Sandbox, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The ``polyaxon`` CLI of the venv, as a user runs it against this server."""
    cli = Path(sys.executable).with_name("polyaxon")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYAXON_")}
    sb.paths.cli_home.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(sb.paths.cli_home), POLYAXON_HOST=sb.url, COLUMNS="200")
    return subprocess.run(
        [str(cli), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def polyaxon_run(sb: Sandbox, polyaxonfile: Path, params: Mapping[str, str] | None = None) -> str:
    """``polyaxon run -f polyaxonfile`` on the agent's queue, each of ``params`` a ``-P``;
    the new run's uuid."""
    args = ["run", "-p", f"{OWNER}/{PROJECT}", "-f", str(polyaxonfile), "--queue", QUEUE]
    for key, value in (params or {}).items():
        args += ["-P", f"{key}={value}"]
    done = polyaxon(sb, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    match = RUN_CREATED.search(done.stdout)
    assert match, done.stdout
    return match.group(1)


def status(sb: Sandbox, uuid: str) -> str:
    return get_run(sb.client, OWNER, PROJECT, uuid).status


def statuses(sb: Sandbox, uuid: str) -> list[str]:
    _, conditions = run_client(sb.client, OWNER, PROJECT, uuid).get_statuses()
    return [c.type for c in conditions or []]


def wait_done(sb: Sandbox, uuid: str, timeout: float = 300) -> str:
    return wait_for(
        f"run {uuid} done",
        lambda: (s := status(sb, uuid)) in ("succeeded", "failed", "stopped") and s,
        timeout=timeout,
        interval=1.0,
    )


def pods_of(node: Node, uuid: str) -> list[Any]:
    return node.cluster.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"app.kubernetes.io/instance={uuid}"
    ).items
