"""``python -m localcluster build | start | stop | status``: the one command line.

Without ``--node`` each command acts on the control plane alone (what
``scripts/controlplane.sh start|stop`` runs); with it, on the control plane and a node
(root; docs/node.md). Exit codes: 0 done (``status``: every recorded process runs),
1 the cluster failed (did not start, left something behind, is not running),
2 bad usage, 3 what the command needs is missing here (the build script, the binary cache).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from localcluster import state
from localcluster.controlplane import PIDS_FILE, ControlPlane, ControlPlaneError, stop_recorded
from localcluster.node import Node, sweep

EXIT_FAILED = 1
EXIT_SETUP = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m localcluster",
        description="A real Kubernetes control plane on loopback, and optionally one node.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, *, bin_dir: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument(
            "--node", action="store_true", help="the control plane and a node (root; docs/node.md)"
        )
        if bin_dir:
            p.add_argument(
                "--bin-dir",
                type=Path,
                help="the built binaries (default: `scripts/controlplane.sh bin-dir`)",
            )
        if name != "build":
            p.add_argument(
                "--state-dir",
                type=Path,
                help="default: $TMPDIR/csb-controlplane-UID, with --node $TMPDIR/csb-node-UID",
            )
        return p

    build = command("build", "build the missing or stale binaries (scripts/controlplane.sh)")
    build.add_argument("names", nargs="*", help="only these binaries (default: all)")
    command("start", "start and leave running")
    command("stop", "stop what `start` started and sweep what a node left (also after a crash)")
    command("status", "the recorded processes, running or gone, and the server", bin_dir=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command != "build" and args.state_dir is None:
        args.state_dir = state.default_state_dir(args.node)
    try:
        return {"build": _build, "start": _start, "stop": _stop, "status": _status}[args.command](
            args
        )
    except state.SetupError as exc:
        print(f"localcluster: {exc}", file=sys.stderr)
        return EXIT_SETUP


def _build(args: argparse.Namespace) -> int:
    if not state.BUILD_SCRIPT.is_file():
        raise state.SetupError(f"no {state.BUILD_SCRIPT} (a source checkout has it)")
    if args.node and args.names:
        print("localcluster: build --node builds every binary; name none", file=sys.stderr)
        return 2
    names = ["--node"] if args.node else args.names
    env = dict(os.environ)
    if args.bin_dir is not None:
        env["CONTROLPLANE_BIN_DIR"] = str(args.bin_dir)
    argv = ["bash", str(state.BUILD_SCRIPT), "build", *names]
    return subprocess.run(argv, env=env, check=False).returncode


def _start(args: argparse.Namespace) -> int:
    bin_dir = args.bin_dir or state.default_bin_dir()
    if args.node:
        return _start_node(bin_dir, args.state_dir)
    return _start_plane(bin_dir, args.state_dir)


def _start_plane(bin_dir: Path, state_dir: Path) -> int:
    if (state_dir / PIDS_FILE).exists():
        left = stop_recorded(state_dir)
        if left:
            print(f"stopped a previous start's processes: {', '.join(left)}", file=sys.stderr)
    shutil.rmtree(state_dir, ignore_errors=True)
    plane = ControlPlane(bin_dir, state_dir)
    try:
        plane.start()
    except ControlPlaneError as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for proc in plane.procs:
        proc.popen = None  # detach: `stop` finds them through the pid file
    print(f"started in {plane.timings['total']} s: {plane.timings}")
    print(f"server: {plane.server}")
    print(f"export KUBECONFIG={plane.admin_kubeconfig}")
    print(f"logs: {plane.logs}; stop with scripts/controlplane.sh stop")
    return 0


def _start_node(bin_dir: Path, state_dir: Path) -> int:
    node = Node(bin_dir, state_dir)
    try:
        node.start()
    except ControlPlaneError as exc:
        print(f"node: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for proc in [*node.procs, *(node.plane.procs if node.plane else [])]:
        proc.popen = None  # detach: `stop` finds them through the pid files
    print(f"started in {node.timings['total']} s: {node.timings}")
    print(f"export KUBECONFIG={node.plane.admin_kubeconfig if node.plane else ''}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    if not args.node:
        stopped = stop_recorded(args.state_dir)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    report = sweep(args.state_dir, args.bin_dir)
    report["plane"] = stop_recorded(args.state_dir)
    print(json.dumps(report))
    left = {k: v for k, v in report["left"].items() if v}
    return EXIT_FAILED if left else 0


def _status(args: argparse.Namespace) -> int:
    procs = state.recorded(args.state_dir)
    if not procs:
        print(f"not started (no pid file in {args.state_dir})")
        return EXIT_FAILED
    for proc in procs:
        print(
            f"{proc.part:<12} {proc.name:<24} {proc.pid:>8} {'running' if proc.running else 'gone'}"
        )
    server = state.server(args.state_dir)
    if server:
        print(f"server: {server}")
    kubeconfig = state.admin_kubeconfig(args.state_dir)
    if kubeconfig.exists():
        print(f"export KUBECONFIG={kubeconfig}")
    return 0 if all(p.running for p in procs) else EXIT_FAILED
