"""``plan``: the modification plan before a pipeline's first switch, through the real CLI
against the Kubernetes fake (and the sandbox's local profiles)."""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import get_args

import pytest

from checkpoint_compare.intervals import median_upper_bound
from checkpoint_compare.table import ROWS, Budget
from checkpoint_storage_bench.contract import (
    CALIBRATED_RUNS,
    LEDGER_ANNOTATION,
    MIN_BUDGET_CHECKPOINTS,
    PLAN_ANSWER_LIMITS_OUTPUT,
    PLAN_ANSWER_NOTES_OUTPUT,
    PLAN_ANSWERABLE_OUTPUT,
    VERDICT_CONFIDENCE,
    VERDICT_RUNS_PER_BLOCK,
    WORKLOADS,
    LedgerEntry,
    format_ledger,
)
from hooks.storage_profile import config
from hooks.storage_profile import plan as plan_module
from hooks.storage_profile.errors import EXIT_CODES, EXIT_PREFLIGHT, PlanRefused
from hooks.storage_profile.plan import earliest_start, switches_of
from sandbox.commands import DATA_DEMO_PARAMS, DEMO_PARAMS
from tests.bundle.bundle import PIPELINE, PROFILES_PIPELINE, load_dag
from tests.hooks.fake_kube import FakeKube
from tests.hooks.helpers import run_hook
from tests.hooks.kube_state import make_class, make_storage_class, make_volume

NS, CLAIM = "ml-team", "training-checkpoints"
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
EBS, GKE = "ebs.csi.aws.com", "pd.csi.storage.gke.io"


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "NOW", lambda: NOW)


def cluster(fake: FakeKube, driver: str = EBS, **volume) -> FakeKube:
    make_volume(fake, driver=driver, current="checkpoint-baseline", **volume)
    make_class(fake, "checkpoint-baseline", driver=driver, iops="3000", throughput="125")
    make_class(fake, "checkpoint-throughput", driver=driver, iops="6000", throughput="250")
    make_class(fake, "checkpoint-io2", driver=driver, iops="16000", throughput="500")
    return fake


def set_ledger(fake: FakeKube, *hours_ago: float) -> None:
    entries = [
        LedgerEntry(NOW - timedelta(hours=h), "checkpoint-baseline", "checkpoint-throughput")
        for h in hours_ago
    ]

    def annotate(claim: dict) -> None:
        claim["metadata"].setdefault("annotations", {})[LEDGER_ANNOTATION] = format_ledger(entries)

    fake.update("PersistentVolumeClaim", CLAIM, NS, annotate)


def plan(profiles: str, *extra: str, summary: Path | None = None):
    args = ["plan", "-n", NS, "--claim", CLAIM, "--profiles", profiles, *extra]
    if summary is not None:
        args += ["--summary-json", str(summary)]
    return run_hook(*args)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------ counting


def test_counting_rules() -> None:
    # The current class and repeated classes need no modification.
    assert switches_of("a", ["a", "b"], False) == [("a", "b")]
    assert switches_of("a", ["a", "a", "b", "b"], False) == [("a", "b")]
    assert switches_of("b", ["a", "b", "c"], False) == [("b", "a"), ("a", "b"), ("b", "c")]
    assert switches_of(None, ["a"], False) == [(None, "a")]
    # --return-to-first adds one, unless the run already ends on the first.
    assert switches_of("a", ["a", "b", "c"], True) == [("a", "b"), ("b", "c"), ("c", "a")]
    assert switches_of("a", ["a", "b", "a"], True) == [("a", "b"), ("b", "a")]
    assert switches_of("a", ["a"], True) == []
    # The restore class comes last: one more, unless the run already ends on it.
    assert switches_of("a", ["b", "c"], False, "a") == [("a", "b"), ("b", "c"), ("c", "a")]
    assert switches_of("a", ["a", "b"], True, "a") == [("a", "b"), ("b", "a")]


def test_earliest_start_in_a_rolling_window() -> None:
    day = timedelta(hours=24)
    ledger = [LedgerEntry(NOW - timedelta(hours=h), None, "x") for h in (30, 20, 10, 2)]
    # 3 in the last 24 h (20, 10, 2 h ago); 4 allowed.
    assert earliest_start(ledger, 1, 4, day, NOW) == NOW
    assert earliest_start(ledger, 2, 4, day, NOW) == NOW - timedelta(hours=20) + day
    assert earliest_start(ledger, 3, 4, day, NOW) == NOW - timedelta(hours=10) + day
    assert earliest_start(ledger, 4, 4, day, NOW) == NOW - timedelta(hours=2) + day
    assert earliest_start(ledger, 5, 4, day, NOW) is None
    assert earliest_start(ledger, 0, 4, day, NOW) == NOW


