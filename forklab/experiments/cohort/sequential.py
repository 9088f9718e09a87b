"""A pre-registered sequential design over a cohort (``analysis.sequential``): the workload
engine's design (``forklab.experiments.experiment.sequential``: α-spending boundaries,
conditional-power futility, the stage-wise p-value and the repeated confidence interval)
applied to waves of runs (``forklab.experiments.cohort.waves``) and to each run's majority
of its k forks, paired with the baseline's.

Who stops on what differs from a workload in one place: the **placebo**. A workload's
placebo draws the baseline's shocks, so one discordant pair fails its check; a cohort's
forks sample a model, so a faithful placebo differs from the baseline by the noise floor.
Its check is "inside the noise floor", which a boundary crossing refutes: a cohort placebo
(and a treatment expected to change nothing) follows the positive control's rule, stopping
only when it crosses a boundary, and otherwise runs every run. Treatments may also stop
for futility. The baseline runs while any other world runs.

Pure; numpy and scipy through the engine's modules, so only activities import this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel

from forklab.experiments.cohort.matrix import UNSPENT, WorldCosts
from forklab.experiments.cohort.noise import CohortVerdict
from forklab.experiments.cohort.spec import CohortExperimentSpec, ForkWorld
from forklab.experiments.cohort.waves import look_counts, run_order
from forklab.experiments.experiment.sequential import (
    Design,
    Rule,
    WorldPath,
    decide,
    make_design,
    world_path,
)
from forklab.experiments.experiment.spec import Direction, Role
from forklab.experiments.experiment.stats import holm_adjust, normal_quantile

#: Simulated experiments behind the plan's expected saving.
PLAN_DRAWS = 2000
#: Discordant pairs a simulated look stands for: the statistic of ``decide`` is then the
#: simulated Brownian motion's to within 1/√this.
_PAIRS = 1_000_000


def expected(spec: CohortExperimentSpec, world: ForkWorld) -> Direction:
    """The pre-registered direction of the world's failure rate: the hypothesis's, else
    what its role implies (a placebo changes nothing, a positive control raises it)."""
    if world.name in spec.hypothesis.expected:
        return spec.hypothesis.expected[world.name]
    if world.role is Role.positive_control:
        return Direction.increase
    if world.role is Role.treatment:
        return Direction.decrease
    return Direction.none


def cohort_rule(role: Role, direction: Direction) -> Rule:
    """A treatment expected to move the failure rate may stop for futility; every other
    world stops only when it crosses a boundary (module docstring: why the placebo too)."""
    if role is Role.treatment and direction is not Direction.none:
        return Rule.treatment
    return Rule.control


def cohort_design(spec: CohortExperimentSpec, runs: int) -> Design | None:
    """The spec's design over the plan's ``runs`` (None without one); its waves are
    ``waves.run_wave_ends(runs, looks)``."""
    seq = spec.analysis.sequential
    if seq is None:
        return None
    if seq.looks > runs:
        raise ValueError(
            f"analysis.sequential.looks: {seq.looks} looks need at least as many runs; the "
            f"cohort resolved {runs}; lower looks"
        )
    return make_design(seq, runs, spec.analysis.alpha)


def world_paths_at(
    spec: CohortExperimentSpec, design: Design, counts: Mapping[str, tuple[list[int], list[int]]]
) -> list[WorldPath]:
    """Each world's path from its cumulative rescues and harms at the looks it ran into
    (``counts[world]``; a world stopped earlier has shorter lists)."""
    paths = []
    for w in spec.worlds:
        if w.role is Role.baseline or w.name not in counts:
            continue
        rescue, harm = counts[w.name]
        if not rescue:
            continue
        direction = expected(spec, w)
        paths.append(
            world_path(
                design, w.name, w.role, direction, cohort_rule(w.role, direction), rescue, harm
            )
        )
    return paths


def matrix_counts(
    spec: CohortExperimentSpec, design: Design, outcomes: Mapping[str, Sequence[str]]
) -> dict[str, tuple[list[int], list[int]]]:
    """Every world's cumulative counts at the looks it ran into, from the outcome matrix:
    a world ran into a look when no fork of the look's runs was left unspent for it."""
    base = list(outcomes[spec.baseline.name])
    order = run_order(spec.seed, len(base))
    k = spec.cohort.forks_per_world
    counts = {}
    for w in spec.worlds:
        if w.role is Role.baseline:
            continue
        rows = list(outcomes[w.name])
        reached, start = [], 0
        for end in design.wave_ends:
            if any(UNSPENT in rows[run] for run in order[start:end]):
                break
            reached.append(end)
            start = end
        counts[w.name] = look_counts(base, rows, order, reached, k)
    return counts


class DesignPath(BaseModel):
    """A world's path through the design, its verdict valid for the design, and what its
    stop left unspent (forks; tokens and world-seconds at the mean its forks spent)."""

    path: WorldPath
    verdict: CohortVerdict
    as_expected: bool
    unspent_forks: int
    unspent_tokens: float
    unspent_seconds: float
    text: str


_WANTED = {
    Direction.decrease: CohortVerdict.rescues,
    Direction.increase: CohortVerdict.harms,
    Direction.none: CohortVerdict.inside_noise_floor,
}

