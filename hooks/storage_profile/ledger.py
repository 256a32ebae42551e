"""The claim's own record of its switches, and the provider budget it implies.

Every switch the hook makes appends one entry to the claim's
:data:`~checkpoint_storage_bench.contract.LEDGER_ANNOTATION`, in the same merge patch as the
class change (atomic, and the claim's ``patch`` permission is all it needs). AWS may return
only a volume's latest modification, and GKE's once-per-4-hours rule has no API at all, so
the ledger is what counts switches against the driver's window
(:data:`~checkpoint_storage_bench.contract.MODIFICATION_WINDOWS`). It counts every switch
the hook asked for, including one the driver then refused: a conservative count.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from checkpoint_storage_bench.contract import (
    LEDGER_ANNOTATION,
    MODIFICATION_WINDOWS,
    LedgerEntry,
    format_ledger,
    parse_ledger,
)


def utcnow() -> datetime:
    """Now, to the second (the ledger's precision, so an entry compares equal once written)."""
    return datetime.now(UTC).replace(microsecond=0)


def read_ledger(claim: dict) -> list[LedgerEntry]:
    """The claim's ledger, oldest first.

    Raises:
        ValueError: The annotation is there but is not a ledger.
    """
    annotations = claim["metadata"].get("annotations") or {}
    return parse_ledger(annotations.get(LEDGER_ANNOTATION))


def with_entry(entries: list[LedgerEntry], entry: LedgerEntry) -> dict[str, str]:
    """The annotations a patch sets to append ``entry`` (a merge patch leaves the others)."""
    return {LEDGER_ANNOTATION: format_ledger([*entries, entry])}


@dataclass(frozen=True)
class Budget:
    """Where a claim stands against its driver's modification window.

    Attributes:
        allowed: Modifications allowed per window.
        window: The rolling window.
        recent: Switches inside the window, oldest first.
    """

    allowed: int
    window: timedelta
    recent: list[LedgerEntry]

    @property
    def exhausted(self) -> bool:
        return len(self.recent) >= self.allowed

    @property
    def next_at(self) -> datetime | None:
        """When one more switch fits: the oldest switch that still counts leaves the window."""
        if not self.exhausted:
            return None
        return self.recent[-self.allowed].at + self.window

    def describe(self, driver: str) -> str:
        hours = f"{self.window.total_seconds() / 3600:g} h"
        last = ", ".join(
            f"{e.at:%Y-%m-%dT%H:%M:%SZ} {e.from_class}->{e.to_class}" for e in self.recent
        )
        return (
            f"the claim's ledger ({LEDGER_ANNOTATION}) has {len(self.recent)} switches in the "
            f"last {hours} ({last}); {driver} allows {self.allowed} per {hours}"
        )


def budget(entries: list[LedgerEntry], driver: str, now: datetime) -> Budget | None:
    """The claim's budget under ``driver``'s window, or None for a driver without a limit."""
    limit = MODIFICATION_WINDOWS.get(driver)
    if limit is None:
        return None
    allowed, seconds = limit
    window = timedelta(seconds=seconds)
    return Budget(allowed, window, [e for e in entries if e.at > now - window])
