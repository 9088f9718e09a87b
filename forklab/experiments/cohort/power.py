"""The plan's power estimate for a cohort world: how likely the rate test (the exact
sign-flip test of ``forklab.experiments.cohort.noise``) is to call an effect of a given
size a win, from each run's success probability in the two worlds.

Run i's difference ``x_i`` (world successes minus baseline successes over k forks) is a
sum of k independent per-fork differences in {-1, 0, +1}. When fork f of the two worlds
draws the same uniform (``common``: the per-call seeds line up), a fork differs only
where the two probabilities differ: +1 with probability ``max(δ_i, 0)``, -1 with
``max(-δ_i, 0)``. When they are independent, +1 with ``p_w (1 - p_b)`` and -1 with
``p_b (1 - p_w)``. Two approximations of the test's power, each where it holds:

- **few differing runs** (expected count below ``SPARSE_RUNS``): almost every nonzero
  ``x_i`` is ±1, and the sign-flip test is then the exact sign test on the ``m`` runs that
  differ. The number ``m`` is Poisson-binomial over the runs, the share of positive ones
  ``π``; the power is ``Σ_m P(m) P(the exact sign test rejects | m, π)``;
- **many**: the normal approximation of the signed sum. ``x_i`` has mean ``k δ_i`` and
  variance ``k v_i`` (``v_i`` the per-fork variance above); the test rejects when
  ``|Σx| >= z·sqrt(Σx²)`` and ``Σx² ≈ n E[x²]``.

``bench/cohort_validity.py`` checks both against simulated experiments
(docs/benchmarks/cohort-validity.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

import numpy as np
import numpy.typing as npt
from scipy.special import bdtr, gammaln, ndtr

from forklab.experiments.experiment.stats import normal_quantile

#: Below this expected number of runs whose forks differ, the sign-test form is used.
SPARSE_RUNS = 40.0


class Coupling(StrEnum):
    """How the forks of two worlds of one run share randomness in a power estimate."""

    #: fork f of both worlds draws the same uniform (the per-call seeds line up)
    common = "common"
    #: the worlds' forks are independent (a provider that ignores ``seed``)
    independent = "independent"


def _fork_steps(
    pb: npt.NDArray[np.float64], pw: npt.NDArray[np.float64], coupling: Coupling
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per run, the probability that one fork's difference is +1 and that it is -1."""
    if coupling is Coupling.common:
        return np.maximum(pw - pb, 0.0), np.maximum(pb - pw, 0.0)
    return pw * (1 - pb), pb * (1 - pw)


def _binomial_pmf(m: int, share: float) -> npt.NDArray[np.float64]:
    """P(Binomial(m, share) = j) for j = 0..m, in logs (m may be in the thousands)."""
    j = np.arange(m + 1, dtype=np.float64)
    if share <= 0.0 or share >= 1.0:
        pmf = np.zeros(m + 1)
        pmf[m if share >= 1.0 else 0] = 1.0
        return pmf
    logs = gammaln(m + 1) - gammaln(j + 1) - gammaln(m - j + 1)
    out: npt.NDArray[np.float64] = np.exp(logs + j * math.log(share) + (m - j) * math.log1p(-share))
    return out


def _sign_test_power(
    up: npt.NDArray[np.float64], down: npt.NDArray[np.float64], k: int, alpha: float
) -> float:
    nonzero = np.zeros(up.size)
    positive = np.zeros(up.size)
    for i, (u, d) in enumerate(zip(up.tolist(), down.tolist(), strict=True)):
        dist = np.array([1.0])
        for _ in range(k):
            dist = np.convolve(dist, [d, 1.0 - u - d, u])
        nonzero[i] = 1.0 - dist[k]
        positive[i] = dist[k + 1 :].sum()
    if nonzero.sum() <= 0.0:
        return 0.0
    share = float(positive.sum() / nonzero.sum())
    runs = np.array([1.0])
    for q in nonzero.tolist():
        runs = np.convolve(runs, [1.0 - q, q])
    power = 0.0
    for m, p_m in enumerate(runs.tolist()):
        if m == 0 or p_m < 1e-15:
            continue
        j = np.arange(m + 1)
        p_value = np.minimum(1.0, 2.0 * bdtr(np.minimum(j, m - j), m, 0.5))
        reject = p_value < alpha
        pmf = _binomial_pmf(m, share)
        power += p_m * float(pmf[reject].sum())
    return min(1.0, power)


def rate_test_power(
    p_base: Sequence[float] | npt.NDArray[np.float64],
    p_world: Sequence[float] | npt.NDArray[np.float64],
    forks: int,
    alpha: float = 0.05,
    coupling: Coupling = Coupling.common,
) -> float:
    """The rate test's two-sided power at ``alpha`` (module docstring: which form when).

    Run i succeeds per fork with probability ``p_base[i]`` in the baseline and
    ``p_world[i]`` in the world.
    """
    pb = np.asarray(p_base, dtype=np.float64)
    pw = np.asarray(p_world, dtype=np.float64)
    if pb.shape != pw.shape or pb.ndim != 1 or pb.size == 0:
        raise ValueError("p_base and p_world must be equal-length, non-empty lists")
    n, k = pb.size, forks
    up, down = _fork_steps(pb, pw, coupling)
    if float((1.0 - (1.0 - up - down) ** k).sum()) < SPARSE_RUNS:
        return _sign_test_power(up, down, k, alpha)
    delta = pw - pb
    if coupling is Coupling.common:
        per_fork = np.abs(delta) - delta**2
    else:
        per_fork = pw * (1 - pw) + pb * (1 - pb)
    mean_x = k * delta
    mu = float(mean_x.mean())
    second = float((k * per_fork + mean_x**2).mean())
    if second <= 0.0:  # every difference is 0: the test never rejects
        return 0.0
    var = max(second - mu * mu, 1e-300)
    z = -normal_quantile(alpha / 2.0)
    edge = z * math.sqrt(n * second)
    scale = math.sqrt(n * var)
    return float(ndtr((n * mu - edge) / scale) + ndtr((-n * mu - edge) / scale))
