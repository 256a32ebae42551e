"""The HTML report of a data workload's verdict (scan, materialize, workspace).

Built from the checkpoint report's pieces (:mod:`checkpoint_compare.report_html`: the
style, the forest plot of the shifts, matplotlib plots as inline PNGs, the same colours) and
its formatting (:mod:`checkpoint_compare.formatting`), so the two reports read alike: the
verdict first, in the workload's terms ("keeps the GPUs fed at 97% AU, baseline 71%"), then
the differences with their intervals, the samples, and the table of figures per profile.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

from checkpoint_compare.formatting import DASH, level, seconds, usd
from checkpoint_compare.intervals import Shift
from checkpoint_compare.report_html import (
    GREEN,
    GREY,
    NO_PLOTS,
    PALETTE,
    RED,
    STYLE,
    interval_panel,
    plots_available,
    png,
)
from checkpoint_compare.workloads import WorkloadProfile, WorkloadVerdict

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _label(v: WorkloadVerdict, p: WorkloadProfile) -> str:
    return p.profile + (" (baseline)" if p.profile == v.baseline else "")


def _colour(p: WorkloadProfile) -> str:
    """Green or red only for a difference that counts (lower is better for every headline)."""
    if not p.significant or p.relative is None:
        return GREY
    return GREEN if p.relative < 0 else RED


def intervals_svg(v: WorkloadVerdict) -> str:
    """Each candidate's shift of the headline figure against the baseline, its interval
    and the noise floor."""
    rows = [(p.profile, p.difference, _colour(p)) for p in v.profiles if p.shift is not None]
    if not rows:
        return ""
    level = f"{v.confidence:.0%} "
    title = f"{v.headline.capitalize()}, {level}interval"
    return "<div id='plot-intervals'>" + interval_panel(title, rows, v.unit, "headline") + "</div>"


def _samples_plot(v: WorkloadVerdict) -> Callable[[Figure], None]:
    """Every sample of the headline per profile (and, for a scan, its AU beside it)."""
    scan = v.workload == "scan" and any(p.au_samples for p in v.profiles)

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot(1, 2 if scan else 1, 1)
        for i, p in enumerate(v.profiles):
            colour = PALETTE[i % len(PALETTE)]
            ax.scatter([i] * len(p.samples), p.samples, color=colour, alpha=0.7)
            ax.hlines(p.median, i - 0.3, i + 0.3, color=colour, linewidth=2)
        ax.set_xticks(range(len(v.profiles)), [_label(v, p) for p in v.profiles], rotation=15)
        ax.set_ylabel(f"{v.headline} ({v.unit})")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{v.headline.capitalize()}: every sample, the median as a bar")
        if scan:
            au = fig.add_subplot(1, 2, 2)
            au.bar(
                [_label(v, p) for p in v.profiles],
                [100 * (p.au or 0.0) for p in v.profiles],
                color=[PALETTE[i % len(PALETTE)] for i in range(len(v.profiles))],
            )
            if v.budget.min_au is not None:
                au.axhline(100 * v.budget.min_au, color="black", linestyle="--", label="budget")
                au.legend()
            au.set_ylim(0, 100)
            au.set_ylabel("accelerator utilization (%)")
            au.set_title("Accelerator utilization (median)")
            au.tick_params(axis="x", rotation=15)

    return draw


def _figure(value: float | None, unit: str, signed: bool = False) -> str:
    return DASH if value is None else f"{seconds(value, signed=signed)} {unit}"


def _interval(shift: Shift | None, unit: str) -> str:
    """``[-2.9, -2.6] s 95%``, or why there is none (the checkpoint report's form, in the
    workload's unit)."""
    if shift is None:
        return DASH
    if not shift.has_interval:
        return f"none: {shift.method}"
    low, high = (seconds(x, signed=True) for x in (shift.low, shift.high))
    return f"[{low}, {high}] {unit} {level(shift.confidence, shift.asked)}".rstrip()


def rows(v: WorkloadVerdict) -> list[tuple[str, list[str]]]:
    """The table: one row per figure, one column per profile."""

    def each(cell: Callable[[WorkloadProfile], str]) -> list[str]:
        return [cell(p) for p in v.profiles]

    def fits(p: WorkloadProfile) -> str:
        return DASH if p.meets_budget is None else "yes" if p.meets_budget else "no"

    out = [
        (f"{v.headline}, median", each(lambda p: _figure(p.median, v.unit))),
        ("samples", each(lambda p: f"{len(p.samples)} from {len(p.runs)} run(s)")),
        ("run medians", each(lambda p: ", ".join(_figure(statistics.median(s), v.unit) for s in p.run_samples if s))),
        ("spread (max − min) / median", each(lambda p: DASH if p.noise is None else f"{p.noise:.0%}")),
        ("shift against the baseline", each(lambda p: _figure(p.shift and p.shift.estimate, v.unit, True))),
        ("interval", each(lambda p: _interval(p.shift, v.unit))),
        ("change", each(lambda p: DASH if p.relative is None else f"{p.relative:+.0%}")),
        ("measurable (outside the noise floor)", each(lambda p: DASH if p.shift is None else "yes" if p.significant else "no")),
    ]  # fmt: skip
    if v.workload == "scan":
        out.append(
            ("accelerator utilization", each(lambda p: DASH if p.au is None else f"{p.au:.0%}"))
        )
    out += [
        ("meets the budget", each(fits)),
        ("volume per month", each(lambda p: usd(p.cost.storage_month if p.cost else None))),
        ("GPUs for the median", each(lambda p: usd(p.cost.gpu_run if p.cost else None))),
    ]
    return out


def to_html(v: WorkloadVerdict) -> str:
    """One self-contained HTML document: the verdict and the recommendation, the
    differences with their intervals, the samples, the table, the cost assumptions."""
    esc = html.escape
    *changes, recommendation = v.sentences
    changes = [f"{v.verdict}.", *changes]
    title = f"Storage profile comparison: {v.workload} ({v.row.title})"
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        "<p class='verdict' id='verdict'><b>Verdict: "
        + "<br>".join(esc(s) for s in changes)
        + "</b></p>",
        f"<p class='verdict' id='recommendation'><b>{esc(recommendation)}</b></p>",
        "<section id='why'><h2>Differences from the baseline</h2><p>Dot: the Hodges–Lehmann "
        f"estimate of the {esc(v.headline)} shift; line: its interval; grey band: the noise "
        "floor. Green: measurably lower (better); red: measurably higher; grey: within the "
        "noise.</p>" + intervals_svg(v),
    ]
    if plots_available():
        size = (11, 4) if v.workload == "scan" else (8, 4)
        parts.append(
            f"<h2>Samples per profile</h2><img id='plot-samples' alt='samples per profile' "
            f"src='data:image/png;base64,{png(_samples_plot(v), size)}'>"
        )
    else:
        parts.append(f"<p id='no-plots'><i>{esc(NO_PLOTS)}</i></p>")
    header = "".join(f"<th>{esc(_label(v, p))}</th>" for p in v.profiles)
    parts.append(
        f"</section><section id='tables'><h2>Figures</h2><table><tr><th></th>{header}</tr>"
    )
    for label, cells in rows(v):
        tds = "".join(f"<td>{esc(c)}</td>" for c in cells)
        parts.append(f"<tr><td>{esc(label)}</td>{tds}</tr>")
    parts.append("</table></section>")
    assumptions = list(dict.fromkeys(a for p in v.profiles if p.cost for a in p.cost.assumptions))
    if assumptions:
        parts.append("<section id='assumptions'><h2>Assumptions</h2><ul>")
        parts += [f"<li>{esc(a)}</li>" for a in assumptions]
        parts.append("</ul></section>")
    parts.append("</body></html>")
    return "\n".join(parts)
