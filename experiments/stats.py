"""Small, exact statistics for paired counterfactual comparisons.

ForkLab runs every episode twice, once in the baseline world and once in a counterfactual
world, so each comparison is a *paired* 2x2 table of outcomes. The orientation used
throughout this module is::

                        world success   world failure
    baseline success         n11             n10        (n10 = harm)
    baseline failure         n01             n00        (n01 = rescue)

``n10`` are episodes the intervention *harmed* (they succeeded in the baseline and failed in
the world) and ``n01`` are episodes it *rescued*. Only the discordant pairs carry information
about the difference; the concordant ones (``n11``, ``n00``) only set the scale.

Where a well-kept library computes a statistic, it is used: ``scipy.stats`` gives the
McNemar tail, the normal quantile and the Wilson interval. What is written here is only
what no library offers in the form a paired experiment needs (Newcombe's paired interval,
Connor's McNemar sample size, the guard's quantile bins), plus Holm, which statsmodels has
but would make statsmodels and pandas runtime dependencies (seconds of start-up for every
``forklab plan``) for a dozen lines; each says so where it is defined. The tests check
every function against an independent reference (SciPy, statsmodels, exact fractions).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
from scipy.stats import binom, binomtest, norm

__all__ = [
    "bin_bounds",
    "bin_label",
    "holm_adjust",
    "mcnemar_exact_p",
    "mcnemar_sample_size",
    "normal_quantile",
    "paired_difference_ci",
    "quantile_edges",
    "wilson_interval",
]


# --------------------------------------------------------------------------- validation


def _count(name: str, value: int) -> int:
    """Return ``value`` as a non-negative ``int``; counts of episodes cannot be anything else."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int count, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _open_unit(name: str, value: float) -> float:
    """Return ``value`` as a float strictly inside (0, 1) (levels, power, probabilities)."""
    x = float(value)
    if not 0.0 < x < 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")
    return x


# --------------------------------------------------------------------------- normal quantile


def normal_quantile(p: float) -> float:
    """Inverse of the standard normal CDF (``scipy.stats.norm.ppf``).

    Used to turn a confidence level, a significance level or a power into a z value.
    ``p == 0`` and ``p == 1`` return ``-inf`` and ``+inf``; anything outside [0, 1] (or NaN)
    raises ``ValueError``.
    """
    x = float(p)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"p must be within [0, 1], got {p!r}")
    return float(norm.ppf(x))


# --------------------------------------------------------------------------- McNemar test


def mcnemar_exact_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts.

    ``b`` = harms (baseline success, world failure) and ``c`` = rescues (baseline failure,
    world success). Under the null hypothesis of no effect each discordant pair is equally
    likely to fall either way, so ``min(b, c)`` is Binomial(b + c, 1/2) and the two-sided
    p-value is ``min(1, 2 * P(X <= min(b, c)))``. With no discordant pairs there is no
    evidence at all and the p-value is 1.

    The tail is ``scipy.stats.binom.cdf`` (the regularised incomplete beta function):
    O(1) in ``m``, and within 1e-9 relative of the exact big-integer sum wherever that sum
    is a normal double (the tests compare them up to m = 20,000). The exact sum grew as
    ``m**2`` bits and took minutes at a million discordant pairs.
    """
    b = _count("b", b)
    c = _count("c", c)
    m = b + c
    if m == 0:
        return 1.0
    return min(1.0, 2.0 * float(binom.cdf(min(b, c), m, 0.5)))


# --------------------------------------------------------------------------- intervals


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a single binomial proportion ``successes / n``.

    Used for the failure rate of each world. Unlike the Wald interval it stays inside
    [0, 1], never collapses to zero width at 0% or 100%, and has close to nominal coverage
    even for the small per-world episode counts ForkLab runs. It is
    ``scipy.stats.binomtest(...).proportion_ci(method="wilson")``, whose
    limits are exactly 0 when ``successes == 0`` and exactly 1 when ``successes == n``.
    ``n == 0`` carries no information and returns ``(0.0, 1.0)``.
    """
    x = _count("successes", successes)
    n = _count("n", n)
    if x > n:
        raise ValueError(f"successes ({x}) cannot exceed n ({n})")
    level = _open_unit("confidence", confidence)
    if n == 0:
        return 0.0, 1.0
    ci = binomtest(x, n).proportion_ci(confidence_level=level, method="wilson")
    return max(0.0, float(ci.low)), min(1.0, float(ci.high))


