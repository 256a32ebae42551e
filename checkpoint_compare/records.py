"""The plain data every loader produces and every later stage consumes.

A :class:`RunRecord` is one Polyaxon run reduced to what the verdict needs: its status,
inputs, outputs and metric series. Loaders (offline directories, summary JSONs, the API)
only have to fill it in; the statistics never see where it came from, so they are tested
on hand-made records.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from checkpoint_storage_bench.contract import (
    DATA_WORKLOADS,
    DIVERGED_AT_STEP,
    FIO_METRIC,
    FIO_OUTPUT,
    MATERIALIZE_TOTAL_S,
    RESUMED_FROM_STEP,
    SCAN_AU,
    SCAN_EPOCH_S,
    SIGNED_FIGURES,
    WORKLOAD_INPUT,
    output_key,
)

# A metric series: (step, value) pairs in step order.
Series = list[tuple[int, float]]

# The loss of a run that diverged is NaN or infinite: a result of training, reported as such
# (the run cannot win), not malformed input. Every other recorded number must be finite
# (and, in a training run, >= 0: the loss is also the only figure that may be negative).
SUMMARY_UUID_PREFIX = "summary:"
"""The uuid of a run read from a summary file: this prefix and the file's path."""

LOSS_KEYS = SIGNED_FIGURES

POSITIVE_FIGURES = ("runtime_s", SCAN_EPOCH_S, MATERIALIZE_TOTAL_S)
"""Times of a whole run, epoch or build: one that took no time measured nothing."""

SHARES = (SCAN_AU,)
"""Figures that are a share, 0 to 1 (compute time / wall time cannot exceed 1)."""


class RunKind(enum.Enum):
    """Which part of the pipeline produced a run."""

    TRAINING = "training"
    FIO = "fio"
    HOOK = "hook"
    DATA = "data"
    OTHER = "other"


