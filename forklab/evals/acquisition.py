"""The acquisition suite: the guard policy (which slices a rule fires on, under a harm
cap) and power planning (is the episode count enough, does the rehearsal point against
the hypothesis) on held-out cases."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from forklab.evals.suite import Case, SuiteResult, run_suite
from forklab.experiments.experiment.analysis.guard import learn_rule
from forklab.experiments.experiment.analysis.power import PowerRow, power_row
from forklab.experiments.experiment.analysis.slices import Clause, SliceEffect
from forklab.experiments.experiment.spec import Direction

GuardPolicy = Callable[
    [Sequence[Sequence[SliceEffect]], int | None], tuple[str, list[Clause], list[SliceEffect]]
]
PowerPolicy = Callable[[str, str, Direction, int, int, int, float, float], PowerRow]


def _slice(feature: str, value: str, rescue: int, harm: int, n: int = 20) -> dict[str, Any]:
    return {
        "feature": feature,
        "value": value,
        "rescue": rescue,
        "harm": harm,
        "unchanged": n - rescue - harm,
        "net": rescue - harm,
        "n": n,
        "difference": (rescue - harm) / n,
        "ci_low": 0.0,
        "ci_high": 0.0,
        "clause": {feature: {"eq": value}},
    }


ZONES = [_slice("zone", "a", 8, 0), _slice("zone", "b", 2, 5), _slice("zone", "c", 3, 1)]
LOAD = [_slice("load", "high", 9, 0, 30), _slice("load", "low", 0, 4, 30)]


def _guard(
    name: str,
    partitions: list[list[dict[str, Any]]],
    cap: int | None,
    basis: str,
    values: list[str],
) -> Case:
    return Case(
        name=name,
        input={"kind": "guard", "partitions": partitions, "harm_cap": cap},
        expected={"basis": basis, "values": values},
    )


def _power(
    name: str, expected: str, harm: int, rescue: int, episodes: int, under: bool, against: bool
) -> Case:
    return Case(
        name=name,
        input={
            "kind": "power",
            "expected": expected,
            "harm": harm,
            "rescue": rescue,
            "episodes": episodes,
        },
        expected={"underpowered": under, "against_expected": against},
    )


CASES = [
    _guard(
        "no cap: slices that rescue at least as much as they harm",
        [ZONES],
        None,
        "zone",
        ["a", "c"],
    ),
    _guard("harm cap 0: only harmless slices", [ZONES], 0, "zone", ["a"]),
    _guard(
        "harm cap 1: the one harm is spent where it buys rescues", [ZONES], 1, "zone", ["a", "c"]
    ),
    _guard("the feature with more rescues wins", [ZONES, LOAD], 0, "load", ["high"]),
    _guard("nothing worth gating", [[_slice("zone", "a", 0, 3)]], None, "", []),
    _power("strong effect at 200 episodes is powered", "decrease", 0, 40, 200, False, False),
    _power("weak effect at 40 episodes is underpowered", "decrease", 2, 4, 40, True, False),
    _power("rehearsal against the hypothesis", "decrease", 6, 1, 100, True, True),
    _power("no net effect: no sample size detects it", "increase", 3, 3, 60, True, False),
    _power("positive control pointing the right way", "increase", 30, 0, 150, False, False),
]


def run(
    guard: GuardPolicy = learn_rule, power: PowerPolicy = power_row, send: bool = False
) -> SuiteResult:
    def task(inp: dict[str, Any]) -> dict[str, Any]:
        if inp["kind"] == "guard":
            partitions = [[SliceEffect.model_validate(s) for s in p] for p in inp["partitions"]]
            basis, _, chosen = guard(partitions, inp["harm_cap"])
            return {"basis": basis, "values": [str(s.value) for s in chosen]}
        row = power(
            "treatment",
            "baseline",
            Direction(inp["expected"]),
            inp["harm"],
            inp["rescue"],
            inp["episodes"],
            0.05,
            0.8,
        )
        return {"underpowered": row.underpowered, "against_expected": row.against_expected}

    return run_suite("acquisition", CASES, task, send)
