"""The runtime seam (sandbox/runtime.py): the commands reach the local process agent and the
node's Polyaxon agent through one interface, and the server knows neither."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import psutil
import pytest
import yaml

from sandbox import commands
from sandbox.config import REPO_ROOT, SandboxPaths, load_agent_settings
from sandbox.local import LocalRuntime
from sandbox.on_node import NodeRuntime
from sandbox.processes import read_pid
from sandbox.runtime import Runtime
from sandbox.server import Sandbox

SANDBOX = REPO_ROOT / "sandbox"


def _imports(module: Path) -> set[str]:
    """Every ``sandbox.*`` module (and name) ``module`` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sandbox"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("sandbox"))
    return found


def test_the_server_and_the_runtimes_import_no_runtime_but_their_base():
    # The server is below both runtimes; neither runtime reaches into the other, nor into
    # the commands above them, nor into a private name of another module.
    assert not {"sandbox.on_node", "sandbox.local", "sandbox.commands"} & _imports(
        SANDBOX / "server.py"
    )
    for name, other in (("local.py", "sandbox.on_node"), ("on_node.py", "sandbox.local")):
        imported = _imports(SANDBOX / name)
        assert other not in imported and "sandbox.commands" not in imported, name
    for path in SANDBOX.glob("*.py"):
        private = [n for n in _imports(path) if n.rsplit(".", 1)[-1].startswith("_")]
        assert private == [], (path.name, private)


def test_the_cli_has_no_branch_on_the_runtime():
    tree = ast.parse((SANDBOX / "cli.py").read_text())
    tests = [ast.unparse(n.test) for n in ast.walk(tree) if isinstance(n, ast.If | ast.IfExp)]
    assert not [t for t in tests if "node" in t or "runtime" in t], tests


@pytest.mark.parametrize("runtime", [LocalRuntime, NodeRuntime])
def test_each_runtime_is_a_runtime_with_its_own_processes(runtime):
    assert issubclass(runtime, Runtime) and runtime.processes
    assert commands.runtime(runtime.name).__class__ is runtime


def test_an_unknown_runtime_is_a_config_error():
    from sandbox.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown runtime 'cloud'"):
        commands.runtime("cloud")


def _process_of(root: Path) -> int:
    """A process in a session of its own, working in ``root`` (as the runtimes start theirs)."""
    proc = subprocess.Popen(["sleep", "60"], cwd=root, start_new_session=True)
    return proc.pid


def test_stop_ends_every_runtimes_processes_and_status_reports_the_running_one(tmp_path):
    paths = SandboxPaths(tmp_path / "root")
    paths.state.mkdir(parents=True)
    sb = Sandbox(paths, load_agent_settings(paths.root))
    node = NodeRuntime(tmp_path / "no-node")
    assert commands.running_runtime(sb).name == "local"  # nothing runs: the default
    pids = {name: _process_of(paths.root) for name in node.processes}
    for name, pid in pids.items():
        node.pid_file(paths, name).write_text(str(pid))
    try:
        assert commands.running_runtime(sb).name == "node"
        info = commands.running_runtime(sb).status(sb)
        assert {info["plx-agent_pid"], info["operator_pid"]} == set(pids.values())
        assert info["server_healthy"] is False and "agent_pid" not in info
        stopped = commands.stop(sb)
    finally:
        for pid in pids.values():
            if psutil.pid_exists(pid):
                psutil.Process(pid).kill()
    assert sorted(stopped) == sorted(f"{n} (pid {p})" for n, p in pids.items())
    for pid in pids.values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    assert not any(read_pid(node.pid_file(paths, n)) for n in node.processes)
    assert commands.stop(sb) == []  # nothing left: nothing to do


def test_start_on_node_without_a_node_is_refused_with_exit_3(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sandbox", "start", "--on-node", "--root", str(tmp_path),
         "--node-state", str(tmp_path / "no-node")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "python -m localcluster start --node" in done.stderr
    assert not (tmp_path / ".sandbox" / "server.pid").exists()


@dataclasses.dataclass
class RecordingRuntime(Runtime):
    """A runtime that starts nothing and records what the demo asked of it."""

    calls: list[str] = dataclasses.field(default_factory=list)

    name: ClassVar[str] = "recording"
    processes: ClassVar[tuple[str, ...]] = ("recorder",)
    hub: ClassVar[bool] = False

    def sandbox(self, paths, host, port, agent_file, profiles_file):
        return Sandbox(paths, load_agent_settings(paths.root), host=host, port=port)

    def start(self, sb, owner, project, echo=print):
        self.calls.append(f"start {owner}/{project}")
        return sb

    def place(self, sb, echo=print):
        self.calls.append("place")
        return {"image": "where-the-pods-run:1", "backend": "kubernetes"}


def test_the_demo_starts_the_runtime_and_submits_where_it_places_the_pods(tmp_path, monkeypatch):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump({"kind": "component", "inputs": [
        {"name": "image", "type": "str"}, {"name": "backend", "type": "str"},
        {"name": "steps", "type": "int"}]}))  # fmt: skip
    rt = RecordingRuntime()
    sb = rt.sandbox(SandboxPaths(tmp_path), "127.0.0.1", 8123, None, None)
    submitted = []

    def submit_pipeline(sb, polyaxonfile, values, project, hub, echo=print):
        submitted.append((values, hub))
        return "uuid-1"

    monkeypatch.setattr(commands, "submit_pipeline", submit_pipeline)
    monkeypatch.setattr(commands, "follow", lambda *a, **k: [])
    monkeypatch.setattr(commands, "print_comparison", lambda *a, **k: None)
    said = []
    assert commands.run_demo(rt, sb, "p", pipeline, {"steps": "3"}, 60, said.append) == "uuid-1"
    assert rt.calls == ["start default/p", "place"]
    # The runtime's placement wins over the demo's defaults, the user's overrides over both.
    assert submitted == [({"image": "where-the-pods-run:1", "backend": "kubernetes",
                           "steps": "3"}, False)]  # fmt: skip
    assert any(line.startswith("runs table: ") for line in said)


def test_status_asks_the_server_where_it_last_listened(tmp_path):
    """The node runtime's server listens on the node's bridge, not on loopback: ``status``
    (like ``stop``) asks it there, unless ``--host`` names another address."""
    import http.server
    import json
    import threading

    class Healthz(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    # Another loopback address stands for the bridge, which needs the node.
    server = http.server.HTTPServer(("127.0.0.2", 0), Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        paths = SandboxPaths(tmp_path)
        paths.state.mkdir(parents=True)
        port = server.server_address[1]
        paths.info.write_text(json.dumps({"host": "127.0.0.2", "port": port}))
        done = subprocess.run(
            [sys.executable, "-m", "sandbox", "status", "--root", str(tmp_path), "-o", "json"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        server.shutdown()
    info = json.loads(done.stdout)
    assert info["url"] == f"http://127.0.0.2:{port}" and info["server_healthy"] is True, info
    assert done.returncode == 6  # the server answers, but no agent runs
    assert "the sandbox's agent is not running" in done.stderr
