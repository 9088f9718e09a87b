"""Small, exact statistics for paired counterfactual comparisons.

Each comparison is a paired 2x2 table: ``n11`` both succeed, ``n10`` harm (baseline
success, world failure), ``n01`` rescue, ``n00`` both fail. Where a well-kept library
computes a statistic without a heavy import, it is used: the standard library's
``statistics.NormalDist`` gives the normal quantile. Written here is only what no library
offers in the form a paired experiment needs, or only behind an import that would cost
every ``forklab plan`` more than its statistics (``scipy.special`` alone takes a quarter
of a second: its array-API layer imports every numpy submodule); each function says why.
The tests compare each against SciPy, statsmodels and exact sums; the formulas and their
sources are in ``docs/analysis.md`` ("The formulas").
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from itertools import pairwise
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

__all__ = [
    "bin_bounds",
    "bin_label",
    "holm_adjust",
    "integer_bin_label",
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


_STANDARD_NORMAL = NormalDist()


def normal_quantile(p: float) -> float:
    """Inverse of the standard normal CDF (``statistics.NormalDist.inv_cdf``, Wichura's
    AS241, full double precision; the tests compare it with ``scipy.special.ndtri``).
    ``p == 0`` and ``p == 1`` give ``-inf`` and ``+inf``; outside [0, 1] (or NaN) raises
    ``ValueError``."""
    x = float(p)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"p must be within [0, 1], got {p!r}")
    if x == 0.0:
        return -math.inf
    if x == 1.0:
        return math.inf
    return _STANDARD_NORMAL.inv_cdf(x)


# --------------------------------------------------------------------------- McNemar test


def mcnemar_exact_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from ``b`` harms and ``c`` rescues (1 with none).

    ``2 * P[X <= min(b, c)]`` for X ~ Binomial(b + c, 1/2), capped at 1 (exactly 1 when
    ``min(b, c)`` is at least half the pairs, rounded down). The tail is
    ``_half_binomial_cdf``: what ``scipy.special.bdtr`` computes, without its import;
    within 1e-9 relative of the exact big-integer sum wherever that sum is a normal
    double (tested up to 20,000 pairs, and against SciPy beyond). The exact sum costs
    ~m^2 bits: minutes at a million discordant pairs.
    """
    b = _count("b", b)
    c = _count("c", c)
    m = b + c
    k = min(b, c)
    if 2 * k + 1 >= m:  # P[X <= k] >= 1/2 (also m == 0): no evidence either way
        return 1.0
    return min(1.0, 2.0 * _half_binomial_cdf(k, m))


def _half_binomial_cdf(k: int, m: int) -> float:
    """``P[X <= k]`` for X ~ Binomial(m, 1/2) and ``2k < m``: the term at ``k`` (Loader's
    saddle-point form, ``_half_binomial_pmf``, accurate to a few ulp however large ``m``),
    times the sum of the ratios down to the terms that no longer count (they fall
    faster than geometrically: about ``9 sqrt(m)`` of them at most)."""
    if k == 0:
        return math.ldexp(1.0, -m)  # exact: 2**-m
    term = _half_binomial_pmf(k, m)
    if term == 0.0:  # below the doubles: so is every smaller term
        return 0.0
    total = ratio = 1.0
    for i in range(k, 0, -1):
        ratio *= i / (m - i + 1)  # P[X = i - 1] / P[X = k]
        total += ratio
        if ratio < total * 1e-17:
            break
    return term * total


#: ``stirlerr(n)`` below 16 from ``log(n!)`` itself, where the series is not yet exact.
_STIRLING_SERIES_FROM = 16


def _stirlerr(n: int) -> float:
    """``log(n!) - log(sqrt(2 pi n) (n/e)**n)``, Stirling's error (Loader 2000)."""
    if n < _STIRLING_SERIES_FROM:
        return math.lgamma(n + 1.0) - (n + 0.5) * math.log(n) + n - 0.5 * math.log(2 * math.pi)
    nn = float(n) * n
    return (
        1.0 / 12 - (1.0 / 360 - (1.0 / 1260 - (1.0 / 1680 - (1.0 / 1188) / nn) / nn) / nn) / nn
    ) / n


def _bd0(x: float, mean: float) -> float:
    """``x log(x / mean) + mean - x`` without its cancellation near ``x == mean`` (Loader
    2000: a series in ``(x - mean) / (x + mean)``)."""
    if abs(x - mean) < 0.1 * (x + mean):
        v = (x - mean) / (x + mean)
        s = (x - mean) * v
        ej = 2.0 * x * v
        v2 = v * v
        j = 1
        while True:
            ej *= v2
            s1 = s + ej / (2 * j + 1)
            if s1 == s:
                return s1
            s = s1
            j += 1
    return x * math.log(x / mean) + mean - x