# -------------------------------------------------------------------- through the CLI (EBS)


def test_fits_and_changes_nothing(fake: FakeKube, tmp_path: Path):
    cluster(fake)
    out = tmp_path / "plan.json"
    result = plan("checkpoint-baseline,checkpoint-throughput", "--return-to-first", summary=out)
    assert result.exit_code == 0, result.output
    data = load(out)
    assert data["schema"] == "storage-profile-plan/1"
    assert data["driver"] == EBS and data["current_class"] == "checkpoint-baseline"
    assert data["modifications_needed"] == 2
    assert data["switches"] == [
        {"from": "checkpoint-baseline", "to": "checkpoint-throughput"},
        {"from": "checkpoint-throughput", "to": "checkpoint-baseline"},
    ]
    assert (data["modifications_allowed"], data["window_s"]) == (4, 86400.0)
    assert data["fits"] and data["earliest_start"] == "2026-12-01T12:00:00Z"
    assert data["refusal"] is None and data["ledger_in_window"] == 0
    assert "modifications    2 (checkpoint-baseline -> checkpoint-throughput" in result.stdout
    assert "earliest start   2026-12-01T12:00:00Z (now)" in result.stdout
    assert fake.requested == []  # read only


def test_refused_until_old_switches_leave_the_window(fake: FakeKube, tmp_path: Path):
    cluster(fake)
    set_ledger(fake, 30, 20, 10, 2)  # three inside the last 24 h
    out = tmp_path / "plan.json"
    result = plan("checkpoint-baseline,checkpoint-throughput,checkpoint-io2", summary=out)
    assert result.exit_code == 3
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("storage-profile: error: the run over checkpoint-baseline, ")
    assert "needs 2 modifications" in line and "allows 4 per 24 h" in line
    assert "has 3 in the last 24 h" in line
    # The 20-hours-old switch leaves the window 4 h from now.
    assert "fits from 2026-12-01T16:00:00Z (in 4 h 0 min)" in line
    data = load(out)
    assert not data["fits"] and data["earliest_start"] == "2026-12-01T16:00:00Z"
    assert data["ledger_in_window"] == 3
    assert fake.requested == []


def test_one_more_switch_would_fit(fake: FakeKube):
    cluster(fake)
    set_ledger(fake, 30, 20, 10, 2)
    result = plan("checkpoint-baseline,checkpoint-throughput")
    assert result.exit_code == 0, result.output


def test_more_than_the_window_allows_never_fits(fake: FakeKube, tmp_path: Path):
    cluster(fake)
    out = tmp_path / "plan.json"
    profiles = "checkpoint-throughput,checkpoint-io2,checkpoint-throughput,checkpoint-io2"
    result = plan(profiles, "--return-to-first", summary=out)
    assert result.exit_code == 3
    assert "needs 5 modifications" in result.stderr
    assert "cannot fit in one window, whenever it starts" in result.stderr
    data = load(out)
    assert data["earliest_start"] is None and data["modifications_needed"] == 5
    assert "earliest start   never, in one run" in result.stdout


def test_the_restore_switch_is_counted_with_the_stages(fake: FakeKube, tmp_path: Path):
    cluster(fake)
    set_ledger(fake, 20, 10)  # two inside the last 24 h
    stages = "checkpoint-throughput,checkpoint-io2"
    assert plan(stages).exit_code == 0  # 2 + 2 switches: fits
    out = tmp_path / "plan.json"
    result = plan(stages, "--restore-after", "--restore-class", "checkpoint-baseline", summary=out)
    assert result.exit_code == 3, result.output
    assert ", then restored to checkpoint-baseline, needs 3 modifications" in result.stderr
    data = load(out)
    assert data["restore_to"] == "checkpoint-baseline" and data["modifications_needed"] == 3
    assert data["switches"][-1] == {"from": "checkpoint-io2", "to": "checkpoint-baseline"}
    assert "order            checkpoint-throughput -> checkpoint-io2 -> checkpoint-baseline" in (
        result.stdout
    )
    # A restore to the class the run ends on is no modification.
    result = plan(stages, "--restore-after", "--restore-class", "checkpoint-io2", summary=out)
    assert result.exit_code == 0 and load(out)["modifications_needed"] == 2
    # The class alone, without --restore-after, counts nothing; --restore-after needs it.
    result = plan(stages, "--restore-class", "checkpoint-baseline", summary=out)
    assert result.exit_code == 0 and load(out)["restore_to"] is None
    result = plan(stages, "--restore-after")
    assert result.exit_code == 2 and "--restore-after needs --restore-class" in result.stderr
    assert fake.requested == []


