"""Byte sizes as people write them ("64MiB", "1.5GB", "4k") and back, and Kubernetes
quantities ("290Mi", "3k", "500m") as the API server reads them."""

from __future__ import annotations

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


# Kubernetes quantities (k8s.io/apimachinery resource.Quantity) are how class parameters are
# written: "290Mi" (GKE throughput), "3k", "500m". Unlike parse_size, suffixes are
# case-sensitive and decimal unless they end in "i" ("1M" is 10^6, "1Mi" 2^20, "1m" 10^-3).
_QUANTITY_SUFFIXES = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
# sign, digits with an optional fraction (also "1." and ".5"), then either a decimal exponent
# ("e3", "E-2") or a suffix. A lone "E" is exa, as in Kubernetes, not an exponent.
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))(?:[eE](?P<exponent>[+-]?\d+)|(?P<suffix>[A-Za-z]*))$"
)


def parse_quantity(text: str) -> float:
    """Parse a Kubernetes quantity as the API server reads it.

    >>> parse_quantity("290Mi") == 290 * 2**20
    True
    >>> parse_quantity("3k"), parse_quantity("500m"), parse_quantity("1e3"), parse_quantity("6000")
    (3000.0, 0.5, 1000.0, 6000.0)

    Raises:
        ValueError: Not a quantity (spaces, an unknown or wrongly cased suffix, a bool).
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    if not isinstance(text, str):
        return float(text)
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(
            f"not a Kubernetes quantity: {text!r} (e.g. 290Mi, 1Gi, 3k, 500m, 1e3; no spaces)"
        )
    number = Decimal(match["number"])
    if match["exponent"] is not None:
        return float(number.scaleb(int(match["exponent"])))
    factor = _QUANTITY_SUFFIXES.get(match["suffix"])
    if factor is None:
        raise ValueError(
            f"unknown suffix {match['suffix']!r} in Kubernetes quantity {text!r} (known: "
            f"{', '.join(s for s in _QUANTITY_SUFFIXES if s)}; suffixes are case-sensitive)"
        )
    return float(number * factor)
