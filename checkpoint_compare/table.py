"""The table of workloads: what each one is judged by, one frozen row per workload.

The checkpointing training run is the first row; the data workloads (scan, materialize,
workspace) the others. A row names the headline figure and its unit (lower is better for
every one), how a run's samples are read, the inputs that must match across runs, the budget
test and the words the reports use. The verdict's engine (refusals, the run-level shift,
the cost, the recommendation, the reports and the JSON schema) is the same for every row;
this module holds only the table, so every part can read it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from checkpoint_compare.cost import check_amount
from checkpoint_storage_bench.config_cli import FiniteFloat, cli
from checkpoint_storage_bench.contract import (
    CADENCE_INPUT,
    CALIBRATED_RUNS,
    CHECKPOINT_METRICS,
    COMPARABLE_INPUTS,
    DATA_COMPARABLE_INPUTS,
    DATA_FORMAT_BOUND_INPUTS,
    DATA_REQUIRED_INPUTS,
    DROP_CACHE_INPUT,
    MATERIALIZE_TOTAL_S,
    REQUIRED_INPUTS,
    SCAN_AU,
    SCAN_CACHE_KEPT_OUT,
    SCAN_EPOCH_S,
    VERDICT_RUNS_PER_BLOCK,
    WORKLOAD_BUDGETS,
    WORKLOADS,
    WORKSPACE_SAVE_P99_MS,
    CalibratedRuns,
)


class Judged(Protocol):
    """What a budget test reads of one profile's figures."""

    median: float
    au: float | None


NONE_MEETS = "none"
"""``recommended_profile`` when no profile can be recommended."""