def test_a_restore_class_that_is_missing_or_of_another_driver_is_refused(fake: FakeKube):
    cluster(fake)
    make_class(fake, "hyperdisk-fast", driver=GKE, iops="6000", throughput="290Mi")
    stages = "checkpoint-baseline,checkpoint-throughput"
    result = plan(stages, "--restore-after", "--restore-class", "checkpoint-gold")
    assert result.exit_code == 3 and "not found: checkpoint-gold" in result.stderr
    result = plan(stages, "--restore-after", "--restore-class", "hyperdisk-fast")
    assert result.exit_code == 3 and f"hyperdisk-fast is for {GKE}" in result.stderr


@pytest.mark.parametrize(
    "profiles", ["checkpoint-baseline", "checkpoint-baseline,checkpoint-baseline"]
)
def test_a_comparison_of_one_class_is_refused_before_anything(fake: FakeKube, profiles: str):
    cluster(fake)
    for extra in ((), ("--return-to-first",)):
        result = plan(profiles, *extra)
        assert result.exit_code == 2, result.output
        assert "at least two different classes" in result.stderr
    assert fake.calls == []  # refused before the API server was asked anything


def test_classes_with_one_output_name_are_refused_before_anything(fake: FakeKube):
    cluster(fake)
    result = plan("checkpoint-baseline,gp3-fast,gp3.fast")
    assert result.exit_code == 2, result.output
    assert "gp3-fast and gp3.fast have the same output name 'gp3_fast'" in result.stderr
    assert fake.calls == []


def test_a_missing_class_is_refused(fake: FakeKube):
    cluster(fake)
    result = plan("checkpoint-baseline,checkpoint-nvme,checkpoint-gold")
    assert result.exit_code == 3
    assert "VolumeAttributesClass not found: checkpoint-nvme, checkpoint-gold" in result.stderr


def test_a_class_of_another_driver_is_refused(fake: FakeKube):
    cluster(fake)
    make_class(fake, "hyperdisk-fast", driver=GKE, iops="6000", throughput="290Mi")
    result = plan("checkpoint-baseline,hyperdisk-fast")
    assert result.exit_code == 3
    assert f"provisioned by {EBS}, but hyperdisk-fast is for {GKE}" in result.stderr


def test_a_malformed_ledger_is_refused(fake: FakeKube):
    cluster(fake)

    def annotate(claim: dict) -> None:
        claim["metadata"]["annotations"] = {LEDGER_ANNOTATION: '{"not": "a list"}'}

    fake.update("PersistentVolumeClaim", CLAIM, NS, annotate)
    result = plan("checkpoint-baseline,checkpoint-throughput")
    assert result.exit_code == 3 and "is not a ledger of switches" in result.stderr


def test_a_missing_claim_is_refused(fake: FakeKube):
    cluster(fake, claim="other-claim")
    result = plan("checkpoint-baseline,checkpoint-throughput")
    assert result.exit_code == 3 and f"claim {NS}/{CLAIM} not found" in result.stderr


# --------------------------------------------------------------- GKE, unbound, unknown


def test_gke_allows_one_change_per_four_hours(fake: FakeKube, tmp_path: Path):
    cluster(fake, driver=GKE, handle="projects/p/zones/z/disks/d")
    assert plan("checkpoint-baseline,checkpoint-throughput").exit_code == 0
    set_ledger(fake, 1)  # switched an hour ago
    out = tmp_path / "plan.json"
    result = plan("checkpoint-baseline,checkpoint-throughput", summary=out)
    assert result.exit_code == 3
    assert "allows 1 per 4 h" in result.stderr and "fits from 2026-12-01T15:00:00Z" in result.stderr
    assert load(out)["window_s"] == 4 * 3600
    result = plan("checkpoint-baseline,checkpoint-throughput", "--return-to-first")
    assert result.exit_code == 3 and "cannot fit in one window" in result.stderr


def test_unbound_claim_on_the_first_profile(fake: FakeKube, tmp_path: Path):
    cluster(fake, bound=False)
    out = tmp_path / "plan.json"
    result = plan("checkpoint-baseline,checkpoint-throughput", summary=out)
    assert result.exit_code == 0, result.output
    data = load(out)
    assert data["bound"] is False and data["driver"] == EBS  # from the classes
    assert data["modifications_needed"] == 1
    assert any("applies when its first pod provisions it" in n for n in data["notes"])


def test_unbound_claim_on_another_class_is_refused(fake: FakeKube):
    cluster(fake, bound=False)
    result = plan("checkpoint-throughput,checkpoint-baseline")
    assert result.exit_code == 3
    assert "is not bound yet and names checkpoint-baseline" in result.stderr
    assert "the first profile must be checkpoint-baseline (not checkpoint-throughput)" in (
        result.stderr
    )


