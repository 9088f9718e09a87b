"""The noise floor and the paired per-run statistics, against reference values (scipy),
and verdicts that never call an effect inside the noise floor a win."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import permutation_test

from forklab.experiments.cohort.noise import (
    CohortVerdict,
    compare_rates,
    judge_worlds,
    noise_floor,
    sign_flip_p,
)
from forklab.experiments.cohort.power import Coupling, rate_test_power
from forklab.experiments.experiment.spec import Direction, Role
from tests.reference_stats import reference_newcombe


@pytest.mark.parametrize("seed", range(12))
def test_the_sign_flip_p_value_is_scipys_exact_permutation_test(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 13))
    x = rng.integers(-3, 4, size=n)
    ref = permutation_test(
        (x,), np.sum, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
    )
    assert sign_flip_p(x) == pytest.approx(min(1.0, float(ref.pvalue)), abs=1e-12)


def test_sign_flip_p_edge_cases() -> None:
    assert sign_flip_p([0, 0, 0]) == 1.0
    assert sign_flip_p([1]) == 1.0
    assert sign_flip_p([3] * 10) == pytest.approx(2 / 2**10)
    with pytest.raises(ValueError, match="counts of forks"):
        sign_flip_p([10**12])  # refused before any array is made


def test_the_noise_floor_is_the_mean_pairwise_disagreement_of_baseline_forks() -> None:
    rng = np.random.default_rng(3)
    m = rng.random((40, 5)) < rng.random((40, 1))
    brute = np.mean([np.mean([a != b for a, b in itertools.combinations(row, 2)]) for row in m])
    floor = noise_floor(m)
    assert floor.flip_rate == pytest.approx(brute)
    assert floor.ci_low <= floor.flip_rate <= floor.ci_high
    assert noise_floor(np.ones((10, 3), dtype=bool)).flip_rate == 0.0
    with pytest.raises(ValueError, match="two baseline forks"):
        noise_floor(np.ones((10, 1), dtype=bool))


def test_compare_rates_majorities_match_newcombe_and_counts() -> None:
    rng = np.random.default_rng(9)
    b = rng.random((60, 3)) < 0.5
    w = rng.random((60, 3)) < 0.7
    c = compare_rates(b, w)
    mb, mw = b.sum(1) >= 2, w.sum(1) >= 2
    n11, n10 = int((mb & mw).sum()), int((mb & ~mw).sum())
    n01, n00 = int((~mb & mw).sum()), int((~mb & ~mw).sum())
    assert (c.rescues, c.harms, c.unchanged) == (n01, n10, n11 + n00)
    d, low, high = reference_newcombe(n11, n10, n01, n00)
    assert (c.majority_difference, c.majority_ci_low, c.majority_ci_high) == pytest.approx(
        (d, low, high), abs=1e-9
    )
    assert c.rate_difference == pytest.approx(float((w.mean(1) - b.mean(1)).mean()))
    with pytest.raises(ValueError, match="do not pair"):
        compare_rates(b, w[:10])


def _coupled(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    return u < p[:, None]


def test_verdicts_against_the_noise_floor() -> None:
    rng = np.random.default_rng(21)
    runs, k = 120, 3
    p = rng.choice([0.2, 0.5, 0.9], size=runs)
    u = rng.random((runs, k))  # the same per-fork randomness in every world (seeds line up)
    base = _coupled(p, u)
    floor, verdicts = judge_worlds(
        base,
        {
            "aa": (Role.treatment, Direction.decrease, _coupled(p, rng.random((runs, k)))),
            "placebo": (Role.placebo, Direction.none, base.copy()),
            "better": (Role.treatment, Direction.decrease, _coupled(np.minimum(p + 0.35, 1), u)),
            "broken": (Role.positive_control, Direction.increase, _coupled(p * 0.3, u)),
        },
    )
    by = {v.world: v for v in verdicts}
    assert floor.flip_rate > 0.1  # a noisy agent
    assert by["placebo"].verdict is CohortVerdict.inside_noise_floor and by["placebo"].as_expected
    assert by["better"].verdict is CohortVerdict.rescues and by["better"].as_expected
    assert by["broken"].verdict is CohortVerdict.harms and by["broken"].as_expected
    # an independent re-draw of the baseline (A/A) flips outcomes by itself: never a win
    assert by["aa"].verdict is CohortVerdict.inside_noise_floor
    assert by["aa"].comparison.rescues + by["aa"].comparison.harms > 0
    assert "inside the noise floor, not a win" in by["aa"].text


def test_the_power_estimate_matches_a_simulation() -> None:
    rng = np.random.default_rng(5)
    runs, k, sims = 40, 3, 400
    p = rng.choice([0.2, 0.5, 0.8], size=runs)
    pw = np.minimum(p + 0.15, 1.0)
    hits = 0
    for _ in range(sims):
        u = rng.random((runs, k))
        c = compare_rates(_coupled(p, u), _coupled(pw, u))
        hits += c.rate_p < 0.05
    planned = rate_test_power(p, pw, k, 0.05, Coupling.common)
    mc = 3 * np.sqrt(planned * (1 - planned) / sims)
    assert abs(hits / sims - planned) < 0.05 + mc
    assert rate_test_power(p, p, k) == 0.0  # identical coupled worlds never differ
    # under the null the (conservative, discrete) test rejects at most at alpha
    assert 0.01 < rate_test_power(p, p, k, coupling=Coupling.independent) <= 0.05
