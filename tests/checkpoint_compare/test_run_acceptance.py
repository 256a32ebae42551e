"""Which runs the verdict accepts and how it reads them: a resumed run, other writer
settings, several summaries of a profile as its repeats, one summary given twice, impossible
figures (exit 2), and a diverged run (null for every non-finite figure) never recommended."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from checkpoint_compare.cli import main
from tests.checkpoint_compare.recorded import run_cli, summary_json, write_training_run

BASE, FAST = "checkpoint-baseline", "checkpoint-throughput"
PAUSES = {BASE: [2.5] + [2.0, 2.02, 1.98] * 2, FAST: [1.5] + [1.0, 1.02, 0.98] * 2}


def _invoke(*args: str, json_out: Path | None = None) -> tuple[int, str, dict | None]:
    extra = ["--json", str(json_out)] if json_out else []
    result = CliRunner().invoke(main, [*args, *extra, "--no-track"])
    # A traceback is exit 1 with the exception kept; a clean error has none to show.
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    report = None
    if json_out and json_out.exists() and result.exit_code == 0:
        report = json.loads(json_out.read_text())
    return result.exit_code, result.output, report


def _summary(tmp_path: Path, name: str, profile: str, runtime: float, **change: Any) -> Path:
    data = summary_json(profile, PAUSES[profile], runtime)
    data.update(change)
    path = tmp_path / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


# --------------------------------------------------- 8: a fresh run records resumed_from_step 0


def test_a_run_that_started_at_step_0_is_not_resumed(runs_root: Path, pricing_file) -> None:
    # The trainer's output is 0 for a run that started at step 0: only the other run resumed.
    write_training_run(BASE, PAUSES[BASE], runtime_s=100.0, outputs={"resumed_from_step": 0})
    write_training_run(FAST, PAUSES[FAST], runtime_s=60.0, outputs={"resumed_from_step": 100})
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 3, output
    assert "from step 100" in output and "from step 0" not in output


def test_runs_that_all_started_at_step_0_are_shown_as_uninterrupted(
    runs_root: Path, pricing_file
) -> None:
    write_training_run(BASE, PAUSES[BASE], runtime_s=100.0, outputs={"resumed_from_step": 0})
    write_training_run(FAST, PAUSES[FAST], runtime_s=92.0, outputs={"resumed_from_step": 0})
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    assert report["profiles"][FAST]["training_runs"][0]["resumed_from_step"] is None
    assert "resumed from step" not in output


# ------------------------------------------------------- 9: the writer's own settings differ


@pytest.mark.parametrize(
    ("key", "base", "fast"),
    [("io_streams", 1, 8), ("overlap", True, False), ("upload_to", None, "s3://bucket/ckpt")],
)
def test_runs_of_different_writer_settings_are_refused(
    runs_root: Path, pricing_file, key: str, base: Any, fast: Any
) -> None:
    write_training_run(BASE, PAUSES[BASE], runtime_s=100.0, **{key: base})
    write_training_run(FAST, PAUSES[FAST], runtime_s=92.0, **{key: fast})
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 3, output
    assert f"{key} differs" in output and repr(fast) in output


# ------------------------------------------------- 10: several summaries of one profile


def test_several_summaries_of_a_profile_are_its_repeats(tmp_path: Path, pricing_file) -> None:
    first = _summary(tmp_path, "base-1", BASE, 100.0)
    # The same file name in another directory is another run.
    second = _summary(tmp_path, "again/base-1", BASE, 101.0)
    fast = _summary(tmp_path, "fast", FAST, 92.0)
    code, output, report = _invoke(
        "--summary", f"{BASE}={first}", "--summary", f"{BASE}={second}",
        "--summary", f"{FAST}={fast}", "--baseline", BASE, "--pricing", str(pricing_file()),
        json_out=tmp_path / "report.json",
    )  # fmt: skip
    assert code == 0, output
    runs = report["profiles"][BASE]["training_runs"]
    assert [r["runtime_s"] for r in runs] == [100.0, 101.0]
    assert len({r["uuid"] for r in runs}) == 2


def test_one_summary_given_twice_is_refused(tmp_path: Path) -> None:
    base = _summary(tmp_path, "base", BASE, 100.0)
    fast = _summary(tmp_path, "fast", FAST, 92.0)
    code, output, _ = _invoke(
        "--summary", f"{BASE}={base}", "--summary", f"{FAST}={base}",
        "--summary", f"{FAST}={fast}", "--baseline", BASE,
    )  # fmt: skip
    assert code == 2, output
    assert str(base) in output and "more than once" in output


# --------------------------------------------- 11: a zero runtime, negative figures


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"runtime_s": 0}, "runtime_s"),
        ({"runtime_s": -100.0}, "runtime_s"),
        ({"ckpt_pause_s_total": -3.0}, "ckpt_pause_s_total"),
        ({"ckpt_pause_share": -0.1}, "ckpt_pause_share"),
        ({"checkpoint_count": -7}, "checkpoint_count"),
        ({"resumed_from_step": -50}, "resumed_from_step"),
        ({"stages": {"pause_s": {"median": -1.0, "min": -2.0, "max": 1.0}}}, "ckpt_pause_s_"),
    ],
)
def test_a_zero_runtime_or_a_negative_figure_in_a_summary_exits_2(
    tmp_path: Path, change: dict, field: str
) -> None:
    bad = _summary(tmp_path, "bad", FAST, 92.0, **change)
    base = _summary(tmp_path, "base", BASE, 100.0)
    code, output, _ = _invoke(
        "--summary", f"{BASE}={base}", "--summary", f"{FAST}={bad}", "--baseline", BASE
    )
    assert code == 2, output
    assert field in output and str(bad) in output


def test_a_negative_pause_of_one_checkpoint_exits_2(tmp_path: Path) -> None:
    data = summary_json(FAST, PAUSES[FAST], 92.0)
    data["checkpoints"][2]["pause_s"] = -1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    base = _summary(tmp_path, "base", BASE, 100.0)
    code, output, _ = _invoke(
        "--summary", f"{BASE}={base}", "--summary", f"{FAST}={bad}", "--baseline", BASE
    )
    assert code == 2, output
    assert "pause_s" in output and "step 150" in output


def test_a_negative_recorded_output_exits_2(runs_root: Path, pricing_file) -> None:
    write_training_run(BASE, PAUSES[BASE], runtime_s=100.0)
    bad = write_training_run(FAST, PAUSES[FAST], runtime_s=-92.0)
    code, output, _ = run_cli(runs_root, pricing_file())
    assert code == 2, output
    assert "runtime_s" in output and bad[:8] in output


# ------------------------------------ a diverged run, as the trainer records it: nulls


def _diverged(tmp_path: Path, profile: str, runtime_s: float) -> Path:
    """The summary of a run whose loss went to NaN: every non-finite figure is null."""
    data = summary_json(profile, PAUSES[profile], runtime_s)
    data.update(final_loss=None, loss_curve=[[10, 7.1], [20, 3.2e12], [30, None], [40, None]])
    path = tmp_path / f"{profile}-diverged.json"
    path.write_text(json.dumps(data))
    return path


def test_a_diverged_summary_is_reported_as_diverged_and_never_crowned(
    tmp_path: Path, pricing_file
) -> None:
    # The baseline class is the cheaper one: "the cheapest to keep" would be the diverged run.
    base = _diverged(tmp_path, BASE, 100.0)
    fast = _summary(tmp_path, "fast", FAST, 92.0, loss_curve=[[10, 7.1], [40, 2.5]])
    for extra in ((), ("--checkpoints-per-month", "1000"), ("--max-pause-s", "5")):
        code, output, report = _invoke(
            "--summary", f"{BASE}={base}", "--summary", f"{FAST}={fast}", "--baseline", BASE,
            "--pricing", str(pricing_file()), *extra, json_out=tmp_path / "report.json",
        )  # fmt: skip
        assert code == 0, output
        assert report["verdict"] not in (BASE, FAST)  # nothing shows they trained alike
        assert report["recommendation"]["profile"] != BASE, (extra, report["recommendation"])
        assert "diverged" in report["profiles"][BASE]["loss_problem"]
        assert "diverged" in report["recommendation"]["reason"]
        assert "diverged" in output


def test_a_diverged_offline_run_is_never_recommended(runs_root: Path, pricing_file) -> None:
    write_training_run(BASE, PAUSES[BASE], runtime_s=100.0, final_loss=float("nan"))
    write_training_run(FAST, PAUSES[FAST], runtime_s=92.0)
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    assert report["recommendation"]["profile"] == FAST
    assert "diverged" in report["recommendation"]["reason"]


def test_when_every_profile_diverged_none_is_recommended(tmp_path: Path, pricing_file) -> None:
    base, fast = _diverged(tmp_path, BASE, 100.0), _diverged(tmp_path, FAST, 92.0)
    code, output, report = _invoke(
        "--summary", f"{BASE}={base}", "--summary", f"{FAST}={fast}", "--baseline", BASE,
        "--pricing", str(pricing_file()), json_out=tmp_path / "report.json",
    )  # fmt: skip
    assert code == 0, output
    assert report["recommendation"]["profile"] == "none"
    assert "diverged" in report["recommendation"]["reason"]


def test_a_run_that_says_where_it_diverged_is_diverged_despite_finite_loss_events(
    runs_root: Path, pricing_file
) -> None:
    # What the trainer records of a diverged run: finite loss events up to the step it
    # diverged, no final_loss output (the outputs take no NaN) and diverged_at_step.
    pauses = PAUSES[BASE]
    write_training_run(
        BASE, pauses, runtime_s=100.0, final_loss=None,
        per_checkpoint={"loss": [3.0 - 0.1 * i for i in range(len(pauses))]},
        outputs={"diverged_at_step": 40},
    )  # fmt: skip
    write_training_run(FAST, PAUSES[FAST], runtime_s=92.0, outputs={"diverged_at_step": 0})
    code, output, report = run_cli(runs_root, pricing_file())
    assert code == 0, output
    assert report["recommendation"]["profile"] == FAST
    assert "from step 40" in output and "diverged" in report["recommendation"]["reason"]