def test_unbound_claim_of_another_drivers_provisioner_is_refused(fake: FakeKube):
    # The GKE classes agree with each other, but the claim's StorageClass provisions with EBS.
    cluster(fake, driver=GKE, bound=False)
    make_storage_class(fake, "ebs-gp3", EBS)
    result = plan("checkpoint-baseline,checkpoint-throughput")
    assert result.exit_code == 3, result.output
    assert f"will be provisioned by {EBS} (StorageClass ebs-gp3)" in result.stderr
    assert f"checkpoint-baseline is for {GKE}" in result.stderr


def test_a_driver_without_a_known_window(fake: FakeKube, tmp_path: Path):
    cluster(fake, driver="example.csi.vendor.io", handle="v-1")
    out = tmp_path / "plan.json"
    profiles = "checkpoint-throughput,checkpoint-io2,checkpoint-throughput,checkpoint-io2"
    result = plan(profiles, summary=out)
    assert result.exit_code == 0, result.output
    data = load(out)
    assert data["modifications_needed"] == 4 and data["modifications_allowed"] is None
    assert any("no modification window known" in n for n in data["notes"])


@pytest.mark.parametrize("profiles", ["", "a,,b", " , "])
def test_bad_profiles_are_a_usage_error(fake: FakeKube, profiles: str):
    cluster(fake)
    result = plan(profiles)
    assert result.exit_code == 2 and "--profiles" in result.stderr


def test_exit_codes_come_from_the_hooks_one_table() -> None:
    # plan is a subcommand like the others: its refusal is a hook error with exit 3, and
    # its --help lists the hook's one table.
    assert PlanRefused.exit_code == EXIT_PREFLIGHT == 3
    help_text = run_hook("plan", "--help").stdout
    for code in EXIT_CODES:
        assert f"\n    {code}  " in help_text
    assert "a plan fits now" in " ".join(help_text.split())


# ------------------------------------------------------------------------ Polyaxon record


def test_inside_a_run_the_plan_is_logged_and_a_refusal_fails_it(
    fake: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cluster(fake)
    monkeypatch.setattr(plan_module, "in_polyaxon_run", lambda: True)
    assert plan("checkpoint-baseline,checkpoint-throughput").exit_code == 0
    set_ledger(fake, 20, 10, 2)
    assert plan("checkpoint-baseline,checkpoint-throughput,checkpoint-io2").exit_code == 3
    records = [
        json.loads(p.read_text())
        for p in (tmp_path / "plx-offline" / "runs").glob("*/run.plx.json")
    ]
    by_status = {r["status"]: r for r in records}
    assert set(by_status) == {"succeeded", "failed"}
    ok, refused = by_status["succeeded"], by_status["failed"]
    assert ok["inputs"]["profiles"] == "checkpoint-baseline,checkpoint-throughput"
    assert ok["outputs"]["modifications_needed"] == 1 and ok["outputs"]["fits"] is True
    assert refused["outputs"]["modifications_needed"] == 2
    assert refused["outputs"]["earliest_start"] == "2026-12-01T16:00:00Z"


# ------------------------------------------------- what the verdict can answer, before a switch

PAIR = "checkpoint-baseline,checkpoint-throughput"
# The pipeline's defaults: 2 runs a profile, 200 steps with a checkpoint every 50.
DEFAULTS = ("--repeats", "2", "--steps", "200", "--checkpoint-every", "50")


def test_the_pipelines_defaults_answer_and_say_only_alternating_is_calibrated(
    fake: FakeKube, tmp_path: Path
):
    # Back to back, two runs a side met the checkpoint's goals without showing them: said
    # before any switch, with the design that showed them, not refused.
    cluster(fake)
    out = tmp_path / "plan.json"
    result = plan(PAIR, *DEFAULTS, summary=out)
    assert result.exit_code == 0, result.output
    data = load(out)
    assert data["answerable"] is True and data["answer_limits"] == []
    assert data["repeats"] == 2
    (note,) = data["answer_notes"]
    met = CALIBRATED_RUNS["checkpoint"].met
    assert note.startswith("the checkpoint workload: checkpoint-throughput and the baseline ")
    assert "count 2 runs a side" in note and f"only with {met} a side" in note
    assert f"(profiles that alternate: {PAIR},{PAIR})" in note
    assert note.endswith("not a limit, not a calibrated answer either")
    assert f"  note: {note}" in result.stdout
    assert "answerable       yes (repeats 2, checkpoint, no budget)" in result.stdout
    assert "limit:" not in result.stdout
    # Alternating at the same repeats is the calibrated design: nothing to say.
    assert plan(f"{PAIR},{PAIR}", *DEFAULTS, summary=out).exit_code == 0
    assert load(out)["answer_notes"] == []
    # One run a stage needs four passes for the same four runs a side.
    assert plan(f"{PAIR},{PAIR}", "--repeats", "1", summary=out).exit_code == 0
    (note,) = load(out)["answer_notes"]
    assert f"(profiles that alternate: {PAIR},{PAIR},{PAIR},{PAIR})" in note


@pytest.mark.parametrize(
    "extra",
    [
        ("--repeats", "1"),
        ("--repeats", "1", "--return-to-first"),  # the baseline twice, the candidate once
        ("--repeats", "1", "--workload", "scan", "--max-pause-s", "1"),  # not scan's budget
        ("--repeats", "1", "--workload", "materialize", "--max-p99-ms", "5"),  # it has none
        # A budget no run can meet with confidence: 4 checkpoints, 3 measured.
        ("--repeats", "1", "--max-pause-s", "0.5", "--steps", "200", "--checkpoint-every", "50"),
    ],
    ids=["no-budget", "return", "another-workloads-budget", "materialize", "too-few-checkpoints"],
)
def test_settings_that_can_answer_nothing_are_refused_before_anything(
    fake: FakeKube, extra: tuple[str, ...]
):
    cluster(fake)
    result = plan(PAIR, *extra)
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if "could say nothing" in ln]
    assert "checkpoint-throughput get one run" in line or "gets one run" in line
    assert "can claim no difference between checkpoint-throughput" in line
    assert fake.calls == []  # refused before the API server was asked anything


