"""Group-sequential boundaries by α-spending (Lan & DeMets 1983), computed exactly.

A world's statistic at look k is the paired score statistic on its discordant pairs,
``Z_k = (rescues − harms) / √(rescues + harms)``. With information proportional to the
episodes run, ``S_k = Z_k √t_k`` (``t_k`` the fraction of the budgeted episodes run by
look k) is a Brownian motion with drift θ per unit of information, θ = 0 under the null
and ``Z_K ~ N(θ, 1)`` at the end. The two-sided boundary ``c_k`` spends the α that the
spending function allots to look k: ``P_0(|Z_j| < c_j for j < k, |Z_k| ≥ c_k) = α(t_k) −
α(t_{k−1})``. The probabilities are integrals over the continuation region, computed by
the recursion of Armitage, McPherson & Rowe (1969) on a Simpson grid (Jennison & Turnbull
2000, ch. 19): exact up to the grid, which ``tests/test_sequential_bounds.py`` checks
against published boundaries and the exit probabilities against α.

Everything here depends on the design only (fractions, α, spending), so the boundaries are
known, printed and signed before any episode runs. ``scipy.special`` is imported where a
design is computed, not with the module: every ``forklab plan`` imports this module
(through the report's models) and most run no sequential design, while that import
alone costs a quarter of a second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from forklab.experiments.experiment.spec import Spending

Floats = npt.NDArray[np.float64]

#: Grid points per unit of z in the continuation region (Simpson's rule: error ~ h⁴).
_PER_UNIT = 24
#: A boundary beyond this spends nothing a double can hold; the look cannot stop.
_NO_STOP = 12.0


def alpha_spent(spending: Spending, alpha: float, t: float) -> float:
    """The cumulative two-sided α the design may have spent by information fraction ``t``:
    O'Brien–Fleming-like ``4 − 4Φ(z_{1−α/4} / √t)`` (each side spends Lan & DeMets'
    one-sided ``2 − 2Φ(z_{1−α/4} / √t)`` of α/2, as in DeMets & Lan 1994) spends almost
    nothing early and keeps the last look near the fixed design's critical value;
    Pocock-like ``α log(1 + (e − 1) t)`` spends evenly, so worlds stop earlier and the
    last look costs more."""
    if t <= 0.0:
        return 0.0
    t = min(t, 1.0)
    if spending is Spending.obrien_fleming:
        from scipy.special import ndtr, ndtri

        return float(4.0 * ndtr(ndtri(alpha / 4.0) / math.sqrt(t)))
    return alpha * math.log(1.0 + (math.e - 1.0) * t)


def _simpson(lo: float, hi: float) -> tuple[Floats, Floats]:
    """Nodes and Simpson weights on [lo, hi] (an odd number of nodes)."""
    n = max(3, math.ceil((hi - lo) * _PER_UNIT) | 1)
    z = np.linspace(lo, hi, n)
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return z, w * (hi - lo) / (3.0 * (n - 1))


class _Continuation:
    """The sub-density of Z_k on the continuation region after look k (mass = P(no stop))."""

    def __init__(self, z: Floats, weighted: Floats, t: float) -> None:
        self.z = z
        self.weighted = weighted  # density × Simpson weight at each node
        self.t = t

    @classmethod
    def first(cls, t: float, c: float, theta: float) -> _Continuation:
        z, w = _simpson(-c, c)
        density = np.exp(-0.5 * (z - theta * math.sqrt(t)) ** 2) / math.sqrt(2.0 * math.pi)
        return cls(z, density * w, t)

    def _shift(self, t: float, theta: float) -> tuple[Floats, float]:
        """The mean of S_t given each node, and the increment's standard deviation."""
        delta = t - self.t
        return self.z * math.sqrt(self.t) + theta * delta, math.sqrt(delta)

    def exits(self, t: float, c: float, theta: float) -> tuple[float, float]:
        """P(continue so far, then Z_t ≥ c) and P(continue so far, then Z_t ≤ −c)."""
        from scipy.special import ndtr

        mean, sd = self._shift(t, theta)
        edge = c * math.sqrt(t)
        up = float(np.dot(self.weighted, ndtr((mean - edge) / sd)))
        down = float(np.dot(self.weighted, ndtr((-edge - mean) / sd)))
        return up, down

    def next(self, t: float, c: float, theta: float) -> _Continuation:
        mean, sd = self._shift(t, theta)
        z, w = _simpson(-c, c)
        x = (z[:, None] * math.sqrt(t) - mean[None, :]) / sd
        kernel = np.exp(-0.5 * x * x) * (math.sqrt(t) / (sd * math.sqrt(2.0 * math.pi)))
        return _Continuation(z, (kernel @ self.weighted) * w, t)


