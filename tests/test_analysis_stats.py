"""The report's statistics, computed through the comparison code, against scipy/statsmodels.

Every table here is built from per-episode outcome columns (as the engine produces them)
and goes through ``paired_table`` / ``paired_effect`` / ``comparison_rows``, so the test
covers the orientation (which cell is a harm) as well as the arithmetic.
"""

from __future__ import annotations

import math
import random

import pytest
from scipy.stats import norm
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from forklab.activities.experiment.twin import twin_held_out
from forklab.experiments.experiment.analysis.build import build_report, comparison_rows
from forklab.experiments.experiment.analysis.pairs import paired_effect, paired_table
from forklab.experiments.experiment.analysis.power import power_row
from forklab.experiments.experiment.analysis.slices import dimensions
from forklab.experiments.experiment.outcomes import ExperimentOutcomes, WorldOutcomes
from forklab.experiments.experiment.spec import Direction, parse_spec
from tests.reference_stats import reference_newcombe

TOL = 1e-9


def _columns(n11: int, n10: int, n01: int, n00: int, rng: random.Random) -> tuple[list[bool], ...]:
    pairs = [(True, True)] * n11 + [(True, False)] * n10 + [(False, True)] * n01
    pairs += [(False, False)] * n00
    rng.shuffle(pairs)
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _tables(count: int) -> list[tuple[int, int, int, int]]:
    rng = random.Random(20261129)
    edge = [
        (0, 0, 0, 1),  # tiny n
        (1, 0, 0, 0),
        (0, 1, 0, 0),
        (0, 0, 1, 0),
        (5, 0, 0, 5),  # no discordant pairs
        (0, 7, 0, 0),  # all one way
        (3, 0, 9, 2),
        (40, 0, 0, 0),
        (0, 0, 0, 40),
        (0, 12, 12, 0),  # balanced discordance, no concordance
    ]
    tables = list(edge)
    while len(tables) < count:
        n = rng.choice([2, 3, 5, 10, 30, 100, 300, 1000])
        cuts = sorted(rng.randint(0, n) for _ in range(3))
        tables.append((cuts[0], cuts[1] - cuts[0], cuts[2] - cuts[1], n - cuts[2]))
    return tables


@pytest.mark.parametrize("chunk", range(4))
def test_paired_effect_matches_statsmodels_on_random_tables(chunk: int) -> None:
    rng = random.Random(chunk)
    tables = _tables(1200)[chunk::4]
    for n11, n10, n01, n00 in tables:
        ref, world = _columns(n11, n10, n01, n00, rng)
        effect = paired_effect(paired_table(ref, world))
        assert (effect.harm, effect.rescue) == (n10, n01)
        expected_p = mcnemar([[n11, n10], [n01, n00]], exact=True).pvalue
        assert effect.mcnemar_p == pytest.approx(expected_p, abs=TOL, rel=TOL)
        d, low, high = reference_newcombe(n11, n10, n01, n00)
        assert effect.difference == pytest.approx(d, abs=TOL)
        assert effect.ci_low == pytest.approx(low, abs=TOL)
        assert effect.ci_high == pytest.approx(high, abs=TOL)


def _spec(worlds: int) -> str:
    names = [f"w{i}" for i in range(worlds)]
    lines = "\n".join(
        f"  - {{name: {n}, role: treatment, intervention: {{name: refresh}}}}" for n in names
    )
    return (
        "id: synthetic\nhypothesis: {text: t}\nseed: 0\nepisodes: 60\n"
        "workload: {name: counter-recovery}\nworlds:\n  - {name: baseline, role: baseline}\n"
        f"{lines}\n"
    )


