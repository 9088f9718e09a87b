"""The noise floor of a stochastic agent, and paired per-run statistics judged against it.

Each run of the cohort is forked ``k`` times per world; outcome ``[run, fork]`` is True
for a success. Three views of a world against the baseline, all paired by run:

- **rates**: per run, the world's successes minus the baseline's over the k forks
  (an integer ``x_i`` in ``[-k, k]``). The test is the exact paired permutation (sign-flip)
  test of their sum: under "the world changes nothing" the two worlds' forks of a run are
  exchangeable, so each ``x_i`` is as likely to be ``-x_i``. Its null distribution is
  worked out exactly by convolution over the runs (no sampling; O(runs x k x runs)).
- **majorities**: per run, whether most of its k forks succeeded, in each world; rescues
  (baseline majority failed, world's succeeded) and harms, exact McNemar and Newcombe's
  paired interval (``forklab.experiments.experiment.stats``).
- **the noise floor**: the A/A flip rate, the probability that two independent baseline
  forks of the same run disagree, estimated without bias from all pairs of the k baseline
  forks of each run (``2 s (k - s) / (k (k - 1))``) and averaged over runs, with a Wilson
  interval on the runs (conservative: the per-run average varies less than one flip).

A world is a win (or a harm) only when its rate test, Holm-adjusted across the worlds,
rejects at α: its paired difference is larger than what the baseline's own forks differ
by. Otherwise its effect is *inside the noise floor*, and the report says so with the
rescues and harms it saw next to the A/A flip rate: never a win. The derivations are in
docs/agent-experiments.md and docs/analysis.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import StrEnum

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel

from forklab.experiments.experiment.spec import Direction, Role
from forklab.experiments.experiment.stats import (
    holm_adjust,
    mcnemar_exact_p,
    normal_quantile,
    paired_difference_ci,
)

Outcomes = npt.NDArray[np.bool_]
#: The exact null distribution spans -total..total; beyond this (a million runs x 10
#: forks) its array would not fit a worker, and no cohort comes near it.
MAX_SIGNED_SUM = 10_000_000


def _matrix(name: str, outcomes: Outcomes | Sequence[Sequence[bool]]) -> Outcomes:
    m = np.asarray(outcomes, dtype=np.bool_)
    if m.ndim != 2 or m.shape[0] == 0 or m.shape[1] == 0:
        raise ValueError(f"{name} must be a runs x forks matrix of outcomes, got shape {m.shape}")
    return m


def _wilson(x: float, n: int, confidence: float) -> tuple[float, float]:
    """Wilson's interval for a (possibly fractional) count ``x`` of ``n``."""
    z = -normal_quantile((1.0 - confidence) / 2.0)
    z2 = z * z
    spread = z * math.sqrt(max(0.0, z2 + 4.0 * x * (n - x) / n))
    low = (2.0 * x + z2 - spread) / (2.0 * (n + z2))
    high = (2.0 * x + z2 + spread) / (2.0 * (n + z2))
    return max(0.0, low if x > 0 else 0.0), min(1.0, high if x < n else 1.0)


class NoiseFloor(BaseModel):
    """The A/A flip rate of the baseline world, with its interval."""

    flip_rate: float
    ci_low: float
    ci_high: float
    runs: int
    forks: int


def noise_floor(
    baseline: Outcomes | Sequence[Sequence[bool]], confidence: float = 0.95
) -> NoiseFloor:
    """The probability that two independent baseline forks of a run disagree."""
    m = _matrix("baseline", baseline)
    runs, k = m.shape
    if k < 2:
        raise ValueError("the noise floor needs at least two baseline forks per run")
    s = m.sum(axis=1).astype(np.float64)
    per_run = 2.0 * s * (k - s) / (k * (k - 1))
    rate = float(per_run.mean())
    low, high = _wilson(rate * runs, runs, confidence)
    return NoiseFloor(flip_rate=rate, ci_low=low, ci_high=high, runs=runs, forks=k)


def sign_flip_p(differences: Sequence[int] | npt.NDArray[np.int64]) -> float:
    """Exact two-sided p-value of the paired permutation test of ``sum(differences)``.

    Under the null each integer difference keeps or flips its sign with probability ½;
    the distribution of the signed sum is the convolution of those two-point laws, built
    run by run over the integer range. ``P(|T| >= |t|)``, 1 when every difference is 0.
    """
    x = np.abs(np.asarray(differences, dtype=np.int64))
    observed = abs(int(np.asarray(differences, dtype=np.int64).sum()))
    x = x[x > 0]
    if x.size == 0:
        return 1.0
    total = int(x.sum())
    if total > MAX_SIGNED_SUM:
        raise ValueError(
            f"the differences sum to {total} in absolute value, over {MAX_SIGNED_SUM}: "
            "they are counts of forks (at most runs x k), not arbitrary integers"
        )
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0
    for v in x.tolist():
        shifted = np.zeros_like(dist)
        shifted[v:] += dist[:-v]
        shifted[:-v] += dist[v:]
        dist = 0.5 * shifted
    sums = np.arange(-total, total + 1)
    return float(min(1.0, dist[np.abs(sums) >= observed].sum()))


class RateComparison(BaseModel):
    """A world against the baseline, paired by run (rates over k forks and majorities)."""

    runs: int
    forks: int
    #: mean per-run success rate difference (world minus baseline), with a normal interval
    rate_difference: float
    rate_ci_low: float
    rate_ci_high: float
    rate_p: float
    #: majority view: runs rescued, harmed, unchanged
    rescues: int
    harms: int
    unchanged: int
    mcnemar_p: float
    majority_difference: float
    majority_ci_low: float
    majority_ci_high: float
    #: runs whose success rate over the k forks rose / fell
    runs_up: int
    runs_down: int


