"""What a team lead reads: figures rounded, every reason said once, runs named, unlike runs
told apart, a report that reads top-down as a decision."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from checkpoint_compare.cli import main
from tests.checkpoint_compare.recorded import (
    summary_json,
    write_hook_run,
    write_repeats,
    write_training_run,
)

BASE, FAST = "checkpoint-baseline", "checkpoint-throughput"


def run_cli(root: Path, *args: str) -> tuple[int, str, Path]:
    html = root.parent / "report.html"
    result = CliRunner().invoke(
        main, ["--offline-root", str(root), *args, "--html", str(html), "--no-track"]
    )
    return result.exit_code, result.output, html


def _no_difference_runs() -> None:
    """Pauses that overlap, runs of equal length: nothing counts. The candidate's pause is
    a little shorter, so the old report priced a break-even for a difference that does
    not count."""
    write_training_run(BASE, [2.0, 2.0, 2.2, 1.8, 2.1, 1.9, 2.05], runtime_s=100.0)
    write_training_run(FAST, [2.0, 1.99, 2.19, 1.79, 2.09, 1.89, 2.04], runtime_s=100.0)


def test_figures_are_rounded_for_a_reader(runs_root: Path) -> None:
    _no_difference_runs()
    code, output, _ = run_cli(runs_root)
    assert code == 0, output
    assert "no measurable difference" in output
    # Money to the cent, never a negative zero.
    amounts = re.findall(r"(-?[\d,]+\.\d+) USD", output)
    assert amounts and all(re.fullmatch(r"-?[\d,]+\.\d\d", a) for a in amounts), amounts
    assert not re.search(r"-0\.0+ USD", output)
    # Times to 3 significant digits: no figure in seconds with more.
    for figure in re.findall(r"([+-]?\d[\d,]*\.\d+) s\b", output):
        digits = figure.lstrip("+-").replace(",", "").replace(".", "").lstrip("0")
        assert len(digits) <= 3, figure
    # Timestamps to the second, in UTC.
    stamps = re.findall(r"measured from\s+(.+?)\s{2}", output)
    assert stamps and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", s) for s in stamps)
    # A break-even for a difference that does not count is no figure to act on.
    assert "pays for itself" not in output


def test_confidence_is_the_one_asked(runs_root: Path) -> None:
    for profile in (BASE, FAST):
        write_repeats(profile, [2.0, 2.0, 2.2, 1.8, 2.1, 1.9, 2.05], runtime_s=100.0, runs=4)
    code, output, _ = run_cli(runs_root)
    assert code == 0, output
    # 4 and 4 runs: Student's t between runs has exactly the confidence asked for (a rank
    # interval's would be 97.1 %, the nearest at or above it).
    assert "95%" in output and "exact:" not in output and " 97" not in output


def test_headers_name_how_each_profile_wrote(runs_root: Path) -> None:
    write_training_run(BASE, [2.0, 2.1, 1.9, 2.0, 2.05], runtime_s=100.0)
    write_training_run(FAST, [1.0, 1.1, 0.9, 1.0, 1.05], runtime_s=95.0)
    code, output, html = run_cli(runs_root)
    assert code == 0, output
    header = next(line for line in output.splitlines() if "(baseline)" in line)
    assert f"{BASE} (baseline) · raw sync fsync" in header and f"{FAST} · raw sync fsync" in header
    assert f"<th>{FAST} · raw sync fsync</th>" in html.read_text()


def test_a_reason_without_an_interval_is_said_once_per_place(runs_root: Path) -> None:
    # One run a side: no interval of the pause.
    write_training_run(BASE, [2.0, 2.1, 1.9], runtime_s=100.0)
    write_training_run(FAST, [1.0, 1.1, 0.9], runtime_s=95.0)
    code, output, _ = run_cli(runs_root)
    assert code == 0, output
    comparison = output[output.index("== Comparison") : output.index("VERDICT:")]
    why = "one run a side cannot separate"
    assert comparison.count(why) == 1, comparison
    # The headline's table (its interval cell), the comparison's note, the verdict.
    assert output.count(why) == 3, output


def test_summary_runs_are_named_by_their_file(tmp_path: Path, runs_root: Path) -> None:
    paths = []
    for profile, pauses in ((BASE, [2.0, 2.1, 1.9, 2.0, 2.05]), (FAST, [1.0, 1.1, 0.9, 1.0, 1.05])):
        path = tmp_path / f"{profile}-run.json"
        path.write_text(json.dumps(summary_json(profile, pauses, 100.0)))
        paths += ["--summary", f"{profile}={path}"]
    runs_root.mkdir(parents=True, exist_ok=True)
    result = CliRunner().invoke(main, [*paths, "--baseline", BASE, "--no-track"])
    assert result.exit_code == 0, result.output
    runs = next(line for line in result.output.splitlines() if line.startswith("training runs"))
    assert "summary:" not in runs and f"{BASE}-run.json" in runs and f"{FAST}-run.json" in runs


def test_html_reads_top_down_as_a_decision(runs_root: Path) -> None:
    write_hook_run(BASE)
    write_training_run(BASE, [2.0, 2.1, 1.9] * 2, runtime_s=100.0)
    write_training_run(FAST, [1.0, 1.1, 0.9] * 2, runtime_s=90.0)
    code, output, html = run_cli(runs_root)
    assert code == 0, output
    text = html.read_text()
    order = [
        "id='verdict'",
        "id='recommendation'",
        "id='plot-intervals'",
        "id='plot-pause'",
        "id='plot-stages'",
        "<table>",
        "id='assumptions'",
        "id='comparison'",
    ]
    at = [text.index(marker) for marker in order]
    assert at == sorted(at), dict(zip(order, at, strict=True))
    assert text.count("<pre>") == 1 and text.index("<pre>") > text.index("id='assumptions'")


def test_interval_axis_has_numbers_a_unit_and_a_labelled_zero(runs_root: Path) -> None:
    write_training_run(BASE, [2.0, 2.1, 1.9] * 2, runtime_s=100.0)
    write_training_run(FAST, [1.0, 1.1, 0.9] * 2, runtime_s=90.0)
    code, output, html = run_cli(runs_root)
    assert code == 0, output
    for panel in re.findall(r"<svg [^>]*data-panel='(\w+)'.*?</svg>", html.read_text()):
        assert panel in ("pause", "runtime")
    svgs = re.findall(r"<svg [^>]*data-panel='\w+'.*?</svg>", html.read_text())
    assert len(svgs) == 2
    for svg in svgs:
        ticks = [t.replace(",", "") for t in re.findall(r"<text class='tick'[^>]*>([^<]+)<", svg)]
        assert len(ticks) >= 3 and all(re.fullmatch(r"[+-]?\d+(\.\d+)?", t) for t in ticks), ticks
        values = [float(t) for t in ticks]
        assert values == sorted(values) and min(values) <= 0 <= max(values)
        assert "class='zero-label'" in svg and ">0 = same as the baseline<" in svg
        assert ">s</text>" in svg  # the unit under the axis


def _fills(html: Path) -> dict[str, str]:
    return dict(
        re.findall(r"<svg [^>]*data-panel='(\w+)'.*?<circle [^>]*fill='(#\w+)'", html.read_text())
    )


def test_colours_agree_with_the_verdict(runs_root: Path) -> None:
    # The pause counts (clearly faster) but the whole run is not measurably shorter: no
    # measurable difference, so neither panel may show a verdict colour.
    write_repeats(BASE, [2.0, 2.1, 1.9] * 2, runtime_s=100.0)
    write_repeats(FAST, [1.0, 1.1, 0.9] * 2, runtime_s=100.0)
    code, output, html = run_cli(runs_root)
    assert code == 0, output
    assert "VERDICT: no measurable difference" in output
    assert _fills(html) == {"pause": "#888", "runtime": "#888"}


def test_colours_of_a_win_are_green(runs_root: Path) -> None:
    write_repeats(BASE, [2.0, 2.1, 1.9] * 2, runtime_s=100.0)
    write_repeats(FAST, [1.0, 1.1, 0.9] * 2, runtime_s=90.0)
    code, output, html = run_cli(runs_root)
    assert code == 0, output
    assert f"VERDICT: {FAST}" in output
    assert _fills(html) == {"pause": "#1a7f37", "runtime": "#1a7f37"}


def _summary(tmp_path: Path, profile: str, pauses: list[float], **keys: object) -> list[str]:
    path = tmp_path / f"{profile}.json"
    path.write_text(json.dumps(summary_json(profile, pauses, 100.0) | keys))
    return ["--summary", f"{profile}={path}"]


def test_summaries_that_know_when_they_ran_need_no_baseline(tmp_path: Path) -> None:
    # Given candidate first: the times, not the order of the arguments, pick the baseline.
    args = _summary(
        tmp_path, FAST, [1.0, 1.1, 0.9, 1.0, 1.05],
        started_at="2026-12-01T10:05:00Z", finished_at="2026-12-01T10:06:40Z",
    ) + _summary(
        tmp_path, BASE, [2.0, 2.1, 1.9, 2.0, 2.05],
        started_at="2026-12-01T10:00:00Z", finished_at="2026-12-01T10:01:40Z",
    )  # fmt: skip
    result = CliRunner().invoke(main, [*args, "--no-track"])
    assert result.exit_code == 0, result.output
    assert f"{BASE} (baseline)" in result.output
    assert "measured from" in result.output and "2026-12-01 10:00:00 UTC" in result.output
    # Without times they still need --baseline.
    older = _summary(tmp_path, FAST, [1.0, 1.1, 0.9]) + _summary(tmp_path, BASE, [2.0, 2.1, 1.9])
    result = CliRunner().invoke(main, [*older, "--no-track"])
    assert result.exit_code == 2 and "give --baseline PROFILE" in result.output


def test_restore_times_are_compared_like_the_pause(runs_root: Path) -> None:
    for runtime in (100.0, 100.5, 99.5, 100.2):
        write_training_run(
            BASE, [2.0, 2.1, 1.9, 2.0], runtime_s=runtime,
            outputs={"restore_s": 3.0 + runtime / 1000, "restore_bytes": 48 * 2**20,
                     "restore_gbps": 0.017}, meta={"restore_measured": "end"},
        )  # fmt: skip
    for runtime in (99.0, 99.5, 98.5, 99.2):
        write_training_run(
            FAST, [1.9, 2.0, 1.8, 1.9], runtime_s=runtime,
            outputs={"restore_s": 1.0 + runtime / 1000, "restore_bytes": 48 * 2**20,
                     "restore_gbps": 0.05}, meta={"restore_measured": "end"},
        )  # fmt: skip
    out = runs_root.parent / "report.json"
    code, output, html = run_cli(runs_root, "--json", str(out))
    assert code == 0, output
    restore = json.loads(out.read_text())["comparisons"][0]["restore"]
    assert restore["counts"] and abs(restore["estimate"] + 2.001) < 1e-9
    assert restore["low"] <= restore["estimate"] <= restore["high"] < 0
    assert "restore s (median; per run: when)" in output and "(end, end, end, end)" in output
    assert "restore of the newest checkpoint -2.00 s [" in output
    assert re.search(r"<svg [^>]*data-panel='restore'", html.read_text())


def test_the_read_back_of_a_library_format_is_a_stage_of_the_table(runs_root: Path) -> None:
    pauses = [2.0, 2.1, 1.9, 2.0, 2.05]
    for profile in (BASE, FAST):
        write_training_run(
            profile, pauses, runtime_s=100.0, checkpoint_format="safetensors",
            per_checkpoint={"ckpt_checksum_s": [0.25] * len(pauses)},
        )  # fmt: skip
    code, output, html = run_cli(runs_root)
    assert code == 0, output
    row = next(line for line in output.splitlines() if line.startswith("checksum median s"))
    assert row.split()[3:] == ["0.250", "0.250"], row
    assert "safetensors sync fsync" in output
