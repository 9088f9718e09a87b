"""Independent reference computations for the statistics tests (statsmodels-based)."""

from __future__ import annotations

import math

from statsmodels.stats.proportion import proportion_confint


def reference_newcombe(
    n11: int, n10: int, n01: int, n00: int, level: float = 0.95
) -> tuple[float, float, float]:
    """Newcombe's method 10 from statsmodels' Wilson limits of the two marginal rates.

    World rate p1 = (n11 + n01) / n, baseline rate p2 = (n11 + n10) / n. Phi follows
    Fagerland, Lydersen & Laake (2017), eq. for the square-and-add interval: 0 for a zero
    margin, (A - n/2)/sqrt(M) for A > n/2, 0 for 0 <= A <= n/2, A/sqrt(M) for A < 0.
    """
    n = n11 + n10 + n01 + n00
    world, base = n11 + n01, n11 + n10
    p1, p2 = world / n, base / n
    l1, u1 = (float(v) for v in proportion_confint(world, n, alpha=1 - level, method="wilson"))
    l2, u2 = (float(v) for v in proportion_confint(base, n, alpha=1 - level, method="wilson"))
    margins = world * (n - world) * base * (n - base)
    a = n11 * n00 - n10 * n01
    if margins == 0:
        phi = 0.0
    elif a > n / 2:
        phi = (a - n / 2) / math.sqrt(margins)
    elif a >= 0:
        phi = 0.0
    else:
        phi = a / math.sqrt(margins)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    return d, low, high