def test_one_run_each_with_a_budget_is_a_warning_not_a_refusal(fake: FakeKube, tmp_path: Path):
    # What the agent tier runs: repeats 1 and a budget, a budget-only answer.
    cluster(fake)
    out = tmp_path / "plan.json"
    args = ("--repeats", "1", "--max-pause-s", "0.6", "--steps", "60", "--checkpoint-every", "5")
    result = plan(PAIR, *args, summary=out)
    assert result.exit_code == 0, result.output
    data = load(out)
    assert data["answerable"] is False and data["fits"] is True
    (limit,) = data["answer_limits"]
    assert limit.startswith("repeats 1: checkpoint-baseline and checkpoint-throughput get one run")
    assert "no difference between checkpoint-throughput and the baseline" in limit
    assert "answerable       no (repeats 1, checkpoint, a budget)" in result.stdout
    assert f"  limit: {limit}" in result.stdout
    # The scan's budget, on the scan.
    args = ("--repeats", "1", "--workload", "scan", "--min-au", "0.8")
    assert plan(PAIR, *args, summary=out).exit_code == 0
    assert load(out)["answerable"] is False and len(load(out)["answer_limits"]) == 1


@pytest.mark.parametrize(("steps", "limited"), [("250", True), ("300", False)])
def test_a_pause_budget_needs_enough_checkpoints_a_run(
    fake: FakeKube, tmp_path: Path, steps: str, limited: bool
):
    # Every 50 steps: 250 make 5 checkpoints, 4 after the warm-up, one short of a 95 % bound.
    cluster(fake)
    out = tmp_path / "plan.json"
    args = ("--repeats", "2", "--steps", steps, "--checkpoint-every", "50", "--max-pause-s", "1")
    result = plan(PAIR, *args, summary=out)
    assert result.exit_code == 0, result.output  # the differences are still answered
    limits = load(out)["answer_limits"]
    assert load(out)["answerable"] is not limited
    if limited:
        (limit,) = limits
        assert limit.startswith("5 checkpoints a run, 4 after the 1 warm-up")
        assert f"needs {MIN_BUDGET_CHECKPOINTS}" in limit and "6 checkpoints a run" in limit
    else:
        assert limits == []
    # A larger warm-up leaves fewer measured.
    result = plan(PAIR, *args, "--warmup", "2", summary=out)
    assert result.exit_code == 0 and load(out)["answerable"] is False


def test_the_plan_counts_a_blocks_runs_for_every_workload() -> None:
    assert tuple(VERDICT_RUNS_PER_BLOCK) == WORKLOADS
    assert all(n >= 1 for n in VERDICT_RUNS_PER_BLOCK.values())


def test_the_budget_bound_needs_the_contracts_number_of_checkpoints() -> None:
    # The plan warns below MIN_BUDGET_CHECKPOINTS without running the verdict's bound.
    values = [1.0] * MIN_BUDGET_CHECKPOINTS
    assert median_upper_bound(values, VERDICT_CONFIDENCE) is not None
    assert median_upper_bound(values[:-1], VERDICT_CONFIDENCE) is None


