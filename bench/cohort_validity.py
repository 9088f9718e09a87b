"""Validity of a cohort experiment's verdicts, by simulation.

Each simulated experiment is a cohort of ``--runs`` recorded runs forked ``--forks``
times into a baseline and one other world. Run i succeeds per fork with a latent
probability ``p_i``: half the runs are "failed last week" (p ~ Beta(2, 5)), half "went
fine" (p ~ Beta(5, 2)), so the cohort mixes both as a real one does. Fork f of both
worlds either draws the same uniform (``coupled``: the per-call seeds line up and the
model honours them) or independent ones (``independent``: a provider that ignores
``seed``, the harder case for the noise floor).

- **A/A** (the world *is* the baseline): the share of experiments whose verdict is a
  win (``rescues``) must be at most α plus the Monte-Carlo error, and the share with any
  verdict beyond the noise floor (win or harm) at most α plus it;
- **known effect**: the world raises each run's success probability by ``--effect``
  (capped at 1); the observed share of wins must match ``rate_test_power``, the plan's
  estimate from the same ``p_i``, within 5 points (plus the Monte-Carlo error).

The ratio columns compare with the nominal figure measured in the same run (α, the
plan's power). Usage: ``python bench/cohort_validity.py [--experiments 1000]``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import numpy as np

from forklab.experiments.cohort.noise import (
    CohortVerdict,
    judge_worlds,
)
from forklab.experiments.cohort.power import Coupling, rate_test_power
from forklab.experiments.experiment.spec import Direction, Role


def _cohort(rng: np.random.Generator, runs: int) -> np.ndarray:
    failed = runs // 2
    return np.concatenate([rng.beta(2, 5, failed), rng.beta(5, 2, runs - failed)])


def _simulate(
    rng: np.random.Generator,
    runs: int,
    forks: int,
    effect: float,
    coupling: Coupling,
    alpha: float,
) -> tuple[CohortVerdict, float]:
    p = _cohort(rng, runs)
    pw = np.minimum(p + effect, 1.0)
    u = rng.random((runs, forks))
    uw = u if coupling is Coupling.common else rng.random((runs, forks))
    base = u < p[:, None]
    world = uw < pw[:, None]
    _, (judged,) = judge_worlds(
        base, {"world": (Role.treatment, Direction.decrease, world)}, alpha=alpha
    )
    return judged.verdict, rate_test_power(p, pw, forks, alpha, coupling)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--forks", type=int, default=3)
    parser.add_argument(
        "--effects", default="0.03,0.12", help="comma-separated known effects to simulate"
    )
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    n, alpha = args.experiments, args.alpha
    mc_alpha = 3 * math.sqrt(alpha * (1 - alpha) / n)
    load = os.getloadavg()
    print(
        f"Run: {n} experiments per row, {args.runs} runs x k = {args.forks}, alpha {alpha}, "
        f"effects +{args.effects}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        "| scenario | forks | wins | beyond floor | bound | planned power | ratio | ms/exp | ok |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    all_ok = True
    effects = [0.0, *(float(e) for e in args.effects.split(","))]
    for effect in effects:
        for coupling in (Coupling.common, Coupling.independent):
            rng = np.random.default_rng([args.seed, int(effect * 1000), len(coupling.value)])
            started = time.perf_counter()
            verdicts: list[CohortVerdict] = []
            planned: list[float] = []
            for _ in range(n):
                verdict, power = _simulate(rng, args.runs, args.forks, effect, coupling, alpha)
                verdicts.append(verdict)
                planned.append(power)
            ms = (time.perf_counter() - started) * 1000 / n
            wins = sum(v is CohortVerdict.rescues for v in verdicts) / n
            beyond = sum(v is not CohortVerdict.inside_noise_floor for v in verdicts) / n
            if effect == 0.0:
                bound = alpha + mc_alpha
                ok = wins <= bound and beyond <= bound
                ratio = f"{beyond / alpha:.2f}x alpha"
                row = (
                    f"| A/A | {coupling.value} | {wins:.3f} | {beyond:.3f} | <= {bound:.3f} "
                    f"| - | {ratio} | {ms:.2f} | {'yes' if ok else 'NO'} |"
                )
            else:
                plan = float(np.mean(planned))
                mc = 3 * math.sqrt(plan * (1 - plan) / n)
                ok = abs(wins - plan) <= 0.05 + mc
                row = (
                    f"| +{effect} | {coupling.value} | {wins:.3f} | {beyond:.3f} "
                    f"| {plan:.3f} ± {0.05 + mc:.3f} | {plan:.3f} | {wins / plan:.2f}x plan "
                    f"| {ms:.2f} | {'yes' if ok else 'NO'} |"
                )
            all_ok &= ok
            print(row, flush=True)
    print(f"Result: all within bounds: {all_ok}")


if __name__ == "__main__":
    main()
