"""The parser on fio 3.33 JSON captured with fixtures/capture.sh."""

from __future__ import annotations

import json

import pytest

from checkpoint_storage_bench.fio import FioOutputError, extract_json, parse_jobs

from .helpers import FIXTURES


def load(name: str) -> dict:
    return extract_json((FIXTURES / name).read_text())


def test_numjobs_with_group_reporting_is_one_aggregated_entry():
    doc = load("randread_numjobs4.json")
    assert len(doc["jobs"]) == 1 and doc["jobs"][0]["job options"]["numjobs"] == "4"
    m = parse_jobs(doc, "randread_4k")
    assert m.bw_bytes == 378861586
    assert m.iops == pytest.approx(92495.504496)
    assert m.bw_mbps == pytest.approx(378.861586)
    # clat percentiles, ns -> us.
    assert (m.lat_p50_us, m.lat_p99_us, m.lat_p999_us) == (626.688, 3489.792, 5799.936)
    # The direction's runtime (ms), not job_runtime, which adds up the 4 jobs.
    assert m.runtime_s == pytest.approx(1.001)
    assert m.errors == 0 and m.error_messages == []
    assert set(m.directions) == {"read"}


def test_read_write_mix_adds_bandwidth_and_takes_the_worse_latency():
    m = parse_jobs(load("randrw_mix.json"))
    read, write = m.directions["read"], m.directions["write"]
    assert read["bw_bytes"] == 1085435908 and write["bw_bytes"] == 476036219
    assert m.bw_bytes == read["bw_bytes"] + write["bw_bytes"]
    assert m.iops == pytest.approx(read["iops"] + write["iops"])
    assert m.lat_p99_us == max(read["lat_p99_us"], write["lat_p99_us"]) == 569.344
    assert m.lat_p999_us == 1810.432


def test_entries_without_group_reporting_are_summed():
    doc = load("numjobs2_no_group.json")
    assert len(doc["jobs"]) == 2
    m = parse_jobs(doc, "two_jobs")
    assert m.bw_bytes == 1206202506 + 1204109540
    assert m.runtime_s == pytest.approx(1.002)


def test_sequential_write_with_end_fsync():
    m = parse_jobs(load("seqwrite_fsync.json"), "seqwrite_1m")
    assert set(m.directions) == {"write"}
    assert m.directions["write"]["io_bytes"] == 32 * 1024**2
    assert m.bw_bytes == 2097152000 and m.iops == 2000


def test_failed_job_after_a_note_line_reports_its_errno():
    text = (FIXTURES / "failed_enospc.json").read_text()
    assert text.startswith("fio: pid=")  # fio's note before the JSON
    m = parse_jobs(extract_json(text), "full")
    assert m.errors == 1
    assert m.error_messages == ["errno 28 (No space left on device)"]
    assert m.bw_bytes == 0 and m.lat_p99_us is None


def test_continue_on_error_counts_every_error():
    doc = load("seqwrite_fsync.json")
    doc["jobs"][0].update(error=5, total_err=3)
    m = parse_jobs(doc)
    assert m.errors == 3 and m.error_messages == ["errno 5 (Input/output error)"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no JSON"),
        ("fio: engine libaio not loadable\n", "no JSON"),
        ('{"jobs": [', "malformed"),
        ('{"jobs": []}', "no jobs"),
    ],
)
def test_output_without_results_is_an_error(text, message):
    with pytest.raises(FioOutputError, match=message):
        extract_json(text)


def test_unknown_job_name_is_an_error():
    with pytest.raises(FioOutputError, match="no job named 'other'"):
        parse_jobs(json.loads((FIXTURES / "randrw_mix.json").read_text()), "other")
