"""Bad input gets a clear one-line error and the contract's exit code; the shipped prices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkpoint_compare.cli import main
from checkpoint_compare.cost import DEFAULT_PRICING, load_pricing, profile_cost


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*args, "--no-track"])
    return result.exit_code, result.output


def test_shipped_pricing_is_the_gp3_list_price() -> None:
    pricing = load_pricing(DEFAULT_PRICING)
    gp3 = pricing.types["gp3"]
    assert (gp3.storage_gib_month, gp3.iops_month, gp3.throughput_mibps_month) == (
        0.08,
        0.005,
        0.040,
    )
    assert (gp3.iops_included, gp3.throughput_included_mibps) == (3000, 125)
    # 200 GiB × 0.08 + 3000 IOPS × 0.005 + 125 MiB/s × 0.040 = 16 + 15 + 5
    fast = profile_cost(pricing, "checkpoint-throughput", 730 * 3600, hook={})
    assert fast.storage_month == pytest.approx(36.0)
    assert fast.storage_run == pytest.approx(36.0)  # a run lasting a whole billing month
    assert fast.gpu_run == pytest.approx(730 * pricing.gpu_hourly_usd)
    base = profile_cost(pricing, "checkpoint-baseline", 3600, hook={})
    assert base.storage_month == pytest.approx(16.0)
    # the hook's record wins over the file; a local driver is priced at 0
    from_hook = profile_cost(pricing, "x", 3600, hook={"vac_type": "gp3", "vac_iops": 4000})
    assert from_hook.storage_month == pytest.approx(16.0 + 5.0)
    sandbox = profile_cost(pricing, "checkpoint-throughput", 3600, hook={"driver": "local"})
    assert sandbox.storage_month == 0 and sandbox.volume_type == "local"


def test_no_source_is_a_usage_error() -> None:
    code, output = _invoke()
    assert code == 2 and "give exactly one source" in output
    code, output = _invoke("--pipeline", "abc")
    assert code == 2 and "needs --api-host and --project" in output


def test_bad_pricing_file(tmp_path: Path) -> None:
    pricing = tmp_path / "pricing.yaml"
    pricing.write_text("defaults: {volume_size_gib: -1, gpu_hourly_usd: 1}\nvolume_types: {}\n")
    code, output = _invoke("--offline-root", str(tmp_path), "--pricing", str(pricing))
    assert code == 2 and "volume_size_gib must be a finite number >= 0" in output
    pricing.write_text(
        "defaults: {volume_size_gib: 1, gpu_hourly_usd: 1}\nvolume_types: {}\n"
        "profiles: {a: {type: io2}}\n"
    )
    code, output = _invoke("--offline-root", str(tmp_path), "--pricing", str(pricing))
    assert code == 2 and "profile a: unknown volume type 'io2'" in output


def test_bad_summary_and_offline_root(tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    summary.write_text(json.dumps({"schema": "fio-sweep/1"}))
    code, output = _invoke("--summary", f"a={summary}", "--summary", f"b={summary}")
    assert code == 2 and "is not a checkpoint-training/1 summary (schema: 'fio-sweep/1')" in output
    code, output = _invoke("--summary", str(summary))
    assert code == 2 and "expected PROFILE=PATH" in output
    code, output = _invoke("--offline-root", str(tmp_path / "nowhere"))
    assert code == 2 and "is not a directory" in output


def test_empty_offline_root_means_runs_missing(tmp_path: Path) -> None:
    code, output = _invoke("--offline-root", str(tmp_path))
    assert code == 3 and "found: none" in output


def test_exit_codes_are_one_table_in_help_and_docs() -> None:
    from checkpoint_compare.errors import EXIT_CODES, BadInput, NotComparable, RunsMissing
    from checkpoint_storage_bench.errors import BenchError

    code, output = _invoke("--help")
    assert code == 0
    docs = (Path(__file__).resolve().parents[2] / "docs" / "compare.md").read_text()
    for exit_code, text in EXIT_CODES.items():
        assert f"{exit_code}  {text}" in output
        assert f"| `{exit_code}` | {text} |" in docs
    for error in (BadInput, NotComparable, RunsMissing):
        assert issubclass(error, BenchError) and error.exit_code in EXIT_CODES


def test_api_calls_retry_5xx_and_stop_on_4xx() -> None:
    from polyaxon.exceptions import ApiException

    from checkpoint_compare.errors import RunsMissing, SourceUnavailable
    from checkpoint_compare.sources import _with_retries
    from checkpoint_storage_bench.retry import Backoff

    answers = [ApiException(status=503, reason="Unavailable"), "ok"]

    def flaky() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert _with_retries("listing", flaky, Backoff(delays=(0,))) == "ok"

    def down() -> str:
        raise ApiException(status=502, reason="Bad Gateway")

    with pytest.raises(SourceUnavailable, match="listing: Polyaxon API unavailable"):
        _with_retries("listing", down, Backoff(delays=(0, 0)))

    def missing() -> str:
        raise ApiException(status=404, reason="Not Found")

    with pytest.raises(RunsMissing, match="HTTP 404"):
        _with_retries("fetching run x", missing, Backoff(delays=(0, 0)))


def test_gke_classes_are_priced_as_hyperdisk_balanced() -> None:
    # What the hook records for the bundle's GKE classes (connections/vac-gke-hyperdisk.yaml).
    pricing = load_pricing(DEFAULT_PRICING)
    hook = {"driver": "pd.csi.storage.gke.io", "vac_iops": "6000", "vac_throughput": "290Mi"}
    cost = profile_cost(pricing, "checkpoint-throughput", 730 * 3600, hook=hook)
    assert cost.volume_type == "hyperdisk-balanced"
    assert (cost.iops, cost.throughput_mibps) == (6000, 290)
    hd = pricing.types["hyperdisk-balanced"]
    assert (hd.iops_included, hd.throughput_included_mibps) == (3000, 140)
    assert hd.as_of  # the date the list prices were read
    expected = 200 * hd.storage_gib_month + 3000 * hd.iops_month + 150 * hd.throughput_mibps_month
    assert cost.storage_month == pytest.approx(expected)
    # A quantity the API server would refuse is an input error, not a silent default.
    with pytest.raises(Exception, match="290 Mi"):
        profile_cost(pricing, "x", 3600, hook=hook | {"vac_throughput": "290 Mi"})