def test_comparison_rows_holm_and_wilson_match_statsmodels() -> None:
    """Whole experiments of random worlds: each row's p, CI, Holm p and Wilson limits."""
    rng = random.Random(7)
    for _ in range(60):
        k = rng.randint(1, 6)
        n = rng.choice([1, 4, 25, 60])
        spec = parse_spec(_spec(k).replace("episodes: 60", f"episodes: {n}"), "synthetic")
        columns = {w.name: [rng.random() < rng.random() for _ in range(n)] for w in spec.worlds}
        out = ExperimentOutcomes(
            episodes=list(range(n)),
            requested=[3] * n,
            resolved=[3] * n,
            checkpoints=["c"] * n,
            features=[{"x": rng.randint(0, 9), "flag": rng.random() < 0.5} for _ in range(n)],
            worlds=[
                WorldOutcomes(
                    name=name,
                    outcomes=col,
                    intervened=[True] * n,
                    shocks=["s"] * n,
                    inherited=["c"] * n,
                    code_digest="d",
                    snapshot="s",
                )
                for name, col in columns.items()
            ],
        )
        rows = comparison_rows(spec, out, dimensions(out.features, 4))
        assert [r.world for r in rows] == [f"w{i}" for i in range(k)]  # nothing to skip
        raw = [r.mcnemar_p for r in rows]
        expected_holm = multipletests(raw, method="holm")[1]
        base = columns["baseline"]
        for row, holm_p in zip(rows, expected_holm, strict=True):
            world = columns[row.world]
            t = [[0, 0], [0, 0]]
            for b, w in zip(base, world, strict=True):
                t[0 if b else 1][0 if w else 1] += 1
            assert row.mcnemar_p == pytest.approx(mcnemar(t, exact=True).pvalue, abs=TOL, rel=TOL)
            assert row.holm_p == pytest.approx(float(holm_p), abs=TOL, rel=TOL)
            d, low, high = reference_newcombe(t[0][0], t[0][1], t[1][0], t[1][1])
            assert (row.difference, row.ci_low, row.ci_high) == pytest.approx(
                (d, low, high), abs=TOL
            )
            assert row.slice_effects
            for s in row.slice_effects:
                assert s.n == s.rescue + s.harm + s.unchanged
                assert s.ci_low <= s.difference <= s.ci_high
        # the guard in build_report runs counter-recovery, so give it that workload's feature
        feats = [{"obs_repeated": f["flag"]} for f in out.features]
        worlds = build_report(
            spec, out.model_copy(update={"features": feats}), "d", held_out=twin_held_out(1)
        ).worlds
        assert [w.name for w in worlds] == list(columns)
        for w in worlds:
            failures = n - sum(columns[w.name])
            low, high = proportion_confint(failures, n, alpha=0.05, method="wilson")
            assert (w.failures, w.episodes) == (failures, n)
            assert (w.failure_ci_low, w.failure_ci_high) == pytest.approx((low, high), abs=TOL)


def test_world_failure_intervals_are_wilson() -> None:
    rng = random.Random(3)
    spec = parse_spec(_spec(2), "synthetic")
    n = spec.episodes
    out = ExperimentOutcomes(
        episodes=list(range(n)),
        requested=[3] * n,
        resolved=[3] * n,
        checkpoints=["c"] * n,
        features=[{"obs_repeated": rng.random() < 0.5} for _ in range(n)],
        worlds=[
            WorldOutcomes(
                name=w.name,
                outcomes=[rng.random() < 0.6 for _ in range(n)],
                intervened=[True] * n,
                shocks=["s"] * n,
                inherited=["c"] * n,
                code_digest="d",
                snapshot="s",
            )
            for w in spec.worlds
        ],
    )
    report = build_report(spec, out, "d", held_out=twin_held_out(1))
    assert [row.name for row in report.worlds] == ["baseline", "w0", "w1"]
    for row in report.worlds:
        low, high = proportion_confint(row.failures, row.episodes, alpha=0.05, method="wilson")
        assert (row.failure_ci_low, row.failure_ci_high) == pytest.approx((low, high), abs=TOL)


@pytest.mark.parametrize(
    ("harm", "rescue", "n"), [(83, 75, 300), (5, 0, 20), (0, 58, 160), (2, 58, 160), (1, 2, 160)]
)
def test_power_row_matches_connor_formula(harm: int, rescue: int, n: int) -> None:
    row = power_row("w", "baseline", Direction.decrease, harm, rescue, n, 0.05, 0.8)
    p10, p01 = harm / n, rescue / n
    psi, delta = p10 + p01, p10 - p01
    root = norm.ppf(0.975) * math.sqrt(psi) + norm.ppf(0.8) * math.sqrt(psi - delta**2)
    assert row.needed == math.ceil(root**2 / delta**2 - 1e-9)
    assert row.underpowered == (row.needed > n)