def _half_binomial_pmf(k: int, m: int) -> float:
    """``C(m, k) / 2**m`` for ``0 < k < m`` in Loader's saddle-point form (R's
    ``dbinom``): Stirling's errors and ``bd0`` keep it to a few ulp where
    ``lgamma`` differences lose digits in proportion to ``log(m!)``. ``scipy.special``
    would compute it only behind its import (see the module's docstring)."""
    half = m / 2.0
    lc = _stirlerr(m) - _stirlerr(k) - _stirlerr(m - k) - _bd0(k, half) - _bd0(m - k, half)
    lf = math.log(2 * math.pi) + math.log(k) + math.log1p(-k / m)
    return math.exp(lc - 0.5 * lf)


# --------------------------------------------------------------------------- intervals


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for ``successes / n``; ``n == 0`` gives ``(0.0, 1.0)``.

    ``scipy.stats.binomtest(...).proportion_ci(method="wilson")`` computes the same (the
    tests compare against it and statsmodels) but sits behind the slow ``scipy.stats``
    import; the closed form is two lines. Written without cancellation, so the limits are
    exactly 0 at ``successes == 0`` and exactly 1 at ``successes == n``.
    """
    x = _count("successes", successes)
    n = _count("n", n)
    if x > n:
        raise ValueError(f"successes ({x}) cannot exceed n ({n})")
    z = -normal_quantile((1.0 - _open_unit("confidence", confidence)) / 2.0)
    if n == 0:
        return 0.0, 1.0
    z2 = z * z
    spread = z * math.sqrt(z2 + 4.0 * x * (n - x) / n)
    denominator = 2.0 * (n + z2)
    low = 0.0 if x == 0 else (2.0 * x + z2 - spread) / denominator
    high = 1.0 if x == n else (2.0 * x + z2 + spread) / denominator
    return max(0.0, low), min(1.0, high)


def _newcombe_phi(n11: int, n10: int, n01: int, n00: int) -> float:
    """Continuity-adjusted correlation of the two marginals (Newcombe & Altman's form).

    It only ever shrinks a positive correlation, which widens the interval: the
    conservative direction.
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
    """World minus baseline success rate with Newcombe's hybrid score interval (method 10).

    Returns ``(estimate, low, high)``, ``estimate = (n01 - n10) / n``; an empty table
    gives ``(0.0, -1.0, 1.0)``. Unlike Wald it does not collapse with no discordant pair.
    Written here because no library has it for *paired* data (statsmodels'
    ``confint_proportions_2indep`` assumes independent samples and would throw away the
    correlation that makes paired forks informative).
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
    """Holm (1979) step-down adjusted p-values, in input order (``[]`` for no input).

    Family-wise error control under any dependence between the comparisons.
    ``statsmodels.stats.multitest.multipletests(method="holm")`` computes the same (the
    tests compare against it) but would make statsmodels and pandas runtime dependencies,
    seconds of start-up for every ``forklab plan``, for these dozen lines.
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
    """Paired episodes a two-sided McNemar test needs (Connor 1987); ``None`` if p10 == p01.

    Driven by how often the worlds disagree, not by the failure rate. A normal
    approximation: for tiny results the exact test may not reach ``alpha`` at all.
    Written here because neither SciPy nor statsmodels has a McNemar sample size.
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


def quantile_edges(values: Sequence[float] | npt.NDArray[np.float64], bins: int) -> list[float]:
    """Interior cut points splitting ``values`` into at most ``bins`` quantile bins.

    Every edge is an observed value picked by integer index arithmetic, so the result is
    exact and independent of input order; ties can merge bins (fewer edges come back).
    The sort is numpy's (millions of episodes); the choice of edge is written here because
    none of ``numpy.quantile``'s methods picks "the smallest x with F_n(x) > i / bins".
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be an int >= 1, got {bins!r}")
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    finite = np.isfinite(ordered)
    if not finite.all():
        raise ValueError(f"values must be finite, got {float(ordered[~finite][0])!r}")
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


def integer_bin_label(value: int, edges: Sequence[float], seen: tuple[int, int]) -> str:
    """The bin holding ``value`` of a feature whose values are all integers, named by the
    integers in it, e.g. ``"3"`` or ``"1..2"`` rather than ``"[1, 3)"`` or ``"(-inf, 1)"``.

    An open end is named by the extreme value ``seen`` (lowest, highest) among the
    episodes the bins were cut from: the label reads what those episodes hold, while the
    bin (and its guard clause) still takes a value never seen, which reads ``"≤ 0"`` or
    ``"≥ 9"`` when it falls outside ``seen``.
    """
    low, high = bin_bounds(value, edges)
    first = math.ceil(low) if math.isfinite(low) else min(seen[0], value)
    last = math.ceil(high) - 1 if math.isfinite(high) else max(seen[1], value)
    if not math.isfinite(low) and value < seen[0]:
        return f"≤ {last}"
    if not math.isfinite(high) and value > seen[1]:
        return f"≥ {first}"
    return str(first) if first == last else f"{first}..{last}"