def _newcombe_phi(n11: int, n10: int, n01: int, n00: int) -> float:
    """Continuity-adjusted correlation between the two marginal proportions.

    ``A = n11 * n00 - n10 * n01`` and ``D = sqrt(product of the four margins)``:

    * ``phi = 0`` if any margin is zero (``D == 0``: the correlation is undefined);
    * ``phi = (A - n/2) / D`` if ``A > n/2``;
    * ``phi = 0`` if ``0 <= A <= n/2``;
    * ``phi = A / D`` if ``A < 0``.

    This is the form used by Newcombe & Altman (Statistics with Confidence, 2nd ed., 2000,
    ch. 6) and by Fagerland, Lydersen & Laake (Stat Med 2014; 33:2850-2875, and their 2017
    book, "Newcombe square-and-add"). Some implementations use the plain Pearson
    ``A / D`` instead; the two agree whenever ``A < 0`` or a margin is zero. The adjustment
    only ever shrinks a *positive* correlation towards zero, which widens the interval a
    little. That is the conservative direction: it keeps the interval from becoming
    over-narrow when the concordant cells dominate.
    """
    n = n11 + n10 + n01 + n00
    margins = (n11 + n10) * (n01 + n00) * (n11 + n01) * (n10 + n00)
    if margins == 0:
        return 0.0
    a = n11 * n00 - n10 * n01  # exact integer
    if 2 * a > n:
        numerator = a - n / 2.0
    elif a >= 0:
        return 0.0
    else:
        numerator = float(a)
    return numerator / math.sqrt(margins)