@dataclass(frozen=True)
class Budget:
    """What the team can accept, and how often it checkpoints (one section of the verdict's
    settings: each field is an option of ``python -m checkpoint_compare``). Each workload
    tests its own fields (``contract.WORKLOAD_BUDGETS``); the others answer nothing for it.
    """

    max_pause_s: float | None = field(default=None, metadata=cli(click_type=FiniteFloat()))
    """Checkpoint budget: the longest acceptable (median) pause per checkpoint, seconds."""
    max_pause_share: float | None = field(default=None, metadata=cli(click_type=FiniteFloat(0, 1)))
    """Checkpoint budget: the largest acceptable share of the runtime spent paused (0-1)."""
    checkpoints_per_month: float | None = field(
        default=None, metadata=cli(click_type=FiniteFloat())
    )
    """The team's checkpoint cadence, for the net cost (GPU time paused + storage)."""
    min_au: float | None = field(default=None, metadata=cli(click_type=FiniteFloat(0, 1)))
    """Scan budget: the lowest acceptable accelerator utilization (0-1; MLPerf: 0.9)."""
    max_p99_ms: float | None = field(default=None, metadata=cli(click_type=FiniteFloat()))
    """Workspace budget: the highest acceptable p99 save latency, ms."""

    def __post_init__(self) -> None:
        for name in self.given():
            check_amount(getattr(self, name), name)
        for name in ("max_pause_share", "min_au"):
            if (value := getattr(self, name)) is not None and value > 1:
                raise ValueError(f"{name} is a share (0-1): {value}")

    def given(self) -> list[str]:
        """The fields given, in declaration order."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


@dataclass(frozen=True)
class WorkloadRow:
    """What one workload is judged by.

    Attributes:
        name: The workload (``contract.WORKLOADS``).
        headline: The output (and, per epoch or round, the metric) of the headline figure.
        label: Its name for people.
        unit: Its unit.
        sample_metric: The metric a run logs once per epoch or round: its within-run
            samples, the first ``--warmup`` of them left out; None: the run's headline
            output is its one sample.
        comparable: Inputs that must be equal across all runs.
        required: Inputs every run must record: without them a comparison cannot be
            vouched for (the others count as equal when no run recorded them).
        format_bound: Inputs compared only for these dataset formats (a shard size means
            nothing to a directory of files).
        budget: The budget test of one profile: True/False, or None when the budget asked
            cannot be judged on it (or none was asked).
        budget_words: The budget in words, None when none was asked.
        unjudgeable: Why no profile can be held to the budget asked (e.g. no AU
            recorded), given the profiles; None when it can.
        budget_figure: The figure the budget is tested on, in words, for one profile.
        refusals: The workload's own reasons to refuse runs, given (label, run) pairs:
            one line each, none when the runs can be compared.
        title: What the workload stands for, for a report's title.
        stem: The headline's name in output names and reasons (``pause`` gives
            ``pause_delta_s``, ``<profile>_pause_s_median``).
        training: The workload is a training run: its figures (stages, runtime, loss, fio,
            hook) are made, and the whole run (runtime, final loss, the cost of a run)
            decides the outcome; otherwise the headline's difference does.
        au_metric: The accelerator utilization a run logs beside its headline (a scan's),
            reported per profile and read by the budget test; None when it has none.
        floor: The practical floor of the headline's difference, given the thresholds and
            the baseline's median: below it a difference never counts.
        budget_fields: The :class:`Budget` fields the workload's verdict reads (its budget,
            and the checkpoint cadence for a training row): the others answer nothing.
        budget_confidence: The budget is tested on an upper confidence bound of each run's
            figure (the checkpoint pause), so its words carry the confidence; otherwise on
            each run's median.
        runs_per_block: Runs of one block (a profile's repeats back to back) counted as
            independent: the calibrated design (``contract.VERDICT_RUNS_PER_BLOCK``).

    The checkpoint row's budget (``--max-pause-s``, ``--max-pause-share``) is tested on the
    pause's figures per run (:mod:`checkpoint_compare.recommendation`), its ``budget`` test
    unused.
    """

    name: str
    headline: str
    label: str
    unit: str
    sample_metric: str | None
    comparable: tuple[str, ...]
    required: tuple[str, ...] = ()
    format_bound: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    budget: Callable[[Judged, Budget], bool | None] = lambda p, b: None
    budget_words: Callable[[Budget], str | None] = lambda b: None
    unjudgeable: Callable[[list[Judged], Budget], str | None] = lambda ps, b: None
    budget_figure: Callable[[Judged], str] = lambda p: ""
    refusals: Callable[[list[tuple[str, Any]]], list[str]] = lambda runs: []
    title: str = ""
    stem: str = ""
    training: bool = False
    au_metric: str | None = None
    floor: Callable[[Any, float], float] = lambda t, base: t.runtime_floor * base
    budget_fields: tuple[str, ...] = ()
    budget_confidence: bool = False

    @property
    def runs_per_block(self) -> int:
        return VERDICT_RUNS_PER_BLOCK[self.name]

    @property
    def calibrated(self) -> CalibratedRuns:
        """How many runs a side the calibration measured to miss, and to show both goals."""
        return CALIBRATED_RUNS[self.name]

    @property
    def words(self) -> str:
        """The headline in a reason: ``pause``, ``epoch time``."""
        return self.stem.replace("_", " ")

    def untested(self, budget: Budget) -> list[str]:
        """The fields of ``budget`` given that this workload's verdict does not read."""
        return [name for name in budget.given() if name not in self.budget_fields]


def _cache_not_kept_out(runs: list[tuple[str, Any]]) -> list[str]:
    """A scan whose page cache was not kept out measured memory, not the volume."""
    cached = [
        label
        for label, r in runs
        if r.outputs.get(SCAN_CACHE_KEPT_OUT) is False or r.inputs.get(DROP_CACHE_INPUT) is False
    ]
    if not cached:
        return []
    return [
        f"the page cache was not kept out of {', '.join(cached)} ({SCAN_CACHE_KEPT_OUT} "
        "false, or --no-drop-cache): it measured memory, not the volume"
    ]


def _pause_budget_words(b: Budget) -> str | None:
    limits = []
    if b.max_pause_s is not None:
        limits.append(f"pause ≤ {b.max_pause_s:g} s per checkpoint")
    if b.max_pause_share is not None:
        limits.append(f"≤ {b.max_pause_share:.1%} of the run paused")
    return ", ".join(limits) or None


def _au_budget(p: Judged, b: Budget) -> bool | None:
    if b.min_au is None or p.au is None:
        return None
    return p.au >= b.min_au


def _no_au(profiles: list[Judged], b: Budget) -> str | None:
    if b.min_au is None or any(p.au is not None for p in profiles):
        return None
    return (
        "no run recorded an accelerator utilization (the scans ran with --compute-ms 0): "
        f"there is no AU to judge against --min-au {b.min_au:g}"
    )


def _p99_budget(p: Judged, b: Budget) -> bool | None:
    return None if b.max_p99_ms is None else p.median <= b.max_p99_ms


ROWS: dict[str, WorkloadRow] = {
    row.name: row
    for row in (
        WorkloadRow(
            name=WORKLOADS[0],
            headline=CHECKPOINT_METRICS["pause_s"],
            label="pause per checkpoint",
            unit="s",
            sample_metric=CHECKPOINT_METRICS["pause_s"],
            comparable=COMPARABLE_INPUTS,
            required=REQUIRED_INPUTS,
            budget_words=_pause_budget_words,
            title="checkpoints of a training run",
            stem="pause",
            training=True,
            floor=lambda t, base: t.practical_floor_s,
            budget_fields=(*WORKLOAD_BUDGETS[WORKLOADS[0]], CADENCE_INPUT),
            budget_confidence=True,
        ),
        WorkloadRow(
            name="scan",
            headline=SCAN_EPOCH_S,
            label="epoch time",
            unit="s",
            sample_metric=SCAN_EPOCH_S,
            comparable=DATA_COMPARABLE_INPUTS["scan"],
            format_bound=DATA_FORMAT_BOUND_INPUTS,
            required=DATA_REQUIRED_INPUTS["scan"],
            budget=_au_budget,
            budget_words=lambda b: (
                None
                if b.min_au is None
                else f"accelerator utilization (AU) >= {b.min_au:.0%} (MLPerf: 90 %)"
            ),
            unjudgeable=_no_au,
            refusals=_cache_not_kept_out,
            budget_figure=lambda p: "no AU recorded" if p.au is None else f"AU {p.au:.0%}",
            title="reading the dataset as training does",
            stem="epoch_time",
            au_metric=SCAN_AU,
            budget_fields=WORKLOAD_BUDGETS["scan"],
        ),
        WorkloadRow(
            name="materialize",
            headline=MATERIALIZE_TOTAL_S,
            label="total time",
            unit="s",
            sample_metric=None,
            comparable=DATA_COMPARABLE_INPUTS["materialize"],
            format_bound=DATA_FORMAT_BOUND_INPUTS,
            required=DATA_REQUIRED_INPUTS["materialize"],
            title="building the preprocessed cache",
            stem="total_time",
            budget_fields=WORKLOAD_BUDGETS["materialize"],
        ),
        WorkloadRow(
            name="workspace",
            headline=WORKSPACE_SAVE_P99_MS,
            label="p99 save latency",
            unit="ms",
            sample_metric=WORKSPACE_SAVE_P99_MS,
            comparable=DATA_COMPARABLE_INPUTS["workspace"],
            required=DATA_REQUIRED_INPUTS["workspace"],
            budget=_p99_budget,
            budget_figure=lambda p: f"p99 save latency {p.median:.3g} ms",
            budget_words=lambda b: (
                None if b.max_p99_ms is None else f"p99 save latency <= {b.max_p99_ms:g} ms"
            ),
            title="a notebook workspace's saves",
            stem="p99_save",
            budget_fields=WORKLOAD_BUDGETS["workspace"],
        ),
    )
}
"""Every workload's row, the checkpoint's first."""

CHECKPOINT = ROWS[WORKLOADS[0]]
"""The training run's row."""
