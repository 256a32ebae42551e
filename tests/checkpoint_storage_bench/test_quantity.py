"""Kubernetes quantities, read with the API server's rules (k8s.io/apimachinery
resource.Quantity): the values are what ``resource.MustParse(x).AsApproximateFloat64()`` gives."""

from __future__ import annotations

import pytest

from checkpoint_storage_bench.units import parse_quantity, parse_size


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("290Mi", 290 * 2**20),
        ("140Mi", 140 * 2**20),
        ("1Ki", 2**10),
        ("1Gi", 2**30),
        ("2Ti", 2 * 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("3k", 3_000),
        ("1M", 1e6),
        ("1.5G", 1.5e9),
        ("2T", 2e12),
        ("1P", 1e15),
        ("1E", 1e18),
        ("500m", 0.5),
        ("5u", 5e-6),
        ("7n", 7e-9),
        ("6000", 6000),
        ("1e3", 1000),
        ("1E3", 1000),
        ("5e-2", 0.05),
        ("+4k", 4000),
        ("-1Mi", -(2**20)),
        ("0.5Gi", 2**29),
        (".5Gi", 2**29),
        ("1.", 1),
        ("0", 0),
    ],
)
def test_kubernetes_suffixes(text: str, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value, rel=1e-15)


@pytest.mark.parametrize(
    "text", ["1K", "1KiB", "1MB", "1mi", "290 Mi", " 1Gi", "", ".", "Mi", "1.2.3", "1e3k", "0x10"]
)
def test_what_is_not_a_quantity(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_quantity(text)
    assert repr(text) in str(info.value)


def test_numbers_pass_through_and_bools_do_not() -> None:
    assert parse_quantity(3000) == 3000.0  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        parse_quantity(True)  # type: ignore[arg-type]


def test_decimal_like_kubernetes_not_binary_like_fio() -> None:
    assert parse_quantity("1M") == 10**6 and parse_size("1M") == 2**20
