"""A pre-registered sequential design: waves of episodes, and after each wave a decision
per world — stop for efficacy, stop for futility, or continue.

Pure and deterministic. ``design_for(spec)`` fixes everything before any episode runs:
the episodes each wave ends at, the information fraction of each look and the two-sided
α-spending boundary of each look (``sequential_bounds``). ``decide`` applies the rules to
the cumulative rescues and harms of many worlds (or many simulated experiments) at once,
vectorised, so the durable path, ``forklab plan`` and ``bench/sequential.py`` run one
code. ``sequential_report`` turns a world's path into the report: its looks (episodes,
rescues, harms, statistic, boundary), where and why it stopped, the p-value of the
stage-wise ordering and the repeated confidence interval, both valid for the design.

Who may stop, and on what:

- a **treatment** stops for efficacy when ``|Z_k| ≥ c_k`` (supported or refuted, by the
  sign against its expected direction), or for futility when its conditional power under
  the current trend falls below ``futility`` (non-binding: the boundaries ignore it, so
  α holds whether or not a world is stopped);
- a **positive control** stops only when it crosses a boundary: its check (did it move
  the failure rate the registered way?) is then decided; it never stops for futility;
- a **placebo** stops only at its first discordant pair: its fidelity check has then
  failed; a faithful placebo runs every episode, since only every episode proves it;
- the **baseline** runs while any other world runs (every pair needs it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import IntEnum

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel

from forklab.experiments.experiment.analysis.verdicts import (
    Verdict,
    WorldVerdict,
    expected_direction,
)
from forklab.experiments.experiment.sequential_bounds import efficacy_bounds, stagewise_p
from forklab.experiments.experiment.spec import (
    Direction,
    ExperimentSpec,
    Role,
    Sequential,
    SequentialMethod,
    Spending,
)
from forklab.experiments.experiment.stats import holm_adjust
from forklab.experiments.experiment.waves import Decision, wave_ends

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


class Rule(IntEnum):
    """Which stopping rules a world follows (by role; see the module docstring)."""

    treatment = 0
    control = 1
    placebo = 2


class Stop(IntEnum):
    """Why a world stopped (the codes ``decide`` returns)."""

    ran_out = 0  # every look passed without a stop: the world ran the whole budget
    efficacy = 1
    futility = 2
    check_decided = 3  # a placebo's first discordant pair


class Design(BaseModel):
    """Everything the design fixes in advance; part of the plan the approver signs (the
    spec's ``analysis.sequential`` is in the fingerprint, and this follows from it)."""

    method: SequentialMethod
    spending: Spending
    alpha: float
    futility: float
    episodes: int
    #: Cumulative episodes at the end of each wave (the last is ``episodes``).
    wave_ends: list[int]
    fractions: list[float]
    bounds: list[float]


def design_for(spec: ExperimentSpec) -> Design | None:
    """The spec's design, or None when it runs every episode in every world."""
    seq = spec.analysis.sequential
    if seq is None:
        return None
    return make_design(seq, spec.episodes, spec.analysis.alpha)


def make_design(seq: Sequential, episodes: int, alpha: float) -> Design:
    """Waves as equal as integers allow (``ceil(N·k/K)``); their fractions of the budget
    are the information fractions (information grows with the episodes run)."""
    ends = wave_ends(episodes, seq.looks)
    fractions = [e / episodes for e in ends]
    bounds = efficacy_bounds(fractions, alpha, seq.spending)
    return Design(
        method=seq.method,
        spending=seq.spending,
        alpha=alpha,
        futility=seq.futility,
        episodes=episodes,
        wave_ends=ends,
        fractions=fractions,
        bounds=[round(float(c), 10) for c in bounds],
    )


def rule_of(spec: ExperimentSpec, world: str, role: Role) -> Rule:
    if role is Role.placebo or expected_direction(spec, world, role) is Direction.none:
        return Rule.placebo
    return Rule.control if role is Role.positive_control else Rule.treatment


def statistic(rescue: Ints, harm: Ints) -> Floats:
    """The paired score statistic (rescues − harms) / √(rescues + harms); 0 with no pair."""
    m = (rescue + harm).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(m > 0, (rescue - harm) / np.sqrt(np.where(m > 0, m, 1.0)), 0.0)
    return z


def conditional_power(z: Floats, fraction: float, final_bound: float) -> Floats:
    """The chance of crossing the last boundary in the current trend's direction if the
    trend (drift ``|z| / √t``) went on: ``1 − Φ((c_K − |z|/√t) / √(1 − t))``."""
    # (imported here: ``sequential_bounds`` says why)
    from scipy.special import ndtr

    if fraction >= 1.0:
        return np.where(np.abs(z) >= final_bound, 1.0, 0.0)
    drift = np.abs(z) / math.sqrt(fraction)
    return np.asarray(ndtr((drift - final_bound) / math.sqrt(1.0 - fraction)), dtype=np.float64)


def decide(design: Design, rescue: Ints, harm: Ints, rule: Rule) -> tuple[Ints, Ints]:
    """For cumulative ``rescue``/``harm`` counts of shape (worlds, looks) following
    ``rule``: the 0-based look each world stopped at (the last look when it never stopped)
    and why (a ``Stop`` code). Counts after a stop are never read, so a caller may pass
    whatever it has (zeros for waves a stopped world never ran)."""
    looks = len(design.wave_ends)
    if rescue.shape != harm.shape or rescue.ndim != 2 or rescue.shape[1] != looks:
        raise ValueError(f"counts must have shape (worlds, {looks}), got {rescue.shape}")
    n = rescue.shape[0]
    stop_at = np.full(n, looks - 1, dtype=np.int64)
    why = np.full(n, int(Stop.ran_out), dtype=np.int64)
    open_ = np.ones(n, dtype=bool)
    for k in range(looks):
        r, h = rescue[:, k], harm[:, k]
        if rule is Rule.placebo:
            hit = open_ & (r + h > 0)
            code = np.where(hit, int(Stop.check_decided), -1)
        else:
            z = statistic(r, h)
            eff = np.abs(z) >= design.bounds[k]
            code = np.where(eff, int(Stop.efficacy), -1)
            if rule is Rule.treatment and design.futility > 0 and k < looks - 1:
                cp = conditional_power(z, design.fractions[k], design.bounds[-1])
                code = np.where(~eff & (cp < design.futility), int(Stop.futility), code)
            hit = open_ & (code >= 0)
        stop_at[hit] = k
        why[hit] = code[hit]
        open_ &= ~hit
    return stop_at, why


# --------------------------------------------------------------------------- the report


class Look(BaseModel):
    look: int
    episodes: int
    rescue: int
    harm: int
    statistic: float
    boundary: float
    conditional_power: float | None
    decision: Decision


class WorldPath(BaseModel):
    world: str
    role: Role
    expected: Direction
    looks: list[Look]
    stopped: Decision
    #: Episodes this world ran (its pairs with the baseline).
    episodes: int
    unspent_episodes: int
    #: The stage-wise ordering p-value (two-sided), valid for the design.
    p_value: float
    #: The repeated confidence interval of the success difference at the stopping look.
    ci_low: float
    ci_high: float
    #: Holm-adjusted across the worlds' comparisons with the baseline.
    holm_p: float = 1.0
    #: The verdict the design's numbers support (validity checks aside): as the fixed
    #: design's, from the stage-wise p (Holm) and the repeated interval.
    verdict: Verdict = Verdict.inconclusive


class SequentialReport(BaseModel):
    design: Design
    worlds: list[WorldPath]
    baseline_episodes: int
    #: World-episodes the fixed design runs (every world, every episode) and this design.
    fixed_world_episodes: int
    sequential_world_episodes: int
    unspent_world_episodes: int
    saved_fraction: float
    #: The saving expected over experiments like this one (``expected_saving``).
    expected_saved_fraction: float | None = None
    expected_saved_low: float | None = None
    expected_saved_high: float | None = None


def _interval(design: Design, look: int, rescue: int, harm: int, n: int) -> tuple[float, float]:
    """The repeated confidence interval (Jennison & Turnbull 1989): the paired difference
    ± the look's boundary × its standard error. Every look's interval covers the true
    difference simultaneously with probability 1 − α, so the one at a data-dependent stop
    is valid too (large-sample, like the boundaries)."""
    if n == 0:
        return -1.0, 1.0
    d = (rescue - harm) / n
    se = math.sqrt(max((rescue + harm) / n - d * d, 0.0) / n)
    c = design.bounds[look]
    return max(-1.0, d - c * se), min(1.0, d + c * se)


def world_path(
    design: Design,
    world: str,
    role: Role,
    expected: Direction,
    rule: Rule,
    rescue: list[int],
    harm: list[int],
) -> WorldPath:
    """One world's path from its cumulative counts at the looks it reached (a stopped
    world's list ends at its stop)."""
    k_all = len(design.wave_ends)
    reached = len(rescue)
    pad = k_all - reached
    r = np.array([rescue + [0] * pad], dtype=np.int64)
    h = np.array([harm + [0] * pad], dtype=np.int64)
    stop_at, why = decide(design, r, h, rule)
    last = int(stop_at[0])
    code: Stop | None = Stop(int(why[0]))
    if last >= reached:  # the counts end before the design's decision: still running
        last, code = reached - 1, None
    looks = []
    for k in range(last + 1):
        z = float(statistic(r[:, k], h[:, k])[0])
        cp = None
        if rule is Rule.treatment and design.futility > 0 and k < k_all - 1:
            cp = round(
                float(conditional_power(np.array([z]), design.fractions[k], design.bounds[-1])[0]),
                6,
            )
        decision = Decision.continue_ if k < last or code is None else _DECISION[code]
        looks.append(
            Look(
                look=k + 1,
                episodes=design.wave_ends[k],
                rescue=int(r[0, k]),
                harm=int(h[0, k]),
                statistic=round(z, 6),
                boundary=design.bounds[k],
                conditional_power=cp,
                decision=decision,
            )
        )
    n = design.wave_ends[last]
    z_last = float(statistic(r[:, last], h[:, last])[0])
    p = stagewise_p(design.fractions, design.bounds, last, z_last)
    if code is Stop.futility:
        # A non-binding futility stop ranks below every efficacy stop: never below α(t_k).
        p = max(p, stagewise_p(design.fractions, design.bounds, last, design.bounds[last]))
    low, high = _interval(design, last, int(r[0, last]), int(h[0, last]), n)
    return WorldPath(
        world=world,
        role=role,
        expected=expected,
        looks=looks,
        stopped=Decision.continue_ if code is None else looks[-1].decision,
        episodes=n,
        unspent_episodes=design.episodes - n,
        p_value=p,
        ci_low=round(low, 6),
        ci_high=round(high, 6),
    )


_DECISION = {
    Stop.ran_out: Decision.completed,
    Stop.efficacy: Decision.efficacy,
    Stop.futility: Decision.futility,
    Stop.check_decided: Decision.check_decided,
}


def sequential_verdict(path: WorldPath, holm_p: float, alpha: float) -> Verdict:
    """Supported when the Holm-adjusted stage-wise p is below α *and* the repeated interval
    lies on the expected side of zero; refuted on the other side; for an expected ``none``
    supported only by a world identical to the baseline over the whole budget."""
    last = path.looks[-1]
    significant = holm_p < alpha and (path.ci_low > 0.0 or path.ci_high < 0.0)
    if path.expected is Direction.none:
        if significant:
            return Verdict.refuted
        identical = last.rescue == 0 and last.harm == 0 and path.unspent_episodes == 0
        return Verdict.supported if identical else Verdict.inconclusive
    if not significant:
        return Verdict.inconclusive
    fewer_failures = path.ci_low > 0.0
    wanted = path.expected is Direction.decrease
    return Verdict.supported if fewer_failures == wanted else Verdict.refuted


_STOP_TEXT = {
    Decision.efficacy: "stopped for efficacy",
    Decision.futility: "stopped for futility",
    Decision.check_decided: "stopped: its check is decided",
    Decision.completed: "ran every episode",
    Decision.continue_: "still running",
}


def design_verdicts(report: SequentialReport, failed_checks: list[str]) -> list[WorldVerdict]:
    """The verdicts a sequential design's report gives: each world's from its path (the
    stage-wise p, Holm across the worlds, and the repeated interval), so a world stopped
    early is judged as the design was signed, on the episodes it ran, never by a fixed
    test on a sample the design chose. A failed validity check makes every one invalid."""
    verdicts = []
    for p in report.worlds:
        if failed_checks:
            verdict = Verdict.invalid
            reason = (
                f"validity checks failed ({', '.join(failed_checks)}); the effect is not evidence"
            )
        else:
            verdict = p.verdict
            last = p.looks[-1]
            expected = "stay the same" if p.expected is Direction.none else p.expected.value
            reason = (
                f"expected failures to {expected}: {_STOP_TEXT[p.stopped]} at look {last.look} "
                f"of {len(report.design.wave_ends)} ({p.episodes} episodes, rescue "
                f"{last.rescue}, harm {last.harm}), success difference repeated "
                f"{1 - report.design.alpha:.0%} CI [{p.ci_low:+.3f}, {p.ci_high:+.3f}], "
                f"stage-wise p {p.p_value:.3g}, Holm p {p.holm_p:.3g}"
            )
        verdicts.append(
            WorldVerdict(
                world=p.world, role=p.role, expected=p.expected, verdict=verdict, reason=reason
            )
        )
    return verdicts


def cumulative_at_looks(
    design: Design, reference: npt.ArrayLike, world: npt.ArrayLike
) -> tuple[list[int], list[int]]:
    """Cumulative rescues and harms of ``world`` against ``reference`` (success booleans
    per episode, in episode order) at each wave end the columns reach."""
    ref = np.asarray(reference, dtype=bool)
    w = np.asarray(world, dtype=bool)
    rescue = np.cumsum(~ref & w)
    harm = np.cumsum(ref & ~w)
    ends = [e for e in design.wave_ends if e <= len(ref)]
    return [int(rescue[e - 1]) for e in ends], [int(harm[e - 1]) for e in ends]


def world_paths(
    spec: ExperimentSpec, design: Design, columns: Mapping[str, npt.ArrayLike]
) -> list[WorldPath]:
    """Each world's path from its success column (the episodes it ran, in order) against
    the baseline's; a world with a column shorter than one wave, or none, has no path yet.
    The durable path asks this after every wave (``decide_look``), the report at the end."""
    base = spec.baseline.name
    paths: list[WorldPath] = []
    if base not in columns:
        return paths  # no baseline, no pairs
    for w in spec.worlds:
        if w.role is Role.baseline or w.name not in columns:
            continue
        ref, col = np.asarray(columns[base]), np.asarray(columns[w.name])
        n = min(len(ref), len(col))
        rescue, harm = cumulative_at_looks(design, ref[:n], col[:n])
        if not rescue:
            continue  # not one wave yet
        paths.append(
            world_path(
                design,
                w.name,
                w.role,
                expected_direction(spec, w.name, w.role),
                rule_of(spec, w.name, w.role),
                rescue,
                harm,
            )
        )
    return paths


def look_paths(
    spec: ExperimentSpec, design: Design, columns: Mapping[str, npt.ArrayLike], look: int
) -> list[WorldPath]:
    """The paths of the worlds that ran into look ``look`` (0-based): the decision of its
    last look is the one the durable path acts on after that wave (continue, or stop)."""
    return [p for p in world_paths(spec, design, columns) if len(p.looks) == look + 1]


def sequential_report(
    spec: ExperimentSpec, design: Design, columns: dict[str, npt.ArrayLike]
) -> SequentialReport:
    """Every world's path (``world_paths``), Holm across them, and the compute. On the
    twin each column holds every episode and the design is rehearsed: the paths are those
    the durable run of the same episodes takes, and the saving is what it will save. On
    the durable path a stopped world's column ends at its stop: the same paths."""
    paths = world_paths(spec, design, columns)
    adjusted = holm_adjust([p.p_value for p in paths])
    paths = [
        p.model_copy(update={"holm_p": q, "verdict": sequential_verdict(p, q, design.alpha)})
        for p, q in zip(paths, adjusted, strict=True)
    ]
    base_n = max((p.episodes for p in paths), default=0)
    fixed = design.episodes * len(spec.worlds)
    used = base_n + sum(p.episodes for p in paths)
    expected = expected_saving(spec, design, columns)
    mean, low, high = expected if expected is not None else (None, None, None)
    return SequentialReport(
        design=design,
        worlds=paths,
        baseline_episodes=base_n,
        fixed_world_episodes=fixed,
        sequential_world_episodes=used,
        unspent_world_episodes=fixed - used,
        saved_fraction=round(1.0 - used / fixed, 6),
        expected_saved_fraction=mean,
        expected_saved_low=low,
        expected_saved_high=high,
    )


#: Resampled experiments behind the expected saving.
EXPECTED_DRAWS = 400


def expected_saving(
    spec: ExperimentSpec, design: Design, columns: dict[str, npt.ArrayLike]
) -> tuple[float, float, float] | None:
    """The saving the design is expected to have on experiments like the rehearsed one:
    the mean, 5th and 95th percentile over ``EXPECTED_DRAWS`` experiments whose episodes
    are drawn with replacement from the rehearsal's (the bootstrap ``bench/sequential.py``
    uses). Each episode is its pattern of pair cells across the worlds, so a wave's draw is
    one multinomial over the distinct patterns: memory grows with the patterns, not the
    episodes. Seeded by the spec's seed, so the plan prints the same figure every time.
    None without every world's every episode (a durable run that stopped worlds)."""
    base = spec.baseline.name
    others = [w for w in spec.worlds if w.role is not Role.baseline]
    full = all(
        w.name in columns and np.size(columns[w.name]) >= design.episodes for w in spec.worlds
    )
    if not full or not others:
        return None  # a durable run whose design stopped worlds: only what it ran is known
    ref = np.asarray(columns[base], dtype=bool)
    cells = np.stack(
        [
            (~ref & np.asarray(columns[w.name], dtype=bool)).astype(np.int8)
            - (ref & ~np.asarray(columns[w.name], dtype=bool)).astype(np.int8)
            for w in others
        ],
        axis=1,
    )
    patterns, counts = np.unique(cells, axis=0, return_counts=True)
    rng = np.random.default_rng(spec.seed)
    sizes = np.diff([0, *design.wave_ends])
    drawn = np.stack(
        [rng.multinomial(n, counts / counts.sum(), size=EXPECTED_DRAWS) for n in sizes], axis=1
    ).cumsum(axis=1)  # (draws, looks, patterns)
    rescue = drawn @ (patterns == 1).astype(np.int64)  # (draws, looks, worlds)
    harm = drawn @ (patterns == -1).astype(np.int64)
    ends = np.array(design.wave_ends)
    used = np.zeros((EXPECTED_DRAWS, len(others)), dtype=np.int64)
    for j, w in enumerate(others):
        at, _ = decide(design, rescue[:, :, j], harm[:, :, j], rule_of(spec, w.name, w.role))
        used[:, j] = ends[at]
    share = (used.sum(axis=1) + used.max(axis=1)) / (design.episodes * len(spec.worlds))
    saved = 1.0 - share
    low, high = np.quantile(saved, [0.05, 0.95])
    return round(float(saved.mean()), 6), round(float(low), 6), round(float(high), 6)
