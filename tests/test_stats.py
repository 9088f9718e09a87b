"""Tests for forklab.experiments.experiment.stats against independent references.

The module uses scipy.special for the McNemar tail and the normal quantile;
statsmodels, exact fractions and big-integer sums are the independent references here.

Published worked examples for the paired (Newcombe) interval:

* Newcombe (1998), Stat Med 17:2635-2650, Table II, example (a,b,c,d) = (36,12,2,0):
  difference 0.2000, method 10 interval 0.0569 to 0.3404. The values were recalled from the
  paper and then confirmed by computation: the formula reproduces them exactly. With
  ``ad - bc < 0`` the phi conventions agree, so this example pins the core formula.
  A pairing quoted elsewhere for the same table, "difference 0.1786, CI 0.0381 to 0.3311",
  is inconsistent: (36,12,2,0) has n = 50 and difference 10/50 = 0.2, not 10/56 = 0.1786.
  A search of every table with that difference and n in {28, 56, 84, 112, 140} found none
  whose method-10 limits (with either phi convention) are 0.0381 and 0.3311. It is not
  used here.
* Fagerland, Lydersen & Laake (2017), Statistical Analysis of Contingency Tables, ch. 8,
  Cavo et al. (2012) data [[59, 6], [16, 80]]: Newcombe square-and-add estimate -0.0621,
  95% CI -0.1186 to -0.0046. The figures are those pinned in the tests of the book's
  companion R package ``contingencytables``. They need the ``n/2``-adjusted phi; the plain
  Pearson phi would give -0.1174 to -0.0059.
"""

from __future__ import annotations

import gc
import math
import random
import sys
from fractions import Fraction
from itertools import pairwise

import pytest
from scipy.stats import binomtest, norm
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from forklab.experiments.experiment.stats import (
    bin_bounds,
    bin_label,
    holm_adjust,
    mcnemar_exact_p,
    mcnemar_sample_size,
    normal_quantile,
    paired_difference_ci,
    quantile_edges,
    wilson_interval,
)
from tests.reference_stats import reference_newcombe

SEED = 20240611
TOL = 1e-9


def close(a: float, b: float, tol: float = TOL) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def random_table(rng: random.Random, n: int) -> tuple[int, int, int, int]:
    """A random paired table (n11, n10, n01, n00) of total n, sometimes with empty cells."""
    weights = [rng.random() ** 2 for _ in range(4)]
    for i in range(4):
        if rng.random() < 0.2:
            weights[i] = 0.0
    if sum(weights) == 0.0:
        weights[rng.randrange(4)] = 1.0
    cells = [0, 0, 0, 0]
    for index in rng.choices(range(4), weights=weights, k=n):
        cells[index] += 1
    return cells[0], cells[1], cells[2], cells[3]


def random_n(rng: random.Random) -> int:
    return rng.choice([rng.randint(1, 20), rng.randint(1, 200), rng.randint(1, 4000)])


# --------------------------------------------------------------------------- normal quantile


def test_normal_quantile_matches_scipy() -> None:
    rng = random.Random(SEED)
    points = [rng.random() for _ in range(5000)]
    points += [10.0 ** -rng.uniform(1.0, 300.0) for _ in range(2000)]
    points += [1.0 - 10.0 ** -rng.uniform(1.0, 15.5) for _ in range(2000)]
    points += [0.5, 0.025, 0.975, 0.02425, 1 - 0.02425, 0.005, 0.995, 1e-300]
    for p in points:
        if p <= 0.0 or p >= 1.0:
            continue
        ref = float(norm.ppf(p))
        assert math.isclose(normal_quantile(p), ref, rel_tol=1e-12, abs_tol=1e-12), p


