"""Submit a pipeline to the sandbox, follow it to the end, and summarise its training runs.

Every call goes through Polyaxon's own SDK (``RunClient``, ``ProjectClient``): the run is
created with ``RunClient.create_from_polyaxonfile`` (Polyaxon checks the file and resolves
its hubRefs), and runs, statuses and logs are read back as ``V1Run`` objects.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from checkpoint_storage_bench.contract import (
    MATERIALIZE_TOTAL_S,
    MATERIALIZE_WRITE_MBPS,
    SCAN_AU,
    SCAN_EPOCH_S,
    SCAN_MBPS,
    STAGES,
    WORKSPACE_SAVE_P99_MS,
    workspace_output,
)
from sandbox.components import quiet_sdk_errors, sdk_call
from sandbox.errors import (
    ConfigError,
    FollowTimeoutError,
    RegisterError,
    RunFailedError,
    ServerUnavailableError,
)

DONE_STATUSES = {"succeeded", "failed", "stopped", "upstream_failed", "skipped", "done"}
LOG_WAIT = 15.0  # seconds to wait for a failed run's log upload


def run_client(client: Any, owner: str, project: str, uuid: str | None = None) -> Any:
    """Polyaxon's ``RunClient`` for one run (or for the project's runs, without ``uuid``)."""
    from polyaxon.client import RunClient

    return RunClient(
        owner=owner, project=project, run_uuid=uuid, client=client, manual_exceptions_handling=True
    )


@contextmanager
def sandbox_hub(url: str) -> Iterator[None]:
    """Point Polyaxon's default client at the sandbox, without any token, for a while.

    Checking a polyaxonfile resolves its ``hubRef`` components with Polyaxon's *default*
    client (``PolyaxonClient()``: the global client config and the user's login), not with
    the client the run is created with. The sandbox's hub is the sandbox server, and the
    user's own token must never be sent to it.
    """
    from polyaxon import settings
    from polyaxon._schemas.client import ClientConfig

    saved = settings.CLIENT_CONFIG, settings.AUTH_CONFIG
    settings.CLIENT_CONFIG = ClientConfig(host=url, verify_ssl=False)
    settings.AUTH_CONFIG = None
    try:
        yield
    finally:
        settings.CLIENT_CONFIG, settings.AUTH_CONFIG = saved


def submit(
    client: Any, url: str, polyaxonfile: Path, owner: str, project: str, params: dict[str, str]
) -> str:
    """Create a run of ``polyaxonfile`` in ``owner/project`` (like ``polyaxon run -f FILE
    -P k=v``); returns its uuid.

    Raises:
        ConfigError: Polyaxon finds the file or a param invalid (or a hubRef unknown).
        RegisterError: The server refused the run.
        ServerUnavailableError: The server did not answer.
    """
    from polyaxon.exceptions import (
        ApiException,
        PolyaxonClientException,
        PolyaxonfileError,
        PolyaxonSchemaError,
    )
    from urllib3.exceptions import HTTPError

    runs = run_client(client, owner, project)
    try:
        with quiet_sdk_errors(), sandbox_hub(url):
            run = runs.create_from_polyaxonfile(
                polyaxonfile=str(polyaxonfile), params=[f"{k}={v}" for k, v in params.items()]
            )
    except ApiException as exc:
        raise RegisterError(
            f"the server refused a run of {polyaxonfile}: HTTP {exc.status} {exc.reason}"
            f"{': ' + str(exc.body)[:500] if exc.body else ''}"
        ) from exc
    except (HTTPError, OSError) as exc:
        raise ServerUnavailableError(f"cannot submit {polyaxonfile} to {url}: {exc}") from exc
    except (PolyaxonfileError, PolyaxonSchemaError, PolyaxonClientException, ValueError) as exc:
        raise ConfigError(f"{polyaxonfile} cannot be run: {exc}") from exc
    return run.uuid


def get_run(client: Any, owner: str, project: str, uuid: str) -> Any:
    """The run's current record (a ``V1Run``)."""
    runs = run_client(client, owner, project, uuid)
    sdk_call(f"read run {uuid}", runs.refresh_data)
    return runs.run_data


def list_runs(client: Any, owner: str, project: str, query: str | None = None) -> list[Any]:
    """A project's runs (``V1Run``), oldest first, optionally filtered (``kind:dag``)."""
    runs = run_client(client, owner, project)
    found = sdk_call(
        f"list runs of {owner}/{project}", runs.list, query=query, sort="created_at", limit=1000
    )
    return list(found.results or [])


def pipeline_ops(client: Any, owner: str, project: str, pipeline: str) -> list[Any]:
    """Every run below a pipeline (``V1Run``), at any depth, in the order they were created.

    A nested pipeline (a DAG op whose component is a DAG, a matrix mapping of runs) makes
    runs whose ``pipeline`` is their direct parent; the server sets ``controller`` to the
    outermost run for all of them, so that is what selects the whole tree.
    """
    return list_runs(client, owner, project, query=f"controller:{pipeline}")


def labels(runs: list[Any], root: str) -> dict[str, str]:
    """A readable path for each run below ``root``: ``stages[1]/train[0]``.

    The path follows each run's ``pipeline`` (its parent) up to ``root``. A matrix run is
    left out of its children's paths (they carry its name with their index among its
    children, in creation order); a run of a mapping whose inputs name a ``profile`` shows
    it too, so a stage reads ``stages[1] checkpoint-throughput``.
    """
    by_uuid = {r.uuid: r for r in runs}
    index: dict[str, int] = {}
    counts: dict[str, int] = {}
    for run in runs:  # oldest first: the index is the order the mapping made them in
        parent = run.pipeline.uuid if run.pipeline else None
        if parent in by_uuid and by_uuid[parent].kind == "matrix":
            index[run.uuid] = counts.get(parent, 0)
            counts[parent] = index[run.uuid] + 1

    def own(run: Any) -> str:
        if run.uuid in index:
            return f"{run.name}[{index[run.uuid]}]"
        return str(run.name)

    found: dict[str, str] = {}
    for run in runs:
        parts, node, seen = [], run, set()
        while node is not None and node.uuid != root and node.uuid not in seen:
            seen.add(node.uuid)
            if node.kind != "matrix" or node is run:
                parts.append(own(node))
            parent = node.pipeline.uuid if node.pipeline else None
            node = by_uuid.get(parent)
        label = "/".join(reversed(parts))
        profile = (run.inputs or {}).get("profile") if run.uuid in index else None
        found[run.uuid] = f"{label} {profile}" if profile else label
    return found


def stop_run(client: Any, owner: str, project: str, uuid: str) -> None:
    """Ask the server to stop a run (a pipeline stops its ops too)."""
    sdk_call(f"stop run {uuid}", run_client(client, owner, project, uuid).stop)


def log_lines(client: Any, owner: str, project: str, uuid: str) -> list[str]:
    """The run's captured log lines, as the UI shows them."""
    logs = sdk_call(f"read the logs of {uuid}", run_client(client, owner, project, uuid).get_logs)
    return [entry.value or "" for entry in (logs.logs if logs else None) or []]


def follow(
    client: Any,
    owner: str,
    project: str,
    uuid: str,
    timeout: float,
    echo: Callable[[str], None] = print,
    every: float = 2.0,
) -> list[Any]:
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
        pipeline = get_run(client, owner, project, uuid)
        ops = pipeline_ops(client, owner, project, uuid)
        names = labels(ops, uuid)
        for op in ops:
            # A matrix's own status adds nothing to its children's lines.
            if op.kind != "matrix" and seen.get(op.uuid) != op.status:
                seen[op.uuid] = op.status
                echo(f"  {names[op.uuid]:<40} {op.status}")
        if pipeline.status in DONE_STATUSES:
            break
        if time.monotonic() > deadline:
            try:
                stop_run(client, owner, project, uuid)
                stopped = "; stopped it"
            except ServerUnavailableError as exc:
                stopped = f"; could not stop it: {exc}"
            raise FollowTimeoutError(
                f"pipeline {uuid} still {pipeline.status} after {timeout:.0f}s{stopped}"
            )
        time.sleep(every)
    if pipeline.status != "succeeded":
        raise RunFailedError(failure_report(client, owner, project, pipeline, ops))
    return ops


def failure_report(client: Any, owner: str, project: str, pipeline: Any, ops: list[Any]) -> str:
    """Which op failed, its status message and its log tail."""
    lines = [f"pipeline {pipeline.name} ({pipeline.uuid}) ended {pipeline.status}"]
    names = labels(ops, pipeline.uuid)
    # The jobs that failed say why; a nested pipeline's own message only counts them.
    failed = [op for op in ops if op.status in ("failed", "stopped")]
    jobs = [op for op in failed if op.kind not in ("dag", "matrix")]
    for op in jobs or failed:
        runs = run_client(client, owner, project, op.uuid)
        _, conditions = sdk_call(f"read the statuses of {op.uuid}", runs.get_statuses)
        message = next(
            (c.message for c in reversed(list(conditions)) if c.type == op.status and c.message),
            "",
        )
        lines.append(f"op {names.get(op.uuid, op.name)} {op.status}: {message}")
        logs = (
            _logs_when_uploaded(client, owner, project, op.uuid)
            if op.kind not in ("dag", "matrix")
            else []
        )
        if logs:
            lines.append(f"last lines of {names.get(op.uuid, op.name)}'s log:")
            lines += ["  " + line for line in logs[-20:]]
    return "\n".join(lines)


def _logs_when_uploaded(
    client: Any, owner: str, project: str, uuid: str, wait: float = LOG_WAIT
) -> list[str]:
    """The run's log lines; a run that reported its own failure may still be exiting, so
    give the agent a moment to upload them."""
    deadline = time.monotonic() + wait
    while True:
        try:
            logs = log_lines(client, owner, project, uuid)
        except ServerUnavailableError:
            logs = []
        if logs or time.monotonic() > deadline:
            return logs
        time.sleep(1.0)


def _fmt(value: Any, unit: str = "", digits: int = 3) -> str:
    if isinstance(value, int | float):
        return f"{value:.{digits}f}{unit}"
    return "-"


def _stage_of(run: Any, by_uuid: dict[str, Any]) -> str | None:
    """The uuid of the nearest DAG above ``run`` (its stage in a nested pipeline, the
    pipeline itself in a flat one)."""
    node, seen = run, set()
    while node is not None and node.pipeline and node.uuid not in seen:
        seen.add(node.uuid)
        parent = by_uuid.get(node.pipeline.uuid)
        if parent is None or parent.kind == "dag":
            return node.pipeline.uuid
        node = parent
    return None


def comparison(ops: list[Any]) -> str:
    """A profile-by-profile table of the training runs: pause, stages, fio, runtime, loss.

    ``ops``: the runs below a pipeline (nested DAGs and matrices included, so each job's
    stage can be found). A training op is a job with a ``ckpt_pause_s_total`` output; its
    fio op is the last fio op of the same stage (the nearest DAG above both) that started
    before it and after that stage's last switch. Runs are taken in the order they started
    (the server creates a mapping's runs ahead of running them).
    """
    by_uuid = {op.uuid: op for op in ops if op.uuid}
    jobs = [op for op in ops if (op.kind or "job") == "job"]
    order = {id(op): i for i, op in enumerate(jobs)}
    jobs.sort(key=lambda op: (op.started_at is None, op.started_at or 0, order[id(op)]))
    rows = []
    fio_of: dict[str | None, Any] = {}  # stage -> its latest fio op
    for op in jobs:
        out = op.outputs or {}
        stage = _stage_of(op, by_uuid)
        if op.name.startswith("switch"):
            fio_of.pop(stage, None)  # a new stage: its own fio sweep follows
        if op.name.startswith("fio"):
            fio_of[stage] = op
        if "ckpt_pause_s_total" not in out:
            continue
        inputs = op.inputs or {}
        suffix = op.name.split("-", 1)[-1]
        fio_op = fio_of.get(stage)
        fio = (fio_op.outputs if fio_op else None) or {}
        bw = {k: v for k, v in fio.items() if k.endswith("_bw_mbps")}
        headline = max(bw.items(), key=lambda kv: kv[1], default=None)
        stages = "  ".join(
            f"{s} {_fmt(out.get(f'ckpt_{s}_s_median'), 's')}"
            for s in STAGES
            if out.get(f"ckpt_{s}_s_median") is not None
        )
        rows.append(
            [
                f"profile {inputs.get('storage_profile', suffix)} ({op.name})",
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
    "out.fio_seqwrite_1m_bw_mbps",
    "out.recommended_profile",
)

# A data workload's figures replace the training's: its headline and what explains it.
DATA_TABLE_FIGURES = {
    "scan": (SCAN_EPOCH_S, SCAN_AU, SCAN_MBPS),
    "materialize": (MATERIALIZE_TOTAL_S, MATERIALIZE_WRITE_MBPS),
    "workspace": (WORKSPACE_SAVE_P99_MS, workspace_output("reopen", "p99")),
}


def table_columns(workload: str) -> tuple[str, ...]:
    """The runs-table columns for ``workload``: the training's, or a data workload's figures
    beside the profile, the fio bandwidth and the recommendation."""
    if workload not in DATA_TABLE_FIGURES:
        return TABLE_COLUMNS
    figures = tuple(f"out.{name}" for name in DATA_TABLE_FIGURES[workload])
    return (*TABLE_COLUMNS[:2], *figures, *TABLE_COLUMNS[-2:])


def runs_table_url(
    host: str,
    owner: str,
    project: str,
    pipeline: str | None = None,
    columns=TABLE_COLUMNS,
    name: str | None = None,
) -> str:
    """The UI's runs table with the comparison columns chosen (and the pipeline's jobs only,
    at any depth: its ``controller`` is the pipeline, its nested DAGs and matrices left out;
    only the ops called ``name`` when given: the table renders only the rows in view)."""
    search: dict[str, str] = {"columns": ",".join(columns)}
    if pipeline:
        search["query"] = f"controller:{pipeline}, kind:job"
        if name:
            search["query"] += f", name:{name}"
    token = base64.b64encode(json.dumps(search).encode()).decode()
    return f"{host}/ui/{owner}/{project}/runs?" + urllib.parse.urlencode({"search": token})