def test_the_plans_workloads_and_budgets_are_the_verdicts() -> None:
    assert get_args(config.Workload) == WORKLOADS and tuple(config.WORKLOAD_BUDGETS) == WORKLOADS
    verdict_budgets = {f.name for f in fields(Budget)}
    planned = {n for names in config.WORKLOAD_BUDGETS.values() for n in names}
    assert planned == verdict_budgets - {"checkpoints_per_month"}  # a cadence, not a budget
    for workload, names in config.WORKLOAD_BUDGETS.items():
        for name in names:  # each row of the verdict's table words the budget it tests
            assert ROWS[workload].budget_words(Budget(**{name: 0.5})) is not None
            assert ROWS[workload].untested(Budget(**{name: 0.5})) == []


def capped(plan_summary: dict) -> list[str]:
    """The plan's notes on repeats beyond what a block counts."""
    return [n for n in plan_summary["answer_notes"] if n.startswith("repeats ")]


def test_more_repeats_in_one_block_buy_a_steadier_estimate_not_a_narrower_interval(
    fake: FakeKube, tmp_path: Path
):
    cluster(fake)
    out = tmp_path / "plan.json"
    result = plan(PAIR, "--repeats", "3", summary=out)
    assert result.exit_code == 0, result.output
    data = load(out)
    assert data["answerable"] is True  # said, not refused
    (note,) = capped(data)
    assert "checkpoint-throughput: 3 runs in 1 block, counted as 2" in note
    assert "a steadier estimate, not a narrower interval" in note
    assert f"  note: {note}" in result.stdout
    # The return adds a block to the baseline (each of 3 runs); the candidate's is still one.
    plan(PAIR, "--repeats", "3", "--return-to-first", summary=out)
    (note,) = capped(load(out))
    assert "checkpoint-baseline: 6 runs in 2 blocks, counted as 4" in note
    assert "checkpoint-throughput: 3 runs in 1 block" in note
    plan(PAIR, "--repeats", "2", "--return-to-first", summary=out)
    assert capped(load(out)) == []
    # Profiles that alternate make every block a replicate: nothing to say.
    alternating = f"{PAIR},{PAIR}"
    assert plan(alternating, "--repeats", "2", summary=out).exit_code == 0
    assert load(out)["answer_notes"] == []
    # And alternating once each answers the difference with one run a stage.
    assert plan(alternating, "--repeats", "1", summary=out).exit_code == 0
    assert load(out)["answerable"] is True


@pytest.mark.parametrize(
    ("profiles", "extra", "short"),
    [
        # Materialize's runs back to back count as one.
        (PAIR, ("--workload", "materialize"), "checkpoint-baseline counts 1 run and "),
        # The return gives the baseline a second block; the candidate is still one.
        (PAIR, ("--workload", "materialize", "--return-to-first"), "checkpoint-throughput"),
        # More repeats in one block are not counted as more runs.
        (PAIR, ("--workload", "materialize", "--repeats", "6"), "checkpoint-throughput counts 1"),
        # The workspace needs more: two passes count two a side.
        (PAIR, ("--workload", "workspace"), "checkpoint-throughput counts 1 run "),
        (PAIR, ("--workload", "workspace", "--return-to-first"), "checkpoint-throughput"),
        (f"{PAIR},{PAIR}", ("--workload", "workspace"), "checkpoint-throughput counts 2 runs"),
    ],
    ids=[
        "materialize",
        "materialize-return",
        "materialize-one-long-block",
        "workspace",
        "workspace-return",
        "workspace-two-passes",
    ],
)
def test_a_data_workload_short_of_its_calibrated_runs_is_refused_before_anything(
    fake: FakeKube, profiles: str, extra: tuple[str, ...], short: str
):
    # Two runs a side detected a factor of two in too few calibrated comparisons of these
    # workloads: without a budget such a run would answer nothing it can be trusted with.
    cluster(fake)
    result = plan(profiles, "--repeats", "2", *extra)
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if "could say nothing" in ln]
    workload = extra[1]
    assert f"the {workload} workload: " in line and short in line
    missed = CALIBRATED_RUNS[workload].missed
    assert f"with {missed} a side the calibration detected a factor of two" in line
    assert "in fewer than 95% of comparisons (docs/compare.md)" in line
    assert f"profiles that alternate: {','.join([PAIR] * passes(workload))})" in line
    assert fake.calls == []  # refused before the API server was asked anything


