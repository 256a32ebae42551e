"""Where the runs come from; every source gives the same
:class:`~checkpoint_compare.records.RunRecord` list:

- an offline root (``<root>/runs/<uuid>/run.plx.json`` plus ``events/metric/*.plx``), what
  ``checkpoint_storage_bench.tracking`` writes outside Polyaxon;
- trainer summary JSONs (``--summary PROFILE=PATH``), schema ``checkpoint-training/1``;
- the Polyaxon API: the children of a pipeline run, or explicit run uuids (inside the
  pipeline's compare op the client is configured by the agent's environment).

:func:`load_runs` picks the source a :class:`~checkpoint_compare.config.Sources` names.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from checkpoint_compare.config import Sources
from checkpoint_compare.errors import BadInput, RunsMissing, SourceUnavailable
from checkpoint_compare.records import (
    SUMMARY_UUID_PREFIX,
    RunKind,
    RunRecord,
    parse_metric_events,
    parse_time,
)
from checkpoint_compare.workloads import SAMPLE_METRICS, is_data_run, record_from_summary
from checkpoint_storage_bench.contract import (
    CHECKPOINT_METRICS,
    DATA_SUMMARY_SCHEMA,
    DISTRIBUTED_CHECKPOINT_METRICS,
    FIO_METRIC,
    IMAGE_INPUT,
    LOSS_METRIC,
    PROVENANCE_KEYS,
    RESTORE_MEASURED,
    RUN_FINISHED_AT,
    RUN_STARTED_AT,
    SUMMARY_SCHEMA,
)
from checkpoint_storage_bench.retry import Backoff, TemporaryError, retry
from checkpoint_storage_bench.tracking import outermost_run, polyaxon_run

log = logging.getLogger(__name__)

# What a summary's checkpoint records → the metric the tracked run logs for it: the stages,
# and for a distributed run the slowest rank's pause and the aggregate rate.
SUMMARY_CHECKPOINT_FIELDS = CHECKPOINT_METRICS | DISTRIBUTED_CHECKPOINT_METRICS
METRIC_NAMES = (*SUMMARY_CHECKPOINT_FIELDS.values(), LOSS_METRIC)
_FAILED = ("failed", "upstream_failed", "stopped")


# ----------------------------------------------------------------------------- offline


def load_offline(root: Path) -> list[RunRecord]:
    """Read every offline run under ``root`` (or ``root/runs``).

    Raises:
        BadInput: The directory does not exist or a run.plx.json is not JSON.
    """
    if not root.is_dir():
        raise BadInput(f"offline root {root} is not a directory")
    runs_dir = root / "runs" if (root / "runs").is_dir() else root
    records = []
    for run_json in sorted(runs_dir.glob("*/run.plx.json")):
        records.append(_load_offline_run(run_json))
    return records


def _load_offline_run(run_json: Path) -> RunRecord:
    try:
        data = json.loads(run_json.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"cannot read offline run {run_json}: {exc}") from exc
    metrics = {}
    for event_file in sorted((run_json.parent / "events" / "metric").glob("*.plx")):
        metrics[event_file.stem] = parse_metric_events(event_file.read_text())
    return _record_from_run_data(data, metrics, source=str(run_json.parent))


def _failure_message(conditions: Iterable[Any]) -> str:
    """The reason and message of the last failed status condition."""
    message = ""
    for cond in conditions or []:
        cond = cond if isinstance(cond, dict) else cond.to_dict()
        if cond.get("type") in _FAILED:
            message = ": ".join(str(p) for p in (cond.get("reason"), cond.get("message")) if p)
    return message


def _mapping(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """``data[key]`` as a dict (absent or null: empty).

    Raises:
        BadInput: It is there but not a JSON object.
    """
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadInput(f"{where}: {key} must be a JSON object, not {type(value).__name__}")
    return dict(value)


def _checked(record: RunRecord) -> RunRecord:
    try:
        record.check_numbers()
    except ValueError as exc:
        raise BadInput(f"{record.source}: run {record.label}: {exc}") from exc
    return record


def _record_from_run_data(data: Any, metrics: dict[str, Any], source: str) -> RunRecord:
    """A record from a run's data as Polyaxon keeps it (offline file or API answer).

    Raises:
        BadInput: The data is not a run (not an object, sections of the wrong type, a
            non-finite number).
    """
    if not isinstance(data, dict):
        raise BadInput(f"{source}: the run data is not a JSON object ({type(data).__name__})")
    conditions = data.get("status_conditions") or []
    if not isinstance(conditions, list):
        raise BadInput(f"{source}: status_conditions must be a list")
    return _checked(
        RunRecord(
            uuid=str(data.get("uuid", "")),
            name=str(data.get("name") or ""),
            status=str(data.get("status") or "unknown"),
            inputs=_mapping(data, "inputs", source),
            outputs=_mapping(data, "outputs", source),
            metrics=metrics,
            created_at=parse_time(data.get("created_at")),
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")),
            message=_failure_message(conditions),
            source=source,
            meta=_mapping(data, "meta_info", source),
        )
    )


# ------------------------------------------------------------------------ summary JSON


def load_summary(profile: str, path: Path) -> RunRecord:
    """Turn a trainer summary JSON into a record, as if it had been tracked.

    Raises:
        BadInput: The file is unreadable, not JSON, not a ``checkpoint-training/1`` summary,
            or malformed (sections of the wrong type, a checkpoint without its step, a
            non-finite number).
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"cannot read summary {path}: {exc}") from exc
    if isinstance(data, dict) and data.get("schema") == DATA_SUMMARY_SCHEMA:
        return _checked(record_from_summary(profile, data, path))
    if not isinstance(data, dict) or data.get("schema") != SUMMARY_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise BadInput(f"{path} is not a {SUMMARY_SCHEMA} summary (schema: {found!r})")
    inputs = _mapping(data, "inputs", str(path))
    inputs.setdefault("storage_profile", data.get("storage_profile"))
    if inputs["storage_profile"] != profile:
        log.warning(
            "%s records storage_profile %r; using %r as given on the command line",
            path,
            inputs["storage_profile"],
            profile,
        )
        inputs["storage_profile"] = profile
    checkpoints = data.get("checkpoints") or []
    if not isinstance(checkpoints, list):
        raise BadInput(f"{path}: checkpoints must be a list, not {type(checkpoints).__name__}")
    metrics: dict[str, list[tuple[int, float]]] = {}
    for i, ckpt in enumerate(checkpoints):
        step = ckpt.get("step") if isinstance(ckpt, dict) else None
        if isinstance(step, bool) or not isinstance(step, int):
            raise BadInput(f"{path}: checkpoints[{i}] is not a checkpoint with an integer step")
        for field_name, metric in SUMMARY_CHECKPOINT_FIELDS.items():
            value = ckpt.get(field_name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                if not math.isfinite(value):
                    raise BadInput(
                        f"{path}: checkpoints[{i}].{field_name} = {value!r} is not a finite number"
                    )
                metrics.setdefault(metric, []).append((step, float(value)))
    if loss := _loss_curve(data.get("loss_curve"), path):
        metrics[LOSS_METRIC] = loss
    outputs = {
        k: v for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    for stage, figures in _mapping(data, "stages", str(path)).items():
        if not isinstance(figures, dict):
            raise BadInput(f"{path}: stages.{stage} must be a JSON object")
        for stat in ("median", "min", "max"):
            if stat in figures:
                outputs[f"ckpt_{stage}_{stat}"] = figures[stat]
    # What ran and where: the summary's "provenance" (older summaries: top-level
    # code_revision, the image digest among the inputs).
    provenance = _mapping(data, "provenance", str(path))
    meta = {
        "code_revision": data.get("code_revision"),
        "image_digest": inputs.get("image_digest"),
    } | {k: provenance[k] for k in PROVENANCE_KEYS if k in provenance and k != IMAGE_INPUT}
    if isinstance(data.get(RESTORE_MEASURED), str):
        meta[RESTORE_MEASURED] = data[RESTORE_MEASURED]
    if provenance.get(IMAGE_INPUT):
        inputs.setdefault(IMAGE_INPUT, provenance[IMAGE_INPUT])
    return _checked(
        RunRecord(
            # The path, not the file name: repeats may be summary.json in two directories.
            uuid=f"{SUMMARY_UUID_PREFIX}{path}",
            name=path.stem,
            status="succeeded",
            inputs=inputs,
            outputs=outputs,
            metrics=metrics,
            # When it ran (trainers since the summary recorded it): orders profiles by time.
            started_at=parse_time(data.get(RUN_STARTED_AT)),
            finished_at=parse_time(data.get(RUN_FINISHED_AT)),
            source=str(path),
            meta={k: v for k, v in meta.items() if v is not None},
        )
    )


def load_summaries(summaries: list[tuple[str, Path]]) -> list[RunRecord]:
    """One record per ``(profile, path)``, in the order given: several of one profile are
    its repeats.

    Raises:
        BadInput: A summary cannot be used (:func:`load_summary`), or one file is given
            twice: one run counted twice would pass for a repeat (or for two profiles).
    """
    records: list[RunRecord] = []
    given: dict[Path, str] = {}
    for profile, path in summaries:
        same = path.resolve()
        if same in given:
            raise BadInput(
                f"summary {path} is given more than once ({given[same]} and {profile}): "
                "one run counts once"
            )
        given[same] = profile
        records.append(load_summary(profile, path))
    return records


def _loss_curve(curve: Any, path: Path) -> list[tuple[int, float]]:
    """The summary's ``loss_curve`` as the loss metric. The trainer writes a loss that is
    not finite as null: it is NaN here, as in the run's loss events, so that a diverged run
    is seen as diverged and not as one that recorded no loss.

    Raises:
        BadInput: It is not a list of ``[step, loss]`` pairs.
    """
    if curve is not None and not isinstance(curve, list):
        raise BadInput(f"{path}: loss_curve must be a list, not {type(curve).__name__}")
    series: list[tuple[int, float]] = []
    for i, point in enumerate(curve or []):
        step, value = point if isinstance(point, list) and len(point) == 2 else (None, None)
        number = value is None or (isinstance(value, int | float) and not isinstance(value, bool))
        if isinstance(step, bool) or not isinstance(step, int) or not number:
            raise BadInput(f"{path}: loss_curve[{i}] is not a [step, loss] pair: {point!r}")
        series.append((step, math.nan if value is None else float(value)))
    return sorted(series, key=lambda point: point[0])


# -------------------------------------------------------------------------------- API

T = TypeVar("T")

API_BACKOFF = Backoff(delays=(0.5, 1.0, 2.0))
"""Four tries, about 3.5 s in all: a server restarting is worth waiting for, a wrong URL is not."""


def _with_retries(what: str, call: Callable[[], T], backoff: Backoff) -> T:
    """Call through the shared retry loop: connection errors and 5xx answers are worth
    another try, 4xx answers are permanent.

    Raises:
        RunsMissing: The server answered 4xx (e.g. an unknown run uuid).
        SourceUnavailable: Every try failed.
    """
    from polyaxon.exceptions import ApiException, PolyaxonClientException

    def once() -> T:
        try:
            return call()
        except ApiException as exc:
            status = getattr(exc, "status", None) or 0
            if 400 <= status < 500:
                raise RunsMissing(f"{what}: HTTP {status} {exc.reason}") from exc
            raise TemporaryError(f"HTTP {status} {exc.reason}") from exc
        except (PolyaxonClientException, OSError) as exc:
            raise TemporaryError(str(exc)) from exc

    try:
        return retry(once, what=what, backoff=backoff)
    except TemporaryError as exc:
        raise SourceUnavailable(f"{what}: Polyaxon API unavailable: {exc}") from exc


@dataclass
class ApiSource:
    """Runs from a Polyaxon server.

    Attributes:
        host: Server URL; None inside a Polyaxon run, where the agent configured the client.
        project: ``owner/name``; None inside a run (the run's own project).
        token: API token, if the server needs one.
        backoff: Retry policy.
    """

    host: str | None = None
    project: str | None = None
    token: str | None = None
    backoff: Backoff = API_BACKOFF

    def _client(self) -> Any:
        from polyaxon.client import ClientConfig, PolyaxonClient

        if not self.host:
            return None  # RunClient then uses the configuration of the run it runs in
        config = ClientConfig(host=self.host.rstrip("/"), verify_ssl=False)
        return PolyaxonClient(config=config, token=self.token or "no-auth")

    def _run_client(self, run_uuid: str | None = None) -> Any:
        from polyaxon.client import RunClient

        owner, name = (self.project.split("/", 1) + [None])[:2] if self.project else (None, None)
        return RunClient(owner=owner, project=name, run_uuid=run_uuid, client=self._client())

    def pipeline_runs(self, pipeline_uuid: str) -> list[RunRecord]:
        """All runs whose pipeline is ``pipeline_uuid``, with their metric events."""
        client = self._run_client(pipeline_uuid)
        runs, offset = [], 0
        while True:
            page = _with_retries(
                f"listing the runs of pipeline {pipeline_uuid}",
                lambda offset=offset: client.list_children(
                    limit=100, offset=offset, sort="created_at"
                ),
                self.backoff,
            )
            results = page.results or []
            runs.extend(results)
            offset += len(results)
            if not results or not page.next:
                break
        return [self._record(run.to_dict()) for run in runs]

    def own_pipeline(self) -> str:
        """Inside a Polyaxon run: the uuid of the pipeline this run belongs to.

        Raises:
            RunsMissing: This run is not an operation of a pipeline.
        """
        client = self._run_client()
        _with_retries("fetching this run", client.refresh_data, self.backoff)
        pipeline = client.run_data.pipeline
        if not pipeline or not pipeline.uuid:
            raise RunsMissing(
                f"run {client.run_uuid} is not part of a pipeline: give --pipeline or --run"
            )
        return pipeline.uuid

    def _parent_of(self, owner: str, project: str, run_uuid: str) -> str | None:
        """The uuid of the pipeline ``run_uuid`` is an operation of (None: of none)."""
        from polyaxon.client import RunClient

        client = RunClient(owner=owner, project=project, run_uuid=run_uuid, client=self._client())
        _with_retries(f"fetching run {run_uuid}", client.refresh_data, self.backoff)
        pipeline = client.run_data.pipeline
        return pipeline.uuid if pipeline and pipeline.uuid else None

    def _this_or(self, run_uuid: str | None) -> tuple[str, str, str]:
        """``(owner, project, uuid)`` of ``run_uuid`` in this source's project, or of the run
        this process runs in (``POLYAXON_RUN_INSTANCE``: its own project, whatever
        ``--project`` says)."""
        if run_uuid is None:
            here = polyaxon_run()
            if here is None:
                raise RunsMissing("not inside a Polyaxon run: give --pipeline")
            return here
        if not self.project or "/" not in self.project:
            raise RunsMissing(f"run {run_uuid}: give --project OWNER/NAME")
        owner, name = self.project.split("/", 1)
        return owner, name, run_uuid

    def outermost_pipeline(self, run_uuid: str | None = None) -> str | None:
        """The outermost pipeline a run (None: this run) belongs to, following each
        pipeline's own pipeline up (the profiles pipeline runs each stage as a pipeline of
        its own); None when the run is no pipeline's operation.

        Raises:
            RunsMissing: The server refused (4xx), or the run cannot be named.
            SourceUnavailable: The server did not answer.
        """
        owner, project, uuid = self._this_or(run_uuid)
        top = outermost_run(owner, project, uuid, self._parent_of)
        return None if top == uuid else top

    def topmost(self, pipeline_uuid: str) -> str:
        """A pipeline's outermost ancestor (itself when it is no operation of another)."""
        return self.outermost_pipeline(pipeline_uuid) or pipeline_uuid

    def runs(self, uuids: dict[str, str | None]) -> list[RunRecord]:
        """The given runs (uuid → profile hint or None)."""
        records = []
        for run_uuid, hint in uuids.items():
            client = self._run_client(run_uuid)
            _with_retries(f"fetching run {run_uuid}", client.refresh_data, self.backoff)
            record = self._record(client.run_data.to_dict())
            record.profile_hint = hint
            records.append(record)
        return records

    def set_readme(self, run_uuid: str, markdown: str) -> None:
        """Set a run's readme (Polyaxon renders it on the run's page).

        Raises:
            RunsMissing: The server refused (4xx).
            SourceUnavailable: The server did not answer.
        """
        client = self._run_client(run_uuid)
        _with_retries(
            f"setting the readme of run {run_uuid}",
            lambda: client.set_readme(markdown, async_req=False),
            self.backoff,
        )

    def _record(self, data: dict[str, Any]) -> RunRecord:
        metrics: dict[str, list[tuple[int, float]]] = {}
        record = _record_from_run_data(data, metrics, source=f"{self.host or 'api'}")
        kind = record.kind
        wanted: list[str] = []
        if kind is RunKind.TRAINING:
            wanted = list(METRIC_NAMES)
        elif kind is RunKind.FIO:
            wanted = [k for k in record.outputs if FIO_METRIC.match(k)]
        elif is_data_run(record):
            wanted = list(SAMPLE_METRICS)
        if wanted and record.status not in ("created", "queued", "scheduled"):
            metrics.update(self._metric_events(record.uuid, wanted))
            _checked(record)
        if record.status in _FAILED and not record.message:
            # Run lists carry no status conditions: ask for the reason of a failure.
            client = self._run_client(record.uuid)
            _, conditions = _with_retries(
                f"fetching the statuses of run {record.uuid}", client.get_statuses, self.backoff
            )
            record.message = _failure_message(conditions)
        return record

    def _metric_events(self, run_uuid: str, names: list[str]) -> dict[str, Any]:
        """Metric series from the streams API; the outputs still carry medians without them."""
        from polyaxon.schemas import V1ArtifactKind

        client = self._run_client(run_uuid)
        try:
            answer = _with_retries(
                f"fetching metric events of run {run_uuid}",
                lambda: client.get_events(kind=V1ArtifactKind.METRIC, names=names, orient="csv"),
                self.backoff,
            )
        except (RunsMissing, SourceUnavailable) as exc:
            log.warning("no metric events for run %s (%s); using its outputs only", run_uuid, exc)
            return {}
        events = getattr(answer, "data", None) or []
        return {e["name"]: parse_metric_events(e.get("data") or "") for e in events if e}


# --------------------------------------------------------------------- the chosen source


@dataclass
class Loaded:
    """What a source gave: the runs, and the pipeline they belong to when they came from a
    pipeline on a Polyaxon server (its page gets the verdict as its readme)."""

    records: list[RunRecord]
    pipeline: str | None = None
    api: ApiSource | None = None


def load_runs(sources: Sources) -> Loaded:
    """Load the runs from the one source ``sources`` names.

    Raises:
        BadInput: A file or directory cannot be read.
        RunsMissing: A run given with ``--run`` does not exist.
        SourceUnavailable: The Polyaxon API did not answer.
    """
    if sources.summaries:
        return Loaded(load_summaries(sources.summaries))
    if sources.offline_root:
        records = load_offline(sources.offline_root)
        if sources.runs:
            return Loaded(_select(records, sources.run_profiles, str(sources.offline_root)))
        return Loaded(records)
    api = ApiSource(host=sources.api_host, project=sources.project, token=sources.token)
    pipeline = sources.pipeline or (None if sources.runs else api.own_pipeline())
    records = api.pipeline_runs(pipeline) if pipeline else []
    if sources.runs:
        known = {r.uuid for r in records}
        records += api.runs({u: p for u, p in sources.run_profiles.items() if u not in known})
        records = _select(records, sources.run_profiles, "the pipeline")
    return Loaded(records, pipeline, api)


def _select(records: list[RunRecord], runs: dict[str, str | None], where: str) -> list[RunRecord]:
    by_uuid = {r.uuid: r for r in records}
    missing = [u for u in runs if u not in by_uuid]
    if missing:
        raise RunsMissing(f"run(s) not found in {where}: {', '.join(missing)}")
    for run_uuid, hint in runs.items():
        by_uuid[run_uuid].profile_hint = hint
    return [by_uuid[u] for u in runs]