def _check_fractions(fractions: Sequence[float]) -> list[float]:
    ts = [float(t) for t in fractions]
    if not ts or any(not 0.0 < t <= 1.0 for t in ts) or any(b <= a for a, b in pairwise(ts)):
        raise ValueError(f"information fractions must rise strictly within (0, 1], got {ts}")
    return ts


def efficacy_bounds(fractions: Sequence[float], alpha: float, spending: Spending) -> Floats:
    """The two-sided boundary ``c_k`` of each look; the last look spends what is left, so
    the design's type I error is exactly α whether or not the last fraction is 1."""
    # scipy.optimize costs a tenth of a second to import: only a sequential design needs it,
    # and every `forklab plan` imports this module
    from scipy.optimize import brentq
    from scipy.special import ndtri

    ts = _check_fractions(fractions)
    bounds: list[float] = []
    state: _Continuation | None = None
    spent = 0.0
    for k, t in enumerate(ts):
        target = alpha if k == len(ts) - 1 else alpha_spent(spending, alpha, t)
        step = target - spent
        if state is None:
            c = float(-ndtri(step / 2.0)) if step > 1e-300 else _NO_STOP
        else:
            prior = state

            def excess(
                c: float, prior: _Continuation = prior, t: float = t, step: float = step
            ) -> float:
                up, down = prior.exits(t, c, 0.0)
                return up + down - step

            c = _NO_STOP if excess(_NO_STOP) >= 0.0 else brentq(excess, 0.0, _NO_STOP, xtol=1e-10)
        c = min(c, _NO_STOP)
        bounds.append(c)
        state = _Continuation.first(t, c, 0.0) if state is None else state.next(t, c, 0.0)
        spent = target
    return np.array(bounds)


def exit_probabilities(
    fractions: Sequence[float], bounds: Sequence[float], theta: float
) -> tuple[Floats, Floats]:
    """Per look: the probability of stopping there above (+c) and below (−c) under drift θ
    (θ = 0 is the null; ``Z`` at the full budget has mean θ)."""
    from scipy.special import ndtr

    ts = _check_fractions(fractions)
    up, down = np.zeros(len(ts)), np.zeros(len(ts))
    state: _Continuation | None = None
    for k, (t, c) in enumerate(zip(ts, bounds, strict=True)):
        if state is None:
            shift = theta * math.sqrt(t)
            up[k], down[k] = float(ndtr(shift - c)), float(ndtr(-c - shift))
            state = _Continuation.first(t, c, theta)
        else:
            up[k], down[k] = state.exits(t, c, theta)
            state = state.next(t, c, theta)
    return up, down


def stagewise_p(fractions: Sequence[float], bounds: Sequence[float], look: int, z: float) -> float:
    """The two-sided p-value of the stage-wise ordering (Armitage 1957; Fairbanks & Madsen
    1982) for a world that stopped at ``look`` (0-based) with statistic ``z``: the null
    probability of stopping earlier, plus that of reaching ``look`` and seeing |Z| ≥ |z|.
    Uniform under the null whatever look the world stops at, so it is valid for the design."""
    ts = _check_fractions(fractions)[: look + 1]
    cs = [float(c) for c in bounds][: look + 1]
    a = abs(z)
    if look == 0:
        from scipy.special import ndtr

        return min(1.0, float(2.0 * ndtr(-a)))
    up, down = exit_probabilities(ts[:-1], cs[:-1], 0.0)
    state = _Continuation.first(ts[0], cs[0], 0.0)
    for t, c in zip(ts[1:-1], cs[1:-1], strict=True):
        state = state.next(t, c, 0.0)
    last_up, last_down = state.exits(ts[-1], a, 0.0)
    return min(1.0, float(up.sum() + down.sum() + last_up + last_down))