def compare_rates(
    baseline: Outcomes | Sequence[Sequence[bool]],
    world: Outcomes | Sequence[Sequence[bool]],
    confidence: float = 0.95,
) -> RateComparison:
    b = _matrix("baseline", baseline)
    w = _matrix("world", world)
    if b.shape != w.shape:
        raise ValueError(
            f"the world's outcomes {w.shape} do not pair with the baseline's {b.shape}"
        )
    runs, k = b.shape
    x = w.sum(axis=1).astype(np.int64) - b.sum(axis=1).astype(np.int64)
    d = x / k
    mean = float(d.mean())
    sd = float(d.std(ddof=1)) if runs > 1 else 0.0
    z = -normal_quantile((1.0 - confidence) / 2.0)
    half = z * sd / math.sqrt(runs)
    mb = b.sum(axis=1) * 2 > k
    mw = w.sum(axis=1) * 2 > k
    n11 = int((mb & mw).sum())
    n10 = int((mb & ~mw).sum())
    n01 = int((~mb & mw).sum())
    n00 = runs - n11 - n10 - n01
    est, low, high = paired_difference_ci(n11, n10, n01, n00, confidence)
    return RateComparison(
        runs=runs,
        forks=k,
        rate_difference=mean,
        rate_ci_low=max(-1.0, mean - half),
        rate_ci_high=min(1.0, mean + half),
        rate_p=sign_flip_p(x),
        rescues=n01,
        harms=n10,
        unchanged=n11 + n00,
        mcnemar_p=mcnemar_exact_p(n10, n01),
        majority_difference=est,
        majority_ci_low=low,
        majority_ci_high=high,
        runs_up=int((x > 0).sum()),
        runs_down=int((x < 0).sum()),
    )


class CohortVerdict(StrEnum):
    #: fewer failures than the baseline, beyond the noise floor
    rescues = "rescues"
    #: more failures than the baseline, beyond the noise floor
    harms = "harms"
    #: the difference is what two baseline forks differ by: no win, no harm shown
    inside_noise_floor = "inside_noise_floor"


class WorldJudgement(BaseModel):
    world: str
    role: Role
    expected: Direction
    comparison: RateComparison
    holm_p: float
    verdict: CohortVerdict
    #: the verdict is what the role expects (a placebo inside the floor, a positive
    #: control that harms, a treatment that moves the expected way)
    as_expected: bool
    text: str


def _verdict(c: RateComparison, holm_p: float, alpha: float) -> CohortVerdict:
    if holm_p >= alpha or c.rate_difference == 0:
        return CohortVerdict.inside_noise_floor
    return CohortVerdict.rescues if c.rate_difference > 0 else CohortVerdict.harms


def _text(
    name: str, c: RateComparison, verdict: CohortVerdict, floor: NoiseFloor, holm_p: float
) -> str:
    seen = (
        f"{c.rescues} rescued / {c.harms} harmed of {c.runs} runs (majority of {c.forks}), "
        f"success rate {c.rate_difference:+.1%} [{c.rate_ci_low:+.1%}, {c.rate_ci_high:+.1%}], "
        f"Holm p {holm_p:.3g}; A/A flip rate {floor.flip_rate:.1%} "
        f"[{floor.ci_low:.1%}, {floor.ci_high:.1%}]"
    )
    if verdict is CohortVerdict.inside_noise_floor:
        return f"{name}: inside the noise floor, not a win: {seen}"
    word = "rescues more runs than it harms" if verdict is CohortVerdict.rescues else "harms"
    return f"{name}: {word}, beyond the noise floor: {seen}"


def judge_worlds(
    baseline: Outcomes | Sequence[Sequence[bool]],
    worlds: Mapping[str, tuple[Role, Direction, Outcomes | Sequence[Sequence[bool]]]],
    alpha: float = 0.05,
    confidence: float = 0.95,
    floor_from: Outcomes | Sequence[Sequence[bool]] | None = None,
) -> tuple[NoiseFloor, list[WorldJudgement]]:
    """Every non-baseline world against the baseline, Holm-adjusted across them.

    ``worlds`` maps a name to (role, the pre-registered direction of its *failure* rate,
    its outcomes). A placebo is as expected inside the floor; a positive control when it
    harms; a treatment when it moves the expected way beyond the floor. ``floor_from``:
    the baseline forks the noise floor is measured on, when the comparisons read the
    baseline as voted (``forklab.experiments.cohort.votes``).
    """
    floor = noise_floor(baseline if floor_from is None else floor_from, confidence)
    names = list(worlds)
    comparisons = [compare_rates(baseline, worlds[n][2], confidence) for n in names]
    adjusted = holm_adjust([c.rate_p for c in comparisons])
    out: list[WorldJudgement] = []
    for name, c, holm_p in zip(names, comparisons, adjusted, strict=True):
        role, expected, _ = worlds[name]
        verdict = _verdict(c, holm_p, alpha)
        wanted = {
            Direction.decrease: CohortVerdict.rescues,
            Direction.increase: CohortVerdict.harms,
            Direction.none: CohortVerdict.inside_noise_floor,
        }[expected]
        out.append(
            WorldJudgement(
                world=name,
                role=role,
                expected=expected,
                comparison=c,
                holm_p=holm_p,
                verdict=verdict,
                as_expected=verdict is wanted,
                text=_text(name, c, verdict, floor, holm_p),
            )
        )
    return floor, out
