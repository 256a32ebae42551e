"""A verdict as titled sections of rows (one column per profile), comparison lines and the
recommendation: what the terminal, HTML and markdown reports show, each figure formatted in
one place."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from checkpoint_compare.comparison import Difference
from checkpoint_compare.figures import ProfileFigures
from checkpoint_compare.formatting import seconds, timestamp, usd
from checkpoint_compare.verdict import Verdict, interval
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
    """One header per profile: its name, whether it is the baseline, and how it wrote its
    checkpoints (format, sync or async, durability), so two unlike runs never look alike."""
    return [
        s.profile + (" (baseline)" if s.profile == verdict.baseline else "") + f" · {_how(s)}"
        for s in verdict.profiles
    ]


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
    """The figures per profile, grouped in titled sections (one column per profile)."""
    profiles = verdict.profiles

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

    def cost(attr: str, fmt=_usd):  # noqa: ANN001, ANN202
        return lambda s: fmt(getattr(verdict.costs[s.profile], attr))

    costs = [
        row("volume type", cost("volume_type", _s)),
        row("IOPS / MiB/s priced", lambda s: _provisioned(verdict, s)),
        row("storage per month", cost("storage_month")),
        row("storage over the run", cost("storage_run")),
        row("GPU over the run", cost("gpu_run")),
        row("run total", cost("run_total")),
    ]
    result = [("Checkpoints and the whole run", timing), ("Where and what ran", provenance)]
    if fio:
        result.append(("fio sweep", fio))
    if any(s.hook for s in profiles):
        result.append(("Storage-profile hook", hook))
    result.append((COST_SECTION, costs))
    return result


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


def _provisioned(verdict: Verdict, s: ProfileFigures) -> str:
    c = verdict.costs[s.profile]
    return "–" if not c.known else f"{c.iops:g} / {c.throughput_mibps:g}"


def _counts(diff: Difference) -> str:
    if diff.counts:
        return "counts"
    # Without an interval the note below says why; the line does not say it again.
    return "does not count" if not diff.shift.has_interval else f"does not count ({diff.why_not})"


def comparison_lines(verdict: Verdict) -> list[str]:
    """One paragraph per candidate: differences with intervals, cost differences, notes."""
    lines = []
    drift = verdict.drift
    if drift is not None:
        pause = interval(drift.pause) if drift.pause else "–"
        lines.append(
            f"drift of {drift.profile} (its last {len(drift.last)} run(s) − its first "
            f"{len(drift.first)}): pause {pause}, runtime {seconds(drift.runtime_s, signed=True)} s"
        )
    for cand in verdict.candidates:
        c = cand.comparison
        speedup = f"; speedup ×{c.pause_speedup:.2f}" if c.pause_speedup else ""
        lines.append(f"{c.candidate.profile} vs {c.baseline.profile}: {cand.outcome.value}")
        lines.append(
            f"  pause per checkpoint {interval(c.pause.shift, say_why=False)}: "
            f"{_counts(c.pause)}{speedup}"
        )
        # The method once: a reason without an interval is the comparison's note already.
        method = f" ({c.runtime.shift.method})" if c.runtime.shift.has_interval else ""
        lines.append(
            f"  whole run {interval(c.runtime.shift, say_why=False)}{method}: {_counts(c.runtime)}"
        )
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
        if cand.cost:
            d = cand.cost
            lines.append(
                f"  GPU time per checkpoint {_usd(d.gpu_per_checkpoint)}, per 1,000 checkpoints "
                f"{_usd(d.gpu_per_1000_checkpoints)}; storage per month {_usd(d.storage_month)}; "
                f"one run {_usd(d.run_total)}"
            )
            # Only a difference that counts saves GPU time worth setting against the price.
            if d.breakeven_checkpoints_month is not None and c.pause.counts:
                lines.append(
                    f"  the extra storage pays for itself above "
                    f"{d.breakeven_checkpoints_month:,.0f} checkpoints a month"
                )
        lines += [f"  note: {n}" for n in c.notes]
    return lines


def recommendation_lines(verdict: Verdict) -> list[str]:
    """The recommendation, and each profile against the budget."""
    rec = verdict.recommendation
    if rec is None:
        return []
    lines = [f"RECOMMENDED: {rec.profile} — {rec.reason}"]
    budget = rec.budget
    if budget.has_limit:
        limits = []
        if budget.max_pause_s is not None:
            limits.append(f"pause ≤ {budget.max_pause_s:g} s per checkpoint")
        if budget.max_pause_share is not None:
            limits.append(f"≤ {budget.max_pause_share:.1%} of the run paused")
        lines.append(f"  budget: {', '.join(limits)} ({rec.confidence:.0%} confidence)")
        for fit in rec.fits:
            verdict_word = "meets it" if fit.meets else "does not"
            lines.append(f"  {fit.profile}: {verdict_word}: {fit.why}")
    return lines
