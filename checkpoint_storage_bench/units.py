"""Byte sizes as people write them ("64MiB", "1.5GB", "4k") and back, and Kubernetes
quantities ("290Mi", "3k", "500m") as the API server reads them."""

from __future__ import annotations

import math
import re
from decimal import Decimal

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse a byte size; bare single letters (k, M, G) are binary, as in fio.

    Raises:
        ValueError: The text is not a non-negative size with a known unit.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (expected e.g. 64MiB, 1GB, 4k)")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}")
    return int(float(number) * factor)


def format_bytes(n: float) -> str:
    """Format a byte count with a binary unit, e.g. 1.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def significant(value: float, digits: int = 4) -> float:
    """``value`` rounded to ``digits`` significant digits: what a figure can tell.

    >>> significant(1.6497099000000617)
    1.65
    >>> significant(123456.7)
    123500.0
    >>> significant(0.000123456)
    0.0001235
    """
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


# Kubernetes quantities (k8s.io/apimachinery resource.Quantity), as class parameters are
# written: "290Mi" (GKE throughput), "3k", "1.5G", "500m". Unlike parse_size above, the
# suffixes are case-sensitive and decimal unless they say "i": "1k" is 1000, "1Ki" 1024,
# "1m" is one thousandth and "1M" a million; "1K" is not a quantity at all.
_QUANTITY_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY_DECIMAL = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
# <sign><digits>[.<digits>] or <digits>. or .<digits>, then a suffix or a decimal exponent.
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<exponent>[eE][+-]?\d+)|(?P<suffix>[A-Za-z]*))$"
)


def parse_quantity(text: str | int | float) -> float:
    """Parse a Kubernetes quantity with the API server's suffix rules.

    Binary suffixes ``Ki Mi Gi Ti Pi Ei`` (powers of 1024), decimal ``n u m k M G T P E``
    (powers of 1000, ``m`` = 10⁻³), or a decimal exponent (``1e3``, ``5E-2``). No spaces,
    case-sensitive. A number without a suffix is taken as is.

    >>> parse_quantity("290Mi") == 290 * 2**20
    True
    >>> parse_quantity("3k"), parse_quantity("1.5G"), parse_quantity("500m")
    (3000.0, 1500000000.0, 0.5)

    Raises:
        ValueError: Not a quantity (names the text and the accepted suffixes).
    """
    if isinstance(text, bool):
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    if isinstance(text, int | float):
        return float(text)
    match = _QUANTITY.match(str(text))
    if not match:
        raise ValueError(
            f"not a Kubernetes quantity: {text!r} (expected a number with an optional "
            "suffix, e.g. 290Mi, 1Gi, 3k, 1.5G, 500m, 1e3; no spaces)"
        )
    number = Decimal(match["number"])
    if match["exponent"]:
        return float(number.scaleb(int(match["exponent"][1:])))
    suffix = match["suffix"]
    if suffix in _QUANTITY_BINARY:
        return float(number * _QUANTITY_BINARY[suffix])
    if suffix in _QUANTITY_DECIMAL:
        return float(number.scaleb(_QUANTITY_DECIMAL[suffix]))
    hint = " (kilo is a lower-case k)" if suffix == "K" else ""
    raise ValueError(
        f"unknown suffix {suffix!r} in Kubernetes quantity {text!r}{hint}; known: "
        f"{' '.join(_QUANTITY_BINARY)} (binary), {' '.join(s for s in _QUANTITY_DECIMAL if s)} "
        "(decimal)"
    )
