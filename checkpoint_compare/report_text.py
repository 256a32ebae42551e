"""The verdict as plain text, for a terminal or a run's log, for every workload."""

from __future__ import annotations

from checkpoint_compare.report_tables import (
    COST_SECTION,
    Row,
    column_names,
    comparison_lines,
    recommendation_lines,
    sections,
)
from checkpoint_compare.verdict import Verdict


def _table(header: list[str], rows: list[Row]) -> list[str]:
    widths = [max(len(r[0]) for r in rows + [(header[0], [])])]
    for i in range(len(header) - 1):
        widths.append(max(len(header[i + 1]), *(len(r[1][i]) for r in rows)))
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), "  ".join("-" * w for w in widths)]
    out += [fmt.format(label, *cells) for label, cells in rows]
    return out


def render_text(verdict: Verdict) -> str:
    """The report as plain text: the sections, the comparison, the notes, the failed runs,
    and last the verdict and the recommendation (what a log's reader looks for)."""
    header = ["", *column_names(verdict)]
    lines = [f"{verdict.workload} verdict, baseline {verdict.baseline}:"]
    for title, rows in sections(verdict):
        lines += ["", f"== {title}"] + _table(header, rows)
        if title == COST_SECTION:
            lines += ["Assumptions:"] + [f"  - {a}" for a in verdict.assumptions]
    lines += ["", "== Comparison"] + comparison_lines(verdict)
    if verdict.notes:
        lines += ["", "== Notes"] + [f"  - {n}" for n in verdict.notes]
    if verdict.failed_runs:
        lines += ["", "== Failed runs (not used)"]
        lines += [f"  {r.label}: {r.status} {r.message}".rstrip() for r in verdict.failed_runs]
    lines += ["", f"VERDICT: {verdict.verdict} — {verdict.reason}"]
    lines += recommendation_lines(verdict)
    return "\n".join(lines) + "\n"
