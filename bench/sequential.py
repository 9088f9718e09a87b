"""Proof by simulation: the sequential design against the fixed design on the same episodes.

Each scenario is a pool of per-episode outcomes in every world: the twin's rehearsal of a
shipped spec at many episodes (retry-cascade, counter-recovery), or a drawn two-world
workload with a small effect sized for 80 % power (where sequential saves least). One
simulated experiment draws the spec's episodes (its budget, N) from the pool with
replacement, so a world's pairs with the baseline keep their real joint distribution, and
runs both designs on *the same* episodes:

- fixed: every world runs all N episodes; a world rejects when the exact McNemar p < α;
- sequential: ``forklab.experiments.experiment.sequential.decide`` — the shipped code —
  on the cumulative rescues and harms at each wave end; the baseline runs while any world
  runs, the placebo until its first discordant pair, the positive control until it crosses.

Under the **null** every world's pairs are made exchangeable (each episode's pair is
swapped with probability ½, which keeps the discordance rate and removes the effect), and
the type I error is the share of worlds that reject; its Monte-Carlo bound is
``α + 1.96·√(α(1−α)/count)``. Under the **alternative** (the pool as it is) it reports the
power of each design (rejections in the true direction, over worlds whose pool effect is
not zero), the agreement of verdicts (reject up / reject down / no rejection) per world
and experiment, and the compute: world-episodes, the twin's unit of world-seconds (it
charges every world-episode the same), as the median over experiments of the
sequential design's share of the fixed design's.

Usage: ``python bench/sequential.py [--experiments 2000] [--repeats 3]``; prints each
configuration's figures per repeat (different seeds), then the spread, and the load.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import yaml
from scipy.special import bdtr

from forklab.activities.experiment.twin import rehearse_outcomes
from forklab.experiments.experiment.sequential import Design, Rule, decide, make_design, rule_of
from forklab.experiments.experiment.spec import ExperimentSpec, Role, Sequential, Spending
from forklab.experiments.experiment.spec import parse_spec as parse
from forklab.experiments.experiment.stats import mcnemar_sample_size

ROOT = Path(__file__).resolve().parent.parent
Bools = npt.NDArray[np.bool_]


@dataclass
class Scenario:
    name: str
    episodes: int  # the budget N of one experiment
    pool: Bools  # (pool episodes, worlds), column 0 the baseline
    rules: list[Rule]  # per non-baseline world
    roles: list[Role]


def _rehearsed(spec_file: str, pool: int) -> Scenario:
    data = yaml.safe_load((ROOT / "forklab" / "workloads" / spec_file).read_text())
    budget = int(data["episodes"])
    data["episodes"] = pool
    spec: ExperimentSpec = parse(yaml.safe_dump(data), spec_file)
    out = rehearse_outcomes(spec, "bench", processes=None)
    base = spec.baseline.name
    names = [base] + [w.name for w in spec.worlds if w.name != base]
    cols = np.stack([np.asarray(out.world(n).outcomes, dtype=bool) for n in names], axis=1)
    worlds = [w for w in spec.worlds if w.name != base]
    return Scenario(
        name=f"{data['id']} (N={budget})",
        episodes=budget,
        pool=cols,
        rules=[rule_of(spec, w.name, w.role) for w in worlds],
        roles=[w.role for w in worlds],
    )


def _small_effect(pool: int, rng: np.random.Generator) -> Scenario:
    """Baseline failure 30 %; the treatment rescues 5 % and harms 2.5 % of episodes; N is
    the exact McNemar sample size for 80 % power at α = 0.05."""
    rescue, harm = 0.05, 0.025
    n = mcnemar_sample_size(harm, rescue, 0.05, 0.8)
    assert n is not None
    base = rng.random(pool) >= 0.3
    u = rng.random(pool)
    world = base.copy()
    fail = np.flatnonzero(~base)
    ok = np.flatnonzero(base)
    world[fail] = u[fail] < rescue / 0.3
    world[ok] = ~(u[ok] < harm / 0.7)
    return Scenario(
        name=f"small effect (N={n}, 80 % power)",
        episodes=n,
        pool=np.stack([base, world], axis=1),
        rules=[Rule.treatment],
        roles=[Role.treatment],
    )


def _fixed_reject(
    rescue: npt.NDArray[np.int64], harm: npt.NDArray[np.int64], alpha: float
) -> npt.NDArray[np.int64]:
    """Exact McNemar at N: +1 / −1 for a rejection with fewer / more failures, else 0."""
    m = rescue + harm
    p = np.minimum(1.0, 2.0 * bdtr(np.minimum(rescue, harm), np.maximum(m, 1), 0.5))
    p = np.where(m == 0, 1.0, p)
    return np.asarray(np.where(p < alpha, np.sign(rescue - harm), 0), dtype=np.int64)


@dataclass
class Figures:
    type1: float
    type1_fixed: float
    type1_count: int
    power_fixed: float
    power_seq: float
    worst_power_gap: float
    agreement: float
    median_share: float
    null_median_share: float


def simulate(sc: Scenario, design: Design, experiments: int, rng: np.random.Generator) -> Figures:
    ends = np.array(design.wave_ends) - 1
    n_worlds = sc.pool.shape[1] - 1
    pool_r = (~sc.pool[:, :1] & sc.pool[:, 1:]).mean(axis=0)
    pool_h = (sc.pool[:, :1] & ~sc.pool[:, 1:]).mean(axis=0)
    truth = np.sign(pool_r - pool_h)
    idx = rng.integers(0, sc.pool.shape[0], size=(experiments, sc.episodes))
    draws = sc.pool[idx]  # (experiments, N, worlds)
    base, worlds = draws[:, :, :1], draws[:, :, 1:]
    pair = (~base & worlds).astype(np.int8) - (base & ~worlds).astype(np.int8)  # +1 rescue
    flips = np.where(rng.random(pair.shape) < 0.5, -1, 1).astype(np.int8)
    out = {}
    for label, signed in (("alt", pair), ("null", pair * flips)):
        rescue = np.cumsum(signed == 1, axis=1)
        harm = np.cumsum(signed == -1, axis=1)
        used = np.zeros((experiments, n_worlds), dtype=np.int64)
        seq_dir = np.zeros((experiments, n_worlds), dtype=np.int64)
        fix_dir = np.zeros((experiments, n_worlds), dtype=np.int64)
        for j in range(n_worlds):
            r_k, h_k = rescue[:, ends, j], harm[:, ends, j]
            at, why = decide(design, r_k, h_k, sc.rules[j])
            used[:, j] = np.array(design.wave_ends)[at]
            rows = np.arange(experiments)
            crossed = why == 1  # Stop.efficacy
            seq_dir[:, j] = np.where(crossed, np.sign(r_k[rows, at] - h_k[rows, at]), 0)
            fix_dir[:, j] = _fixed_reject(rescue[:, -1, j], harm[:, -1, j], design.alpha)
        total = used.sum(axis=1) + used.max(axis=1)  # the baseline runs the longest
        share = total / (sc.episodes * (n_worlds + 1))
        out[label] = (seq_dir, fix_dir, share)
    seq_a, fix_a, share_a = out["alt"]
    seq_n, fix_n, share_n = out["null"]
    tested = [j for j, r in enumerate(sc.rules) if r is not Rule.placebo]
    type1 = float(np.mean(seq_n[:, tested] != 0))
    effect = [j for j in tested if truth[j] != 0]
    gaps, p_fix, p_seq = [], [], []
    for j in effect:
        pf = float(np.mean(fix_a[:, j] == truth[j]))
        ps = float(np.mean(seq_a[:, j] == truth[j]))
        p_fix.append(pf)
        p_seq.append(ps)
        gaps.append(pf - ps)
    return Figures(
        type1=type1,
        type1_fixed=float(np.mean(fix_n[:, tested] != 0)),
        type1_count=experiments * len(tested),
        power_fixed=float(np.mean(p_fix)) if p_fix else float("nan"),
        power_seq=float(np.mean(p_seq)) if p_seq else float("nan"),
        worst_power_gap=max(gaps) if gaps else 0.0,
        agreement=float(np.mean(seq_a[:, tested] == fix_a[:, tested])),
        median_share=float(np.median(share_a)),
        null_median_share=float(np.median(share_n)),
    )


#: The spec's defaults first, then what each departure from them costs or saves.
CONFIGS = {
    "default (OBF, 8 looks, futility 0.005)": Sequential(),
    "OBF, 8 looks, futility 0.01": Sequential(futility=0.01),
    "OBF, 5 looks, no futility": Sequential(looks=5, futility=0.0),
    "Pocock, 5 looks, no futility": Sequential(looks=5, futility=0.0, spending=Spending.pocock),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.05)
    args = ap.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(20261203)
    scenarios = [
        _rehearsed("retry-cascade.yaml", 4000),
        _rehearsed("recovery-counter.yaml", 20000),
        _small_effect(200_000, rng),
    ]
    mc = 1.96 * np.sqrt(args.alpha * (1 - args.alpha))
    print(f"load average before: {os.getloadavg()}; cores: {os.cpu_count()}")
    print(
        "| scenario | design | type I seq (fixed; bound) | power fixed → seq (worst gap) "
        "| agreement | median compute (alt) | median compute (null) |"
    )
    print("|---|---|---|---|---|---|---|")
    for sc in scenarios:
        for label, seq in CONFIGS.items():
            design = make_design(seq, sc.episodes, args.alpha)
            runs = [
                simulate(sc, design, args.experiments, np.random.default_rng(1000 * r + 7))
                for r in range(args.repeats)
            ]

            def cell(get: Callable[[Figures], float], fmt: str, runs: list[Figures] = runs) -> str:
                values = [get(f) for f in runs]
                spread = max(values) - min(values)
                return f"{fmt.format(float(np.mean(values)))} ±{fmt.format(spread / 2)}"

            bound = args.alpha + mc / np.sqrt(runs[0].type1_count)
            print(
                f"| {sc.name} | {label} | {cell(lambda f: f.type1, '{:.4f}')} "
                f"({runs[0].type1_fixed:.4f}; {bound:.4f}) "
                f"| {cell(lambda f: f.power_fixed, '{:.3f}')} → "
                f"{cell(lambda f: f.power_seq, '{:.3f}')} "
                f"({cell(lambda f: f.worst_power_gap, '{:+.3f}')}) "
                f"| {cell(lambda f: f.agreement, '{:.3f}')} "
                f"| {cell(lambda f: f.median_share, '{:.1%}')} "
                f"| {cell(lambda f: f.null_median_share, '{:.1%}')} |"
            )
    print(
        f"\n{args.repeats} repeats × {args.experiments} experiments per row (mean ±half-range); "
        f"{time.perf_counter() - started:.0f} s; load average after: {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