def test_a_data_workload_with_its_calibrated_runs_answers(fake: FakeKube, tmp_path: Path):
    # A driver without a window: the answer does not depend on EBS's 4 modifications a day.
    cluster(fake, driver="example.csi.vendor.io", handle="v-1")
    out = tmp_path / "plan.json"
    for workload in ("materialize", "workspace"):
        # One pass more than the most the calibration measured to miss: 2 runs a side each.
        calibrated = CALIBRATED_RUNS[workload]
        profiles = ",".join([PAIR] * passes(workload))
        result = plan(profiles, "--repeats", "2", "--workload", workload, summary=out)
        assert result.exit_code == 0, result.output
        assert load(out)["answerable"] is True and load(out)["answer_limits"] == []
        # Said when the calibration did not reach a 95 % detection with that many.
        counted = passes(workload) * VERDICT_RUNS_PER_BLOCK[workload]
        unproven = calibrated.met is None or calibrated.met > counted
        notes = [n for n in load(out)["answer_notes"] if n.startswith(f"the {workload} ")]
        assert len(notes) == unproven
        if unproven:
            assert "with none of the designs measured" in notes[0]
    # With a budget the workspace run still answers that: a limit, not a refusal.
    args = ("--repeats", "2", "--workload", "workspace", "--max-p99-ms", "20")
    assert plan(PAIR, *args, summary=out).exit_code == 0
    (limit,) = load(out)["answer_limits"]
    assert load(out)["answerable"] is False and limit.startswith("the workspace workload: ")
    # The storage-bound scan reaches its goals with two runs a side, back to back; the
    # checkpoint with the profiles alternating.
    for workload, profiles in (("scan", PAIR), ("checkpoint", f"{PAIR},{PAIR}")):
        blocks = len(profiles.split(",")) // 2  # a side
        assert CALIBRATED_RUNS[workload].met == blocks * VERDICT_RUNS_PER_BLOCK[workload]
        args = ("--repeats", "2", "--workload", workload)
        assert plan(profiles, *args, summary=out).exit_code == 0
        assert load(out)["answer_limits"] == [] and load(out)["answer_notes"] == []


def test_every_workload_has_its_calibrated_runs() -> None:
    assert tuple(CALIBRATED_RUNS) == WORKLOADS
    for calibrated in CALIBRATED_RUNS.values():
        # Below 2 runs a side there is no interval at all: nothing to calibrate.
        assert calibrated.met is None or calibrated.met > max(1, calibrated.missed)


def test_without_repeats_only_the_window_is_judged(fake: FakeKube, tmp_path: Path):
    cluster(fake)
    out = tmp_path / "plan.json"
    result = plan(PAIR, summary=out)
    assert result.exit_code == 0, result.output
    assert load(out)["answerable"] is None and "answerable" not in result.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--repeats", "0"), "--repeats must be at least 1"),
        (("--repeats", "2", "--steps", "100"), "--steps and --checkpoint-every go together"),
        (("--repeats", "2", "--max-pause-s", "nan"), "--max-pause-s must be a positive number"),
        (("--repeats", "2", "--min-au", "-1"), "--min-au must be a positive number"),
        (
            (
                "--warmup",
                "-1",
            ),
            "--warmup must be 0 or more",
        ),
    ],
)
def test_bad_answer_settings_are_a_usage_error(fake: FakeKube, extra, message: str):
    cluster(fake)
    result = plan(PAIR, *extra)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert fake.calls == []


