"""The verdict in a data workload's terms: epoch time and accelerator utilization for a scan,
total time for materialize, p99 save latency for a workspace; the run the unit of
replication; the checkpoint verdict's refusals and cost model; the recommendation against
--min-au / --max-p99-ms."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkpoint_compare.cli import main
from checkpoint_compare.comparison import Thresholds
from checkpoint_compare.cost import DEFAULT_PRICING, load_pricing
from checkpoint_compare.errors import BadInput, NotComparable, RunsMissing
from checkpoint_compare.records import RunRecord
from checkpoint_compare.verdict import judge_runs
from checkpoint_compare.workloads import is_data_comparison
from checkpoint_storage_bench.contract import (
    DATA_SUMMARY_SCHEMA,
    LEDGER_OUTPUT,
    RUN_STARTED_AT,
    VERDICT_OUTPUTS,
    LedgerEntry,
    format_ledger,
    headline_outputs,
    profile_headline_figures,
)
from tests.checkpoint_compare.workload_runs import (
    BASE,
    BASE_AU,
    BASE_EPOCHS,
    FAST,
    FAST_AU,
    FAST_EPOCHS,
    SCAN_INPUTS,
    T0,
    judge,
    scan_run,
    slow_and_fast,
    workspace_run,
)

REPO = Path(__file__).resolve().parents[2]


def test_scan_speaks_epoch_time_and_au_with_the_shift_and_its_interval() -> None:
    verdict = judge(slow_and_fast(), min_au=0.9)
    assert verdict.workload == "scan" and verdict.baseline == BASE
    base, fast = verdict.profiles
    assert len(base.samples) == 10 and [len(s) for s in base.run_samples] == [5, 5]
    assert base.au == pytest.approx(0.71) and fast.au == pytest.approx(0.97)
    assert fast.shift.has_interval and fast.shift.high < 0 and fast.significant
    assert fast.shift.n_x == 2 and "run medians" in fast.shift.method
    assert fast.relative == pytest.approx(-0.275)
    text = " ".join(verdict.sentences)
    assert "epoch time 7.2 s vs 10 s" in text and "28% faster" in text
    assert "keeps the GPUs fed at 97% AU, baseline 71%" in text
    assert verdict.recommended == FAST
    assert fast.cost.storage_month > base.cost.storage_month > 0
    # Without a budget the measurably faster profile is recommended, and nothing is said
    # to keep the GPUs fed: there is no AU floor to judge it against.
    free = judge(slow_and_fast())
    assert free.recommended == FAST
    assert "keeps the GPUs fed" not in " ".join(free.sentences)


def test_one_run_a_side_claims_nothing_and_asks_for_repeats() -> None:
    """The epochs of one run are not independent draws: one run a side cannot tell the
    profile from the run."""
    verdict = judge(
        [scan_run(BASE, BASE_EPOCHS[0], BASE_AU), scan_run(FAST, FAST_EPOCHS[0], FAST_AU)]
    )
    fast = verdict.profiles[1]
    assert not fast.shift.has_interval and not fast.significant
    assert "one run a side cannot separate the profile" in fast.shift.method
    assert "more runs, repeats, are needed" in verdict.sentences[0]
    assert verdict.verdict == "no measurable difference"


def test_the_au_budget_picks_the_cheapest_profile_that_meets_it() -> None:
    assert judge(slow_and_fast(), min_au=0.9).recommended == FAST
    assert judge(slow_and_fast(), min_au=0.6).recommended == BASE  # cheaper, and enough
    none = judge(slow_and_fast(), min_au=0.99)
    assert none.recommended is None
    assert none.verdict == FAST  # the verdict is about the difference, not the budget
    # The recommender's words are the checkpoint verdict's: each profile's figure named.
    assert (
        "no profile meets the budget: checkpoint-baseline: AU 71%; checkpoint-throughput: AU 97%"
        in none.sentences[-1]
    )
    assert "does not keep the GPUs fed" in none.sentences[0]


def test_the_au_budget_is_met_by_every_run_not_by_the_epochs_pooled() -> None:
    """Pooled, 8 of the fast profile's 12 epochs are at 97 % AU and the median meets 90 %;
    its second run starved the GPUs at 80 % for most of its epochs."""
    runs = [
        *(scan_run(BASE, e, BASE_AU) for e in BASE_EPOCHS),
        scan_run(FAST, FAST_EPOCHS[0], [0.97] * 6),
        scan_run(FAST, FAST_EPOCHS[1], [0.97] * 2 + [0.8] * 4),
    ]
    verdict = judge(runs, min_au=0.9)
    assert verdict.profiles[1].au == 0.97  # the pooled median
    assert verdict.profiles[1].meets_budget is False
    assert verdict.recommended is None


def test_repeats_back_to_back_count_as_one_block_and_interleaved_runs_as_replicates() -> None:
    """Four runs a side, 5 % apart with a 2 % spread between runs. Run as the pipeline runs
    them (AAAA BBBB), the runs of a block share their minutes on the machine and count as
    two: no claim. The same runs interleaved (AA BB AA BB) replicate the blocks: a claim."""
    base, fast = [1.02, 0.98, 1.01, 0.99], [0.97, 0.93, 0.96, 0.94]

    def runs(order: list[tuple[str, float]]) -> list:
        return [scan_run(p, [v] * 3, [0.5] * 3, at=T0 + timedelta(minutes=i))
                for i, (p, v) in enumerate(order)]  # fmt: skip

    blocked = judge(runs([(BASE, v) for v in base] + [(FAST, v) for v in fast]))
    shift = blocked.profiles[1].shift
    assert shift.n_x == shift.n_y == 4 and "2 and 2 counted" in shift.method
    assert shift.low < 0 < shift.high and not blocked.profiles[1].significant
    pairs = [(BASE, base[0]), (BASE, base[1]), (FAST, fast[0]), (FAST, fast[1]),
             (BASE, base[2]), (BASE, base[3]), (FAST, fast[2]), (FAST, fast[3])]  # fmt: skip
    interleaved = judge(runs(pairs))
    assert interleaved.profiles[1].significant
    assert interleaved.profiles[1].direction == "better"


def test_a_workspaces_runs_back_to_back_count_as_one_run() -> None:
    """A workspace's p99 moves with whatever shares its block: its repeats back to back count
    as one run, so one block a side has no interval; two passes (AA BB AA BB) count two."""
    base = [[30.0, 21.0, 22.0, 21.5], [30.0, 21.5, 22.0, 21.0]]
    fast = [[15.0, 9.0, 9.5, 9.2], [15.0, 9.3, 9.1, 9.4]]
    one_pass = [workspace_run(p, r) for p, runs in ((BASE, base), (FAST, fast)) for r in runs]
    shift = judge(one_pass).profiles[1].shift
    assert shift.n_x == shift.n_y == 2 and not shift.has_interval
    assert "1 and 1 runs counted (at most 1 a block" in shift.method
    two_passes = [workspace_run(p, r) for _ in range(2) for p, runs in ((BASE, base), (FAST, fast)) for r in runs]  # fmt: skip
    verdict = judge(two_passes)
    shift = verdict.profiles[1].shift
    assert shift.n_x == shift.n_y == 4 and "2 and 2 counted" in shift.method
    assert verdict.profiles[1].significant and verdict.profiles[1].direction == "better"


def test_without_min_au_no_profile_is_said_to_keep_the_gpus_fed() -> None:
    runs = [
        scan_run(BASE, [1.0, 1.0, 1.0], [0.12] * 3),
        scan_run(FAST, [1.0, 1.0, 1.0], [0.12] * 3),
    ]
    text = " ".join(judge(runs).sentences)
    assert "keeps the GPUs fed" not in text and "at 12% AU, baseline 12%" in text


def test_min_au_without_any_au_says_there_is_no_au_to_judge() -> None:
    runs = [
        RunRecord(uuid=f"r{p}", inputs={**SCAN_INPUTS, "storage_profile": p, "compute_ms": 0},
                  outputs={"scan_epoch_s": 1.0, "scan_au": None},
                  metrics={"scan_epoch_s": [(0, 1.0), (1, 1.0)]})
        for p in (BASE, FAST)
    ]  # fmt: skip
    verdict = judge(runs, baseline=BASE, min_au=0.9)
    assert verdict.recommended is None
    assert "there is no AU to judge against --min-au 0.9" in verdict.sentences[-1]
    assert "meets the budget" not in verdict.sentences[-1]


def test_an_unpriced_profile_is_never_called_the_cheapest() -> None:
    runs = [scan_run(BASE, [1.0] * 3, [0.5] * 3), scan_run("nvme-local", [1.0] * 3, [0.95] * 3)]
    verdict = judge(runs, min_au=0.9)
    assert verdict.recommended == "nvme-local"
    assert (
        "cheapest" not in verdict.recommendation.reason
        and "nothing is said of what it costs" in verdict.recommendation.reason
    )
    both = judge(runs, min_au=0.4)
    assert both.recommended == BASE  # priced before unpriced
    assert (
        "nvme-local also meets it, not priced: nothing is said of its cost"
        in both.recommendation.reason
    )


def test_noise_is_no_difference_and_the_cheapest_is_recommended() -> None:
    runs = [
        scan_run(BASE, [12.0, 10.0, 10.4, 9.7, 10.2, 9.9], [0.7] * 6),
        scan_run(BASE, [12.0, 10.3, 10.0, 9.8, 10.1, 9.9], [0.7] * 6),
        scan_run(FAST, [12.0, 10.1, 9.8, 10.3, 9.9, 10.0], [0.7] * 6),
        scan_run(FAST, [12.0, 10.0, 10.2, 9.9, 10.1, 10.2], [0.7] * 6),
    ]
    verdict = judge(runs)
    assert verdict.profiles[1].shift.has_interval and not verdict.profiles[1].significant
    assert "no measurable difference" in verdict.sentences[0]
    assert verdict.recommended == BASE
    # With the dearer class as the baseline, the cheaper one that is not measurably
    # slower is recommended, not the baseline.
    dear_first = judge(runs, baseline=FAST)
    assert dear_first.recommended == BASE
    assert "the cheapest profile that is not measurably slower" in dear_first.recommendation.reason


def test_workspace_speaks_p99_save_latency_against_its_budget() -> None:
    runs = [
        workspace_run(BASE, [30.0, 21.0, 22.0, 20.5, 21.5, 22.5]),
        workspace_run(BASE, [30.0, 21.5, 21.0, 22.0, 21.5, 22.0]),
        workspace_run(FAST, [15.0, 9.0, 9.5, 8.8, 9.1, 9.4]),
        workspace_run(FAST, [15.0, 9.3, 9.1, 9.2, 9.4, 9.3]),
    ]
    verdict = judge(runs, max_p99_ms=10.0)
    assert verdict.row.label == "p99 save latency" and verdict.row.unit == "ms"
    assert verdict.recommended == FAST
    assert "p99 save latency 9.25 ms vs 21.5 ms" in verdict.sentences[0]
    assert judge(runs, max_p99_ms=25.0).recommended == BASE


def test_refusals() -> None:
    other_dataset = [
        scan_run(BASE, [1.0, 1.0], [0.5] * 2),
        scan_run(FAST, [1.0, 1.0], [0.5] * 2, dataset_size=1),
    ]
    with pytest.raises(NotComparable, match="dataset_size differs"):
        judge(other_dataset)
    with pytest.raises(NotComparable, match="one profile only"):
        judge([scan_run(BASE, [1.0, 1.0], [0.5] * 2)])
    mixed = [scan_run(BASE, [1.0], [0.5]), workspace_run(FAST, [1.0])]
    with pytest.raises(NotComparable, match="one data workload"):
        judge(mixed)
    pricing = load_pricing(DEFAULT_PRICING, None, None)
    with pytest.raises(RunsMissing, match="io2"):
        judge_runs(slow_and_fast(), pricing, Thresholds(), expected=("io2",))
    assert is_data_comparison(slow_and_fast())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"prefetch_factor": 4}, "prefetch_factor differs"),
        ({"shuffle_buffer": 1}, "shuffle_buffer differs"),
        ({"loader": "webdataset"}, "loader differs"),
        ({"image": "registry.example.com/ml/bench:0.3"}, "image differs"),
    ],
)
def test_runs_of_other_loader_settings_or_images_are_refused(change: dict, named: str) -> None:
    runs = [scan_run(BASE, [1.0, 1.0], [0.5] * 2, prefetch_factor=2, shuffle_buffer=64,
                     image="registry.example.com/ml/bench:0.2"),
            scan_run(FAST, [1.0, 1.0], [0.5] * 2, **{"prefetch_factor": 2, "shuffle_buffer": 64,
                     "image": "registry.example.com/ml/bench:0.2", **change})]  # fmt: skip
    with pytest.raises(NotComparable, match=named):
        judge(runs)


def test_a_run_that_does_not_record_its_dataset_is_refused() -> None:
    unknown = scan_run(FAST, [1.0, 1.0], [0.5] * 2)
    del unknown.inputs["dataset_size"]
    with pytest.raises(
        NotComparable, match=r"checkpoint-throughput \(.*\) does not record dataset_size"
    ):
        judge([scan_run(BASE, [1.0, 1.0], [0.5] * 2), unknown])


def test_a_scan_served_by_the_page_cache_is_never_compared() -> None:
    kept_in = scan_run(FAST, [0.1, 0.1], [0.9] * 2)
    kept_in.outputs["scan_cache_kept_out"] = False
    with pytest.raises(
        NotComparable, match="page cache was not kept out of .*checkpoint-throughput"
    ):
        judge([scan_run(BASE, [1.0, 1.0], [0.5] * 2), kept_in])
    no_drop = [scan_run(p, [1.0, 1.0], [0.5] * 2, drop_cache=False) for p in (BASE, FAST)]
    with pytest.raises(NotComparable, match="no-drop-cache"):
        judge(no_drop)


def test_the_shard_size_is_compared_only_where_it_matters() -> None:
    files = [
        scan_run(BASE, [1.0, 1.0], [0.5] * 2, dataset_format="files", shard_size="16MiB"),
        scan_run(FAST, [1.0, 1.0], [0.5] * 2, dataset_format="files", shard_size="64MiB"),
    ]
    judge(files)  # a directory of files has no shards
    shards = [
        scan_run(BASE, [1.0, 1.0], [0.5] * 2, shard_size="16MiB"),
        scan_run(FAST, [1.0, 1.0], [0.5] * 2, shard_size="64MiB"),
    ]
    with pytest.raises(NotComparable, match="shard_size differs"):
        judge(shards)
    # A row group is Parquet's alone.
    judge([scan_run(BASE, [1.0, 1.0], [0.5] * 2, row_group_size=1 << 20),
           scan_run(FAST, [1.0, 1.0], [0.5] * 2, row_group_size=4 << 20)])  # fmt: skip
    with pytest.raises(NotComparable, match="row_group_size differs"):
        judge([scan_run(BASE, [1.0, 1.0], [0.5] * 2, dataset_format="parquet",
                        row_group_size=1 << 20),
               scan_run(FAST, [1.0, 1.0], [0.5] * 2, dataset_format="parquet",
                        row_group_size=4 << 20)])  # fmt: skip


def test_a_switch_of_the_claim_inside_a_scan_is_refused() -> None:
    base = scan_run(BASE, [1.0] * 4, [0.5] * 4)
    fast = scan_run(FAST, [1.0] * 4, [0.5] * 4)
    fast.started_at, fast.finished_at = T0 + timedelta(hours=1), T0 + timedelta(hours=2)
    ledger = [
        LedgerEntry(T0 - timedelta(minutes=5), BASE, FAST, "pipeline-1"),
        LedgerEntry(T0 + timedelta(minutes=90), FAST, BASE, "pipeline-2"),
    ]
    hook = RunRecord(
        uuid="hook", inputs={"claim": "data", "namespace": "ml", "target_class": FAST},
        outputs={"applied_class": FAST, LEDGER_OUTPUT: format_ledger(ledger)},
    )  # fmt: skip
    with pytest.raises(NotComparable, match=f"switched from {FAST} to {BASE}.*by pipeline-2"):
        judge([base, fast, hook])


def test_a_drift_of_the_baseline_as_large_as_the_difference_is_named_and_nothing_declared() -> None:
    """A…B…A: the baseline's runs before and after the candidate's moved by 2 s, the
    candidate is 2 s slower than the baseline's pooled runs: the drift is named and the
    difference is not declared (the baseline's two blocks disagree by the drift, and with a
    block's runs counted as two that spread keeps the interval across zero)."""
    runs = [
        *(scan_run(BASE, [11.0, 10.0, 10.0, 10.0], [0.7] * 4) for _ in range(3)),
        *(scan_run(FAST, [14.0, 13.0, 13.0, 13.0], [0.7] * 4) for _ in range(4)),
        *(scan_run(BASE, [13.0, 12.0, 12.0, 12.0], [0.7] * 4) for _ in range(3)),
    ]
    verdict = judge(runs)
    fast = verdict.profiles[1]
    assert verdict.drift is not None and verdict.drift.shift.estimate == pytest.approx(2.0)
    assert fast.shift.low < 0 < fast.shift.high and abs(fast.shift.estimate) > fast.floor
    assert not fast.significant
    assert any(
        "the difference may be drift, not the profile" in n for n in verdict.candidates[0].notes
    )
    assert verdict.verdict == "no measurable difference"


def write_summary(path: Path, profile: str, epochs: list[float], **extra) -> Path:
    summary = {
        "schema": DATA_SUMMARY_SCHEMA, "workload": "scan", "storage_profile": profile,
        "run_uuid": None, "config": {"dataset_format": "webdataset", "dataset_size": "1MiB"},
        "outputs": {"scan_epoch_s": sorted(epochs)[len(epochs) // 2], "scan_au": 0.5},
        "details": {"epochs": [{"epoch": i, "epoch_s": e, "au": 0.5} for i, e in enumerate(epochs)]},
        **extra,
    }  # fmt: skip
    path.write_text(json.dumps(summary))
    return path


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--no-track", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: s.update(details="epochs"), "details must be a JSON object"),
        (lambda s: s["details"]["epochs"].append(3), "details.epochs[4] is not an epoch"),
        (lambda s: s["details"]["epochs"][0].update(epoch=None), "details.epochs[0] is not an epoch"),
        (lambda s: s["details"].update(epochs={"0": 1.0}), "details.epochs must be a list"),
        (lambda s: s["details"].update(rounds=[1.0, "fast"]), "details.rounds[1] = 'fast' is not a number"),
        (lambda s: s["details"]["epochs"][2].update(epoch_s=0.0), "metric scan_epoch_s at step 2 = 0.0 is not > 0"),
        (lambda s: s["details"]["epochs"][2].update(epoch_s=-1.0), "metric scan_epoch_s at step 2 = -1.0 is not > 0"),
        (lambda s: s["details"]["epochs"][1].update(au=5.0), "metric scan_au at step 1 = 5.0 is not a share"),
        (lambda s: s["details"]["epochs"][1].update(au=-1.0), "metric scan_au at step 1 = -1.0 is negative"),
        (lambda s: s["outputs"].update(scan_au=5.0), "outputs scan_au = 5.0 is not a share"),
    ],
)  # fmt: skip
def test_malformed_or_impossible_data_summaries_exit_2_naming_the_field(
    tmp_path: Path, edit, field: str
) -> None:
    base = write_summary(tmp_path / "base.json", BASE, [1.0, 1.0, 1.0, 1.0])
    fast = tmp_path / "fast.json"
    summary = json.loads(write_summary(fast, FAST, [1.0, 1.0, 1.0, 1.0]).read_text())
    edit(summary)
    fast.write_text(json.dumps(summary))
    code, output = cli("--summary", f"{BASE}={base}", "--summary", f"{FAST}={fast}")
    assert code == 2, output
    assert field in output and str(fast) in output
    assert "Traceback" not in output


def test_refusals_name_the_summary_file(tmp_path: Path) -> None:
    base = write_summary(tmp_path / "base-run.json", BASE, [1.0] * 4)
    fast = write_summary(tmp_path / "fast-run.json", FAST, [1.0] * 4, config={
        "dataset_format": "webdataset", "dataset_size": "2MiB"})  # fmt: skip
    code, output = cli("--summary", f"{BASE}={base}", "--summary", f"{FAST}={fast}")
    assert code == 3, output
    # Each run by its profile and its file, not by a cut-off path.
    assert f"{BASE} ({base})=" in output and f"{FAST} ({fast})=" in output


def _summary_flags(paths: list[Path]) -> list[str]:
    """``--summary PROFILE=PATH`` for each summary, in the order given."""
    flags = []
    for path in paths:
        flags += ["--summary", f"{json.loads(path.read_text())['storage_profile']}={path}"]
    return flags


def test_the_baseline_follows_the_start_times_not_the_flag_order(tmp_path: Path) -> None:
    late = write_summary(tmp_path / "a.json", FAST, [1.0] * 4,
                         **{RUN_STARTED_AT: (T0 + timedelta(hours=1)).isoformat()})  # fmt: skip
    early = write_summary(tmp_path / "b.json", BASE, [1.0] * 4, **{RUN_STARTED_AT: T0.isoformat()})
    out = tmp_path / "v.json"
    for order in ([late, early], [early, late]):
        code, output = cli(*_summary_flags(order), "--json", str(out))
        assert code == 0, output
        assert json.loads(out.read_text())["baseline"] == BASE
    # Without start times which profile ran first is unknown, whatever the order of the
    # flags or the file names: the checkpoint verdict's rule, --baseline is needed.
    untimed_b = write_summary(tmp_path / "b-untimed.json", BASE, [1.0] * 4)
    untimed_a = write_summary(tmp_path / "a-untimed.json", FAST, [1.0] * 4)
    for order in ([untimed_b, untimed_a], [untimed_a, untimed_b]):
        code, output = cli(*_summary_flags(order), "--json", str(out))
        assert code == 2, output
        assert "no start time" in output and "--baseline" in output
        code, output = cli(*_summary_flags(order), "--baseline", BASE, "--json", str(out))
        assert code == 0, output
        assert json.loads(out.read_text())["baseline"] == BASE


def test_a_data_summary_mixed_with_training_summaries_is_refused(tmp_path: Path) -> None:
    from tests.checkpoint_compare.recorded import summary_json

    data = write_summary(tmp_path / "scan.json", FAST, [1.0] * 4)
    training = tmp_path / "train.json"
    training.write_text(json.dumps(summary_json(BASE, [2.0] * 6, 100.0)))
    code, output = cli("--summary", f"{BASE}={training}", "--summary", f"{FAST}={data}")
    assert code == 3, output
    assert "mixed with training runs" in output and "scan.json" in output


def test_the_json_report_is_the_one_schema(tmp_path: Path) -> None:
    from checkpoint_compare.report_json import SCHEMA, document

    doc = document(judge(slow_and_fast(), min_au=0.9))
    assert doc["schema"] == SCHEMA and doc["workload"] == "scan"
    assert doc["verdict"] == FAST and doc["recommendation"]["profile"] == FAST
    assert doc["profiles"][BASE]["difference"] is None
    diff = doc["profiles"][FAST]["difference"]
    assert diff["claimed"] is True and diff["direction"] == "better"
    assert diff["runs"] == {"profile": 2, "baseline": 2}
    assert diff["low"] < diff["estimate"] < diff["high"] < 0 and diff["confidence"] == 0.95
    assert "run medians" in diff["method"]
    same = document(
        judge([scan_run(BASE, BASE_EPOCHS[0], BASE_AU), scan_run(FAST, FAST_EPOCHS[0], FAST_AU)])
    )
    assert same["profiles"][FAST]["difference"]["claimed"] is False
    assert same["profiles"][FAST]["difference"]["direction"] == "none"


def test_the_cli_judges_real_scan_summaries(tmp_path: Path) -> None:
    data = tmp_path / "claim" / "data"
    data.parent.mkdir()
    env_args = ["--dataset-size", "256KiB", "--record-size", "4KiB", "--shard-size", "64KiB"]
    for profile in (BASE, FAST):
        done = subprocess.run(
            [sys.executable, "-m", "data_workloads", "scan", "--data-dir", str(data), *env_args,
             "--epochs", "3", "--num-workers", "1", "--compute-ms", "2", "--no-track",
             "--storage-profile", profile, "--summary-json", str(tmp_path / f"{profile}.json")],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    out = tmp_path / "verdict.json"
    done = subprocess.run(
        [sys.executable, "-m", "checkpoint_compare", "--no-track", "--min-au", "0.01",
         "--summary", f"{BASE}={tmp_path / f'{BASE}.json'}",
         "--summary", f"{FAST}={tmp_path / f'{FAST}.json'}", "--json", str(out),
         "--html", str(tmp_path / "verdict.html")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scan verdict, baseline checkpoint-baseline" in done.stdout
    assert "\nVERDICT: " in done.stdout and "\nRECOMMENDED: " in done.stdout
    assert "epoch time" in done.stdout and "AU" in done.stdout
    verdict = json.loads(out.read_text())
    assert verdict["workload"] == "scan" and len(verdict["profiles"]) == 2
    assert all(len(p["samples"]) == 2 for p in verdict["profiles"].values())  # 1 warm-up
    page = (tmp_path / "verdict.html").read_text()
    assert "Storage profile comparison: scan" in page and "AU, baseline" in page
    assert page.index("id='verdict'") < page.index("id='tables'")


def test_outputs_carry_the_verdict_and_none_when_nothing_fits() -> None:
    from checkpoint_compare.verdict import op_outputs

    out = op_outputs(judge(slow_and_fast(), min_au=0.99))
    assert out["recommended_profile"] == "none" and out["workload"] == "scan"
    assert out["verdict"] == FAST and "does not keep the GPUs fed" in out["verdict_reason"]
    assert out["recommendation_reason"].startswith("no profile meets the budget")
    assert out["checkpoint_throughput_scan_au"] == pytest.approx(0.97)
    assert out["epoch_time_delta_s"] < 0 and out["checkpoint_baseline_epoch_time_s_median"] > 0
    low, high = (out[f"checkpoint_throughput_epoch_time_diff_ci_{e}_s"] for e in ("low", "high"))
    assert low <= out["epoch_time_delta_s"] <= high < 0  # the candidate's interval, as a pause's
    assert op_outputs(judge(slow_and_fast()))["recommended_profile"] == FAST
    # Every name is the contract's: the fixed ones, the headline's, the profiles' figures.
    named = set(VERDICT_OUTPUTS) | set(headline_outputs("epoch_time", "s").values())
    per_profile = (
        "runs",
        "run_cost_usd",
        "scan_au",
        *profile_headline_figures("epoch_time", "s").values(),
    )
    named |= {f"{p}_{f}" for p in ("checkpoint_baseline", "checkpoint_throughput")
              for f in per_profile}  # fmt: skip
    assert set(out) <= named, sorted(set(out) - named)


def test_a_missing_headline_figure_is_bad_input() -> None:
    runs = [scan_run(BASE, [1.0, 1.0], [0.5] * 2),
            RunRecord(uuid="x", inputs={**SCAN_INPUTS, "storage_profile": FAST})]  # fmt: skip
    with pytest.raises(BadInput, match="no run recorded scan_epoch_s"):
        judge(runs, baseline=BASE)


def _tracked_scan(profile: str, epochs: list[float]) -> None:
    from checkpoint_storage_bench.tracking import tracked_run

    with tracked_run(f"scan-{profile}", tags=["data"]) as t:
        t.log_inputs(**SCAN_INPUTS, storage_profile=profile)
        for i, e in enumerate(epochs):
            t.log_metrics(i, {"scan_epoch_s": e, "scan_au": 0.5})
        t.log_outputs(scan_epoch_s=sorted(epochs)[len(epochs) // 2], scan_au=0.5)


def test_a_verdict_over_the_pipeline_ignores_an_earlier_compare_run(
    runs_root: Path, pricing_file
) -> None:
    """The compare run records which workload it judged; were that its input ``workload``,
    the next verdict over the pipeline's runs would take the compare run for a scan."""
    for profile, epochs in ((BASE, BASE_EPOCHS), (FAST, FAST_EPOCHS)):
        for e in epochs:
            _tracked_scan(profile, e)
    args = ["--offline-root", str(runs_root), "--pricing", str(pricing_file())]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(main, [*args, "--no-track"])
    assert again.exit_code == 0, again.output
    assert f"VERDICT: {FAST}" in again.output


def test_scans_of_another_claim_or_volume_are_refused_as_training_runs_are() -> None:
    def hook(profile: str, claim: str, handle: str) -> RunRecord:
        return RunRecord(
            uuid=f"hook-{profile}", inputs={"claim": claim, "namespace": "ml",
            "target_class": profile, "driver": "ebs.csi.aws.com", "volume_handle": handle},
            outputs={"applied_class": profile},
        )  # fmt: skip

    runs = slow_and_fast()
    with pytest.raises(NotComparable, match="the claim differs.*the volume differs"):
        judge([*runs, hook(BASE, "data", "vol-1"), hook(FAST, "other-team", "vol-2")])
    judge([*runs, hook(BASE, "data", "vol-1"), hook(FAST, "data", "vol-1")])