_STOPPED = {
    "efficacy": "stopped for efficacy",
    "futility": "stopped for futility",
    "completed": "ran every run",
    "continue": "still running",
}


def design_verdict(path: WorldPath, holm_p: float, alpha: float) -> CohortVerdict:
    """Beyond the noise floor only when the Holm-adjusted stage-wise p is below α and the
    repeated interval of the majority success difference excludes zero."""
    if holm_p >= alpha or path.ci_low <= 0.0 <= path.ci_high:
        return CohortVerdict.inside_noise_floor
    return CohortVerdict.rescues if path.ci_low > 0.0 else CohortVerdict.harms


def unspent(rows: Sequence[str], cost: WorldCosts) -> tuple[int, float, float]:
    forks = sum(row.count(UNSPENT) for row in rows)
    if not cost.forks:
        return forks, 0.0, 0.0
    return forks, forks * cost.tokens / cost.forks, forks * cost.seconds / cost.forks


def design_paths(
    spec: CohortExperimentSpec,
    design: Design,
    outcomes: Mapping[str, Sequence[str]],
    costs: Mapping[str, WorldCosts],
) -> list[DesignPath]:
    """Every world's path recomputed from the matrix (the same pure rules the workflow's
    looks applied, on the same outcomes: the same paths), Holm across the worlds."""
    paths = world_paths_at(spec, design, matrix_counts(spec, design, outcomes))
    adjusted = holm_adjust([p.p_value for p in paths])
    out = []
    for p, q in zip(paths, adjusted, strict=True):
        p = p.model_copy(update={"holm_p": q})
        verdict = design_verdict(p, q, design.alpha)
        forks, tokens, seconds = unspent(outcomes[p.world], costs.get(p.world, WorldCosts()))
        last = p.looks[-1]
        word = {
            CohortVerdict.rescues: "rescues more runs than it harms",
            CohortVerdict.harms: "harms",
            CohortVerdict.inside_noise_floor: "inside the noise floor, not a win",
        }[verdict]
        stopped = _STOPPED.get(p.stopped.value, p.stopped.value)
        text = (
            f"{p.world}: {word} (sequential design): {stopped} at look {last.look} of "
            f"{len(design.wave_ends)} ({p.episodes} runs: "
            f"{last.rescue} rescued / {last.harm} harmed by majority), statistic "
            f"{last.statistic:+.3f} against boundary ±{last.boundary:.3f}; majority success "
            f"difference repeated {1 - design.alpha:.0%} CI [{p.ci_low:+.3f}, {p.ci_high:+.3f}], "
            f"stage-wise p {p.p_value:.3g}, Holm p {q:.3g}"
        )
        out.append(
            DesignPath(
                path=p,
                verdict=verdict,
                as_expected=verdict is _WANTED[p.expected],
                unspent_forks=forks,
                unspent_tokens=round(tokens, 3),
                unspent_seconds=round(seconds, 3),
                text=text,
            )
        )
    return out


def planned_saving(
    spec: CohortExperimentSpec, design: Design, effect: bool
) -> tuple[float, float, float]:
    """The share of the experiment's forks the design is expected to leave unspent (mean,
    5th and 95th percentile over ``PLAN_DRAWS`` simulated experiments, seeded by the
    spec's seed): with every world inert (``effect`` False), or with every world moving
    the way it is expected to by the effect a fixed design of the same runs detects with
    ``analysis.power`` (drift ``z_{1−α/2} + z_power``; a world expected to change nothing
    stays inert). Each world's statistic is a Brownian motion at the looks' fractions,
    decided by the design's own rules; the baseline runs until the last world stops. The
    worlds are drawn independently (their shared baseline correlates them in a real run),
    so the percentiles are indicative; the mean is what the approver weighs."""
    rng = np.random.default_rng(spec.seed)
    fractions = np.array(design.fractions)
    steps = np.diff(np.concatenate([[0.0], fractions]))
    theta = normal_quantile(1.0 - design.alpha / 2.0) + normal_quantile(spec.analysis.power)
    others = [w for w in spec.worlds if w.role is not Role.baseline]
    used = np.zeros((PLAN_DRAWS, len(others)))
    for j, w in enumerate(others):
        direction = expected(spec, w)
        drift = theta if effect and direction is not Direction.none else 0.0
        walk = np.cumsum(
            rng.standard_normal((PLAN_DRAWS, len(fractions))) * np.sqrt(steps) + drift * steps,
            axis=1,
        )
        z = walk / np.sqrt(fractions)
        pairs = (_PAIRS * fractions).astype(np.int64)
        rescue = np.rint((pairs + z * np.sqrt(pairs)) / 2.0).astype(np.int64)
        at, _ = decide(design, rescue, pairs - rescue, cohort_rule(w.role, direction))
        used[:, j] = fractions[at]
    share = (used.sum(axis=1) + used.max(axis=1)) / len(spec.worlds)
    saved = 1.0 - share
    low, high = np.quantile(saved, [0.05, 0.95])
    return round(float(saved.mean()), 4), round(float(low), 4), round(float(high), 4)