def test_inside_a_run_what_the_verdict_can_answer_is_logged(
    fake: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cluster(fake)
    monkeypatch.setattr(plan_module, "in_polyaxon_run", lambda: True)
    assert plan(PAIR, "--repeats", "1", "--max-pause-s", "0.6").exit_code == 0
    assert plan(PAIR, "--repeats", "2").exit_code == 0
    records = {
        record["inputs"]["repeats"]: record
        for p in (tmp_path / "plx-offline" / "runs").glob("*/run.plx.json")
        if (record := json.loads(p.read_text()))
    }
    assert {r["status"] for r in records.values()} == {"succeeded"}
    assert records[1]["inputs"]["workload"] == "checkpoint"
    outputs = records[1]["outputs"]
    assert outputs[PLAN_ANSWERABLE_OUTPUT] is False
    assert outputs[PLAN_ANSWER_LIMITS_OUTPUT].startswith("repeats 1: ")
    # Back to back, two runs a side answer, but not as the calibrated design: a note.
    outputs = records[2]["outputs"]
    assert outputs[PLAN_ANSWERABLE_OUTPUT] is True and outputs[PLAN_ANSWER_LIMITS_OUTPUT] == ""
    assert outputs[PLAN_ANSWER_NOTES_OUTPUT].endswith("not a calibrated answer either")


def _pipeline_plan_argv(path: Path, params: dict) -> list[str]:
    dag = load_dag(path, params)
    if path == PIPELINE:  # the two-profile wrapper runs the profiles pipeline nested
        (dag,) = dag.children("comparison")
    argv = dag.compile_op("plan").argv
    assert argv[:3] == ["python", "-m", "hooks.storage_profile"]
    return argv[3:]


# The agent tier's pipelines: one run a profile and the demo's budget (tests/agent_node).
AGENT_TIER = {"repeats": 1, **{k: DEMO_PARAMS[k] for k in ("steps", "checkpoint_every")}}


def passes(workload: str) -> int:
    """Passes over the profiles that count more runs a side than the calibration missed."""
    return CALIBRATED_RUNS[workload].missed // VERDICT_RUNS_PER_BLOCK[workload] + 1


@pytest.mark.parametrize(
    ("path", "params", "answerable"),
    [
        (PIPELINE, {}, True),
        (PROFILES_PIPELINE, {}, True),
        (PROFILES_PIPELINE, {**AGENT_TIER, "max_pause_s": DEMO_PARAMS["max_pause_s"]}, False),
        (PROFILES_PIPELINE, {**AGENT_TIER, "workload": "scan", **DATA_DEMO_PARAMS}, False),
        (PIPELINE, {"repeats": 1}, None),
        (PIPELINE, {"workload": "materialize"}, None),
        (PIPELINE, {"workload": "materialize", "passes": passes("materialize")}, True),
        (PROFILES_PIPELINE, {"repeats": 1, "workload": "materialize"}, None),
        (PROFILES_PIPELINE, {"workload": "materialize"}, None),
        (PROFILES_PIPELINE, {"workload": "workspace", "max_p99_ms": 20}, False),
        (
            PROFILES_PIPELINE,
            {"workload": "workspace", "profiles": PAIR.split(",") * passes("workspace")},
            True,
        ),
        (
            PROFILES_PIPELINE,
            {"workload": "materialize", "profiles": PAIR.split(",") * passes("materialize")},
            True,
        ),
    ],
    ids=[
        "defaults",
        "profiles-defaults",
        "agent-tier",
        "agent-tier-scan",
        "one-run",
        "two-profile-materialize",
        "two-profile-materialize-passes",
        "materialize",
        "materialize-defaults",
        "workspace-budget",
        "workspace-alternating",
        "materialize-alternating",
    ],
)
def test_the_pipelines_plan_op_says_what_its_settings_can_answer(
    fake: FakeKube, tmp_path: Path, path: Path, params: dict, answerable: bool | None
):
    # The plan op's own command line, compiled from the pipeline and run: the defaults
    # answer, a budget-only run is a warning, settings that answer nothing stop the pipeline
    # before any switch (exit 2: every stage is upstream-failed). A driver without a window:
    # the workspace's four passes need more than EBS's 4 modifications a day.
    cluster(fake, driver="example.csi.vendor.io", handle="v-1")
    out = tmp_path / "plan.json"
    result = run_hook(*_pipeline_plan_argv(path, params), "--summary-json", str(out))
    if answerable is None:
        assert result.exit_code == 2, result.output
        assert "could say nothing about the profiles" in result.stderr
        assert fake.calls == []
    else:
        assert result.exit_code == 0, result.output
        assert load(out)["answerable"] is answerable


# ---------------------------------------------------------------------------- sandbox


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    root = tmp_path / "sandbox"
    for name in ("disk", "memory"):
        (root / "media" / name).mkdir(parents=True)
    (root / "claims").mkdir()
    (root / "claims" / "training-checkpoints").symlink_to(root / "media" / "disk")
    path = root / "profiles.yaml"
    path.write_text(
        "claim: training-checkpoints\nnamespace: sandbox\n"
        "claimPath: claims/training-checkpoints\n"
        "profiles:\n  disk: {path: media/disk}\n  memory: {path: media/memory}\n"
    )
    return path


def local_plan(profiles_file: Path, profiles: str, *extra: str):
    return run_hook(
        "plan", "-n", "sandbox", "--claim", "training-checkpoints", "--profiles", profiles,
        "--backend", "local", "--profiles-file", str(profiles_file), *extra,
    )  # fmt: skip


def test_local_backend_has_no_window(
    sandbox: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("SANDBOX_ROOT", str(sandbox.parent))
    out = tmp_path / "plan.json"
    profiles = "disk,memory,disk,memory,disk,memory"
    result = local_plan(sandbox, profiles, "--return-to-first", "--summary-json", str(out))
    assert result.exit_code == 0, result.output
    data = load(out)
    assert data["backend"] == "local" and data["current_class"] == "disk"
    assert data["modifications_needed"] == 6 and data["window_s"] is None and data["fits"]
    assert (sandbox.parent / "claims" / "training-checkpoints").resolve().name == "disk"


def test_local_backend_refuses_unknown_profiles(sandbox: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SANDBOX_ROOT", str(sandbox.parent))
    result = local_plan(sandbox, "disk,nvme")
    assert result.exit_code == 3
    assert "unknown sandbox profile nvme (known: disk, memory)" in result.stderr
    result = run_hook(
        "plan", "-n", "other", "--claim", "training-checkpoints", "--profiles", "disk,memory",
        "--backend", "local", "--profiles-file", str(sandbox),
    )  # fmt: skip
    assert result.exit_code == 3 and "the sandbox has claim sandbox/" in result.stderr
