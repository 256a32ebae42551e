"""The `agent_node` tier: Polyaxon's own agent and the operator stand-in on the local node.

Needs what the node tier needs (tests/node: root, the node's binaries, Debian's containerd,
runc, CNI plugins, umoci, mmdebstrap) and network for pip the first time (Polyaxon's init
and sidecar images are built with it, then cached). It changes the machine like the node
tier, so it runs only when asked: ``CSB_NODE_TIER=1``. Without it, or off CI without what it
needs, the tier is one SKIPPED reason per test; with ``CI`` and ``CSB_NODE_TIER=1`` it never
skips.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_storage_bench.ports import free_port
from localcluster.node import Node
from sandbox.commands import stop
from sandbox.config import NODE_BRIDGE_ADDRESS, SandboxPaths
from sandbox.on_node import NodeRuntime, server_settings
from sandbox.server import Sandbox
from tests.agent_node.runs import OWNER, PROJECT
from tests.node.conftest import skip_tier_unless_ready, started_node


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_tier_unless_ready(items, Path(__file__).parent, "agent_node")


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    yield from started_node("agent", tier="agent_node")


@pytest.fixture(scope="module")
def sandbox_on_node(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """The sandbox's server on the bridge, Polyaxon's agent and the operator stand-in."""
    root = tmp_path_factory.mktemp("sandbox")
    paths = SandboxPaths(root)
    sb = Sandbox(
        paths=paths,
        agent=server_settings(root),
        host=NODE_BRIDGE_ADDRESS,
        port=free_port(NODE_BRIDGE_ADDRESS),
    )
    try:
        NodeRuntime(node.state_dir).start(sb, OWNER, PROJECT)
        yield sb
    finally:
        stopped = stop(sb)
        print("sandbox stopped:", stopped)
