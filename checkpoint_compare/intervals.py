"""Confidence intervals that one outlier cannot dominate: the Hodges–Lehmann shift between
two samples with its rank-based (Mann–Whitney) interval, and a distribution-free upper
bound for one sample's median.

Why Hodges–Lehmann and not a bootstrap of the difference of medians: checkpoint pauses are
few (often 4 to 20 a run) and skewed by the odd slow one. The rank interval is exact for
such small samples (its coverage does not rest on an approximation that needs many points),
deterministic (no seed, so the same runs always give the same verdict), and robust: up to
29 % of the pairwise differences can be wild without moving the estimate. The bootstrap is
anti-conservative for small samples and, with discrete data, jumps with the seed.

Both assume the checkpoints of a profile are exchangeable draws: a trend inside a run
(warm-up, a filling page cache) breaks that, hence the warm-up checkpoints are left out.
They also assume the checkpoints of different runs are exchangeable, and they are not:
whatever differs between two runs (the machine's load, a neighbour writing to the same
disk, the state of the device) moves every checkpoint of a run together. Pooling the
checkpoints of one run a side then credits that run-to-run difference to the profile, and
the interval shrinks with the number of checkpoints although the runs, the unit assigned to
a profile, stay two.

``run_level_shift`` makes the run the unit of replication: each run is summarised by the
median of its samples (robust to the odd slow checkpoint inside a run), and the interval is
Student's two-sample t interval on those run medians with the between-run variance pooled
over both profiles (n_x + n_y − 2 degrees of freedom). Why pooled and not Welch: a pipeline
runs few repeats (2 or 3 a side), and Welch's degrees of freedom then fall towards
n − 1 = 1, where the 97.5 % quantile is 12.7 (pooled, 2 and 2 runs: 4.3): an interval too
wide to detect even a factor of two. Under the hypothesis that matters for a false claim —
the profile makes no difference — both sides' runs come from one distribution, so the equal
variance pooling assumes holds; and with equal repeats a side the pooled standard error *is*
Welch's, only the degrees of freedom differ. Integer degrees of freedom also give the t
quantile in closed form (no scipy): deterministic, no seed, no resampling. With fewer than
two runs on a side there is no between-run spread to measure on that side and no interval
is given.

A profile's repeats run back to back, one block (its minutes on the machine), and whatever
changes between two blocks — the machine's load, a neighbour — moves every run of a block
together: more runs of one block do not replicate the block. The calibration measured it
(docs/compare.md): 2 runs a side claimed no difference in 38 A/A comparisons, 4 runs a side
claimed one in 2 of 6, the second block slower in all four runs. So with ``blocks`` given,
a side counts at most ``runs_per_block`` runs per block as independent (the workload's
calibrated design, ``contract.VERDICT_RUNS_PER_BLOCK``): the spread is still estimated from
every run, but the interval is never narrower than that design gives.

>>> r = run_level_shift([[2.0, 2.1, 2.2], [2.3, 2.2, 2.4]], [[1.0, 1.1, 1.2], [1.2, 1.1, 1.3]])
>>> round(r.estimate, 3), r.n_x, r.n_y, r.excludes_zero, r.confidence
(1.05, 2, 2, True, 0.95)
>>> run_level_shift([[2.0, 2.1]], [[1.0, 1.1], [1.2, 1.1]]).has_interval
False

>>> s = hodges_lehmann([1.0, 1.1, 0.9, 1.0, 1.05], [2.0, 2.1, 1.9, 2.0, 2.05])
>>> round(s.estimate, 3), s.low < s.estimate < s.high < 0, s.confidence >= 0.95
(-1.0, True, True)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Up to this many pairs the Mann–Whitney distribution is computed exactly; above it the
# normal approximation (with continuity correction) is within a rank of the exact one.
EXACT_PAIRS = 2500


@dataclass(frozen=True)
class Shift:
    """How much sample ``x`` is above sample ``y``, with a confidence interval.

    Attributes:
        estimate: The Hodges–Lehmann shift: median of all differences ``x_i − y_j``.
        low: Lower end of the interval, or None when the samples are too small to reach
            the asked confidence.
        high: Upper end, or None likewise.
        confidence: The confidence the interval actually has (the rank distribution is
            discrete: at least the one asked for); None without an interval.
        n_x: Size of ``x``.
        n_y: Size of ``y``.
        method: How the interval was made, for the reader.
        asked: The confidence asked for, which the report names (a rank interval's
            ``confidence`` may be above it).
    """

    estimate: float
    low: float | None
    high: float | None
    confidence: float | None
    n_x: int
    n_y: int
    method: str
    asked: float | None = None

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly on one side of zero."""
        if self.low is None or self.high is None:
            return False
        return self.low > 0 or self.high < 0


