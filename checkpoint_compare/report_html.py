"""The self-contained HTML report: tables from ``report_tables`` plus matplotlib plots as PNGs.

Everything is inline (base64 ``<img>``, a ``<style>`` block): the file opens from a
run's artifacts or an air-gapped laptop without fetching anything. matplotlib is a
dependency of the default install; should it be missing all the same, the report has every
table and the verdict, and says the plots need matplotlib, rather than the verdict failing.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from checkpoint_compare.comparison import Difference, Outcome
from checkpoint_compare.figures import ProfileFigures
from checkpoint_compare.report_tables import (
    column_names,
    comparison_lines,
    recommendation_lines,
    sections,
)
from checkpoint_compare.verdict import Candidate, Verdict, interval

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NO_PLOTS = (
    "plots need matplotlib, a dependency of the package that is not installed here "
    "(pip install 'matplotlib>=3.8'); the tables hold every figure"
)


def plots_available() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


_STACKED = ("serialize", "write", "fsync", "checksum", "upload")
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 72em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.verdict { font-size: 1.3em; padding: 0.6em; background: #eef4ff; border-left: 4px solid #36c; }
img { max-width: 100%; display: block; margin: 0.5em 0 1.5em; }
pre { background: #f6f6f6; padding: 0.8em; white-space: pre-wrap; }
"""


def png(draw: Callable[[Figure], None], size: tuple[float, float] = (8, 4)) -> str:
    import matplotlib

    matplotlib.use("Agg")  # no display, no GUI toolkit: files only
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=size, dpi=100)
    try:
        draw(fig)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
    finally:
        plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


PALETTE = ("#4c72b0", "#dd8452", "#8172b3", "#937860", "#da8bc3", "#ccb974", "#64b5cd")


def profile_colours(verdict: Verdict) -> dict[str, str]:
    """One colour per profile in every plot (the baseline first), so a profile is the same
    colour wherever it appears; the verdict's colours (green, red) are left to the
    differences that decide it."""
    return {p.profile: PALETTE[i % len(PALETTE)] for i, p in enumerate(verdict.profiles)}


def _label(verdict: Verdict, profile: str) -> str:
    return profile + (" (baseline)" if profile == verdict.baseline else "")


def _stage_bars(verdict: Verdict, figures: list[ProfileFigures]) -> Callable[[Figure], None]:
    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        names = [_label(verdict, s.profile) for s in figures]
        bottoms = [0.0] * len(names)
        for stage in _STACKED:
            heights = [s.stages[stage].median if stage in s.stages else 0.0 for s in figures]
            if any(heights):
                ax.bar(names, heights, bottom=bottoms, label=stage)
                bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        ax.scatter(
            names,
            [s.pause.median for s in figures],
            color="black",
            marker="_",
            s=800,
            zorder=3,
            label="pause (training blocked)",
        )
        ax.set_ylabel("median seconds per checkpoint")
        ax.set_title("Checkpoint stages per profile (measured checkpoints)")
        ax.legend()

    return draw


def _pause_over_steps(verdict: Verdict, figures: list[ProfileFigures]) -> Callable[[Figure], None]:
    colours = profile_colours(verdict)

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        for s in figures:
            many = len(s.per_run) > 1
            for i, run in enumerate(s.per_run):
                label = _label(verdict, s.profile) + (f" run {i + 1}" if many else "")
                colour = colours[s.profile]
                if run.measured:
                    steps, values = zip(*sorted(run.measured), strict=True)
                    ax.plot(steps, values, marker="o", color=colour, label=label)
                if run.warmup:  # hollow: shown, not compared
                    steps, values = zip(*sorted(run.warmup), strict=True)
                    ax.plot(
                        steps, values, marker="o", linestyle="none", markerfacecolor="white",
                        color=colour, label=f"{label}, warm-up (not compared)",
                    )  # fmt: skip
        ax.set_xlabel("training step")
        ax.set_ylabel("pause per checkpoint (s)")
        ax.set_ylim(bottom=0)
        ax.set_title("Pause per checkpoint, by profile")
        ax.legend(fontsize="small")

    return draw


