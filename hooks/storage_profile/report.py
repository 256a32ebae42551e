"""The switch report: printed, written as JSON and logged to the Polyaxon run."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from checkpoint_storage_bench.contract import SWITCH_SCHEMA
from checkpoint_storage_bench.tracking import in_polyaxon_run, tracked_run


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    delta = datetime.fromisoformat(end) - datetime.fromisoformat(start)
    return round(delta.total_seconds(), 6)


@dataclass
class Report:
    """What a switch did and when each stage became true.

    ``requested_at`` is the patch time, or the time of the check when nothing needed
    patching; the durations count from it. ``unbound_noop``: the claim was not bound yet and
    already asked for the target class, which applies when its volume is provisioned (the
    settle times are 0). ``holder`` holds the claim's Lease; ``lease`` says what was done
    with it. ``ledger`` is the claim's ledger annotation as this switch left it.
    """

    backend: str
    namespace: str
    claim: str
    target_class: str
    claim_uid: str | None = None
    pv: str | None = None
    volume_handle: str | None = None
    driver: str | None = None
    previous_class: str | None = None
    applied_class: str | None = None
    class_parameters: dict[str, Any] = field(default_factory=dict)
    settle: str = "provider"
    provider: str | None = None
    patched: bool = False
    dry_run: bool = False
    rolled_back: bool = False
    unbound_noop: bool = False
    ledger: str | None = None
    holder: str | None = None
    lease: str | None = None
    outcome: str = "unknown"
    exit_code: int | None = None
    error: str | None = None
    requested_at: str | None = None
    k8s_settled_at: str | None = None
    provider_settled_at: str | None = None
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def k8s_settle_s(self) -> float | None:
        return seconds_between(self.requested_at, self.k8s_settled_at)

    @property
    def provider_settle_s(self) -> float | None:
        return seconds_between(self.k8s_settled_at, self.provider_settled_at)

    @property
    def total_settle_s(self) -> float | None:
        return seconds_between(self.requested_at, self.provider_settled_at or self.k8s_settled_at)

    def to_dict(self) -> dict[str, Any]:
        data = {"schema": SWITCH_SCHEMA, **asdict(self)}
        data.update(
            k8s_settle_s=self.k8s_settle_s,
            provider_settle_s=self.provider_settle_s,
            total_settle_s=self.total_settle_s,
        )
        return data

    def render(self) -> str:
        """A readable block for the op's log."""

        def dur(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}s"

        params = ", ".join(f"{k}={v}" for k, v in sorted(self.class_parameters.items()))
        lines = [
            f"storage profile: {self.outcome}"
            + (f" (exit {self.exit_code})" if self.exit_code else ""),
            f"  claim            {self.namespace}/{self.claim} (uid {self.claim_uid or '-'})",
            f"  volume           {self.pv or '-'}  handle {self.volume_handle or '-'}  "
            f"driver {self.driver or '-'}",
            f"  class            {self.previous_class or '-'} -> {self.target_class}"
            f"  (applied: {self.applied_class or '-'})",
            f"  parameters       {params or '-'}",
            f"  requested        {self.requested_at or '-'}",
            f"  k8s settled      {self.k8s_settled_at or '-'}  ({dur(self.k8s_settle_s)})",
            f"  provider settled {self.provider_settled_at or '-'}  "
            f"({dur(self.provider_settle_s)}, {self.provider or 'none'})",
            f"  total            {dur(self.total_settle_s)}",
            f"  lease            {self.lease or '-'}",
        ]
        if self.error:
            lines.append(f"  error            {self.error}")
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def log_to_polyaxon(self, summary_path: Path | None = None) -> bool:
        """Log names as inputs and durations as outputs, only inside a Polyaxon run.

        A failed switch also marks the run failed: ``end()`` would otherwise record success
        while the process exits non-zero.

        Returns:
            Whether anything was logged.
        """
        if not in_polyaxon_run():
            return False
        try:
            with tracked_run("storage-profile-switch", tags=["storage-profile"]) as tracker:
                tracker.log_inputs(
                    claim=self.claim,
                    namespace=self.namespace,
                    previous_class=self.previous_class,
                    target_class=self.target_class,
                    driver=self.driver,
                    volume_handle=self.volume_handle,
                    holder=self.holder,
                    # The class's parameters (type, iops, throughput, …) price the profile.
                    **{f"vac_{k.lower()}": v for k, v in self.class_parameters.items()},
                )
                tracker.log_outputs(
                    k8s_settle_s=self.k8s_settle_s,
                    provider_settle_s=self.provider_settle_s,
                    total_settle_s=self.total_settle_s,
                    applied_class=self.applied_class,
                    unbound_noop=self.unbound_noop,
                    # The claim's switches so far: the verdict refuses a profile whose claim
                    # was switched inside a training run's measured interval.
                    ledger=self.ledger,
                )
                if summary_path is not None and summary_path.exists():
                    tracker.log_artifact(summary_path, name="storage_profile_summary")
                if self.exit_code:
                    raise SwitchFailed(f"{self.outcome}: {self.error}")
        except SwitchFailed:
            pass
        return True


def not_switched(report: Report, holder: str | None, echo: Callable[[str], None]) -> Report:
    """``report`` as ``switch --only-if-switched`` leaves it when ``holder`` never switched
    the claim: nothing changed, said once."""
    note = (
        f"claim {report.namespace}/{report.claim} was never switched by {holder} "
        "(--only-if-switched): nothing to switch back; nothing was changed"
    )
    report.holder = holder
    report.outcome = "not-switched"
    report.notes.append(note)
    echo(note)
    return report


class SwitchFailed(Exception):
    """Raised inside the tracked run so that the run is recorded as failed."""