def mann_whitney_counts(n: int, m: int) -> list[int]:
    """How many of the C(n+m, n) orderings give each value of U (0 … n·m), no ties.

    The coefficients of the Gaussian binomial [n+m choose n]_q, built from the product
    ∏ (1 − q^(m+i)) / (1 − q^i), i = 1 … n.

    >>> mann_whitney_counts(2, 2)
    [1, 1, 2, 1, 1]
    """
    n, m = min(n, m), max(n, m)
    size = n * m + 1
    poly = [0] * size
    poly[0] = 1
    for i in range(1, n + 1):
        # multiply by (1 − q^(m+i)) …
        for k in range(size - 1, m + i - 1, -1):
            poly[k] -= poly[k - m - i]
        # … then divide by (1 − q^i): a running sum with stride i (the division is exact).
        for k in range(i, size):
            poly[k] += poly[k - i]
    return poly


def _rank_k(n: int, m: int, confidence: float) -> tuple[int, float] | None:
    """The largest k with P(U ≤ k − 1) ≤ (1 − confidence) / 2, and the confidence the
    interval [D_(k), D_(nm−k+1)] then has; None when even k = 1 is too wide a risk."""
    alpha_half = (1 - confidence) / 2
    if n * m <= EXACT_PAIRS:
        counts = mann_whitney_counts(n, m)
        total = math.comb(n + m, n)
        cumulative, k = 0, 0
        while k < len(counts) and (cumulative + counts[k]) / total <= alpha_half:
            cumulative += counts[k]
            k += 1
        if k == 0:
            return None
        return k, 1 - 2 * cumulative / total
    sigma = math.sqrt(n * m * (n + m + 1) / 12)
    z = statistics.NormalDist().inv_cdf(1 - alpha_half)
    k = math.floor(n * m / 2 + 0.5 - z * sigma)
    if k < 1:
        return None
    tail = statistics.NormalDist().cdf((k - 1 + 0.5 - n * m / 2) / sigma)
    return k, 1 - 2 * tail


def values_for_interval(confidence: float = 0.95) -> int:
    """The fewest values per sample (two samples of one size) for which the rank interval
    reaches ``confidence``: what a run needs to make for its pauses to be compared.

    >>> values_for_interval(0.95), values_for_interval(0.99)
    (4, 5)
    """
    n = 1
    while _rank_k(n, n, confidence) is None:
        n += 1
    return n


