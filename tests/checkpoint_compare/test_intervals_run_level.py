"""The run-level shift: the run, not the checkpoint, is the unit of replication."""

from __future__ import annotations

import doctest
import math
import random

import pytest

from checkpoint_compare import intervals
from checkpoint_compare.intervals import hodges_lehmann, run_level_shift, student_t_quantile


def _simulated_pair(rng: random.Random, *, shift: float, runs: int = 2, per_run: int = 10):
    """Runs of two profiles whose every run has its own offset (the machine's load, a
    neighbour on the disk): offset spread 1.0, within-run spread 0.2, x above y by
    ``shift``."""

    def profile(mean: float) -> list[list[float]]:
        out = []
        for _ in range(runs):
            offset = rng.gauss(0.0, 1.0)
            out.append([mean + offset + rng.gauss(0.0, 0.2) for _ in range(per_run)])
        return out

    return profile(10.0 + shift), profile(10.0)


def test_doctests():
    result = doctest.testmod(intervals)
    assert result.attempted >= 8 and result.failed == 0


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 3, 3.182), (0.975, 5, 2.571),
     (0.95, 4, 2.132), (0.975, 30, 2.042), (0.995, 7, 3.499), (0.975, 120, 1.980)],
)  # fmt: skip
def test_student_t_quantile_matches_the_tables(p, df, expected):
    assert student_t_quantile(p, df) == pytest.approx(expected, abs=5e-4)


def test_interval_is_the_pooled_two_sample_t_on_run_medians():
    # Run medians x: 5, 7, 6; y: 3, 4 (each run's median, whatever its other samples).
    runs_x = [[5.0, 4.0, 9.0], [7.0], [6.0, 6.0]]
    runs_y = [[3.0, 100.0, 2.0], [4.0]]
    s = run_level_shift(runs_x, runs_y)
    # mean 6 − mean 3.5; pooled variance (2·1 + 1·0.5) / 3; t(0.975, 3) = 3.1824.
    half = 3.182446 * math.sqrt((2.5 / 3) * (1 / 3 + 1 / 2))
    assert s.estimate == pytest.approx(2.5)
    assert (s.low, s.high) == (
        pytest.approx(2.5 - half, abs=1e-5),
        pytest.approx(2.5 + half, abs=1e-5),
    )
    assert (s.n_x, s.n_y, s.confidence, s.asked) == (3, 2, 0.95, 0.95)
    assert "run medians" in s.method and "3 df" in s.method


def test_swapping_the_sides_negates_the_interval():
    runs_x = [[1.0, 1.2, 1.1], [1.4, 1.3]]
    runs_y = [[2.0, 2.2], [1.9, 2.5, 2.1], [2.3]]
    a, b = run_level_shift(runs_x, runs_y), run_level_shift(runs_y, runs_x)
    assert a.estimate == pytest.approx(-b.estimate)
    assert a.low == pytest.approx(-b.high) and a.high == pytest.approx(-b.low)


@pytest.mark.parametrize("sides", [(1, 2), (2, 1), (1, 1)])
def test_one_run_on_a_side_gives_the_estimate_and_no_interval(sides):
    runs = {1: [[1.0, 1.1, 0.9, 1.0]], 2: [[2.0, 2.1], [2.2, 2.0]]}
    s = run_level_shift(runs[sides[0]], runs[sides[1]])
    assert s.low is None and s.high is None and s.confidence is None
    assert not s.has_interval and not s.excludes_zero
    assert (s.n_x, s.n_y) == sides
    assert "one run a side cannot separate the profile from run-to-run variation" in s.method
    assert s.estimate == pytest.approx(
        {(1, 2): 1.0 - 2.075, (2, 1): 2.075 - 1.0, (1, 1): 0.0}[sides]
    )


def test_a_block_counts_its_runs_per_block_and_one_counted_a_side_has_no_interval():
    x, y = [[2.0], [2.1], [2.2], [2.3]], [[1.0], [1.1], [1.2], [1.3]]
    two = run_level_shift(x, y, 0.95, (2, 2), runs_per_block=2)
    one = run_level_shift(x, y, 0.95, (2, 2), runs_per_block=1)
    assert "(6 df)" in two.method and "(2 df; 2 and 2 counted" in one.method
    assert one.low < two.low < two.high < one.high
    lone = run_level_shift(x, y, 0.95, (1, 2), runs_per_block=1)
    assert not lone.has_interval and lone.estimate == pytest.approx(1.0)
    assert "1 and 2 runs counted (at most 1 a block" in lone.method
    with pytest.raises(ValueError, match="blocks need runs_per_block >= 1"):
        run_level_shift(x, y, 0.95, (2, 2))


def test_many_checkpoints_do_not_narrow_the_interval_between_two_runs():
    # Same run medians, ten times the checkpoints: the between-run spread is the same,
    # so the interval is too (the old pooled interval shrank with the checkpoints).
    few = run_level_shift([[2.0], [2.4]], [[1.0], [1.6]])
    many = run_level_shift([[2.0] * 10, [2.4] * 10], [[1.0] * 10, [1.6] * 10])
    assert (few.low, few.high) == (many.low, many.high)
    assert few.low < 0 < few.high


@pytest.mark.parametrize(
    ("runs_x", "runs_y", "confidence", "message"),
    [([], [[1.0]], 0.95, "x: no runs"),
     ([[1.0]], [[1.0], []], 0.95, "y: run 2 has no values"),
     ([[1.0, math.nan]], [[1.0]], 0.95, "x: run 1 has a value that is not finite"),
     ([[1.0]], [[math.inf]], 0.95, "y: run 1 has a value that is not finite"),
     ([[1.0]], [[1.0]], 1.0, "confidence must be in (0, 1)")],
)  # fmt: skip
def test_bad_input_is_a_value_error(runs_x, runs_y, confidence, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_level_shift(runs_x, runs_y, confidence)


def test_a_a_pairs_with_run_offsets_claim_at_most_five_percent_where_pooled_checkpoints_do_not():
    # Many A/A comparisons (two runs a side of one profile, each run offset by its own
    # noise): at 95 % the run-level interval may exclude zero in about 5 % of them. The
    # Hodges–Lehmann interval over the pooled checkpoints treats 20 checkpoints a side as
    # independent and claims a difference in most of them.
    rng = random.Random(20261204)
    pairs = [_simulated_pair(rng, shift=0.0) for _ in range(1500)]
    run_level = sum(run_level_shift(x, y).excludes_zero for x, y in pairs) / len(pairs)
    # 1500 draws of a 5 % rate: the binomial's 99.9 % range is about 3.3 %–7.0 %.
    assert run_level <= 0.07, run_level
    assert run_level >= 0.02, run_level  # not an interval so wide it never claims
    pooled_hl = (
        sum(
            hodges_lehmann([v for r in x for v in r], [v for r in y for v in r]).excludes_zero
            for x, y in pairs[:200]
        )
        / 200
    )
    assert pooled_hl > 0.3, pooled_hl


def test_a_b_difference_well_above_the_run_spread_is_detected():
    # A difference of four times the between-run spread, three runs a side: detected in
    # nearly every comparison, always with the right sign.
    rng = random.Random(7)
    shifts = [run_level_shift(*_simulated_pair(rng, shift=4.0, runs=3)) for _ in range(400)]
    detected = [s for s in shifts if s.excludes_zero]
    assert len(detected) / len(shifts) >= 0.9
    assert all(s.low > 0 for s in detected)
