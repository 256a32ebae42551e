"""How the reports write a figure, in one place: what a person reads, not float noise.

Money to the cent (never ``-0.00``), seconds to 3 significant digits, timestamps to the
second in UTC, a confidence level as asked.

>>> usd(-0.00004), usd(1234.567), usd(None)
('0.00 USD', '1,234.57 USD', '–')
>>> seconds(0.153456), seconds(54.77), seconds(-0.0001234, signed=True), seconds(0.0)
('0.153', '54.8', '-0.000123', '0')
>>> seconds(12345.6)
'12,300'
>>> timestamp("2026-12-01T23:41:29.123456+00:00")
'2026-12-01 23:41:29 UTC'
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from checkpoint_storage_bench.units import significant

DASH = "–"


def usd(value: float | None, unit: bool = True) -> str:
    """Dollars to the cent; a figure that rounds to zero is 0.00, never -0.00."""
    if value is None:
        return DASH
    cents = round(value, 2) or 0.0  # -0.0 is falsy: it becomes 0.0
    return f"{cents:,.2f}" + (" USD" if unit else "")


def seconds(value: float | None, signed: bool = False, digits: int = 3) -> str:
    """Seconds to ``digits`` significant digits, without a unit (the caller says ``s``)."""
    if value is None:
        return DASH
    if not math.isfinite(value):
        return str(value)
    rounded = significant(value, digits) or 0.0
    # Enough decimals for the significant digits, none beyond them.
    decimals = 0 if rounded == 0 else max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    text = f"{rounded:{'+' if signed else ''},.{decimals}f}"
    return "0" if rounded == 0 and not signed else ("±0" if rounded == 0 else text)


def timestamp(value: Any) -> str:
    """An ISO time (or datetime) to the second, in UTC; naive times are taken as UTC."""
    if value in (None, ""):
        return DASH
    when = value
    if not isinstance(when, datetime):
        try:
            when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return str(value)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def level(achieved: float | None, asked: float | None) -> str:
    """An interval's confidence as asked for (the verdict's intervals between runs have
    exactly that level), else the one it has."""
    shown = asked if asked is not None else achieved
    return "" if shown is None else f"{shown:.0%}"
