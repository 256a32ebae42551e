"""A verdict as titled sections of rows (one column per profile), comparison lines and the
recommendation: what the terminal, HTML and markdown reports show, each figure formatted in
one place, for every workload. The headline's section and lines come from the row; a
training row's figures (stages, the whole run, fio, the hook) add their own sections."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from checkpoint_compare.comparison import Difference
from checkpoint_compare.figures import ProfileFigures
from checkpoint_compare.formatting import DASH, level, seconds, timestamp, usd
from checkpoint_compare.intervals import Shift
from checkpoint_compare.verdict import ProfileVerdict, Verdict, budget_words, interval
from checkpoint_storage_bench.contract import STAGES

Row = tuple[str, list[str]]
COST_SECTION = "Cost"  # the assumptions are shown right after this section


def _f(value: float | None, fmt: str | None = None, unit: str = "") -> str:
    """A figure: 3 significant digits unless ``fmt`` says otherwise."""
    if value is None:
        return "–"
    return (seconds(value) if fmt is None else fmt.format(value)) + unit


_usd = usd


def column_names(verdict: Verdict) -> list[str]:
    """One header per profile: its name, whether it is the baseline, and for a training run
    how it wrote its checkpoints (format, sync or async, durability), so two unlike runs
    never look alike."""
    return [
        p.profile
        + (" (baseline)" if p.profile == verdict.baseline else "")
        + (f" · {_how(p.figures)}" if p.figures is not None else "")
        for p in verdict.profiles
    ]


def _figure(value: float | None, unit: str, signed: bool = False) -> str:
    return DASH if value is None else f"{seconds(value, signed=signed)} {unit}"


def shift_interval(shift: Shift | None, unit: str) -> str:
    """``[-2.9, -2.6] s 95%``, or why there is none."""
    if shift is None:
        return DASH
    if not shift.has_interval:
        return f"none: {shift.method}"
    low, high = (seconds(x, signed=True) for x in (shift.low, shift.high))
    return f"[{low}, {high}] {unit} {level(shift.confidence, shift.asked)}".rstrip()


def headline_rows(verdict: Verdict) -> list[Row]:
    """The headline of every profile: its median, samples, runs, the shift against the
    baseline with its interval, the budget, the price; the AU where the row has one."""
    row, unit = verdict.row, verdict.row.unit

    def each(cell: Callable[[ProfileVerdict], str]) -> list[str]:
        return [cell(p) for p in verdict.profiles]

    def fits(p: ProfileVerdict) -> str:
        return DASH if p.meets_budget is None else "yes" if p.meets_budget else "no"

    rows = [
        (f"{row.label}, median", each(lambda p: _figure(p.median, unit))),
        ("samples", each(lambda p: f"{len(p.samples)} from {len(p.runs)} run(s)")),
        ("run medians", each(lambda p: ", ".join(_figure(m, unit) for m in p.run_medians))),
        ("spread (max − min) / median", each(lambda p: DASH if p.noise is None else f"{p.noise:.0%}")),
        ("shift against the baseline", each(lambda p: _figure(p.shift and p.shift.estimate, unit, True))),
        ("interval", each(lambda p: shift_interval(p.shift, unit))),
        ("change", each(lambda p: DASH if p.relative is None else f"{p.relative:+.0%}")),
        ("measurable (outside the noise floor)", each(lambda p: DASH if p.shift is None else "yes" if p.significant else "no")),
    ]  # fmt: skip
    if row.au_metric is not None:
        rows.append(
            ("accelerator utilization", each(lambda p: DASH if p.au is None else f"{p.au:.0%}"))
        )
    rows.append(("meets the budget", each(fits)))
    return rows


def _how(s: ProfileFigures) -> str:
    def one(key: str, show=str) -> str:  # noqa: ANN001 — the runs' value(s) of one input
        values = list(dict.fromkeys(show(r.run.inputs.get(key)) for r in s.per_run))
        return "/".join(values)

    return " ".join(
        (
            one("checkpoint_format", lambda v: v or "?"),
            one("async_checkpoint", lambda v: "?" if v is None else "async" if v else "sync"),
            one("durability", lambda v: v or "?"),
        )
    )


def _s(value: Any) -> str:
    return "–" if value in (None, "") else str(value)


def sections(verdict: Verdict) -> list[tuple[str, list[Row]]]:
    """The figures per profile, grouped in titled sections (one column per profile): the
    headline's, a training run's own, the cost."""
    result = [(f"{verdict.row.label.capitalize()} ({verdict.row.title})", headline_rows(verdict))]
    if verdict.figures:
        result += _training_sections(verdict, verdict.figures)
    result.append((COST_SECTION, _cost_rows(verdict)))
    return result


def _training_sections(
    verdict: Verdict, profiles: list[ProfileFigures]
) -> list[tuple[str, list[Row]]]:
    """A training run's figures: its checkpoints and the whole run, where and what ran, the
    fio sweep, the hook."""

    def row(label: str, fn) -> Row:  # noqa: ANN001 — a small local formatter
        return label, [fn(s) for s in profiles]

    warmup = verdict.thresholds.warmup
    timing = [
        row("training runs", lambda s: ", ".join(r.run.label for r in s.per_run)),
        row("measured from", lambda s: timestamp(s.interval[0])),
        row("measured until", lambda s: timestamp(s.interval[1])),
        row("checkpoints per run", lambda s: str(s.checkpoint_count)),
        row(f"warm-up pause s (first {warmup})", lambda s: _f(s.warmup_median)),
        row("checkpoints compared", lambda s: str(len(s.measured_pauses))),
        row(
            "pause median (min–max) s",
            lambda s: f"{_f(s.pause.median)} ({_f(s.pause.min)}–{_f(s.pause.max)})",
        ),
    ]
    for stage in STAGES:
        if stage != "pause" and any(stage in s.stages for s in profiles):
            timing.append(
                row(
                    f"{stage} median s",
                    lambda s, st=stage: _f(s.stages[st].median if st in s.stages else None),
                )
            )
    timing += [
        row("write GB/s (median)", lambda s: _f(s.write_gbps_median)),
        *(
            [row("aggregate GB/s, all ranks (median)", lambda s: _f(s.aggregate_gbps_median))]
            if any(s.aggregate_gbps_median is not None for s in profiles)
            else []
        ),
        row("upload GB/s (median)", lambda s: _f(s.upload_gbps_median)),
        *(
            [
                row(
                    "restore s (median; per run: when)",
                    lambda s: (
                        _f(statistics.median(s.restores)) + f" ({_restore_when(s)})"
                        if s.restores
                        else "– (not measured)"
                    ),
                ),
                row("restore GB/s (median)", lambda s: _f(s.restore_gbps_median)),
            ]
            if any(s.restores for s in profiles)
            else []
        ),
        row("total runtime s (median)", lambda s: _f(s.runtime_s)),
        row(
            "runtime between runs s",
            lambda s: "– (one run)" if len(s.per_run) < 2 else f"±{_f(s.runtime_spread_s / 2)}",
        ),
        row("time paused s", lambda s: _f(s.pause_total_s)),
        row("share paused", lambda s: _f(s.pause_share, "{:.1%}")),
        row("final loss", lambda s: _f(s.final_loss, "{:.4f}") if not s.loss_problem else "?"),
    ]

    def runs(fn) -> Callable[[ProfileFigures], str]:  # noqa: ANN001 — one value per run
        return lambda s: ", ".join(_s(fn(r)) for r in s.per_run)

    provenance = [row("node (per run)", runs(lambda r: r.node))]
    for label, fn in (
        ("GPU (per run)", lambda r: r.gpu_model),
        ("image (per run)", lambda r: r.image),
        ("ranks writing (per run)", lambda r: r.world_size),
        ("resumed from step (per run)", lambda r: r.resumed_from_step),
    ):
        if any(fn(r) is not None for s in profiles for r in s.per_run):
            provenance.append(row(label, runs(fn)))
    if any(r.slowest_rank for s in profiles for r in s.per_run):
        provenance.append(
            row("pause measured", lambda s: ", ".join(
                "slowest rank" if r.slowest_rank else "single process" for r in s.per_run))
        )  # fmt: skip

    cases = sorted({c for s in profiles for c in s.fio})
    fio: list[Row] = []
    for case in cases:
        for measure, label, fmt in (
            ("bw_mbps", "MB/s", "{:.1f}"),
            ("iops", "IOPS", "{:.0f}"),
            ("lat_p99_us", "p99 µs", "{:.0f}"),
        ):
            fio.append(
                row(
                    f"fio {case} {label}",
                    lambda s, c=case, m=measure, f=fmt: _f(s.fio.get(c, {}).get(m), f),
                )
            )

    hook = [
        row("claim", lambda s: _claim(s)),
        row("volume handle (driver)", lambda s: _volume(s)),
        row("applied class", lambda s: _s(s.hook.get("applied_class"))),
        row("settle: kubernetes s", lambda s: _f(s.hook.get("k8s_settle_s"))),
        row("settle: provider s", lambda s: _f(s.hook.get("provider_settle_s"))),
        row("settle: total s", lambda s: _f(s.hook.get("total_settle_s"))),
    ]

    result = [("Checkpoints and the whole run", timing), ("Where and what ran", provenance)]
    if fio:
        result.append(("fio sweep", fio))
    if any(s.hook for s in profiles):
        result.append(("Storage-profile hook", hook))
    return result


def _cost_rows(verdict: Verdict) -> list[Row]:
    """What each profile costs: its volume, a month, over a run (a data workload's run: its
    headline's median) and the GPU time of a run."""

    def cost(attr: str, fmt=_usd):  # noqa: ANN001, ANN202
        return [fmt(getattr(p.cost, attr)) for p in verdict.profiles]

    return [
        ("volume type", cost("volume_type", _s)),
        ("IOPS / MiB/s priced", [_provisioned(p) for p in verdict.profiles]),
        ("storage per month", cost("storage_month")),
        ("storage over the run", cost("storage_run")),
        ("GPU over the run", cost("gpu_run")),
        ("run total", cost("run_total")),
    ]


def _restore_when(s: ProfileFigures) -> str:
    return ", ".join(r.restore_measured or "?" for r in s.per_run if r.restore_s is not None)


def _claim(s: ProfileFigures) -> str:
    if not s.hook:
        return "– (no hook run)"
    return f"{_s(s.hook.get('namespace'))}/{_s(s.hook.get('claim'))}"


def _volume(s: ProfileFigures) -> str:
    if not s.hook:
        return "–"
    return f"{_s(s.hook.get('volume_handle'))} ({_s(s.hook.get('driver'))})"


def _provisioned(p: ProfileVerdict) -> str:
    c = p.cost
    return "–" if not c.known else f"{c.iops:g} / {c.throughput_mibps:g}"


def _counts(diff: Difference) -> str:
    if diff.counts:
        return "counts"
    # Without an interval the note below says why; the line does not say it again.
    return "does not count" if not diff.shift.has_interval else f"does not count ({diff.why_not})"


def comparison_lines(verdict: Verdict) -> list[str]:
    """One paragraph per candidate: its outcome, the headline's difference with its
    interval, a training run's whole run, restore and stages, cost differences, notes."""
    lines = []
    row, unit = verdict.row, verdict.row.unit
    drift = verdict.drift
    if drift is not None:
        shift = interval(drift.shift, unit=unit) if drift.shift else "–"
        runtime = (
            f", runtime {seconds(drift.runtime_s, signed=True)} s"
            if drift.runtime_s is not None
            else ""
        )
        lines.append(
            f"drift of {drift.profile} (its last {len(drift.last)} run(s) − its first "
            f"{len(drift.first)}): {row.words} {shift}{runtime}"
        )
    base = verdict.profiles[0]
    for cand in verdict.candidates:
        p, c = cand.profile, cand.comparison
        speedup = f"; speedup ×{base.median / p.median:.2f}" if p.median > 0 else ""
        lines.append(f"{cand.name} vs {verdict.baseline}: {cand.outcome.value}")
        if p.difference is not None:
            lines.append(
                f"  {row.label} {interval(p.difference.shift, say_why=False, unit=unit)}: "
                f"{_counts(p.difference)}{speedup}"
            )
        if c is not None:
            lines += _whole_run_lines(c)
        if cand.cost:
            d = cand.cost
            lines.append(
                f"  GPU time per checkpoint {_usd(d.gpu_per_checkpoint)}, per 1,000 checkpoints "
                f"{_usd(d.gpu_per_1000_checkpoints)}; storage per month {_usd(d.storage_month)}; "
                f"one run {_usd(d.run_total)}"
            )
            # Only a difference that counts saves GPU time worth setting against the price.
            if d.breakeven_checkpoints_month is not None and p.significant:
                lines.append(
                    f"  the extra storage pays for itself above "
                    f"{d.breakeven_checkpoints_month:,.0f} checkpoints a month"
                )
        lines += [f"  note: {n}" for n in cand.notes]
    return lines


def _whole_run_lines(c: Any) -> list[str]:
    """A training run's whole run, restore and stage medians against the baseline's."""
    # The method once: a reason without an interval is the comparison's note already.
    method = f" ({c.runtime.shift.method})" if c.runtime.shift.has_interval else ""
    lines = [
        f"  whole run {interval(c.runtime.shift, say_why=False)}{method}: {_counts(c.runtime)}"
    ]
    if c.restore is not None:
        lines.append(
            f"  restore of the newest checkpoint {interval(c.restore.shift, say_why=False)}: "
            f"{_counts(c.restore) if c.restore.shift.has_interval else 'does not count'}"
            + ("" if c.restore.shift.has_interval else f" ({c.restore.shift.method})")
        )
    stages = ", ".join(
        f"{s} {seconds(d, signed=True)} s" for s, d in c.stage_deltas.items() if s != "pause"
    )
    if stages:
        lines.append(f"  stage medians: {stages}")
    return lines


def recommendation_lines(verdict: Verdict) -> list[str]:
    """The recommendation, and each profile against the budget."""
    rec = verdict.recommendation
    if rec is None:
        return []
    lines = [f"RECOMMENDED: {rec.profile} — {rec.reason}"]
    if words := budget_words(verdict):
        confidence = f" ({rec.confidence:.0%} confidence)" if verdict.row.budget_confidence else ""
        lines.append(f"  budget: {words}{confidence}")
        for fit in rec.fits:
            if fit.meets is not None:
                verdict_word = "meets it" if fit.meets else "does not"
                lines.append(f"  {fit.profile}: {verdict_word}: {fit.why}")
    return lines
