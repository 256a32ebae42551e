"""The verdict as markdown: what a run's readme shows (Polyaxon renders a run's ``readme``
on its page), so the pipeline's page answers the question without opening an artifact."""

from __future__ import annotations

from checkpoint_compare.formatting import seconds, usd
from checkpoint_compare.report_tables import column_names, comparison_lines, recommendation_lines
from checkpoint_compare.verdict import Verdict, interval
from checkpoint_compare.workloads import WorkloadVerdict


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _usd(value: float | None) -> str:
    return usd(value, unit=False)


def to_markdown(verdict: Verdict) -> str:
    """The verdict, the recommendation, one table of headline figures, the comparisons."""
    rec = verdict.recommendation
    level = f"{verdict.thresholds.confidence:.0%}"
    names = column_names(verdict)
    by_candidate = {c.comparison.candidate.profile: c for c in verdict.candidates}

    def row(label: str, cells: list[str]) -> str:
        return "| " + " | ".join(_cell(c) for c in [label, *cells]) + " |"

    rows = [
        row("", names),
        "|" + "---|" * (len(names) + 1),
        row("training runs", [str(len(p.per_run)) for p in verdict.profiles]),
        row("checkpoints compared", [str(len(p.measured_pauses)) for p in verdict.profiles]),
        row("pause median s", [seconds(p.pause.median) for p in verdict.profiles]),
        row(
            f"pause vs baseline, {level} interval",
            [
                "–"
                if p.profile not in by_candidate
                else interval(by_candidate[p.profile].comparison.pause.shift, say_why=False)
                for p in verdict.profiles
            ],
        ),  # fmt: skip
        row("runtime s (median)", [seconds(p.runtime_s) for p in verdict.profiles]),
        row(
            "runtime vs baseline",
            [
                "–"
                if p.profile not in by_candidate
                else interval(by_candidate[p.profile].comparison.runtime.shift, say_why=False)
                for p in verdict.profiles
            ],
        ),  # fmt: skip
        row(
            "outcome",
            [
                by_candidate[p.profile].outcome.value if p.profile in by_candidate else "baseline"
                for p in verdict.profiles
            ],
        ),  # fmt: skip
        row(
            "storage USD/month",
            [_usd(verdict.costs[p.profile].storage_month) for p in verdict.profiles],
        ),  # fmt: skip
        row("one run USD", [_usd(verdict.costs[p.profile].run_total) for p in verdict.profiles]),
    ]
    parts = [
        "# Storage profile comparison",
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


def workload_markdown(v: WorkloadVerdict) -> str:
    """A data workload's verdict: its sentences, one per line."""
    return (
        f"**Verdict ({v.workload}): {v.verdict}**\n\n"
        + "\n".join(f"- {s}" for s in v.sentences)
        + "\n"
    )


def render_markdown(verdict: Verdict | WorkloadVerdict) -> str:
    """Any workload's verdict as markdown (the run's and the pipeline's readme)."""
    if isinstance(verdict, WorkloadVerdict):
        return workload_markdown(verdict)
    return to_markdown(verdict)
