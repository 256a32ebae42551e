"""Fixtures of the verdict tests (the recorded-run writers live in ``recorded.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from checkpoint_storage_bench.tracking import offline_root


@pytest.fixture(autouse=True)
def _fast_tracking_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polyaxon sleeps ``tracking_flush_delay`` (1 s) in every end(); the offline event
    writers close synchronously before it, so the tests skip the wait."""
    from polyaxon import settings

    monkeypatch.setattr(settings.CLIENT_CONFIG, "tracking_flush_delay", 0)


@pytest.fixture
def runs_root() -> Path:
    """The offline root the hand-made runs land in."""
    return offline_root()


@pytest.fixture
def pricing_file(tmp_path: Path) -> Callable[..., Path]:
    """Write a pricing file variant (defaults: the shipped one's figures)."""

    def make(gpu_hourly: float = 4.0, extra_profiles: str = "") -> Path:
        path = tmp_path / "pricing.yaml"
        path.write_text(
            f"""
region: us-east-1
defaults: {{volume_size_gib: 200, gpu_hourly_usd: {gpu_hourly}, hours_per_month: 730}}
volume_types:
  gp3: {{storage_gib_month: 0.08, iops_included: 3000, iops_month: 0.005,
         throughput_included_mibps: 125, throughput_mibps_month: 0.040}}
  local: {{storage_gib_month: 0, note: "sandbox, priced at 0"}}
profiles:
  checkpoint-baseline: {{type: gp3, iops: 3000, throughput: 125}}
  checkpoint-throughput: {{type: gp3, iops: 6000, throughput: 250}}
{extra_profiles}
drivers: {{local: local}}
"""
        )
        return path

    return make