def paired_difference_ci(
    n11: int, n10: int, n01: int, n00: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Difference in success rate (world minus baseline) with Newcombe's hybrid score CI.

    Table orientation (see the module docstring): ``n11`` both succeed, ``n10`` baseline
    success and world failure (harm), ``n01`` baseline failure and world success (rescue),
    ``n00`` both fail. Returns ``(estimate, low, high)`` with
    ``estimate = (n01 - n10) / n``, positive when the world rescues more than it harms.

    Hand-written because no library has it: statsmodels' ``confint_proportions_2indep``
    is for *independent* samples, and ignoring the pairing would throw away the
    correlation that makes paired forks informative.

    Method: Newcombe (1998), "Improved confidence intervals for the difference between
    binomial proportions based on paired data", Stat Med 17:2635-2650, method 10 (the
    "square-and-add" hybrid score interval). With ``p1 = (n11 + n01) / n`` (world),
    ``p2 = (n11 + n10) / n`` (baseline), their Wilson limits ``(l1, u1)``, ``(l2, u2)``
    and the correlation ``phi`` (see ``_newcombe_phi``; exactly what is implemented,
    including the ``n/2`` continuity adjustment and ``phi = 0`` for a zero margin)::

        low  = d - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)
        high = d + sqrt((u1 - p1)^2 - 2 phi (u1 - p1)(p2 - l2) + (p2 - l2)^2)

    Why this interval: the Wald interval for paired proportions collapses to zero width
    when there are no discordant pairs and overshoots [-1, 1]; Newcombe's interval keeps
    good coverage for small n and is what the McNemar-style rescue/harm counts need. The
    limits always lie within [-1, 1] (they are clamped against rounding only).

    An empty table (``n == 0``) carries no information and returns ``(0.0, -1.0, 1.0)``.
    """
    n11 = _count("n11", n11)
    n10 = _count("n10", n10)
    n01 = _count("n01", n01)
    n00 = _count("n00", n00)
    _open_unit("confidence", confidence)
    n = n11 + n10 + n01 + n00
    if n == 0:
        return 0.0, -1.0, 1.0
    p1 = (n11 + n01) / n
    p2 = (n11 + n10) / n
    l1, u1 = wilson_interval(n11 + n01, n, confidence)
    l2, u2 = wilson_interval(n11 + n10, n, confidence)
    phi = _newcombe_phi(n11, n10, n01, n00)
    estimate = (n01 - n10) / n
    dl1, du1 = p1 - l1, u1 - p1
    dl2, du2 = p2 - l2, u2 - p2
    below = math.sqrt(max(0.0, dl1 * dl1 - 2.0 * phi * dl1 * du2 + du2 * du2))
    above = math.sqrt(max(0.0, du1 * du1 - 2.0 * phi * du1 * dl2 + dl2 * dl2))
    return estimate, max(-1.0, estimate - below), min(1.0, estimate + above)


# --------------------------------------------------------------------------- multiplicity


def holm_adjust(pvalues: Sequence[float]) -> list[float]:
    """Holm (1979) step-down adjusted p-values, returned in input order.

    An experiment compares several worlds against the same baseline, so the family-wise
    error rate must be controlled; Holm does that under any dependence between the tests
    and is uniformly more powerful than Bonferroni. With the p-values sorted ascending,
    ``p_(1) <= ... <= p_(m)``, the adjusted value of ``p_(j)`` is
    ``min(1, max_{i <= j} (m - i + 1) p_(i))``: monotone in the sorted order and capped at 1.
    Reject hypothesis ``i`` at level ``alpha`` iff its adjusted value is ``<= alpha``. Ties
    receive identical adjusted values, whatever their order. An empty input gives ``[]``.
    """
    values = [float(p) for p in pvalues]
    for p in values:
        if not 0.0 <= p <= 1.0:  # also rejects NaN
            raise ValueError(f"p-values must be within [0, 1], got {p!r}")
    m = len(values)
    order = sorted(range(m), key=lambda i: values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * values[index]))
        adjusted[index] = running
    return adjusted


# --------------------------------------------------------------------------- planning


def mcnemar_sample_size(
    p10: float, p01: float, alpha: float = 0.05, power: float = 0.8
) -> int | None:
    """Number of paired episodes for a two-sided McNemar test to detect a discordance gap.

    ``p10`` is the expected probability of a harm pair (baseline success, world failure),
    ``p01`` of a rescue pair. With ``psi = p10 + p01`` and ``delta = p10 - p01``, Connor
    (1987, Biometrics 43:207-211) gives::

        n = (z_{1 - alpha/2} sqrt(psi) + z_{power} sqrt(psi - delta^2))^2 / delta^2

    rounded up. Hand-written because neither SciPy nor statsmodels offers a McNemar
    sample size. This is what a pre-registration needs: only the discordant pairs are
    informative, so the required n is driven by how often the worlds disagree, not by the
    overall failure rate. Returns ``None`` when ``delta == 0`` (there is no effect to
    detect, so no n suffices). Values within 1e-9 above an integer are treated as that
    integer so that floating-point noise cannot add a spurious extra episode; the result
    is at least 1.

    The formula is a normal approximation. For very small results, check against the
    exact test: with ``n`` discordant pairs, the smallest attainable exact two-sided
    p-value is ``2**(1 - n)``. For example, ``p10 = 1, p01 = 0`` gives ``n = 4``, but four
    pairs can reach no p-value below 0.125.
    """
    a = float(p10)
    r = float(p01)
    if not (0.0 <= a <= 1.0 and 0.0 <= r <= 1.0 and a + r <= 1.0):
        raise ValueError(f"need 0 <= p10, p01 and p10 + p01 <= 1, got {p10!r}, {p01!r}")
    _open_unit("alpha", alpha)
    _open_unit("power", power)
    delta = a - r
    if delta == 0.0:
        return None
    psi = a + r
    z_alpha = -normal_quantile(float(alpha) / 2.0)
    z_power = normal_quantile(float(power))
    root = z_alpha * math.sqrt(psi) + z_power * math.sqrt(max(0.0, psi - delta * delta))
    n = root * root / (delta * delta)
    return max(1, math.ceil(n - 1e-9))


# --------------------------------------------------------------------------- binning


def quantile_edges(values: Sequence[float], bins: int) -> list[float]:
    """Interior cut points splitting ``values`` into at most ``bins`` quantile bins.

    Used to turn a numeric episode feature into a few readable ranges, so that rescues and
    harms can be broken down by range and a range can become a guard rule.

    Definition: with the ``n`` values sorted as ``x_(1) <= ... <= x_(n)``, the candidate
    edge for ``i = 1 .. bins - 1`` is ``x_(floor(i n / bins) + 1)``, i.e. the smallest
    observed ``x`` whose empirical CDF ``F_n(x)`` is *strictly* greater than ``i / bins``.
    The index is computed in integer arithmetic, so the result is exact and deterministic
    (independent of input order), and every edge is an observed value, which keeps labels
    readable. Bins are lower-inclusive ``[edge_k, edge_{k+1})`` with ``(-inf, edge_1)`` and
    ``[edge_last, +inf)`` at the ends, so without ties the first ``j`` bins hold exactly
    ``floor(j n / bins)`` values. Duplicate candidates (from ties) and a candidate equal
    to the minimum (which would leave the first bin empty) are dropped, so fewer than
    ``bins - 1`` edges may come back; no edges means a single bin. Returns a strictly
    increasing list. Values must be finite; ``bins`` must be >= 1.

    The sort is numpy's (millions of episodes); the choice of edges is written here
    because none of ``numpy.quantile``'s methods is "the smallest x with F_n(x) > q".
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be an int >= 1, got {bins!r}")
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    if not np.isfinite(ordered).all():
        bad = ordered[~np.isfinite(ordered)][0]
        raise ValueError(f"values must be finite, got {float(bad)!r}")
    n = len(ordered)
    if n == 0:
        return []
    edges: list[float] = []
    lowest = float(ordered[0])
    for i in range(1, bins):
        candidate = float(ordered[(i * n) // bins])
        if candidate > lowest and (not edges or candidate > edges[-1]):
            edges.append(candidate)
    return edges


def _check_edges(edges: Sequence[float]) -> list[float]:
    cuts = [float(e) for e in edges]
    for e in cuts:
        if not math.isfinite(e):
            raise ValueError(f"edges must be finite, got {e!r}")
    for lo, hi in pairwise(cuts):
        if not lo < hi:
            raise ValueError(f"edges must be strictly increasing, got {lo!r} then {hi!r}")
    return cuts


def bin_bounds(value: float, edges: Sequence[float]) -> tuple[float, float]:
    """``(low, high)`` of the bin holding ``value``: ``low <= value < high``.

    The ends are ``-inf`` and ``+inf``, so the pair maps directly onto a guard rule
    ``{"ge": low, "lt": high}`` that selects exactly the episodes of that bin.
    ``edges`` are the cut points of ``quantile_edges`` (strictly increasing, finite).
    """
    cuts = _check_edges(edges)
    x = float(value)
    if math.isnan(x):
        raise ValueError("value must not be NaN")
    k = bisect_right(cuts, x)  # number of edges <= value
    low = cuts[k - 1] if k > 0 else -math.inf
    high = cuts[k] if k < len(cuts) else math.inf
    return low, high


def _fmt(x: float) -> str:
    """Shortest faithful text for an edge: ``2`` rather than ``2.0``, ``0.1`` not ``0.1000``."""
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


def bin_label(value: float, edges: Sequence[float]) -> str:
    """Readable label of the bin holding ``value``, e.g. ``"[2, 5)"``.

    Interval notation matches ``bin_bounds``: lower bound included, upper excluded, and
    the open-ended bins read ``"(-inf, 2)"`` and ``"[9, inf)"``. Edges are printed with
    their shortest round-trip representation, so distinct edges never share a label.
    """
    low, high = bin_bounds(value, edges)
    opening = "(" if math.isinf(low) else "["
    return f"{opening}{_fmt(low)}, {_fmt(high)})"
