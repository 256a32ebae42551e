"""The self-contained HTML report: tables from ``report_tables`` plus matplotlib plots as PNGs.

Everything is inline (base64 ``<img>``, a ``<style>`` block): the file opens from a
run's artifacts or an air-gapped laptop without fetching anything. matplotlib is the
``report`` extra: without it (the job image installs the package without extras, and the
component always asks for HTML) the report has every table and the verdict, and says the
plots need matplotlib, rather than the verdict failing.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from typing import TYPE_CHECKING

from checkpoint_compare.comparison import Difference
from checkpoint_compare.report_tables import (
    COST_SECTION,
    comparison_lines,
    recommendation_lines,
    sections,
)
from checkpoint_compare.verdict import Verdict

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NO_PLOTS = (
    "plots need matplotlib, which is not installed "
    "(pip install 'checkpoint-storage-bench[report]'); the tables hold every figure"
)


def plots_available() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


_STACKED = ("serialize", "write", "fsync", "upload")
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 72em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.verdict { font-size: 1.3em; padding: 0.6em; background: #eef4ff; border-left: 4px solid #36c; }
img { max-width: 100%; display: block; margin: 0.5em 0 1.5em; }
pre { background: #f6f6f6; padding: 0.8em; white-space: pre-wrap; }
"""


def _png(draw: Callable[[Figure], None], size: tuple[float, float] = (8, 4)) -> str:
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


def _stage_bars(verdict: Verdict) -> Callable[[Figure], None]:
    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        names = [s.profile for s in verdict.profiles]
        bottoms = [0.0] * len(names)
        for stage in _STACKED:
            heights = [
                s.stages[stage].median if stage in s.stages else 0.0 for s in verdict.profiles
            ]
            if any(heights):
                ax.bar(names, heights, bottom=bottoms, label=stage)
                bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        ax.scatter(
            names,
            [s.pause.median for s in verdict.profiles],
            color="black",
            marker="_",
            s=800,
            zorder=3,
            label="pause (training blocked)",
        )
        ax.set_ylabel("median seconds per checkpoint")
        ax.set_title("Checkpoint stages per profile")
        ax.legend()

    return draw


def _pause_over_steps(verdict: Verdict) -> Callable[[Figure], None]:
    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        for s in verdict.profiles:
            for i, series in enumerate(s.pause_series):
                if series:
                    steps, values = zip(*series, strict=True)
                    label = s.profile if len(s.pause_series) == 1 else f"{s.profile} run {i + 1}"
                    ax.plot(steps, values, marker="o", label=label)
        ax.set_xlabel("training step")
        ax.set_ylabel("pause (s)")
        ax.set_ylim(bottom=0)
        ax.set_title("Pause per checkpoint")
        ax.legend()

    return draw


def _fio_bars(verdict: Verdict) -> Callable[[Figure], None]:
    cases = sorted({c for s in verdict.profiles for c in s.fio})

    def draw(fig: Figure) -> None:
        width = 0.8 / len(verdict.profiles)
        for i, (measure, label) in enumerate(
            (("bw_mbps", "bandwidth (MB/s)"), ("lat_p99_us", "p99 latency (µs)"))
        ):
            ax = fig.add_subplot(1, 2, i + 1)
            for j, s in enumerate(verdict.profiles):
                xs = [k + j * width for k in range(len(cases))]
                ax.bar(
                    xs, [s.fio.get(c, {}).get(measure, 0) for c in cases], width, label=s.profile
                )
            ax.set_xticks([k + 0.4 - width / 2 for k in range(len(cases))], cases, rotation=30)
            ax.set_title(f"fio {label}")
            ax.legend()

    return draw


_SVG_W, _ROW_H, _LABEL_W, _PAD = 720, 34, 200, 24


