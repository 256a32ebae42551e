"""Kubernetes quantities, read with the API server's rules (k8s.io/apimachinery
resource.Quantity): the values below are what ``resource.MustParse(x).AsApproximateFloat64()``
gives."""

from __future__ import annotations

import pytest

from checkpoint_storage_bench.units import parse_quantity, parse_size


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("290Mi", 290 * 2**20),  # GKE Hyperdisk throughput as its docs write it
        ("1Gi", 2**30),
        ("1Ki", 1024),
        ("2Ti", 2 * 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("3k", 3000),
        ("1.5G", 1.5e9),
        ("500m", 0.5),
        ("250u", 250e-6),
        ("7n", 7e-9),
        ("6000", 6000),
        ("125", 125),
        ("1M", 1e6),
        ("2T", 2e12),
        ("3P", 3e15),
        ("1E", 1e18),  # a lone E is exa, not an exponent
        ("1e3", 1000),
        ("1E3", 1000),
        ("5e-2", 0.05),
        ("2E+2", 200),
        ("+4k", 4000),
        ("-1Mi", -(2**20)),
        ("0.5Gi", 2**29),
        (".5Gi", 2**29),
        ("1.", 1),
        ("1.G", 1e9),
        ("0", 0),
        ("007", 7),
    ],
)
def test_kubernetes_suffixes(text: str, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value, rel=1e-15)


def test_numbers_pass_through() -> None:
    assert parse_quantity(3000) == 3000.0 and parse_quantity(1.5) == 1.5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1K", "kilo is a lower-case k"),  # upper-case K is not a Kubernetes suffix
        ("1KiB", "unknown suffix 'KiB'"),
        ("1MB", "unknown suffix 'MB'"),
        ("1e", "unknown suffix 'e'"),
        ("1mi", "unknown suffix 'mi'"),
        ("290 Mi", "not a Kubernetes quantity"),
        (" 1Gi", "not a Kubernetes quantity"),
        ("", "not a Kubernetes quantity"),
        (".", "not a Kubernetes quantity"),
        ("Mi", "not a Kubernetes quantity"),
        ("1.2.3", "not a Kubernetes quantity"),
        ("1e3k", "not a Kubernetes quantity"),
        ("0x10", "not a Kubernetes quantity"),
    ],
)
def test_what_is_not_a_quantity(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_quantity(text)
    assert repr(text) in str(info.value)


def test_bool_is_not_a_quantity() -> None:
    with pytest.raises(ValueError):
        parse_quantity(True)  # type: ignore[arg-type]


def test_differs_from_fio_style_sizes_on_purpose() -> None:
    # fio's "1M" is binary; Kubernetes' is decimal. Each parser keeps its own convention.
    assert parse_size("1M") == 2**20
    assert parse_quantity("1M") == 10**6