def test_normal_quantile_edges_and_symmetry() -> None:
    assert normal_quantile(0.5) == 0.0
    assert normal_quantile(0.0) == -math.inf
    assert normal_quantile(1.0) == math.inf
    for p in (0.25, 0.125, 2.0**-20, 1e-3):  # points where 1 - p is exact
        assert normal_quantile(1.0 - p) == -normal_quantile(p)
    assert math.isfinite(normal_quantile(5e-324))
    for bad in (-0.1, 1.1, math.nan):
        with pytest.raises(ValueError):
            normal_quantile(bad)


# --------------------------------------------------------------------------- McNemar


def test_mcnemar_matches_statsmodels_and_scipy() -> None:
    rng = random.Random(SEED + 1)
    smallest = 1.0
    for _ in range(1200):
        m = random_n(rng)
        lean = min(1.0, max(0.0, rng.gauss(0.5, 0.06)))  # near 0.5: a spread of p-values
        b = sum(rng.random() < lean for _ in range(m))
        c = m - b
        ours = mcnemar_exact_p(b, c)
        ref_sm = float(
            mcnemar([[rng.randint(0, 50), b], [c, rng.randint(0, 50)]], exact=True).pvalue
        )
        ref_sp = binomtest(b, m, 0.5).pvalue
        # Relative agreement, so that far-tail p-values (down to ~1e-100) are checked too.
        assert math.isclose(ours, ref_sm, rel_tol=TOL, abs_tol=1e-300), (b, c, ours, ref_sm)
        assert math.isclose(ours, ref_sp, rel_tol=TOL, abs_tol=1e-300), (b, c, ours, ref_sp)
        smallest = min(smallest, ours)
    assert smallest < 1e-30  # the sample really reached the far tail


def exact_mcnemar(b: int, c: int) -> float:
    """The exact two-sided tail as a big-integer sum over 2**m, correctly rounded."""
    m = b + c
    if m == 0:
        return 1.0
    term = tail = 1
    for i in range(min(b, c)):
        term = term * (m - i) // (i + 1)  # C(m, i + 1)
        tail += term
    return 1.0 if 2 * tail >= 1 << m else 2 * tail / (1 << m)


def test_mcnemar_equals_the_exact_sum_up_to_m_20000() -> None:
    for m in range(0, 60):  # every table, also against exact fractions
        for b in range(m + 1):
            c = m - b
            tail = sum(Fraction(math.comb(m, i), 2**m) for i in range(min(b, c) + 1))
            expected = 1.0 if m == 0 else float(min(Fraction(1), 2 * tail))
            assert math.isclose(mcnemar_exact_p(b, c), expected, rel_tol=1e-12)
            assert mcnemar_exact_p(c, b) == mcnemar_exact_p(b, c)
    rng = random.Random(SEED + 9)
    sizes = [rng.randint(60, 20_000) for _ in range(40)] + [20_000]
    checked = 0
    for m in sizes:
        spread = math.sqrt(m) / 2
        for z in (0.0, 0.5, 1, 2, 3, 5, 8, 13, 21, 34, 55):
            k = int(m / 2 - z * spread)
            if k < 0:
                continue
            exact = exact_mcnemar(k, m - k)
            if exact < sys.float_info.min:
                continue  # below the normal doubles: no relative precision to compare
            assert math.isclose(mcnemar_exact_p(k, m - k), exact, rel_tol=1e-9), (k, m)
            checked += 1
    assert checked > 300


def test_mcnemar_agrees_with_scipy_beyond_the_exact_sums() -> None:
    """Past 20,000 pairs the exact sum is too slow for a test: SciPy's regularised
    incomplete beta is a reference there, to its own precision, which falls with the
    pairs (against 40-digit arithmetic: 1.3e-8 at five million pairs in the tail, 1.1e-6
    at two million near p = 1, where ours is within 1e-14; the next test)."""
    from scipy.special import bdtr

    rng = random.Random(SEED + 13)
    checked = 0
    for _ in range(300):
        m = int(10.0 ** rng.uniform(4.3, 7.0))
        k = int(m / 2 - rng.uniform(0.0, 8.0) * math.sqrt(m) / 2)
        expected = min(1.0, 2.0 * float(bdtr(k, m, 0.5)))
        if expected < sys.float_info.min:
            continue
        assert math.isclose(mcnemar_exact_p(k, m - k), expected, rel_tol=1e-5), (k, m)
        checked += 1
    assert checked > 250