def _fio_bars(figures: list[ProfileFigures]) -> Callable[[Figure], None]:
    cases = sorted({c for s in figures for c in s.fio})

    def draw(fig: Figure) -> None:
        width = 0.8 / len(figures)
        for i, (measure, label) in enumerate(
            (("bw_mbps", "bandwidth (MB/s)"), ("lat_p99_us", "p99 latency (µs)"))
        ):
            ax = fig.add_subplot(1, 2, i + 1)
            for j, s in enumerate(figures):
                xs = [k + j * width for k in range(len(cases))]
                ax.bar(
                    xs, [s.fio.get(c, {}).get(measure, 0) for c in cases], width, label=s.profile
                )
            ax.set_xticks([k + 0.4 - width / 2 for k in range(len(cases))], cases, rotation=30)
            ax.set_title(f"fio {label}")
            ax.legend()

    return draw


_SVG_W, _ROW_H, _LABEL_W, _PAD, _AXIS_H = 720, 34, 200, 24, 34
GREEN, RED, GREY = "#1a7f37", "#c62828", "#888"


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 × a power of ten) spanning [low, high]."""
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step)
    return [i * step for i in range(first, math.floor(high / step) + 1)]


def interval_colour(cand: Candidate) -> str:
    """Green or red only where the difference decides the verdict: the candidate is
    measurably faster (or slower) on the whole (a training run: because of its
    checkpoints). A difference that counts on its own but does not decide (a faster pause
    under a run that is not measurably faster) is grey, like one that does not count, so
    the colours never contradict the verdict."""
    if cand.outcome in (Outcome.BETTER, Outcome.FASTER_COSTLIER):
        return GREEN
    if cand.outcome in (Outcome.WORSE, Outcome.SLOWER_CHEAPER):
        return RED
    return GREY


def interval_panel(
    title: str, rows: list[tuple[str, Difference, str]], unit: str, panel: str
) -> str:
    """One forest plot: per candidate its estimate (dot), interval (line) and practical
    floor (band around zero), on an axis with numbers and a labelled zero line. Drawn as
    SVG, so it needs no plotting library."""
    values = [0.0]
    for _, diff, _ in rows:
        values += [diff.estimate, diff.floor, -diff.floor]
        if diff.shift.has_interval:
            values += [diff.shift.low, diff.shift.high]  # type: ignore[list-item]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    low, high = low - 0.08 * span, high + 0.08 * span
    width = _SVG_W - _LABEL_W - _PAD

    def x(value: float) -> float:
        return _LABEL_W + (value - low) / (high - low) * width

    bottom = _PAD + _ROW_H * len(rows)
    height = bottom + _AXIS_H
    esc = html.escape
    out = [
        f"<svg width='{_SVG_W}' height='{height}' role='img' aria-label='{esc(title)}' "
        f"data-panel='{panel}'>",
        f"<text x='{_LABEL_W}' y='16' font-size='13'>{esc(title)} ({unit}, candidate − "
        "baseline)</text>",
    ]
    # The axis: a baseline rule, round ticks with their values, the unit.
    out.append("<g class='axis'>")
    out.append(
        f"<line x1='{_LABEL_W}' y1='{bottom}' x2='{_LABEL_W + width}' y2='{bottom}' stroke='#333'/>"
    )
    for tick in _ticks(low, high):
        tx = x(tick)
        out.append(
            f"<line x1='{tx:.1f}' y1='{bottom}' x2='{tx:.1f}' y2='{bottom + 5}' stroke='#333'/>"
            f"<text class='tick' x='{tx:.1f}' y='{bottom + 17}' font-size='11' "
            f"text-anchor='middle'>{'0' if tick == 0 else f'{tick:+g}'}</text>"
        )
    out.append(
        f"<text x='{_LABEL_W + width + 4}' y='{bottom + 17}' font-size='11'>{unit}</text></g>"
    )
    out.append(
        f"<line class='zero' x1='{x(0):.1f}' y1='{_PAD}' x2='{x(0):.1f}' y2='{bottom}' "
        "stroke='#333' stroke-dasharray='3,3'/>"
        f"<text class='zero-label' x='{x(0):.1f}' y='{bottom + 31}' font-size='11' "
        "text-anchor='middle' fill='#333'>0 = same as the baseline</text>"
    )
    for i, (name, diff, colour) in enumerate(rows):
        y = _PAD + _ROW_H * i + _ROW_H / 2
        s = diff.shift
        attrs = (
            f"class='interval' data-candidate='{esc(name)}' data-estimate='{s.estimate!r}' "
            f"data-low='{s.low!r}' data-high='{s.high!r}' data-counts='{str(diff.counts).lower()}'"
        )
        out.append(f"<g {attrs}>")
        out.append(
            f"<rect x='{x(-diff.floor):.1f}' y='{y - 10:.1f}' width='{x(diff.floor) - x(-diff.floor):.1f}' "
            "height='20' fill='#eee'><title>practical floor</title></rect>"
        )
        out.append(f"<text x='4' y='{y + 4:.1f}' font-size='12'>{esc(name)}</text>")
        if s.has_interval:
            out.append(
                f"<line x1='{x(s.low):.1f}' y1='{y:.1f}' x2='{x(s.high):.1f}' y2='{y:.1f}' "  # type: ignore[arg-type]
                f"stroke='{colour}' stroke-width='3'/>"
            )
        out.append(
            f"<circle cx='{x(s.estimate):.1f}' cy='{y:.1f}' r='5' fill='{colour}'>"
            f"<title>{esc(interval(s, unit=unit))}</title></circle>"
        )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def intervals_svg(verdict: Verdict) -> str:
    """The headline's differences of every candidate with their intervals, coloured as the
    verdict decides; a training run's whole run and restore beside them."""

    def rows(
        measure: Callable[[Candidate], Difference | None],
        colour: Callable[[Candidate], str] = interval_colour,
    ) -> list[tuple[str, Difference, str]]:
        return [
            (c.name, diff, colour(c))
            for c in verdict.candidates
            if (diff := measure(c)) is not None
        ]

    row = verdict.row
    level = f"{verdict.thresholds.confidence:.0%}"
    panels = [
        interval_panel(
            f"{row.label.capitalize()}, {level} interval", rows(lambda c: c.profile.difference),
            row.unit, row.stem,
        ),
    ]  # fmt: skip
    if whole := rows(lambda c: c.comparison.runtime if c.comparison else None):
        panels.append(interval_panel("Whole run", whole, "s", "runtime"))
    # The restore informs and does not decide the verdict: never a verdict colour.
    if restore := rows(lambda c: c.comparison.restore if c.comparison else None, lambda c: GREY):
        panels.append(interval_panel("Restore of the newest checkpoint", restore, "s", "restore"))
    return "<div id='plot-intervals'>" + "".join(panels) + "</div>"


