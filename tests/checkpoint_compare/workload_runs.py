"""Hand-made data-workload runs for the verdict tests: two scans a side, a workspace's
rounds, judged as the verdict judges them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from checkpoint_compare.comparison import Thresholds
from checkpoint_compare.cost import DEFAULT_PRICING, load_pricing
from checkpoint_compare.records import RunRecord
from checkpoint_compare.table import Budget
from checkpoint_compare.verdict import Verdict, judge_runs

BASE, FAST = "checkpoint-baseline", "checkpoint-throughput"
SCAN_INPUTS = {"workload": "scan", "dataset_format": "webdataset", "dataset_size": 1 << 30}
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
_order = iter(range(10_000))


def scan_run(
    profile: str, epochs: list[float], au: list[float], at: datetime | None = None, **inputs
) -> RunRecord:
    n = next(_order)
    start = at or T0 + timedelta(minutes=n)
    return RunRecord(
        uuid=f"{profile}-{n}",
        name="data",
        inputs={**SCAN_INPUTS, "storage_profile": profile, **inputs},
        outputs={"scan_epoch_s": sorted(epochs)[len(epochs) // 2], "scan_au": au[0]},
        metrics={"scan_epoch_s": list(enumerate(epochs)), "scan_au": list(enumerate(au))},
        started_at=start,
        finished_at=start + timedelta(seconds=sum(epochs)),
    )


def judge(records: list[RunRecord], baseline: str | None = None, **budget) -> Verdict:
    """The one verdict's engine over the runs, as ``python -m checkpoint_compare`` judges
    them."""
    pricing = load_pricing(DEFAULT_PRICING, None, None)
    verdict, _ = judge_runs(
        records, pricing, Thresholds(warmup=1), baseline=baseline,
        budget=Budget(**budget),
    )  # fmt: skip
    return verdict


BASE_EPOCHS = ([14.0, 10.0, 10.2, 9.9, 10.1, 10.0], [13.0, 10.0, 9.9, 10.1, 10.0, 10.0])
FAST_EPOCHS = ([9.0, 7.3, 7.2, 7.4, 7.3, 7.2], [9.0, 7.2, 7.2, 7.3, 7.1, 7.2])
BASE_AU = [0.5, 0.71, 0.7, 0.72, 0.7, 0.71]
FAST_AU = [0.8, 0.97, 0.97, 0.96, 0.97, 0.98]


def slow_and_fast() -> list[RunRecord]:
    """Two runs a side (the pipeline's repeats), baseline first."""
    return [
        *(scan_run(BASE, e, BASE_AU) for e in BASE_EPOCHS),
        *(scan_run(FAST, e, FAST_AU) for e in FAST_EPOCHS),
    ]


def workspace_run(profile: str, rounds: list[float]) -> RunRecord:
    n = next(_order)
    return RunRecord(
        uuid=f"ws-{profile}-{n}",
        inputs={"workload": "workspace", "storage_profile": profile, "files": 200},
        outputs={"workspace_save_p99_ms": max(rounds)},
        metrics={"workspace_save_p99_ms": list(enumerate(rounds))},
        started_at=T0 + timedelta(minutes=n),
    )
