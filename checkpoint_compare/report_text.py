"""The verdict as plain text, for a terminal or a run's log."""

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
from checkpoint_compare.workloads import WorkloadVerdict
from checkpoint_compare.workloads import terminal as workload_terminal


def _table(header: list[str], rows: list[Row]) -> list[str]:
    widths = [max(len(r[0]) for r in rows + [(header[0], [])])]
    for i in range(len(header) - 1):
        widths.append(max(len(header[i + 1]), *(len(r[1][i]) for r in rows)))
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), "  ".join("-" * w for w in widths)]
    out += [fmt.format(label, *cells) for label, cells in rows]
    return out


def terminal(verdict: Verdict) -> str:
    """The report as plain text for a terminal or a run's log."""
    header = ["", *column_names(verdict)]
    lines = []
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
    return "\n".join(lines).lstrip("\n") + "\n"


def render_text(verdict: Verdict | WorkloadVerdict) -> str:
    """Any workload's verdict for a terminal."""
    if isinstance(verdict, WorkloadVerdict):
        return workload_terminal(verdict)
    return terminal(verdict)
