"""The sandbox's local agent: executes the runs the server queues, as local processes.

Polyaxon's CE server compiles, queues and advances DAGs but executes nothing, and Polyaxon
2.18's own process executor crashes. This agent does what a cluster agent does, on the local
machine:

1. poll the server for its state (queued runs, stop requests);
2. convert each queued run with Polyaxon's own converter (``polyaxon._local_process``);
3. run the ``polyaxon-main`` container's command with its env, in its own HOME and context
   dir, its connections' mount paths mapped to local directories, and the venv's python;
   an op that mounts the claim runs in the claim's cgroup, where block-I/O limits emulate
   the claim's volume class (``sandbox.claim``);
4. capture stdout/stderr and upload them as the run's logs (the UI's Logs tab);
5. report running / succeeded / failed, and stop runs on request.

The init and sidecar containers are not run: the run's artifacts dir (which the sidecar
would sync) is a symlink into the host-path artifacts store, so tracked events and outputs
land where the server reads them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint_storage_bench.processes import STOP_GRACE, signal_group
from localcluster.emulation.io_limits import in_cgroup
from sandbox import claim
from sandbox.config import REPO_ROOT, AgentSettings, SandboxPaths

log = logging.getLogger("sandbox.agent")

MAIN_CONTAINER = "polyaxon-main"
LOG_UPLOAD_EVERY = 3.0  # seconds between log uploads while a run is going
SHUTDOWN_GRACE = 5.0  # the same when the agent itself stops (sandbox.server gives it 10 s)
FAILURE_TAIL_LINES = 20
PYTHON_NAMES = {"python", "python3", f"python3.{sys.version_info.minor}"}


@dataclass
class LocalCommand:
    """A run's main container, made runnable on this machine."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path


def mounts_claim(content: Any, claim_connections: frozenset[str]) -> bool:
    """Whether a compiled operation mounts one of ``claim_connections`` in its main
    container (``run.connections``; an ``init`` connection is a copy, not a mount)."""
    spec = json.loads(content) if isinstance(content, str | bytes) else content
    names = ((spec or {}).get("run") or {}).get("connections") or []
    return bool(set(names) & claim_connections)


# The downward API fields a local process can answer truthfully: the "node" is this machine.
DOWNWARD_API = {
    "spec.nodeName": socket.gethostname,
    "metadata.namespace": lambda: "sandbox",
    "status.podIP": lambda: "127.0.0.1",
    "status.hostIP": lambda: "127.0.0.1",
}


def downward_api_env(content: Any) -> dict[str, str | None]:
    """Values for the main container's ``valueFrom.fieldRef`` env vars, answered locally.

    Polyaxon's local converter keeps only ``value`` and turns such a variable into the
    string ``"null"``; a field this machine cannot answer maps to None (the variable is
    removed rather than set to a made-up value).
    """
    spec = json.loads(content) if isinstance(content, str | bytes) else content
    container = ((spec or {}).get("run") or {}).get("container") or {}
    found: dict[str, str | None] = {}
    for item in container.get("env") or []:
        field = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if item.get("name") and field:
            answer = DOWNWARD_API.get(field)
            found[item["name"]] = answer() if answer else None
    return found


def without_downward_api(content: Any) -> str:
    """The compiled operation without the main container's ``valueFrom`` env vars.

    Polyaxon's local converter cannot parse them ("Could not parse env var value ...
    valueFrom") when the container has plain ``value`` vars too, and fails the whole
    conversion; the agent answers them itself (:func:`downward_api_env`).
    """
    spec = json.loads(content) if isinstance(content, str | bytes) else dict(content or {})
    container = ((spec or {}).get("run") or {}).get("container") or {}
    if container.get("env"):
        container["env"] = [item for item in container["env"] if not item.get("valueFrom")]
    return json.dumps(spec)


def _mount_pattern(mount: str) -> re.Pattern[str]:
    # The mount path as a whole path component: /checkpoints, /checkpoints/x, "=/checkpoints"
    # but not /checkpoints-old or /data/checkpoints.
    return re.compile(r"(?<![\w.\-/])" + re.escape(mount.rstrip("/")) + r"(?=/|$|[^\w.\-])")