def _samples_plot(verdict: Verdict) -> Callable[[Figure], None]:
    """Every sample of the headline per profile (and, where the row has one, its AU)."""
    row, profiles = verdict.row, verdict.profiles
    au = row.au_metric is not None and any(p.au_samples for p in profiles)
    colours = profile_colours(verdict)

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot(1, 2 if au else 1, 1)
        for i, p in enumerate(profiles):
            ax.scatter([i] * len(p.samples), p.samples, color=colours[p.profile], alpha=0.7)
            ax.hlines(p.median, i - 0.3, i + 0.3, color=colours[p.profile], linewidth=2)
        ax.set_xticks(range(len(profiles)), [_label(verdict, p.profile) for p in profiles])
        ax.tick_params(axis="x", rotation=15)
        ax.set_ylabel(f"{row.label} ({row.unit})")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{row.label.capitalize()}: every sample, the median as a bar")
        if au:
            bars = fig.add_subplot(1, 2, 2)
            bars.bar(
                [_label(verdict, p.profile) for p in profiles],
                [100 * (p.au or 0.0) for p in profiles],
                color=[colours[p.profile] for p in profiles],
            )
            if (floor := verdict.budget.min_au) is not None:
                bars.axhline(100 * floor, color="black", linestyle="--", label="budget")
                bars.legend()
            bars.set_ylim(0, 100)
            bars.set_ylabel("accelerator utilization (%)")
            bars.set_title("Accelerator utilization (median)")
            bars.tick_params(axis="x", rotation=15)

    return draw