@pytest.mark.parametrize(
    ("k", "m"),
    [(99_000, 200_000), (499_000, 1_000_000), (1_086_400, 2_172_813), (4_997_000, 10**7)],
)
def test_mcnemar_far_beyond_the_exact_sums_against_40_digits(k: int, m: int) -> None:
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    term = mpmath.binomial(m, k) / mpmath.mpf(2) ** m
    total = ratio = mpmath.mpf(1)
    for i in range(k, 0, -1):
        ratio *= mpmath.mpf(i) / (m - i + 1)
        total += ratio
        if ratio < total * mpmath.mpf(10) ** -25:
            break
    assert math.isclose(mcnemar_exact_p(k, m - k), float(2 * term * total), rel_tol=1e-12)


def test_mcnemar_scales_to_millions_of_pairs() -> None:
    # The exact sum would take minutes here; the tail is O(1).
    p = mcnemar_exact_p(4_999_000, 5_001_000)
    assert 0.5 < p < 0.6
    assert mcnemar_exact_p(4_900_000, 5_100_000) == 0.0  # far below the doubles


def test_mcnemar_edge_cases() -> None:
    assert mcnemar_exact_p(0, 0) == 1.0  # no discordant pairs
    assert mcnemar_exact_p(0, 1) == 1.0  # n = 1
    assert mcnemar_exact_p(1, 0) == 1.0
    assert mcnemar_exact_p(0, 2) == 0.5
    assert mcnemar_exact_p(0, 10) == 2.0 / 1024.0  # all discordant one way
    assert mcnemar_exact_p(7, 7) == 1.0
    assert mcnemar_exact_p(3000, 0) == 2.0**-2999  # far tail, still exact
    assert 0.0 < mcnemar_exact_p(2000, 2400) < 1e-4
    with pytest.raises(ValueError):
        mcnemar_exact_p(-1, 3)
    with pytest.raises(TypeError):
        mcnemar_exact_p(1.5, 3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Holm


def test_holm_matches_statsmodels(monkeypatch: pytest.MonkeyPatch) -> None:
    # This statsmodels build runs a full gc.collect() inside every multipletests call
    # (~40 ms each); skipping it changes nothing numerically and keeps the test fast.
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    rng = random.Random(SEED + 2)
    for _ in range(1000):
        m = rng.randint(1, 25)
        ps = [rng.random() ** rng.choice([1, 3, 8]) for _ in range(m)]
        if rng.random() < 0.3:  # ties, zeros and ones
            ps += [ps[0]] * rng.randint(1, 3) + rng.choice([[0.0], [1.0], []])
            rng.shuffle(ps)
        ours = holm_adjust(ps)
        ref = multipletests(ps, method="holm")[1]
        assert len(ours) == len(ps)
        for a, b in zip(ours, ref, strict=True):
            assert close(a, float(b), 1e-12)
        # Monotone in the order of the raw p-values, capped at 1, never below the raw value.
        pairs = sorted(zip(ps, ours, strict=True))
        assert all(lo[1] <= hi[1] for lo, hi in pairwise(pairs))
        assert all(p <= adj <= 1.0 for p, adj in zip(ps, ours, strict=True))


def test_holm_edge_cases() -> None:
    assert holm_adjust([]) == []
    assert holm_adjust([0.03]) == [0.03]
    assert holm_adjust([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm_adjust([0.5, 0.9]) == [1.0, 1.0]
    for bad in ([-0.1], [1.5], [math.nan]):
        with pytest.raises(ValueError):
            holm_adjust(bad)


# --------------------------------------------------------------------------- Wilson


def test_wilson_matches_statsmodels() -> None:
    rng = random.Random(SEED + 3)
    for _ in range(1500):
        n = random_n(rng)
        x = rng.choice([0, n, rng.randint(0, n), rng.randint(0, min(n, 3))])
        level = rng.choice([0.8, 0.9, 0.95, 0.99, 0.999, rng.uniform(0.5, 0.9999)])
        low, high = wilson_interval(x, n, level)
        ref_low, ref_high = proportion_confint(x, n, alpha=1 - level, method="wilson")
        assert close(low, float(ref_low)), (x, n, level)
        assert close(high, float(ref_high)), (x, n, level)
        assert 0.0 <= low <= x / n <= high <= 1.0


def test_wilson_edge_cases() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == 1.0
    low, high = wilson_interval(1, 1)
    assert low == pytest.approx(0.20654931, abs=1e-8) and high == 1.0
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
    with pytest.raises(ValueError):
        wilson_interval(1, 2, confidence=1.0)
    with pytest.raises(ValueError):
        wilson_interval(1, 2, confidence=0.0)


# --------------------------------------------------------------------------- Newcombe


def test_newcombe_matches_independent_reference() -> None:
    rng = random.Random(SEED + 4)
    for _ in range(1500):
        n = random_n(rng)
        table = random_table(rng, n)
        level = rng.choice([0.95, 0.95, 0.9, 0.99, rng.uniform(0.6, 0.999)])
        est, low, high = paired_difference_ci(*table, confidence=level)
        ref = reference_newcombe(*table, level)
        assert close(est, ref[0]) and close(low, ref[1]) and close(high, ref[2]), (table, level)
        assert -1.0 <= low <= est <= high <= 1.0


def test_newcombe_published_examples() -> None:
    # Newcombe (1998) Table II: a=36 both positive, b=12, c=2, d=0; difference (b - c)/n.
    # Newcombe's "first" classification plays the world here: n01 = b, n10 = c.
    est, low, high = paired_difference_ci(n11=36, n10=2, n01=12, n00=0)
    assert est == pytest.approx(0.2)
    assert round(low, 4) == 0.0569 and round(high, 4) == 0.3404
    # Fagerland et al. (2017), Cavo et al. (2012): rows = first, columns = second.
    est, low, high = paired_difference_ci(n11=59, n10=16, n01=6, n00=80)
    assert round(est, 4) == -0.0621
    assert round(low, 4) == -0.1186 and round(high, 4) == -0.0046


def test_newcombe_orientation_and_symmetry() -> None:
    # Rescues raise the world's success rate: positive estimate.
    est, low, high = paired_difference_ci(n11=5, n10=1, n01=9, n00=5)
    assert est == pytest.approx(8 / 20) and low > 0.0
    # Swapping harm and rescue mirrors the interval.
    mirrored = paired_difference_ci(n11=5, n10=9, n01=1, n00=5)
    assert mirrored == pytest.approx((-est, -high, -low), abs=1e-15)


def test_newcombe_edge_cases() -> None:
    assert paired_difference_ci(0, 0, 0, 0) == (0.0, -1.0, 1.0)  # empty table
    # No discordant pairs: estimate 0 but a non-degenerate interval (unlike Wald).
    est, low, high = paired_difference_ci(30, 0, 0, 20)
    assert est == 0.0 and low < 0.0 < high
    # All discordant one way, and zero marginals (phi = 0).
    est, low, high = paired_difference_ci(0, 0, 25, 0)
    assert est == 1.0 and 0.8 < low < 1.0 and high == pytest.approx(1.0)
    est, low, high = paired_difference_ci(0, 25, 0, 0)
    assert est == -1.0 and low == pytest.approx(-1.0) and -1.0 < high < -0.8
    # n = 1, each cell.
    for table in ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1)):
        est, low, high = paired_difference_ci(*table)
        ref = reference_newcombe(*table, 0.95)
        assert (est, low, high) == pytest.approx(ref, abs=1e-12)
        assert -1.0 <= low <= est <= high <= 1.0
    with pytest.raises(ValueError):
        paired_difference_ci(1, -1, 0, 0)
    with pytest.raises(ValueError):
        paired_difference_ci(1, 1, 1, 1, confidence=95)


def test_newcombe_phi_adjustment_is_applied() -> None:
    # A = 59*80 - 6*16 = 4624 > n/2: the adjustment shifts phi and so the limits.
    plain_phi = (59 * 80 - 6 * 16) / math.sqrt(65 * 96 * 75 * 86)
    assert plain_phi > 0.0
    _, low, _ = paired_difference_ci(n11=59, n10=16, n01=6, n00=80)
    assert round(low, 4) != -0.1174  # the plain-phi value
    # 0 <= A <= n/2 sets phi to 0: equals the independence (phi = 0) square-and-add result.
    table = (1, 1, 1, 2)  # A = 1, n/2 = 2.5
    est, low, high = paired_difference_ci(*table)
    l1, u1 = wilson_interval(2, 5)
    l2, u2 = wilson_interval(2, 5)
    assert low == pytest.approx(est - math.hypot(0.4 - l1, u2 - 0.4), abs=1e-15)
    assert high == pytest.approx(est + math.hypot(u1 - 0.4, 0.4 - l2), abs=1e-15)


# --------------------------------------------------------------------------- sample size


def test_sample_size_matches_scipy() -> None:
    rng = random.Random(SEED + 5)
    for _ in range(1000):
        p10 = rng.uniform(0.0, 0.5)
        p01 = rng.uniform(0.0, 0.5)
        alpha = rng.choice([0.05, 0.01, 0.1, rng.uniform(0.001, 0.2)])
        power = rng.choice([0.8, 0.9, rng.uniform(0.5, 0.99)])
        psi, delta = p10 + p01, p10 - p01
        raw = (
            norm.ppf(1 - alpha / 2) * math.sqrt(psi) + norm.ppf(power) * math.sqrt(psi - delta**2)
        ) ** 2 / delta**2
        ours = mcnemar_sample_size(p10, p01, alpha, power)
        assert ours is not None
        if abs(raw - round(raw)) < 1e-6:  # float noise at an exact integer
            assert ours in (max(1, round(raw)), round(raw) + 1)
        else:
            assert ours == max(1, math.ceil(raw)), (p10, p01, alpha, power, raw)
        assert mcnemar_sample_size(p01, p10, alpha, power) == ours  # direction-free


def test_sample_size_examples_and_edges() -> None:
    # psi = 0.3, delta = 0.2: (1.95996 * sqrt(0.3) + 0.84162 * sqrt(0.26))^2 / 0.04 = 56.45.
    assert mcnemar_sample_size(0.25, 0.05) == 57
    assert mcnemar_sample_size(0.1, 0.1) is None  # no effect to detect
    assert mcnemar_sample_size(0.0, 0.0) is None
    assert mcnemar_sample_size(0.25, 0.05, power=0.9) > 57  # type: ignore[operator]
    # Every pair discordant one way: psi = delta = 1, so n = z^2 = 3.84 -> 4 (asymptotic).
    assert mcnemar_sample_size(1.0, 0.0) == 4
    for args in ((-0.1, 0.1), (0.6, 0.5), (0.1, 0.2, 0.0), (0.1, 0.2, 0.05, 1.0)):
        with pytest.raises(ValueError):
            mcnemar_sample_size(*args)


# --------------------------------------------------------------------------- binning


def brute_force_edges(values: list[float], bins: int) -> list[float]:
    """Definition check: smallest x with F_n(x) > i/bins, deduplicated, above the minimum."""
    n = len(values)
    out: list[float] = []
    for i in range(1, bins):
        level = Fraction(i, bins)
        edge = min(x for x in values if Fraction(sum(v <= x for v in values), n) > level)
        if edge > min(values) and edge not in out:
            out.append(edge)
    return out


def test_quantile_edges_definition() -> None:
    rng = random.Random(SEED + 6)
    for _ in range(300):
        n = rng.randint(1, 60)
        if rng.random() < 0.5:
            values = [float(rng.randint(0, rng.randint(0, 6))) for _ in range(n)]
        else:
            values = [round(rng.gauss(0, 10), 3) for _ in range(n)]
        bins = rng.randint(1, 8)
        edges = quantile_edges(values, bins)
        assert edges == brute_force_edges(values, bins)
        assert all(a < b for a, b in pairwise(edges))
        assert len(edges) <= bins - 1
        shuffled = values[:]
        rng.shuffle(shuffled)
        assert quantile_edges(shuffled, bins) == edges  # order-independent


def test_quantile_edges_balanced_without_ties() -> None:
    values = [float(v) for v in range(1, 11)]
    assert quantile_edges(values, 2) == [6.0]
    assert quantile_edges(values, 4) == [3.0, 6.0, 8.0]
    assert quantile_edges(values, 20) == values[1:]  # more bins than values: each value
    counts: dict[str, int] = {}
    for v in values:
        label = bin_label(v, [3.0, 6.0, 8.0])
        counts[label] = counts.get(label, 0) + 1
    assert counts == {"(-inf, 3)": 2, "[3, 6)": 3, "[6, 8)": 2, "[8, inf)": 3}


def test_quantile_edges_edge_cases() -> None:
    assert quantile_edges([], 4) == []
    assert quantile_edges([3.0, 3.0, 3.0], 4) == []  # a single bin
    assert quantile_edges([1.0, 2.0], 1) == []
    # 80% zeros: candidates equal to the minimum are dropped instead of giving empty bins.
    assert quantile_edges([0.0] * 8 + [1.0, 2.0], 4) == []
    assert quantile_edges([0.0] * 8 + [1.0, 2.0], 5) == [1.0]
    assert quantile_edges([0.0] * 8 + [1.0, 2.0], 10) == [1.0, 2.0]
    for bad in (0, -1):
        with pytest.raises(ValueError):
            quantile_edges([1.0], bad)
    with pytest.raises(ValueError):
        quantile_edges([1.0, math.nan], 2)
    with pytest.raises(ValueError):
        quantile_edges([1.0, math.inf], 2)


def test_bin_bounds_and_labels() -> None:
    edges = [2.0, 5.0, 9.0]
    assert bin_bounds(3.0, edges) == (2.0, 5.0)
    assert bin_label(3.0, edges) == "[2, 5)"
    assert bin_bounds(2.0, edges) == (2.0, 5.0)  # low inclusive
    assert bin_bounds(5.0, edges) == (5.0, 9.0)  # high exclusive
    assert bin_bounds(-7.0, edges) == (-math.inf, 2.0)
    assert bin_label(-7.0, edges) == "(-inf, 2)"
    assert bin_bounds(1e9, edges) == (9.0, math.inf)
    assert bin_label(9.0, edges) == "[9, inf)"
    assert bin_label(0.15, [0.1, 0.25]) == "[0.1, 0.25)"
    assert bin_bounds(4.0, []) == (-math.inf, math.inf)
    assert bin_label(4.0, []) == "(-inf, inf)"
    with pytest.raises(ValueError):
        bin_bounds(1.0, [3.0, 2.0])
    with pytest.raises(ValueError):
        bin_bounds(math.nan, edges)


def test_bin_bounds_make_exact_guard_rules() -> None:
    rng = random.Random(SEED + 7)
    values = [round(rng.lognormvariate(1.0, 1.0), 2) for _ in range(500)]
    edges = quantile_edges(values, 5)
    for v in values:
        low, high = bin_bounds(v, edges)
        rule = {"ge": low, "lt": high}
        selected = [w for w in values if rule["ge"] <= w < rule["lt"]]
        assert v in selected
        assert {bin_label(w, edges) for w in selected} == {bin_label(v, edges)}