def map_mounts(value: str, mounts: dict[str, Path]) -> str:
    """Rewrite every container mount path in ``value`` to its local directory."""
    for mount, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        value = _mount_pattern(mount).sub(lambda _m, local=local: str(local), value)
    return value


def localize(
    container: Any,
    mounts: dict[str, Path],
    home: Path,
    context_root: Path,
    base_env: dict[str, str] | None = None,
) -> LocalCommand:
    """Turn a converted ``polyaxon-main`` container into a local command.

    Args:
        container: The ``V1Container`` from Polyaxon's local-process converter.
        mounts: Container mount path -> local directory.
        home: The run's own HOME (so no child reuses a cached ``~/.polyaxon/.run``).
        context_root: The run's ``POLYAXON_CONTEXT_ROOT``.
        base_env: The environment to start from (default: the agent's, minus POLYAXON_*).

    Returns:
        argv (a leading ``python`` is the venv's interpreter), env (the repo root on
        PYTHONPATH, so ``python -m trainer`` imports) and cwd (the run's own directory, so
        relative output paths stay out of the repository).
    """
    argv = [map_mounts(str(a), mounts) for a in (container.command or []) + (container.args or [])]
    if not argv:
        raise ValueError("the run's main container has no command")
    if Path(argv[0]).name in PYTHON_NAMES:
        argv[0] = sys.executable
    env = {
        k: v
        for k, v in (base_env if base_env is not None else os.environ).items()
        if not k.startswith("POLYAXON_")
    }
    for item in container.env or []:
        pair = item.root if hasattr(item, "root") else item
        name, value = pair if isinstance(pair, tuple | list) else next(iter(pair.items()))
        env[str(name)] = map_mounts(str(value), mounts)
    env.update(
        HOME=str(home),
        POLYAXON_CONTEXT_ROOT=str(context_root),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p),
        # `python` inside a shell command (sh -c "... python -m x") is the venv's too.
        PATH=os.pathsep.join(p for p in (str(Path(sys.executable).parent), env.get("PATH")) if p),
        PYTHONUNBUFFERED="1",
    )
    return LocalCommand(argv=argv, env=env, cwd=home.parent)


@dataclass
class _Running:
    proc: subprocess.Popen
    stop_requested: bool = False