def hodges_lehmann(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> Shift:
    """The shift of ``x`` over ``y`` and its rank-based confidence interval.

    Raises:
        ValueError: A sample is empty, or the confidence is not in (0, 1).
    """
    if not x or not y:
        raise ValueError("both samples need at least one value")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    diffs = sorted(a - b for a in x for b in y)
    estimate = statistics.median(diffs)
    found = _rank_k(len(x), len(y), confidence)
    if found is None:
        return Shift(estimate, None, None, None, len(x), len(y), "too few values for the interval")
    k, achieved = found
    method = "exact rank interval" if len(x) * len(y) <= EXACT_PAIRS else "normal approximation"
    return Shift(estimate, diffs[k - 1], diffs[-k], achieved, len(x), len(y), method, confidence)


def median_upper_bound(values: Sequence[float], confidence: float = 0.95) -> float | None:
    """A one-sided upper confidence bound of the median (distribution-free: an order
    statistic chosen from the binomial distribution); None with too few values (5 are
    needed for 95 %).

    >>> median_upper_bound([1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.95, 1.05, 1.0, 4.0])
    1.3
    >>> median_upper_bound([1.0, 1.2, 0.9]) is None
    True
    """
    n = len(values)
    ordered = sorted(values)
    cumulative = 0.0
    for j in range(1, n + 1):
        # P(the median ≤ x_(j)) = P(Binomial(n, 1/2) ≤ j − 1)
        cumulative += math.comb(n, j - 1) / 2**n
        if cumulative >= confidence:
            return ordered[j - 1]
    return None


def _student_t_two_sided(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's t with ``df`` (a positive integer) degrees of freedom: the
    finite series of Abramowitz & Stegun 26.7.3–4 in θ = atan(t / √df)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(2, df, 2):
            term *= cos2 * (k - 1) / k
            total += term
        return sin * total
    if df == 1:
        return 2 * theta / math.pi
    term = math.cos(theta)
    total = term
    for k in range(3, df, 2):
        term *= cos2 * (k - 1) / k
        total += term
    return 2 / math.pi * (theta + sin * total)


def student_t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` integer degrees of
    freedom, by bisection on the closed-form distribution (to 1e-12).

    >>> round(student_t_quantile(0.975, 1), 3), round(student_t_quantile(0.975, 2), 3)
    (12.706, 4.303)
    >>> round(student_t_quantile(0.975, 10), 3), round(student_t_quantile(0.995, 30), 3)
    (2.228, 2.75)
    """
    if not 0.5 < p < 1:
        raise ValueError(f"the quantile must be in (0.5, 1), got {p}")
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    target = 2 * p - 1
    low, high = 0.0, 1.0
    while _student_t_two_sided(high, df) < target:
        high *= 2
    while high - low > 1e-12 * max(1.0, high):
        mid = (low + high) / 2
        if _student_t_two_sided(mid, df) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _run_summaries(runs: Sequence[Sequence[float]], side: str) -> list[float]:
    if not runs:
        raise ValueError(f"{side}: no runs")
    summaries = []
    for i, run in enumerate(runs):
        if not run:
            raise ValueError(f"{side}: run {i + 1} has no values")
        if not all(math.isfinite(v) for v in run):
            raise ValueError(f"{side}: run {i + 1} has a value that is not finite")
        summaries.append(statistics.median(run))
    return summaries


def counted_runs(runs: int, blocks: int | None, runs_per_block: int) -> int:
    """How many of a side's ``runs`` count as independent: at most ``runs_per_block`` a block
    of back-to-back runs (a side's runs make at least one block).

    >>> counted_runs(4, 1, 2), counted_runs(4, 2, 2), counted_runs(3, None, 1)
    (2, 4, 1)
    """
    return min(runs, runs_per_block * max(1, blocks or 0))


def run_level_shift(
    runs_x: Sequence[Sequence[float]],
    runs_y: Sequence[Sequence[float]],
    confidence: float = 0.95,
    blocks: tuple[int, int] | None = None,
    runs_per_block: int | None = None,
) -> Shift:
    """How much the runs ``runs_x`` are above the runs ``runs_y`` (same units as the
    samples), the run being the unit of replication: each run summarised by its median,
    the interval Student's t on those medians with the between-run variance pooled (see
    the module's docstring for why). ``n_x``/``n_y`` count runs. With fewer than two runs
    on a side, the estimate alone: one run cannot tell the profile from the run.
    ``blocks``: how many blocks of back-to-back runs each side's runs make (None: every
    run independent); a side then counts at most ``runs_per_block`` runs a block.

    Raises:
        ValueError: A side without runs, a run without values or with a value that is not
            finite, a confidence not in (0, 1), or ``blocks`` without a positive
            ``runs_per_block``.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if blocks is not None and (runs_per_block is None or runs_per_block < 1):
        raise ValueError(f"blocks need runs_per_block >= 1, got {runs_per_block}")
    x = _run_summaries(runs_x, "x")
    y = _run_summaries(runs_y, "y")
    n_x, n_y = len(x), len(y)
    estimate = statistics.fmean(x) - statistics.fmean(y)
    if n_x < 2 or n_y < 2:
        return Shift(
            estimate, None, None, None, n_x, n_y,
            "one run a side cannot separate the profile from run-to-run variation:"
            " at least 2 runs of each profile are needed",
            confidence,
        )  # fmt: skip
    pooled = ((n_x - 1) * statistics.variance(x) + (n_y - 1) * statistics.variance(y)) / (
        n_x + n_y - 2
    )
    e_x, e_y = n_x, n_y
    if blocks is not None and runs_per_block is not None:
        e_x = counted_runs(n_x, blocks[0], runs_per_block)
        e_y = counted_runs(n_y, blocks[1], runs_per_block)
    if e_x < 2 or e_y < 2:
        return Shift(
            estimate, None, None, None, n_x, n_y,
            f"{e_x} and {e_y} runs counted (at most {runs_per_block} a block: runs back to back"
            " share their block), and one a side cannot separate the profile from"
            " block-to-block variation: profiles that alternate (A, B, A, B) give each a"
            " second block",
            confidence,
        )  # fmt: skip
    df = e_x + e_y - 2
    half = student_t_quantile(1 - (1 - confidence) / 2, df) * math.sqrt(
        pooled * (1 / e_x + 1 / e_y)
    )
    counted = (
        f"; {e_x} and {e_y} counted: runs back to back share their block"
        if (e_x, e_y) != (n_x, n_y)
        else ""
    )
    return Shift(
        estimate, estimate - half, estimate + half, confidence, n_x, n_y,
        f"Student's t on the run medians, between-run variance pooled ({df} df{counted})",
        confidence,
    )  # fmt: skip
