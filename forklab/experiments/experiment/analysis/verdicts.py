"""Per-world verdicts against the pre-registered direction, and the effect check.

A world's verdict reads its comparison with the baseline. Expected directions are of
the *failure rate*; the paired difference is of the *success rate*, so "decrease"
expects a positive difference. A verdict is a claim only when the numbers carry it:

- ``supported``: the interval lies wholly on the expected side of zero and the
  Holm-adjusted McNemar p is below α (both, so neither multiplicity nor a lucky
  interval can make a win);
- ``refuted``: the same evidence, on the other side (for ``none``: any such effect);
- ``inconclusive``: anything else, in particular an interval that crosses zero;
- ``invalid``: a validity check failed, so the effects are not evidence at all.

For an expected ``none`` (a placebo) there is no equivalence margin to test against;
the one outcome the numbers support is a world identical to the baseline in every
episode (no discordant pair), which is what common random numbers make possible.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel

from forklab.experiments.experiment.analysis.pairs import PairedEffect, crosses_zero
from forklab.experiments.experiment.results import Check, CheckKind
from forklab.experiments.experiment.spec import Direction, ExperimentSpec, Role


class Verdict(StrEnum):
    supported = "supported"
    refuted = "refuted"
    inconclusive = "inconclusive"
    invalid = "invalid"


class WorldVerdict(BaseModel):
    world: str
    role: Role
    expected: Direction
    verdict: Verdict
    reason: str


def expected_direction(spec: ExperimentSpec, world: str, role: Role) -> Direction:
    """The pre-registered direction; unregistered worlds default by role (treatments are
    meant to cut failures, positive controls to raise them, placebos to change nothing)."""
    if world in spec.hypothesis.expected:
        return spec.hypothesis.expected[world]
    return {
        Role.treatment: Direction.decrease,
        Role.positive_control: Direction.increase,
    }.get(role, Direction.none)


def _interval(effect: PairedEffect) -> str:
    pct = round(effect.confidence * 100)
    return (
        f"success difference {effect.difference:+.3f}, {pct}% CI "
        f"[{effect.ci_low:+.3f}, {effect.ci_high:+.3f}]"
    )


def judge(effect: PairedEffect, holm_p: float, expected: Direction, alpha: float) -> Verdict:
    """The verdict the numbers support for one effect (validity aside)."""
    significant = holm_p < alpha and not crosses_zero(effect)
    if expected is Direction.none:
        if significant:
            return Verdict.refuted
        if effect.rescue == 0 and effect.harm == 0:
            return Verdict.supported
        return Verdict.inconclusive
    if not significant:
        return Verdict.inconclusive
    fewer_failures = effect.ci_low > 0.0
    wanted = expected is Direction.decrease
    return Verdict.supported if fewer_failures == wanted else Verdict.refuted


def world_verdict(
    world: str,
    role: Role,
    expected: Direction,
    effect: PairedEffect,
    holm_p: float,
    alpha: float,
    failed_checks: list[str],
) -> WorldVerdict:
    if failed_checks:
        return WorldVerdict(
            world=world,
            role=role,
            expected=expected,
            verdict=Verdict.invalid,
            reason=f"validity checks failed ({', '.join(failed_checks)}); the effect is not "
            "evidence",
        )
    verdict = judge(effect, holm_p, expected, alpha)
    detail = f"{_interval(effect)}, Holm p {holm_p:.3g}"
    if verdict is Verdict.inconclusive and crosses_zero(effect):
        why = f"the interval crosses zero ({detail})"
    elif verdict is Verdict.inconclusive:
        why = f"Holm p is not below α = {alpha:g} ({detail})"
    elif expected is Direction.none and verdict is Verdict.supported:
        why = "identical to the baseline in every episode"
    else:
        why = detail
    return WorldVerdict(
        world=world,
        role=role,
        expected=expected,
        verdict=verdict,
        reason=f"expected failures to {_expected_text(expected)}: {why}",
    )


def _expected_text(expected: Direction) -> str:
    return "stay the same" if expected is Direction.none else expected.value


def effect_check(verdicts: list[WorldVerdict]) -> Check:
    """Did every world move the way the hypothesis said? Reported, never a validity gate."""
    misses = [
        f"{v.world} {v.verdict.value}" for v in verdicts if v.verdict is not Verdict.supported
    ]
    if not verdicts:
        reason = "no world to compare with the baseline"
    elif misses:
        reason = "not supported: " + ", ".join(misses)
    else:
        reason = f"all {len(verdicts)} worlds moved as pre-registered"
    return Check(
        name="effect_direction",
        passed=bool(verdicts) and not misses,
        reason=reason,
        kind=CheckKind.effect,
    )


def predictions_text(verdicts: list[tuple[str, Verdict]]) -> str:
    """The hypothesis as a count of its predictions (one per world), naming the worlds
    whose prediction did not hold, grouped by verdict: "5 of 7 predictions supported;
    jitter and queue-memory inconclusive". A reader sees at once how much of the
    hypothesis held, rather than a bare "not supported" over a mostly-supported spec."""
    held = sum(1 for _, v in verdicts if v is Verdict.supported)
    noun = "prediction" if len(verdicts) == 1 else "predictions"
    parts = [f"{held} of {len(verdicts)} {noun} supported"]
    for verdict in (Verdict.refuted, Verdict.inconclusive, Verdict.invalid):
        names = [world for world, v in verdicts if v is verdict]
        if names:
            listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
            parts.append(f"{listed} {verdict.value}")
    return "; ".join(parts)


def hypothesis_headline(valid: bool, verdicts: list[tuple[str, Verdict]]) -> str:
    """One sentence: is the hypothesis judged, and how many of its predictions held."""
    if not valid:
        return "Hypothesis not judged: the experiment is invalid."
    if not verdicts:
        return "Hypothesis not judged: no world to compare with the baseline."
    held = sum(1 for _, v in verdicts if v is Verdict.supported)
    if held == len(verdicts):
        how = "supported"
    elif held:
        how = "partly supported"
    else:
        how = "not supported"
    return f"Hypothesis {how}: {predictions_text(verdicts)}."
