"""The overhead check compares like with like, and flags above 10%."""

from __future__ import annotations

from pathlib import Path

from checkpoint_storage_bench.fio import Measures
from fio_sweep.commands import CaseResult, overhead_check
from fio_sweep.spec import load_spec


def _result(mb_per_s: float) -> CaseResult:
    spec = load_spec()
    return CaseResult(spec.case(spec.overhead_case), Measures(bw_bytes=mb_per_s * 1e6))


def test_slower_claim_is_flagged():
    check = overhead_check(_result(800), _result(1000), Path("/local"))
    assert check["overhead_pct"] == 20.0
    assert check["flagged"] and check["note"] is None


def test_within_ten_percent_is_not_flagged():
    check = overhead_check(_result(950), _result(1000), Path("/local"))
    assert not check["flagged"]


def test_direct_against_buffered_is_not_compared():
    check = overhead_check(_result(800), _result(5000), Path("/tmp/local"), same_io=False)
    assert check["overhead_pct"] is None and not check["flagged"]
    assert "O_DIRECT" in check["note"]