@dataclass
class LocalAgent:
    """Polls one server and runs its queued runs locally.

    Attributes:
        paths: The sandbox's paths (per-run dirs go under ``paths.runs``).
        settings: Connections, artifacts store and local mounts.
        host: The server URL.
        owner: The organization whose runs are executed.
        poll: Seconds between two polls.
        max_parallel: Runs executed at the same time. 1 by default: an op's tracking reports
            it succeeded a moment before its process exits, and the server then queues the
            next op; one at a time, the next process starts only after the last has exited.
    """

    paths: SandboxPaths
    settings: AgentSettings
    host: str
    owner: str = "default"
    poll: float = 1.0
    max_parallel: int = 1
    _running: dict[str, _Running] = field(default_factory=dict, init=False)
    # Runs stopped before their process started (queued in the pool, or being prepared).
    _cancelled: set[str] = field(default_factory=set, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        # Imported here: polyaxon reads its settings from the environment at import time.
        from polyaxon import settings as plx_settings
        from polyaxon._connections import V1Connection
        from polyaxon._constants.globals import NO_AUTH
        from polyaxon._runner.agent.client import AgentClient
        from polyaxon._schemas.agent import AgentConfig
        from polyaxon._schemas.client import ClientConfig
        from polyaxon.client import PolyaxonClient

        self._agent_config = AgentConfig(
            artifacts_store=V1Connection.from_dict(self.settings.artifacts_store),
            connections=[V1Connection.from_dict(c) for c in self.settings.connections],
            namespace="sandbox",
        )
        plx_settings.set_agent_config(self._agent_config)
        plx_settings.CLIENT_CONFIG.host = self.host
        self._client_config = ClientConfig(host=self.host, verify_ssl=False)
        # NO_AUTH: never send the user's own ~/.polyaxon token to the sandbox server.
        self._plx = PolyaxonClient(config=self._client_config, token=NO_AUTH)
        self.client = AgentClient(owner=self.owner, client=self._plx)
        self.store = Path(self.settings.artifacts_store["schema"]["hostPath"])
        # Where ops that mount the claim run (None: no profile emulates a class).
        self._claim_cgroup = claim.claim_cgroup(self.settings.profiles)

    # -- loop ------------------------------------------------------------------------------

    def serve(self) -> None:
        """Poll until SIGTERM/SIGINT; then stop every run still going."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        log.info("agent polling %s every %.1fs", self.host, self.poll)
        ready = False
        with ThreadPoolExecutor(self.max_parallel) as pool:
            while not self._stop.is_set():
                try:
                    self.poll_once(pool)
                    if not ready:
                        # `python -m sandbox start` waits for this file.
                        self.paths.agent_ready.write_text(str(os.getpid()))
                        ready = True
                except Exception as exc:  # noqa: BLE001 - a bad poll must not end the agent
                    log.warning("poll failed: %s", exc)
                self._stop.wait(self.poll)
            self.shutdown()

    def poll_once(self, pool: ThreadPoolExecutor) -> None:
        """Fetch the server's state once and dispatch queued runs and stop requests."""
        state = self.client.get_state().state
        if not state:
            return
        for run_data in state.stopping or []:
            self.stop_run(run_data[0])
        for run_data in state.queued or []:
            pool.submit(self._guarded, self.execute, run_data)

    def _guarded(self, fn: Any, run_data: Sequence[Any]) -> None:
        try:
            fn(run_data)
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            log.exception("run %s: agent error", run_data[0])
            owner, project, uuid = _run_info(run_data[0])
            self._status(owner, project, uuid, "failed", "AgentError", f"sandbox agent: {exc}")

    def shutdown(self) -> None:
        """Stop every run still going (they are reported stopped as each one ends).

        All runs get SIGTERM at once and share one grace period, so the agent is done well
        within the grace ``python -m sandbox stop`` gives it.
        """
        with self._lock:
            running = list(self._running.items())
        for _, entry in running:
            entry.stop_requested = True
            signal_group(entry.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + SHUTDOWN_GRACE
        for uuid, entry in running:
            try:
                entry.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(entry.proc.pid, signal.SIGKILL)
                entry.proc.wait()
            log.info("stopped run %s at agent shutdown", uuid)

    # -- one run ---------------------------------------------------------------------------

    def convert(self, run_data: Sequence[Any]) -> Any:
        """The run's ``polyaxon-main`` container, from Polyaxon's own converter."""
        from polyaxon._local_process.executor import Executor

        owner, project, uuid = _run_info(run_data[0])
        containers = Executor().convert(
            owner_name=owner,
            project_name=project,
            run_name=run_data[2],
            run_uuid=uuid,
            content=without_downward_api(run_data[3]),
            default_auth=False,
            agent_content=self._agent_config.to_json(),
        )
        for container in containers:
            if container.name == MAIN_CONTAINER:
                return container
        raise ValueError(f"no {MAIN_CONTAINER} container in the converted run")

    def prepare_dirs(self, uuid: str) -> tuple[Path, Path, Path]:
        """The run's HOME, context root and log file; its artifacts dir is the store's."""
        run_dir = self.paths.runs / uuid
        home, context = run_dir / "home", run_dir / "context"
        home.mkdir(parents=True, exist_ok=True)
        (context / "artifacts").mkdir(parents=True, exist_ok=True)
        store_run = self.store / uuid
        (store_run / "outputs").mkdir(parents=True, exist_ok=True)
        link = context / "artifacts" / uuid
        if not link.is_symlink():
            link.symlink_to(store_run, target_is_directory=True)
        managed = self.settings.profiles.claim_path if self.settings.profiles else None
        for local in self.settings.local_mounts.values():
            if local == managed:
                # The storage-profile hook owns this symlink; never turn it into a directory.
                if not local.exists():
                    raise FileNotFoundError(
                        f"claim path {local} is missing or dangling "
                        "(python -m sandbox start prepares it)"
                    )
            elif not local.exists():
                local.mkdir(parents=True, exist_ok=True)
        return home, context, run_dir / "main.log"

    def in_claim_cgroup(self, argv: list[str]) -> list[str]:
        """``argv`` made to run in the claim's cgroup, where the claim's volume class is
        emulated; the cgroup is made again with the current profile's limits if it went."""
        assert self._claim_cgroup is not None and self.settings.profiles is not None
        if not self._claim_cgroup.exists():
            claim.restore(self.settings.profiles, self._claim_cgroup)
        return in_cgroup(argv, self._claim_cgroup)

    def _not_to_start(self, uuid: str) -> str | None:
        """Why a run must not start (the agent stops, or the run was stopped), else None.

        Call under ``self._lock``.
        """
        if self._stop.is_set():
            return "Agent shut down"
        if uuid in self._cancelled:
            self._cancelled.discard(uuid)
            return "Stopped before it started"
        return None

    def execute(self, run_data: Sequence[Any]) -> None:
        """Run one queued run to its end and report its status and logs."""
        owner, project, uuid = _run_info(run_data[0])
        name = run_data[2]
        with self._lock:
            # Queued behind other runs when the agent or the run was stopped: never started.
            why = self._not_to_start(uuid)
        if why:
            self._status(owner, project, uuid, "stopped", "SandboxAgent", why)
            return
        try:
            container = self.convert(run_data)
            home, context, log_file = self.prepare_dirs(uuid)
            command = localize(container, self.settings.local_mounts, home, context)
            # The storage-profile hook resolves the profiles file's relative paths from here.
            command.env["SANDBOX_ROOT"] = str(self.paths.root)
            # The converter fills in the agent's configured host, not necessarily this one.
            command.env["POLYAXON_HOST"] = self.host
            for var, value in downward_api_env(run_data[3]).items():
                if value is None:
                    command.env.pop(var, None)
                else:
                    command.env[var] = value
            if self._claim_cgroup is not None and mounts_claim(
                run_data[3], self.settings.claim_connections
            ):
                command.argv = self.in_claim_cgroup(command.argv)
        except Exception as exc:  # noqa: BLE001
            self._status(owner, project, uuid, "failed", "AgentConvert", f"cannot run: {exc}")
            return
        log.info("run %s (%s): %s", name, uuid, " ".join(command.argv)[:300])
        lines: list[Any] = []
        # Start and register under the lock: shutdown() and stop_run() then either see this
        # run or this run sees the stop, never neither.
        with self._lock:
            why = self._not_to_start(uuid)
            if why:
                self._status(owner, project, uuid, "stopped", "SandboxAgent", why)
                return
            self._status(
                owner, project, uuid, "running", "SandboxAgent", "Run started by the agent"
            )
            try:
                proc = subprocess.Popen(
                    command.argv,
                    env=command.env,
                    cwd=command.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: a stop ends its children
                )
            except OSError as exc:
                self._status(owner, project, uuid, "failed", "AgentStart", f"cannot start: {exc}")
                return
            entry = _Running(proc)
            self._running[uuid] = entry
        reader = threading.Thread(target=_read_lines, args=(proc, log_file, lines), daemon=True)
        reader.start()
        uploaded = 0  # lines uploaded so far
        try:
            last_upload = 0.0
            while proc.poll() is None:
                time.sleep(0.2)
                if time.monotonic() - last_upload > LOG_UPLOAD_EVERY and len(lines) > uploaded:
                    uploaded = self.upload_logs(owner, project, uuid, lines, log_file.parent)
                    last_upload = time.monotonic()
        finally:
            # Whatever the command left running in its group, and the command itself if
            # supervising it failed: no run outlives its supervision.
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            with self._lock:
                self._running.pop(uuid, None)
        reader.join(timeout=10)
        if len(lines) > uploaded:
            self.upload_logs(owner, project, uuid, lines, log_file.parent)
        # The server caches a run's logs on first read (the UI reads while it runs); drop
        # that copy so the full log shows once the run is done.
        shutil.rmtree(self.paths.archives / uuid / "plxlogs", ignore_errors=True)
        code = proc.returncode
        if entry.stop_requested:
            self._status(owner, project, uuid, "stopped", "SandboxAgent", "Stopped on request")
        elif code == 0:
            self._status(owner, project, uuid, "succeeded", "SandboxAgent", "Exited with 0")
        else:
            tail = "\n".join(line.value for line in lines[-FAILURE_TAIL_LINES:])
            self._status(
                owner, project, uuid, "failed", "ProcessFailed", f"exit code {code}:\n{tail}"
            )
        log.info("run %s (%s) ended with exit code %s", name, uuid, code)

    def stop_run(self, instance: str) -> None:
        """Honour a stop request: end the run's process group (or confirm it is gone)."""
        owner, project, uuid = _run_info(instance)
        with self._lock:
            entry = self._running.get(uuid)
            if entry is None:
                # Not started (yet): if it is queued or being prepared, it never will be.
                self._cancelled.add(uuid)
        if entry is None:
            self._status(owner, project, uuid, "stopped", "SandboxAgent", "Not running here")
            return
        if not entry.stop_requested:
            entry.stop_requested = True
            threading.Thread(target=_stop_process_group, args=(entry.proc,), daemon=True).start()

    def upload_logs(
        self, owner: str, project: str, uuid: str, lines: list[Any], run_dir: Path
    ) -> int:
        """Upload the captured lines as ``plxlogs/polyaxon-main.jsonl`` of the run.

        Best effort: a failure is logged, never raised (the run goes on).

        Returns:
            How many lines were uploaded (0 when the upload failed).
        """
        from polyaxon.client import RunClient
        from traceml.logging import V1Logs

        snapshot = list(lines)  # the reader thread keeps appending
        if not snapshot:
            return 0
        try:
            path = run_dir / "polyaxon-main.jsonl"
            path.write_text(V1Logs.model_construct(logs=snapshot).get_jsonl_events())
            run = RunClient(owner=owner, project=project, run_uuid=uuid, client=self._plx)
            run.upload_artifact(
                filepath=str(path), path="plxlogs", overwrite=True, show_progress=False
            )
        except Exception as exc:  # noqa: BLE001 - logs are best effort, the run goes on
            log.warning("run %s: log upload failed: %s", uuid, exc)
            return 0
        return len(snapshot)

    def _status(
        self, owner: str, project: str, uuid: str, status: str, reason: str, message: str
    ) -> None:
        try:
            self.client.log_run_status(
                run_owner=owner,
                run_project=project,
                run_uuid=uuid,
                status=status,
                reason=reason,
                message=message[-4000:],
            )
        except Exception as exc:  # noqa: BLE001
            log.warning("run %s: cannot report status %s: %s", uuid, status, exc)


def _run_info(instance: str) -> tuple[str, str, str]:
    from polyaxon._env_vars.getters import get_run_info

    return get_run_info(run_instance=instance)


def _read_lines(proc: subprocess.Popen, log_file: Path, lines: list[Any]) -> None:
    from traceml.logging import V1Log

    assert proc.stdout is not None
    with open(log_file, "a", encoding="utf-8") as out:
        for raw in proc.stdout:
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            out.write(text + "\n")
            out.flush()
            entry = V1Log.process_log_line(
                value=text or " ", node="sandbox", pod=None, container=MAIN_CONTAINER
            )
            if entry is not None:
                lines.append(entry)


def _stop_process_group(proc: subprocess.Popen, grace: float = STOP_GRACE) -> None:
    """SIGTERM the run's process group, SIGKILL it after ``grace`` seconds."""
    signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
