"""Load the runs of one pipeline and assign them to storage profiles.

Three sources give the same :class:`~checkpoint_compare.records.RunRecord` list:

- an offline root (``<root>/runs/<uuid>/run.plx.json`` plus ``events/metric/*.plx``), what
  ``checkpoint_storage_bench.tracking`` writes outside Polyaxon;
- trainer summary JSONs (``--summary PROFILE=PATH``), schema ``checkpoint-training/1``;
- the Polyaxon API: the children of a pipeline run, or explicit run uuids (inside the
  pipeline's compare op the client is configured by the agent's environment).

:func:`group_by_profile` then picks, per profile, the training run, the hook run that
switched the claim to it and the fio sweep measured on it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from checkpoint_compare.errors import BadInput, RunsMissing, SourceUnavailable
from checkpoint_compare.records import (
    RunKind,
    RunRecord,
    parse_metric_events,
    parse_time,
)
from checkpoint_storage_bench.contract import (
    CHECKPOINT_METRICS,
    FIO_METRIC,
    LOSS_METRIC,
    SUMMARY_SCHEMA,
)

log = logging.getLogger(__name__)

METRIC_NAMES = (*CHECKPOINT_METRICS.values(), LOSS_METRIC)
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


def _record_from_run_data(data: dict[str, Any], metrics: dict[str, Any], source: str) -> RunRecord:
    return RunRecord(
        uuid=str(data.get("uuid", "")),
        name=data.get("name") or "",
        status=str(data.get("status") or "unknown"),
        inputs=dict(data.get("inputs") or {}),
        outputs=dict(data.get("outputs") or {}),
        metrics=metrics,
        created_at=parse_time(data.get("created_at")),
        started_at=parse_time(data.get("started_at")),
        finished_at=parse_time(data.get("finished_at")),
        message=_failure_message(data.get("status_conditions") or []),
        source=source,
        meta=dict(data.get("meta_info") or {}),
    )


# ------------------------------------------------------------------------ summary JSON


def load_summary(profile: str, path: Path) -> RunRecord:
    """Turn a trainer summary JSON into a record, as if it had been tracked.

    Raises:
        BadInput: The file is unreadable, not JSON, or not a ``checkpoint-training/1`` summary.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"cannot read summary {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != SUMMARY_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise BadInput(f"{path} is not a {SUMMARY_SCHEMA} summary (schema: {found!r})")
    inputs = dict(data.get("inputs") or {})
    inputs.setdefault("storage_profile", data.get("storage_profile"))
    if inputs["storage_profile"] != profile:
        log.warning(
            "%s records storage_profile %r; using %r as given on the command line",
            path,
            inputs["storage_profile"],
            profile,
        )
        inputs["storage_profile"] = profile
    metrics: dict[str, list[tuple[int, float]]] = {}
    for ckpt in data.get("checkpoints") or []:
        for field_name, metric in CHECKPOINT_METRICS.items():
            value = ckpt.get(field_name)
            if isinstance(value, int | float):
                metrics.setdefault(metric, []).append((int(ckpt["step"]), float(value)))
    outputs = {
        k: v for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    for stage, figures in (data.get("stages") or {}).items():
        for stat in ("median", "min", "max"):
            if isinstance(figures, dict) and stat in figures:
                outputs[f"ckpt_{stage}_{stat}"] = figures[stat]
    return RunRecord(
        uuid=f"summary:{path.name}",
        name=path.stem,
        status="succeeded",
        inputs=inputs,
        outputs=outputs,
        metrics=metrics,
        source=str(path),
        meta={
            "code_revision": data.get("code_revision"),
            "image_digest": inputs.get("image_digest"),
        },
    )


# -------------------------------------------------------------------------------- API

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Retry policy for API calls: ``attempts`` tries, delays doubling from ``first_s``."""

    attempts: int = 4
    first_s: float = 0.5
    max_s: float = 8.0

    def delays(self) -> list[float]:
        return [min(self.first_s * 2**i, self.max_s) for i in range(self.attempts - 1)]


def _with_retries(what: str, call: Callable[[], T], backoff: Backoff) -> T:
    """Call, retrying connection errors and 5xx answers; 4xx are permanent."""
    from polyaxon.exceptions import ApiException, PolyaxonClientException

    last: Exception | None = None
    for delay in [*backoff.delays(), None]:
        try:
            return call()
        except ApiException as exc:
            status = getattr(exc, "status", None) or 0
            if 400 <= status < 500:
                raise RunsMissing(f"{what}: HTTP {status} {exc.reason}") from exc
            last = exc
        except (PolyaxonClientException, OSError) as exc:
            last = exc
        if delay is not None:
            time.sleep(delay)
    raise SourceUnavailable(f"{what}: Polyaxon API unavailable: {last}")


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
    backoff: Backoff = field(default_factory=Backoff)

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

    def _record(self, data: dict[str, Any]) -> RunRecord:
        metrics: dict[str, list[tuple[int, float]]] = {}
        record = _record_from_run_data(data, metrics, source=f"{self.host or 'api'}")
        kind = record.kind
        wanted: list[str] = []
        if kind is RunKind.TRAINING:
            wanted = list(METRIC_NAMES)
        elif kind is RunKind.FIO:
            wanted = [k for k in record.outputs if FIO_METRIC.match(k)]
        if wanted and record.status not in ("created", "queued", "scheduled"):
            metrics.update(self._metric_events(record.uuid, wanted))
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


# ---------------------------------------------------------------------------- grouping


@dataclass
class ProfileRuns:
    """The runs that describe one storage profile.

    Attributes:
        profile: The profile (VolumeAttributesClass) name.
        training: The training run measured on it.
        hook: The hook run that switched the claim to it, if any.
        fio: The fio sweep measured on it, if any.
        ignored: Older runs of the same profile that were not used.
    """

    profile: str
    training: RunRecord
    hook: RunRecord | None = None
    fio: RunRecord | None = None
    ignored: list[RunRecord] = field(default_factory=list)


def _run_time(record: RunRecord) -> tuple[bool, datetime | None]:
    """Sort key: when the run started (else was created); unknown times sort last."""
    when = record.started_at or record.created_at
    return when is None, when


def _newest_first(records: Iterable[RunRecord]) -> list[RunRecord]:
    return sorted(records, key=lambda r: (r.created_at is not None, r.created_at), reverse=True)


def _profile_of(record: RunRecord, hooks: list[RunRecord]) -> str | None:
    """A run's profile: given explicitly, recorded as an input, or the class last applied."""
    if record.profile_hint:
        return record.profile_hint
    if record.kind is RunKind.TRAINING:
        return str(record.inputs["storage_profile"])
    if record.kind is RunKind.HOOK:
        return str(record.outputs.get("applied_class") or record.inputs["target_class"])
    if record.inputs.get("storage_profile"):
        return str(record.inputs["storage_profile"])
    # A fio sweep measures whatever class the claim had: the last hook that ran before it.
    if record.created_at is None:
        return None
    before = [h for h in hooks if h.succeeded and h.created_at and h.created_at < record.created_at]
    return _profile_of(max(before, key=lambda h: h.created_at), []) if before else None


def group_by_profile(
    records: list[RunRecord], expected: Iterable[str] = ()
) -> tuple[list[ProfileRuns], list[RunRecord]]:
    """Assign runs to profiles; the newest training run of each profile is the one compared.

    Args:
        records: All loaded runs (other kinds, e.g. the DAG or a compare op, are ignored).
        expected: Profiles that must be present.

    Returns:
        The profiles in the order their training runs were created, and the failed
        training runs (reported, never used).

    Raises:
        RunsMissing: An expected profile has no training run, the newest one of a profile
            failed or did not finish, or fewer than two profiles remain.
    """
    hooks = [r for r in records if r.kind is RunKind.HOOK]
    by_profile: dict[str, list[RunRecord]] = {}
    for record in records:
        if record.kind is RunKind.TRAINING:
            by_profile.setdefault(_profile_of(record, hooks) or "", []).append(record)
    failed = [r for runs in by_profile.values() for r in runs if not r.succeeded]

    problems = []
    groups = []
    for profile, runs in by_profile.items():
        newest, *older = _newest_first(runs)
        if not newest.succeeded:
            why = f": {newest.message}" if newest.message else ""
            problems.append(
                f"profile {profile}: run {newest.label} {newest.status}{why} (from {newest.source})"
            )
            continue
        group = ProfileRuns(profile=profile, training=newest, ignored=older)
        for kind, attr in ((RunKind.HOOK, "hook"), (RunKind.FIO, "fio")):
            candidates = [
                r
                for r in records
                if r.kind is kind and r.succeeded and _profile_of(r, hooks) == profile
            ]
            # The newest one created before the training run: it describes that run's volume.
            if newest.created_at:
                candidates = [
                    r for r in candidates if not r.created_at or r.created_at <= newest.created_at
                ]
            if candidates:
                setattr(group, attr, _newest_first(candidates)[0])
        groups.append(group)
    for profile in expected:
        if profile not in by_profile:
            problems.append(f"profile {profile}: no training run found")
    if problems:
        raise RunsMissing("; ".join(problems))
    if len(groups) < 2:
        found = ", ".join(g.profile for g in groups) or "none"
        raise RunsMissing(f"need training runs of at least two profiles, found: {found}")
    # Run order decides the default baseline: the profile whose training started first.
    groups.sort(key=lambda g: _run_time(g.training))
    return groups, failed