def _interval_panel(title: str, rows: list[tuple[str, Difference]], unit: str) -> str:
    """One forest plot: per candidate its estimate (dot), interval (line) and practical
    floor (band around zero); zero marked. Drawn as SVG, so it needs no plotting library."""
    values = [0.0]
    for _, diff in rows:
        values += [diff.estimate, diff.floor, -diff.floor]
        if diff.shift.has_interval:
            values += [diff.shift.low, diff.shift.high]  # type: ignore[list-item]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    low, high = low - 0.08 * span, high + 0.08 * span
    width = _SVG_W - _LABEL_W - _PAD

    def x(value: float) -> float:
        return _LABEL_W + (value - low) / (high - low) * width

    height = _PAD * 2 + _ROW_H * len(rows)
    esc = html.escape
    out = [
        f"<svg width='{_SVG_W}' height='{height}' role='img' aria-label='{esc(title)}'>",
        f"<text x='{_LABEL_W}' y='16' font-size='13'>{esc(title)} ({unit}, candidate − "
        "baseline)</text>",
        f"<line x1='{x(0):.1f}' y1='{_PAD}' x2='{x(0):.1f}' y2='{height - 8}' stroke='#333' "
        "stroke-dasharray='3,3'/>",
    ]
    for i, (name, diff) in enumerate(rows):
        y = _PAD + _ROW_H * i + _ROW_H / 2
        colour = "#888"
        if diff.counts:
            colour = "#1a7f37" if diff.estimate < 0 else "#c62828"
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
        out.append(f"<circle cx='{x(s.estimate):.1f}' cy='{y:.1f}' r='5' fill='{colour}'/>")
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def intervals_svg(verdict: Verdict) -> str:
    """The pause and whole-run differences of every candidate with their intervals."""
    pause = [(c.comparison.candidate.profile, c.comparison.pause) for c in verdict.candidates]
    runtime = [(c.comparison.candidate.profile, c.comparison.runtime) for c in verdict.candidates]
    level = f"{verdict.thresholds.confidence:.0%}"
    return (
        "<div id='plot-intervals'>"
        + _interval_panel(f"Pause per checkpoint, {level} interval", pause, "s")
        + _interval_panel("Whole run", runtime, "s")
        + "</div>"
    )


def to_html(verdict: Verdict) -> str:
    """Render the report as one self-contained HTML document."""
    esc = html.escape
    header = "".join(
        f"<th>{esc(s.profile)}{' (baseline)' if s.profile == verdict.baseline else ''}</th>"
        for s in verdict.profiles
    )
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        "<title>Storage profile comparison</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Storage profile comparison</h1>",
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
        "<h2>Differences from the baseline</h2><p>Dot: the Hodges–Lehmann estimate; line: its "
        "interval; grey band: the practical floor. Green: counts, faster; red: counts, "
        "slower; grey: does not count.</p>" + intervals_svg(verdict)
    )
    plots = [
        ("plot-stages", "Stage breakdown", _stage_bars(verdict)),
        ("plot-pause", "Pause per checkpoint over steps", _pause_over_steps(verdict)),
    ]
    if any(s.fio for s in verdict.profiles):
        plots.append(("plot-fio", "fio bandwidth and latency per case", _fio_bars(verdict)))
    for title, rows in sections(verdict):
        parts.append(f"<h2>{esc(title)}</h2><table><tr><th></th>{header}</tr>")
        for label, cells in rows:
            tds = "".join(f"<td>{esc(c)}</td>" for c in cells)
            parts.append(f"<tr><td>{esc(label)}</td>{tds}</tr>")
        parts.append("</table>")
        if title == COST_SECTION:
            parts.append("<p>Assumptions:</p><ul id='assumptions'>")
            parts += [f"<li>{esc(a)}</li>" for a in verdict.assumptions]
            parts.append("</ul>")
    lines = comparison_lines(verdict) + [""] + recommendation_lines(verdict)
    lines += [f"note: {n}" for n in verdict.notes]
    parts.append("<h2>Comparison</h2><pre>" + esc("\n".join(lines)) + "</pre>")
    if not plots_available():
        parts.append(f"<p id='no-plots'><i>{esc(NO_PLOTS)}</i></p>")
        plots = []
    for plot_id, title, draw in plots:
        size = (10, 4) if plot_id == "plot-fio" else (8, 4)
        parts.append(
            f"<h2>{esc(title)}</h2><img id='{plot_id}' alt='{esc(title)}' "
            f"src='data:image/png;base64,{_png(draw, size)}'>"
        )
    if verdict.failed_runs:
        parts.append("<h2>Failed runs (not used)</h2><ul>")
        parts += [
            f"<li>{esc(r.label)}: {esc(r.status)} {esc(r.message)}</li>"
            for r in verdict.failed_runs
        ]
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
