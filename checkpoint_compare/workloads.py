"""A data workload's runs as the verdict reads them: its summary file as a record, and which
workload a set of runs measured (its row of :mod:`checkpoint_compare.table`).

Every name comes from :mod:`checkpoint_storage_bench.contract`; the verdict itself is the one
engine of :mod:`checkpoint_compare.verdict`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from checkpoint_compare.errors import BadInput, NotComparable
from checkpoint_compare.records import SUMMARY_UUID_PREFIX, RunKind, RunRecord, parse_time
from checkpoint_compare.table import CHECKPOINT, ROWS, WorkloadRow
from checkpoint_storage_bench.contract import (
    DATA_SUMMARY_CONFIG,
    DATA_SUMMARY_DETAILS,
    DATA_SUMMARY_EPOCH,
    DATA_SUMMARY_EPOCHS,
    DATA_SUMMARY_OUTPUTS,
    DATA_SUMMARY_ROUNDS,
    DATA_SUMMARY_SCHEMA,
    DATA_WORKLOADS,
    RUN_FINISHED_AT,
    RUN_STARTED_AT,
    SCAN_AU,
    SCAN_EPOCH_S,
    WORKLOAD_INPUT,
    WORKSPACE_SAVE_P99_MS,
    scan_epoch_field,
)

SAMPLE_METRICS = tuple(
    {m for r in ROWS.values() if not r.training for m in (r.sample_metric, r.au_metric) if m}
)
"""The metric events the verdict fetches for a data-workload run."""


def is_data_run(record: RunRecord) -> bool:
    return record.kind is RunKind.DATA


def is_data_comparison(records: list[RunRecord]) -> bool:
    """Whether the runs are a data workload's.

    Raises:
        NotComparable: Data-workload runs mixed with training runs: one verdict is about
            one workload.
    """
    data = [r for r in records if is_data_run(r)]
    training = [r for r in records if r.kind is RunKind.TRAINING]
    if data and training:
        raise NotComparable(
            f"data-workload runs ({', '.join(r.label for r in data)}) mixed with training "
            f"runs ({', '.join(r.label for r in training)}): compare one workload at a time"
        )
    return bool(data)


def workload_row(records: list[RunRecord]) -> WorkloadRow:
    """The row of the workload the runs measured: the training run's unless they are a
    data workload's.

    Raises:
        NotComparable: Runs of several workloads (data and training, or two data ones).
    """
    if not is_data_comparison(records):
        return CHECKPOINT
    workloads = {r.inputs.get(WORKLOAD_INPUT) for r in records if is_data_run(r)}
    if len(workloads) != 1 or not workloads <= set(DATA_WORKLOADS):
        raise NotComparable(
            f"expected the runs of one data workload, found {sorted(map(str, workloads))}"
        )
    (workload,) = workloads
    return ROWS[workload]


def _details(data: dict[str, Any], path: Path) -> tuple[list[Any], list[Any]]:
    """The summary's epochs and rounds lists.

    Raises:
        BadInput: ``details`` or a list is of the wrong type, naming the field.
    """
    details = data.get(DATA_SUMMARY_DETAILS)
    if details is None:
        return [], []
    if not isinstance(details, dict):
        raise BadInput(
            f"{path}: {DATA_SUMMARY_DETAILS} must be a JSON object, not {type(details).__name__}"
        )
    found = []
    for key in (DATA_SUMMARY_EPOCHS, DATA_SUMMARY_ROUNDS):
        value = details.get(key)
        if value is not None and not isinstance(value, list):
            raise BadInput(f"{path}: {DATA_SUMMARY_DETAILS}.{key} must be a list, not {type(value).__name__}")  # fmt: skip
        found.append(value or [])
    return found[0], found[1]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def record_from_summary(profile: str, data: dict[str, Any], path: Path) -> RunRecord:
    """A ``data-workload/1`` summary as a record, as if it had been tracked.

    Raises:
        BadInput: Its sections, epochs or rounds are malformed (naming the field).
    """
    for key in (DATA_SUMMARY_OUTPUTS, DATA_SUMMARY_CONFIG):
        if not isinstance(data.get(key), dict):
            raise BadInput(f"{path}: a {DATA_SUMMARY_SCHEMA} summary needs {key} (an object)")
    epochs, rounds = _details(data, path)
    metrics: dict[str, list[tuple[int, float]]] = {}
    where = f"{path}: {DATA_SUMMARY_DETAILS}"
    for i, e in enumerate(epochs):
        step = e.get(DATA_SUMMARY_EPOCH) if isinstance(e, dict) else None
        if not isinstance(e, dict) or isinstance(step, bool) or not isinstance(step, int):
            raise BadInput(f"{where}.{DATA_SUMMARY_EPOCHS}[{i}] is not an epoch with an integer {DATA_SUMMARY_EPOCH}")  # fmt: skip
        for metric in (SCAN_EPOCH_S, SCAN_AU):
            value = e.get(scan_epoch_field(metric))
            if value is not None and not _number(value):
                raise BadInput(f"{where}.{DATA_SUMMARY_EPOCHS}[{i}].{scan_epoch_field(metric)} = {value!r} is not a number")  # fmt: skip
            if value is not None:
                metrics.setdefault(metric, []).append((step, float(value)))
    for i, value in enumerate(rounds):
        if not _number(value):
            raise BadInput(f"{where}.{DATA_SUMMARY_ROUNDS}[{i}] = {value!r} is not a number")  # fmt: skip
        metrics.setdefault(WORKSPACE_SAVE_P99_MS, []).append((i, float(value)))
    return RunRecord(
        # The path: two summaries of one name in two directories are two runs.
        uuid=f"{SUMMARY_UUID_PREFIX}{path}",
        name=path.stem,
        inputs={
            **data[DATA_SUMMARY_CONFIG],
            WORKLOAD_INPUT: data.get(WORKLOAD_INPUT),
            "storage_profile": profile,
        },
        outputs=dict(data[DATA_SUMMARY_OUTPUTS]),
        metrics=metrics,
        started_at=parse_time(data.get(RUN_STARTED_AT)),
        finished_at=parse_time(data.get(RUN_FINISHED_AT)),
        source=str(path),
        profile_hint=profile,
        meta={k: v for k, v in (data.get("provenance") or {}).items() if isinstance(k, str)}
        if isinstance(data.get("provenance"), dict)
        else {},
    )