@dataclass
class RunRecord:
    """One run, as loaded from any source.

    Attributes:
        uuid: The Polyaxon run uuid (or a label for summary files).
        name: The run name.
        status: Polyaxon status, e.g. ``succeeded``, ``failed``, ``running``.
        inputs: Run inputs.
        outputs: Run outputs.
        metrics: Metric name → series.
        created_at: When the run was created; orders runs of one pipeline.
        started_at: Start of the measured interval.
        finished_at: End of the measured interval.
        message: The failure reason, when the run failed.
        source: Where it was loaded from (a path or URL), for messages.
        profile_hint: A profile given explicitly (``--run PROFILE=UUID``).
        meta: Run meta (the trainer's ``code_revision`` and ``image_digest``).
    """

    uuid: str
    name: str = ""
    status: str = "succeeded"
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Series] = field(default_factory=dict)
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    message: str = ""
    source: str = ""
    profile_hint: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> RunKind:
        """Classify by the inputs/outputs each part records (docs/contracts.md)."""
        if "storage_profile" in self.inputs and (
            "checkpoint_format" in self.inputs or "model_size_bytes" in self.inputs
        ):
            return RunKind.TRAINING
        if self.inputs.get(WORKLOAD_INPUT) in DATA_WORKLOADS:
            return RunKind.DATA
        if "target_class" in self.inputs and "claim" in self.inputs:
            return RunKind.HOOK
        if any(FIO_OUTPUT.match(k) for k in self.outputs) or any(
            FIO_METRIC.match(k) for k in self.metrics
        ):
            return RunKind.FIO
        return RunKind.OTHER

    def check_numbers(self) -> None:
        """Refuse non-finite numbers (NaN, ±inf, or ``1e400`` read as inf) anywhere but the
        loss, and, in a training or data-workload run, a negative figure, a time of a run,
        epoch or build that is not positive (``POSITIVE_FIGURES``) or a share above 1
        (``SHARES``; the loss is signed, ``contract.SIGNED_FIGURES``): the writers record
        null for what they cannot tell, so such a figure is made up, and it would be ranked
        as the fastest.

        Raises:
            ValueError: Naming the field and the value.
        """
        measured = self.kind in (RunKind.TRAINING, RunKind.DATA)
        for section, values in (("inputs", self.inputs), ("outputs", self.outputs),
                                ("meta", self.meta)):  # fmt: skip
            for key, value in values.items():
                if key not in LOSS_KEYS and not _finite(value):
                    raise ValueError(f"{section} {key} = {value!r} is not a finite number")
                if measured and section == "outputs" and (why := _unsigned_problem(key, value)):
                    raise ValueError(f"{section} {key} = {value!r} {why}")
        for name, series in self.metrics.items():
            for step, value in series:
                if name not in LOSS_KEYS and not _finite(value):
                    raise ValueError(
                        f"metric {name} at step {step} = {value!r} is not a finite number"
                    )
                if measured and (why := _unsigned_problem(name, value)):
                    raise ValueError(f"metric {name} at step {step} = {value!r} {why}")

    def _step_output(self, name: str) -> int | None:
        """A step the trainer records as an output, 0 (or a null summary key) for none."""
        step = self.outputs.get(name)
        if isinstance(step, bool) or not isinstance(step, int | float) or not step > 0:
            return None
        return int(step)

    @property
    def resumed_from_step(self) -> int | None:
        """The step a resumed run continued from; None for a run that started at step 0
        (the trainer's output is 0 then, its summary null)."""
        return self._step_output(RESUMED_FROM_STEP)

    @property
    def diverged_at_step(self) -> int | None:
        """The first step whose loss was not finite; None while the loss stayed finite."""
        return self._step_output(DIVERGED_AT_STEP)

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def label(self) -> str:
        """A short identification for messages: name and uuid prefix (a summary file: its
        file name, which names the run, where a uuid prefix would say only "summary:")."""
        if self.uuid.startswith(SUMMARY_UUID_PREFIX):
            return self.uuid.removeprefix(SUMMARY_UUID_PREFIX)
        short = self.uuid[:8]
        return f"{self.name} ({short})" if self.name else short

    def fio_cases(self) -> dict[str, dict[str, float]]:
        """The fio headline figures: case → {bw_mbps, iops, lat_p99_us, ...}.

        Outputs give the headline three; metric events add the other latency percentiles.
        """
        cases: dict[str, dict[str, float]] = {}
        for key, value in self.outputs.items():
            match = FIO_OUTPUT.match(key)
            if match and isinstance(value, int | float):
                cases.setdefault(match["case"], {})[match["measure"]] = float(value)
        for key, series in self.metrics.items():
            match = FIO_METRIC.match(key)
            if match and series:
                case = output_key(match["case"])
                cases.setdefault(case, {}).setdefault(match["measure"], series[-1][1])
        return cases


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _unsigned_problem(key: str, value: Any) -> str | None:
    """Why a measured run's figure cannot be what it says (None: it can)."""
    if key in LOSS_KEYS or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if key in POSITIVE_FIGURES and not value > 0:
        return "is not > 0 (a run that took no time measured nothing)"
    if value < 0:
        return "is negative (a measured run's figures are >= 0)"
    if key in SHARES and value > 1:
        return "is not a share between 0 and 1"
    return None


def parse_metric_events(text: str) -> Series:
    """Parse a Polyaxon metric event file (``step|timestamp|metric`` lines, with header).

    The same text comes from offline ``events/metric/<name>.plx`` files and from the API's
    ``orient=csv`` answer, so both loaders use this. Events without a step are skipped.
    """
    series: Series = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or parts[0] in ("", "step"):
            continue
        try:
            series.append((int(float(parts[0])), float(parts[-1])))
        except ValueError:
            continue
    series.sort(key=lambda point: point[0])
    return series


def parse_time(value: Any) -> datetime | None:
    """Parse an ISO timestamp as Polyaxon writes it; None when absent or unparsable."""
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
