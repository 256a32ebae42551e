"""The data-workload verdict's HTML report: the verdict first in the workload's terms, then
the shift of its headline figure with the interval, the samples as a real image, the table."""

from __future__ import annotations

import base64
import io
import re

import matplotlib.image

from checkpoint_compare.report_html import GREEN, GREY
from checkpoint_compare.report_html import render_html as to_html
from tests.checkpoint_compare.workload_runs import (
    BASE,
    FAST,
    judge,
    scan_run,
    slow_and_fast,
    workspace_run,
)


def test_the_scan_report_says_the_verdict_first_in_au_then_shows_why() -> None:
    page = to_html(judge(slow_and_fast(), min_au=0.9))
    verdict = page[page.index("id='verdict'") : page.index("id='recommendation'")]
    assert "keeps the GPUs fed at 97% AU, baseline 71%" in verdict
    assert "epoch time 7.2 s vs 10 s" in verdict
    assert f"Recommended: {FAST}" in page
    order = [page.index(f"id='{i}'") for i in ("verdict", "recommendation", "plot-intervals",
                                                "plot-samples", "tables")]  # fmt: skip
    assert order == sorted(order)
    # The forest plot: the faster candidate's shift, green (it counts), below zero.
    (g,) = re.findall(r"<g class='interval'[^>]*>", page)
    assert f"data-candidate='{FAST}'" in g and "data-counts='true'" in g
    assert float(re.search(r"data-high='([^']+)'", g)[1]) < 0
    assert GREEN in page[page.index("id='plot-intervals'") :]
    # The samples plot is a PNG that decodes.
    src = re.search(r"id='plot-samples'[^>]*src='data:image/png;base64,([^']+)'", page)[1]
    image = matplotlib.image.imread(io.BytesIO(base64.b64decode(src)), format="png")
    assert image.shape[0] > 100 and image.shape[1] > 100
    # The table: a column per profile, the AU, the budget, the monthly cost.
    table = page[page.index("id='tables'") :]
    assert f"<th>{BASE} (baseline)</th><th>{FAST}</th>" in table
    assert "<td>accelerator utilization</td><td>71%</td><td>97%</td>" in table
    assert "<td>meets the budget</td><td>no</td><td>yes</td>" in table
    assert "<td>samples</td><td>10 from 2 run(s)</td>" in table


def test_noise_is_grey_and_a_workspace_speaks_milliseconds() -> None:
    runs = [
        scan_run(BASE, [12.0, 10.0, 10.4, 9.7, 10.2, 9.9], [0.7] * 6),
        scan_run(FAST, [12.0, 10.1, 9.8, 10.3, 9.9, 10.0], [0.7] * 6),
    ]
    page = to_html(judge(runs))
    assert "no measurable difference" in page
    (g,) = re.findall(r"<g class='interval'[^>]*>.*?</g>", page)
    assert "data-counts='false'" in g and GREY in g and GREEN not in g
    ws = to_html(judge([workspace_run(BASE, [30.0, 21.0, 22.0, 20.5]),
                        workspace_run(FAST, [15.0, 9.0, 9.5, 8.8])], max_p99_ms=10.0))  # fmt: skip
    # Three rounds after the warm-up per profile: too few for an interval, and it says so.
    assert "p99 save latency 9 ms vs 21 ms" in ws and "<td>none: " in ws
    assert "<td>p99 save latency, median</td>" in ws and " ms</td>" in ws
    assert "accelerator utilization" not in ws