def _table(verdict: Verdict, title: str, rows: list[tuple[str, list[str]]]) -> str:
    esc = html.escape
    header = "".join(f"<th>{esc(name)}</th>" for name in column_names(verdict))
    out = [f"<h2>{esc(title)}</h2><table><tr><th></th>{header}</tr>"]
    for label, cells in rows:
        tds = "".join(f"<td>{esc(c)}</td>" for c in cells)
        out.append(f"<tr><td>{esc(label)}</td>{tds}</tr>")
    out.append("</table>")
    return "".join(out)


def render_html(verdict: Verdict) -> str:
    """Render the report as one self-contained HTML document that reads top-down as a
    decision: the verdict and what to do, the plots that show why, the tables, the
    assumptions, and last the comparison in words. The same document for every workload;
    a training run adds its pauses over the steps, its stages and the fio sweep."""
    esc = html.escape
    title = f"Storage profile comparison: {verdict.workload} ({verdict.row.title})"
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<p class='verdict' id='verdict'><b>Verdict: {esc(verdict.verdict)}</b><br>"
        f"{esc(verdict.reason)}</p>",
    ]
    if verdict.recommendation is not None:
        rec = verdict.recommendation
        parts.append(
            f"<p class='verdict' id='recommendation'><b>Recommended: {esc(rec.profile)}</b><br>"
            f"{esc(rec.reason)}</p>"
        )
    parts.append(
        "<section id='why'><h2>Differences from the baseline</h2><p>Dot: the estimate (the "
        "shift between the runs' medians); line: its interval; grey band: the practical "
        "floor. Green: measurably faster, and it decides the verdict; red: measurably slower, "
        "and it decides; grey: does not decide the verdict (within noise, or not borne out by "
        "the whole run).</p>" + intervals_svg(verdict)
    )
    figures = verdict.figures
    plots = [
        ("plot-samples", f"{verdict.row.label.capitalize()} per profile", _samples_plot(verdict))
    ]
    if figures:
        plots += [
            ("plot-pause", "Pause per checkpoint, by profile", _pause_over_steps(verdict, figures)),
            ("plot-stages", "Stage breakdown per profile", _stage_bars(verdict, figures)),
        ]
    if any(s.fio for s in figures):
        plots.append(("plot-fio", "fio bandwidth and latency per case", _fio_bars(figures)))
    if not plots_available():
        parts.append(f"<p id='no-plots'><i>{esc(NO_PLOTS)}</i></p>")
        plots = []
    for plot_id, plot_title, draw in plots:
        size = (10, 4) if plot_id == "plot-fio" else (8, 4)
        parts.append(
            f"<h2>{esc(plot_title)}</h2><img id='{plot_id}' alt='{esc(plot_title)}' "
            f"src='data:image/png;base64,{png(draw, size)}'>"
        )
    parts.append("</section><section id='tables'>")
    for section, rows in sections(verdict):
        parts.append(_table(verdict, section, rows))
    parts.append("</section><section id='assumptions'><h2>Assumptions</h2><ul>")
    parts += [f"<li>{esc(a)}</li>" for a in verdict.assumptions]
    parts.append("</ul></section>")
    if verdict.notes:
        parts.append("<section id='notes'><h2>Notes</h2><ul>")
        parts += [f"<li>{esc(n)}</li>" for n in verdict.notes]
        parts.append("</ul></section>")
    if verdict.failed_runs:
        parts.append("<h2>Failed runs (not used)</h2><ul>")
        parts += [
            f"<li>{esc(r.label)}: {esc(r.status)} {esc(r.message)}</li>"
            for r in verdict.failed_runs
        ]
        parts.append("</ul>")
    lines = comparison_lines(verdict) + [""] + recommendation_lines(verdict)
    parts.append(
        "<details id='comparison'><summary>The comparison in words</summary><pre>"
        + esc("\n".join(lines))
        + "</pre></details>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)
