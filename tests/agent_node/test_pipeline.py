"""The README's cluster command on the local node: ``polyaxon run -p PROJECT -f
polyaxonfiles/checkpoint-storage-profiles.yaml --queue AGENT/QUEUE -P profiles=...`` through
Polyaxon's own agent and the operator stand-in, over the node's classes, at the sandbox
demo's sizes; the project's image built from its Dockerfile (scripts/image.sh).

Slow (the project's image and a training per class): runs only with ``CSB_AGENT_PIPELINE=1``
on top of the tier's ``CSB_NODE_TIER=1``.
"""

from __future__ import annotations

import json
import os

import pytest

from sandbox import commands
from sandbox.on_node import NODE_DEMO_OVERRIDES, apply_bundle, import_image, project_image
from sandbox.pipeline import follow, get_run, log_lines
from sandbox.server import Sandbox
from tests.agent_node.conftest import PROJECT
from tests.agent_node.test_polyaxon_agent import OWNER, RUN_CREATED, polyaxon
from tests.kube.cluster import NAMESPACE
from tests.kube.node import Node

pytestmark = pytest.mark.skipif(
    not os.environ.get("CSB_AGENT_PIPELINE"), reason="slow: set CSB_AGENT_PIPELINE=1"
)
PIPELINE = commands.REPO_ROOT / "polyaxonfiles" / "checkpoint-storage-profiles.yaml"


@pytest.fixture(scope="module")
def image_in_node(node: Node) -> str:
    """The project's image, built (cached) and imported. Session-scoped so that it is built
    with the real HOME's image cache, before the per-test HOME of tests/conftest.py."""
    image, archive = project_image()
    import_image(node.state_dir, archive, image.rsplit(":", 1)[0])
    return image


def test_the_readme_command_runs_the_pipeline_on_the_node(
    node: Node, sandbox_on_node: Sandbox, image_in_node: str
) -> None:
    sb = sandbox_on_node
    image = image_in_node
    _, classes = apply_bundle(node.cluster.api, NAMESPACE)
    params = dict(commands.DEMO_PARAMS, **NODE_DEMO_OVERRIDES, image=image, api_host=sb.url)
    params = {k: v for k, v in params.items() if k in commands.declared_inputs(PIPELINE)}
    args = ["run", "-p", f"{OWNER}/{PROJECT}", "-f", str(PIPELINE), "--queue", "agent/queue"]
    args += ["-P", f"profiles={json.dumps(classes)}"]
    for key, value in params.items():
        args += ["-P", f"{key}={value}"]
    done = polyaxon(sb, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    uuid = RUN_CREATED.search(done.stdout).group(1)

    ops = follow(sb.client, OWNER, PROJECT, uuid, timeout=3000)

    assert get_run(sb.client, OWNER, PROJECT, uuid).status == "succeeded"
    jobs = [op for op in ops if op.kind == "job"]
    assert jobs and all(op.status == "succeeded" for op in jobs), [
        (op.name, op.status) for op in jobs
    ]
    for op in jobs:  # every op's log reached the server through Polyaxon's sidecar
        assert log_lines(sb.client, OWNER, PROJECT, op.uuid), op.name
    compare = commands.compare_op(ops)
    assert compare is not None
    outputs = get_run(sb.client, OWNER, PROJECT, compare.uuid).outputs or {}
    assert outputs.get("verdict"), outputs
    # The demo's pause budget (0.6 s for an 88 MB checkpoint): the baseline class's 125 MiB/s
    # misses it, a faster class meets it; the recommendation is the cheapest that does.
    assert outputs.get("recommended_profile") in classes[1:], outputs
