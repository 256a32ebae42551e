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
        asked: The confidence asked for, which the report names (``confidence`` may be
            above it; a range of the differences between few runs may be below it).
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


def pairwise_range(x: Sequence[float], y: Sequence[float]) -> Shift:
    """The Hodges–Lehmann shift with the range of all differences as its interval: it
    excludes zero only when every value of one sample is above every value of the other.
    Used for the runtime when there are too few runs for a rank interval at the confidence
    asked for; its own confidence is 1 − 2 / C(n+m, n) (e.g. 67 % for 2 and 2 runs)."""
    if not x or not y:
        raise ValueError("both samples need at least one value")
    diffs = sorted(a - b for a in x for b in y)
    achieved = 1 - 2 / math.comb(len(x) + len(y), len(x))
    return Shift(
        statistics.median(diffs), diffs[0], diffs[-1], max(achieved, 0.0), len(x), len(y),
        "range of the differences between runs",
    )  # fmt: skip


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
