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

from checkpoint_compare.report_tables import COST_SECTION, comparison_lines, sections
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
            if s.pause_series:
                steps, values = zip(*s.pause_series, strict=True)
                ax.plot(steps, values, marker="o", label=s.profile)
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
    parts.append("<h2>Comparison</h2><pre>" + esc("\n".join(comparison_lines(verdict))) + "</pre>")
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
