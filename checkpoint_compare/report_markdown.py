"""The verdict as markdown: what a run's readme shows (Polyaxon renders a run's ``readme``
on its page), so the pipeline's page answers the question without opening an artifact. The
same document for every workload: its headline's table, a training run's whole run."""

from __future__ import annotations

from checkpoint_compare.formatting import seconds, usd
from checkpoint_compare.report_tables import column_names, comparison_lines, recommendation_lines
from checkpoint_compare.verdict import Verdict, interval


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _usd(value: float | None) -> str:
    return usd(value, unit=False)


def render_markdown(verdict: Verdict) -> str:
    """The verdict, the recommendation, one table of headline figures, the comparisons."""
    rec = verdict.recommendation
    row_of, unit = verdict.row, verdict.row.unit
    level = f"{verdict.thresholds.confidence:.0%}"
    names = column_names(verdict)
    by_candidate = {c.name: c for c in verdict.candidates}
    profiles = verdict.profiles

    def row(label: str, cells: list[str]) -> str:
        return "| " + " | ".join(_cell(c) for c in [label, *cells]) + " |"

    def against(measure) -> list[str]:  # noqa: ANN001 — a candidate's Difference, or None
        cells = []
        for p in profiles:
            diff = measure(by_candidate[p.profile]) if p.profile in by_candidate else None
            cells.append("–" if diff is None else interval(diff.shift, say_why=False, unit=unit))
        return cells

    rows = [
        row("", names),
        "|" + "---|" * (len(names) + 1),
        row("runs", [str(len(p.runs)) for p in profiles]),
        row("samples compared", [str(len(p.samples)) for p in profiles]),
        row(f"{row_of.words} median {unit}", [seconds(p.median) for p in profiles]),
        row(
            f"{row_of.words} vs baseline, {level} interval", against(lambda c: c.profile.difference)
        ),
    ]
    if verdict.figures:
        rows += [
            row("runtime s (median)", [seconds(f.runtime_s) for f in verdict.figures]),
            row("runtime vs baseline", against(lambda c: c.comparison.runtime)),
        ]
    if row_of.au_metric is not None:
        rows.append(row("AU", ["–" if p.au is None else f"{p.au:.0%}" for p in profiles]))
    rows += [
        row(
            "outcome",
            [
                by_candidate[p.profile].outcome.value if p.profile in by_candidate else "baseline"
                for p in profiles
            ],
        ),  # fmt: skip
        row("storage USD/month", [_usd(p.cost.storage_month) for p in profiles]),
        row("one run USD", [_usd(p.cost.run_total) for p in profiles]),
    ]
    parts = [
        f"# Storage profile comparison: {verdict.workload} ({row_of.title})",
        "",
        f"**Verdict: {verdict.verdict}** — {verdict.reason}",
        "",
    ]
    if rec is not None:
        parts += [f"**Recommended: {rec.profile}** — {rec.reason}", ""]
        parts += [f"- {line.strip()}" for line in recommendation_lines(verdict)[1:]]
        parts.append("")
    parts += rows
    parts += ["", "## Comparison", "", "```text", *comparison_lines(verdict), "```", ""]
    if verdict.notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in verdict.notes] + [""]
    parts += ["## Assumptions", ""] + [f"- {a}" for a in verdict.assumptions]
    if verdict.failed_runs:
        parts += ["", "## Failed runs (not used)", ""]
        parts += [f"- {r.label}: {r.status} {r.message}".rstrip() for r in verdict.failed_runs]
    return "\n".join(parts) + "\n"
